"""How often a failing check names the learner's actual mistake, over the catalogue of realistic wrong versions.

    HF_HUB_OFFLINE=1 COURSE_FAST=1 python bench/naming_rate.py [--only SUBSTRING] [--verbose]

The catalogue lives in tests/wrong_versions.py (the tests run the same entries). Every entry is run through the
check the learner calls; the course's correct implementations are run too, to show that none is refused. Prints,
per check and overall: caught (AssertionError), named, unnamed (with the message's first line), passed wrongly;
then the overall ratios.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("COURSE_FAST", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import torch
from wrong_versions import CASES, run_case


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="", help="run only the checks whose name contains this")
    parser.add_argument("--verbose", action="store_true", help="print every message's head")
    args = parser.parse_args()
    torch.set_num_threads(1)  # deterministic and polite to other jobs
    start = time.perf_counter()
    rows: dict[str, dict[str, int]] = {}
    notes: list[str] = []
    for c in CASES:
        if args.only and args.only not in c.check:
            continue
        t0 = time.perf_counter()
        outcome, message = run_case(c)
        dt = time.perf_counter() - t0
        row = rows.setdefault(
            c.check, dict.fromkeys(["wrong", "caught", "named", "unnamed", "passed", "correct", "refused", "error"], 0)
        )
        first = message.splitlines()[0][:200] if message else ""
        if c.correct:
            row["correct"] += 1
            if outcome != "pass":
                row["refused" if outcome == "refused" else "error"] += 1
                notes.append(f"  REFUSED correct  {c.check}: {first}")
        else:
            row["wrong"] += 1
            if outcome in ("named", "unnamed"):
                row["caught"] += 1
                row[outcome] += 1
                if outcome == "unnamed":
                    notes.append(f"  unnamed  {c.check} [{c.label}]: {first}")
            elif outcome == "pass":
                row["passed"] += 1
                notes.append(f"  PASSED   {c.check} [{c.label}]")
            else:
                row["error"] += 1
                notes.append(f"  ERROR    {c.check} [{c.label}]: {first}")
        if args.verbose:
            print(f"{outcome:8s} {dt:5.2f}s {c.check} [{c.label or 'correct'}]: {first[:160]}")
    width = max(len(k) for k in rows) if rows else 10
    print(f"{'check':{width}s}  wrong caught named unnamed passed | correct refused")
    total = dict.fromkeys(["wrong", "caught", "named", "unnamed", "passed", "correct", "refused", "error"], 0)
    for check, row in rows.items():
        print(
            f"{check:{width}s}  {row['wrong']:5d} {row['caught']:6d} {row['named']:5d} {row['unnamed']:7d} "
            f"{row['passed']:6d} | {row['correct']:7d} {row['refused']:7d}"
        )
        for key in total:
            total[key] += row[key]
    print()
    print("\n".join(notes))
    print()
    wrong = max(total["wrong"], 1)
    print(
        f"{total['wrong']} wrong versions over {len(rows)} checks: caught {100 * total['caught'] / wrong:.0f}%, "
        f"named {100 * total['named'] / wrong:.0f}% ({total['named']}/{total['wrong']}), "
        f"passed wrongly {total['passed']}, bench errors {total['error']}; "
        f"correct versions refused {total['refused']}/{total['correct']}. ({time.perf_counter() - start:.0f} s)"
    )


if __name__ == "__main__":
    main()
