"""How long `python -m instructor.grade` takes for one whole submission (every notebook of the course).

    python bench/bench_grading.py [--students 1] [--jobs N] [--keep DIR]

The submission is the solution notebooks (every test passes, so every cell runs). The nbgrader course set-up
(generate_assignment for each notebook, cached by the solutions' hash) is timed separately: it happens once
per version of the course, not per submission. Prints the wall time per submission and the machine's load.
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from instructor.course import SOLUTIONS_DIR, notebook_names
from instructor.grade import prepare_course


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--students", type=int, default=1, help="copies of the submission to grade in one batch")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--keep", type=Path, help="keep the output here")
    parser.add_argument("--cold-kernels", action="store_true", help="pass --cold-kernels to the grader")
    parser.add_argument("--no-sandbox", action="store_true", help="pass --no-sandbox to the grader (to compare)")
    args = parser.parse_args()
    names = notebook_names()
    tmp = Path(tempfile.mkdtemp(prefix="bench-grading-"))
    try:
        t = time.perf_counter()
        prepare_course(tmp / "setup", names, 60, 300)
        setup = time.perf_counter() - t
        submissions = tmp / "submissions"
        for i in range(args.students):
            folder = submissions / f"student{i:02d}"
            folder.mkdir(parents=True)
            for name in names:
                shutil.copyfile(SOLUTIONS_DIR / f"{name}.ipynb", folder / f"{name}.ipynb")
        out = args.keep or tmp / "out"
        print(f"cores: {os.cpu_count()}, jobs: {args.jobs}, load average before: {loadavg()}")
        t = time.perf_counter()
        run = subprocess.run(
            [sys.executable, "-m", "instructor.grade", str(submissions), "--out", str(out), "--jobs", str(args.jobs)]
            + (["--cold-kernels"] if args.cold_kernels else [])
            + (["--no-sandbox"] if args.no_sandbox or args.cold_kernels else []),
            check=False,
            capture_output=True,
            text=True,
            env=dict(os.environ, HF_HUB_OFFLINE=os.environ.get("HF_HUB_OFFLINE", "1")),
        )
        wall = time.perf_counter() - t
        print(run.stderr.strip())
        if run.returncode:
            print(f"grading failed (exit {run.returncode})")
            return 1
        with open(out / "summary.csv", newline="") as f:
            summary = list(csv.DictReader(f))
        score = sum(float(r["score"]) for r in summary)
        total = sum(float(r["max_score"]) for r in summary)
        print(f"load average after: {loadavg()}")
        print(f"course set-up (cached per version of the solutions): {setup:.1f} s")
        print(f"graded {args.students} submission(s) x {len(names)} notebooks: {score:g}/{total:g} points")
        print(f"wall time: {wall:.1f} s in all, {wall / args.students:.1f} s per submission")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
