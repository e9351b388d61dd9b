"""Cost of the path most learners take: notebooks in their default mode with the reference at GPT-2 small's size.

    python bench/bench_fullsize.py [--notebooks 05 06 07 08] [--learner [--no-solutions]] [--checks] [--hf-home DIR]

The reference comes from the stand-in hub (tests/hub_standin.py: GPT-2 small's shape, random weights, in a hub
cache, HF_HUB_OFFLINE=1), so `load_reference_gpt2()` takes the online path with no network. Each notebook runs
through nbgrader's Validator in its default mode (COURSE_FAST unset), one at a time, in a fresh process; printed:
wall time, the kernel's peak resident memory, and the Validator's verdict, against the goals (10 minutes, 4 GB).
--learner also runs each generated learner notebook (every graded test must fail). --checks runs
bench/bench_checks.py with the full-size reference (the checks' goal: 0.5 s plus the learner's constructor).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import hub_standin

GOAL_S, GOAL_MB = 600, 4096


def _verdict(results: dict, invert: bool) -> str:
    passed, failed = len(results.get("passed", [])), len(results.get("failed", []))
    if invert:
        return f"learner version: {failed} graded tests fail, {passed} pass" + (" (none should)" if passed else "")
    return f"solutions: {failed} graded tests fail" + (" (none should)" if failed else "") if failed else "all pass"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--notebooks", nargs="*", default=["05", "06", "07", "08"], help="notebook number prefixes")
    parser.add_argument("--learner", action="store_true", help="also the learner versions (Validator, inverted)")
    parser.add_argument("--no-solutions", action="store_true", help="only the learner versions (with --learner)")
    parser.add_argument("--checks", action="store_true", help="also bench/bench_checks.py at full size")
    parser.add_argument("--hf-home", help="an existing stand-in (default: written to a temporary folder)")
    args = parser.parse_args()

    from instructor.course import SOLUTIONS_DIR, notebook_names
    from instructor.generate import generate

    load = os.getloadavg()
    print(f"{os.cpu_count()} cores; load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} at the start")
    work = Path(tempfile.mkdtemp(prefix="bench-fullsize-"))
    hf_home = Path(args.hf_home) if args.hf_home else work / "hf_home"
    if not args.hf_home:
        start = time.perf_counter()
        hub_standin.write_standin_hub(hf_home)
        print(f"stand-in hub written in {time.perf_counter() - start:.0f} s: {hf_home}")
    names = [n for n in notebook_names() if any(n.startswith(prefix) for prefix in args.notebooks)]
    if args.learner:
        generate(work / "learner", names)
    runs = [(name, SOLUTIONS_DIR / f"{name}.ipynb", False) for name in names if not args.no_solutions]
    runs += [(name, work / "learner" / f"{name}.ipynb", True) for name in names if args.learner]
    for name, path, invert in runs:
        report = hub_standin.validate_at_full_size(path, hf_home, invert=invert)
        wall, peak, cpu = report["wall_s"], report["peak_rss_mb"], report["kernel_cpu_s"]
        print(
            f"{name} ({'learner' if invert else 'solutions'}): {wall:6.1f} s = {wall / GOAL_S:.2f}x the 10 min goal "
            f"(kernel CPU {cpu:.0f} s); "
            f"kernel peak {peak:6.0f} MiB = {peak / GOAL_MB:.2f}x the 4 GB goal; {_verdict(report['results'], invert)}",
            flush=True,
        )
    if args.checks:
        env = {k: v for k, v in os.environ.items() if k != "COURSE_FAST"}
        env.update(hub_standin.environment(hf_home))
        print("checks with the full-size reference (bench/bench_checks.py --source gpt2-small):", flush=True)
        subprocess.run(
            [sys.executable, str(REPO / "bench" / "bench_checks.py"), "--source", "gpt2-small"], env=env, check=True
        )
    load = os.getloadavg()
    print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} at the end (other work on the machine counts)")
    shutil.rmtree(work)  # the stand-in alone is 500 MB


if __name__ == "__main__":
    main()
