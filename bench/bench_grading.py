"""How long `python -m instructor.grade` takes for one whole submission (every notebook of the course).

    python bench/bench_grading.py [--students 1] [--jobs N] [--keep DIR]
    python bench/bench_grading.py --ray-nodes 1 2 [--students 4] [--node-cpus 1] [--notebooks 01_layernorm ...]

The submission is the solution notebooks (every test passes, so every cell runs). The nbgrader course set-up
(generate_assignment for each notebook, cached by the solutions' hash) is timed separately: it happens once
per version of the course, not per submission. Prints the wall time per submission and the machine's load.

`--ray-nodes` grades the same batch with `--engine ray` on a Ray cluster started here (a head that runs no task
and that many worker nodes of `--node-cpus` CPUs each), once per count, and reports submissions per minute while
the students' tasks ran (from the first task sent to the last result, `OUT/logs/jobs.jsonl`), the per-core rate,
the measured ratio between the counts, and what the per-core rate projects for a class of 1,000. Nodes on one
machine share its cores: the ratio measures how the work divides, not what more machines would add.
"""

from __future__ import annotations

import argparse
import csv
import json
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
    parser.add_argument("--ray-nodes", type=int, nargs="+", help="grade on Ray with these numbers of worker nodes")
    parser.add_argument("--node-cpus", type=int, default=1, help="CPUs of each Ray worker node (default 1)")
    parser.add_argument("--notebooks", nargs="+", help="only these notebooks (default: all)")
    args = parser.parse_args()
    if args.ray_nodes:
        return bench_ray(args)
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


def _span(out: Path) -> float:
    """Seconds from the first grading task sent to the last one done."""
    events = [json.loads(line) for line in (out / "logs" / "jobs.jsonl").read_text().splitlines() if line.strip()]
    grading = [e for e in events if e["what"] == "grading"]
    sent = min(e["time"] for e in grading if e["event"] == "sent")
    done = max(e["time"] for e in grading if e["event"] == "done")
    return done - sent


def bench_ray(args) -> int:
    from ray.cluster_utils import Cluster

    names = args.notebooks or notebook_names()
    tmp = Path(tempfile.mkdtemp(prefix="bench-grading-ray-"))
    rates = {}
    try:
        prepare_course(tmp / "setup", notebook_names(), 60, 300)
        students = max(args.students, 2 * max(args.ray_nodes))
        submissions = tmp / "submissions"
        for i in range(students):
            folder = submissions / f"student{i:02d}"
            folder.mkdir(parents=True)
            for name in names:
                shutil.copyfile(SOLUTIONS_DIR / f"{name}.ipynb", folder / f"{name}.ipynb")
        print(f"cores: {os.cpu_count()}; {students} submissions of {len(names)} notebooks; load: {loadavg()}")
        for nodes in args.ray_nodes:
            cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "object_store_memory": 200 << 20})
            for _ in range(nodes):
                cluster.add_node(num_cpus=args.node_cpus, object_store_memory=200 << 20)
            cluster.wait_for_nodes()
            out = tmp / f"out-{nodes}"
            t = time.perf_counter()
            run = subprocess.run(
                [sys.executable, "-m", "instructor.grade", str(submissions), "--out", str(out)]
                + ["--engine", "ray", "--address", cluster.address, "--task-cpus", str(args.node_cpus)]
                + (["--notebooks", *args.notebooks] if args.notebooks else []),
                check=False,
                capture_output=True,
                text=True,
                env=dict(os.environ, HF_HUB_OFFLINE=os.environ.get("HF_HUB_OFFLINE", "1")),
            )
            wall = time.perf_counter() - t
            cluster.shutdown()
            if run.returncode:
                print(run.stderr[-3000:])
                print(f"grading failed (exit {run.returncode})")
                return 1
            with open(out / "summary.csv", newline="") as f:
                summary = list(csv.DictReader(f))
            score = sum(float(r["score"]) for r in summary)
            total = sum(float(r["max_score"]) for r in summary)
            span = _span(out)
            rates[nodes] = students / span * 60
            cores = nodes * args.node_cpus
            print(
                f"{nodes} worker node(s), {cores} CPU(s): {score:g}/{total:g} points; tasks {span:.1f} s, "
                f"{rates[nodes]:.2f} submissions/min ({rates[nodes] / cores:.2f} per core); whole command "
                f"{wall:.1f} s (with Ray's connection and the feedback tasks); load after: {loadavg()}"
            )
        base = min(rates)
        for nodes, rate in sorted(rates.items()):
            if nodes != base:
                print(
                    f"measured ratio {nodes} nodes / {base} node(s): {rate / rates[base]:.2f} (ideal {nodes / base:g})"
                )
        # Each count's own per-core rate: one node leaves the machine's other cores to the job's helpers (an
        # optimistic figure), all nodes share them (a pessimistic one); machines of their own fall in between.
        print("projection for 1,000 submissions from the measured per-core rates, hours:")
        print(
            "  cores  "
            + "  ".join(f"at {rate / (n * args.node_cpus):.2f}/min/core ({n} node)" for n, rate in rates.items())
        )
        for cores in (2, 16, 64, 256):
            hours = [1000 / (rate / (n * args.node_cpus) * cores) / 60 for n, rate in rates.items()]
            print(f"  {cores:>5}  " + "  ".join(f"{h:>27.1f}" for h in hours))
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
