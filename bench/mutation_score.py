"""Mutation testing of the exercise checks: how many small changes to each exercise's solution its check catches.

    HF_HUB_OFFLINE=1 COURSE_FAST=1 python bench/mutation_score.py [--only NAME] [--operators core|all] [--survivors]

The mutants come from cosmic-ray's operators (`cosmic_ray.mutating.mutate_code`): replaced arithmetic and
comparison operators, numbers nudged by one, `not` added, booleans and `and`/`or` swapped, loops that never run,
decorators removed, `break`/`continue` exchanged. Only lines inside an exercise's `### BEGIN SOLUTION` ...
`### END SOLUTION` region are mutated: what a learner writes, not the scaffolding the notebook gives them.

Each solution notebook is run once (fast mode, in its own process, as nbval runs it); then, for every mutant of
every exercise cell, a forked copy of that state runs the mutated cell and the graded test cell that follows it
(tests/exercise_variants.py, shared with the tests).
An AssertionError is a kill by the check; any other exception or a hang is counted apart (the mutant crashed: the
learner would see a traceback, not a check's message); a mutant that passes has survived. A survivor is either
listed in `bench/mutation_equivalents.py` with the reason it computes the same thing, or a blind spot of the check.

Prints per exercise: mutants, killed by the check, crashed, equivalent, unexplained survivors; then the totals.
Exit status 1 when any survivor is unexplained (`--survivors` prints each one's changed line).
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))  # the notebook-state runner the tests use too

# One replacement per arithmetic operator (the full cross product mostly adds mutants no learner writes), every
# comparison, and the structural operators. VariableReplacer/Inserter draw at random: their mutants change per run.
BINARY = ["Add_Sub", "Sub_Add", "Mul_Div", "Div_Mul", "FloorDiv_Div", "Mod_FloorDiv", "Pow_Mul", "BitAnd_BitOr",
          "BitOr_BitAnd", "MatMult_Mul"]  # fmt: skip
STRUCTURAL = ["AddNot", "ReplaceTrueWithFalse", "ReplaceFalseWithTrue", "ReplaceAndWithOr", "ReplaceOrWithAnd",
              "ReplaceBreakWithContinue", "ReplaceContinueWithBreak", "NumberReplacer", "RemoveDecorator",
              "ZeroIterationForLoop", "ReplaceUnaryOperator_USub_UAdd", "ReplaceUnaryOperator_Invert_UAdd",
              "ReplaceUnaryOperator_Delete_Not"]  # fmt: skip


def operator_names(which: str) -> list[str]:
    from cosmic_ray.plugins import operator_names as available

    names = sorted(available())
    if which == "all":
        return [n for n in names if not n.startswith("core/Variable")]
    chosen = [f"core/ReplaceBinaryOperator_{b}" for b in BINARY] + [f"core/{s}" for s in STRUCTURAL]
    chosen += [n for n in names if n.startswith("core/ReplaceComparisonOperator_")]
    return [n for n in chosen if n in names]


def solution_lines(source: str) -> set[int]:
    """0-based numbers of the lines inside BEGIN/END SOLUTION regions."""
    inside, lines = False, set()
    for number, line in enumerate(source.splitlines()):
        if "### BEGIN SOLUTION" in line:
            inside = True
        elif "### END SOLUTION" in line:
            inside = False
        elif inside:
            lines.add(number)
    return lines


def mutants(source: str, operators: list[str]) -> list[dict]:
    """Every mutant of `source` that changes only lines of its solution regions: operator, occurrence, the line
    before and after."""
    from cosmic_ray.mutating import mutate_code
    from cosmic_ray.plugins import get_operator

    allowed = solution_lines(source)
    before = source.splitlines()
    found, seen = [], set()
    for name in operators:
        operator = get_operator(name)()
        occurrence = 0
        while True:
            try:
                mutated = mutate_code(source, operator, occurrence)
            except Exception:  # noqa: BLE001 - an operator that cannot handle some syntax: no more of its mutants
                break
            if mutated is None:
                break
            occurrence += 1
            after = mutated.splitlines()
            changed = [
                i
                for tag, i1, i2, _, _ in difflib.SequenceMatcher(a=before, b=after).get_opcodes()
                if tag != "equal"
                for i in range(i1, max(i2, i1 + 1))
            ]
            if not changed or not set(changed) <= allowed or mutated in seen:
                continue
            seen.add(mutated)
            line = changed[0]
            new = after[line] if len(after) == len(before) else ""
            found.append(
                {
                    "operator": name.removeprefix("core/"),
                    "occurrence": occurrence - 1,
                    "line": line + 1,
                    "before": before[line].strip(),
                    "after": new.strip(),
                    "code": mutated,
                }
            )
    return found


def score_notebook(name: str, only: str | None, operators: list[str], timeout: float, emit) -> None:
    """Run notebook `name` once, then every mutant of each of its exercises; `emit(record)` for each."""
    from exercise_variants import NotebookState, exercises

    notebook = json.loads((ROOT / "solutions" / f"{name}.ipynb").read_text(encoding="utf-8"))
    if not [e for e in exercises(notebook) if not only or only == name or only in e["name"]]:
        return
    state = NotebookState(name)
    emit({"notebook": name, "setup_s": round(state.setup_s, 1)})
    for exercise in state.exercises:
        if only and only != name and only not in exercise["name"]:
            continue
        baseline = state.try_variant(exercise, exercise["source"], timeout=timeout * 3)
        if baseline["outcome"] != "survived":
            emit({"notebook": name, "exercise": exercise["name"], "error": f"the solution fails: {baseline}"})
            continue
        for mutant in mutants(exercise["source"], operators):
            result = state.try_variant(exercise, mutant.pop("code"), timeout=timeout)
            emit({"notebook": name, "exercise": exercise["name"], "test": exercise["test_name"], **mutant, **result})


# ---------------------------------------------------------------------------------------------- the report
def explained(record: dict, equivalents: list[dict]) -> str | None:
    for entry in equivalents:
        same_line = (entry["exercise"], entry["before"], entry["after"]) == (
            record["exercise"],
            record["before"],
            record["after"],
        )
        if same_line and entry.get("operator", record["operator"]) == record["operator"]:
            return entry["why"]
    return None


def report(records: list[dict], equivalents: list[dict], show: bool) -> int:
    rows: dict[tuple[str, str], dict] = {}
    unexplained = []
    for record in records:
        if "exercise" not in record:
            continue
        row = rows.setdefault(
            (record["notebook"], record["exercise"]),
            {"mutants": 0, "killed": 0, "crashed": 0, "equivalent": 0, "survived": 0, "error": ""},
        )
        if "error" in record:
            row["error"] = record["error"]
            continue
        row["mutants"] += 1
        if record["outcome"] in ("killed", "crashed"):
            row[record["outcome"]] += 1
        elif explained(record, equivalents):
            row["equivalent"] += 1
        else:
            row["survived"] += 1
            unexplained.append(record)
    print(
        f"{'notebook':26s} {'exercise':28s} {'mutants':>7s} {'killed':>6s} {'crashed':>7s} {'equiv':>5s} {'surv':>4s}"
    )
    totals = dict.fromkeys(("mutants", "killed", "crashed", "equivalent", "survived"), 0)
    for (notebook, exercise), row in sorted(rows.items()):
        print(
            f"{notebook:26s} {exercise:28s} {row['mutants']:7d} {row['killed']:6d} {row['crashed']:7d} "
            f"{row['equivalent']:5d} {row['survived']:4d} {row['error'][:80]}"
        )
        for key in totals:
            totals[key] += row[key]
    print(
        f"{'total':55s} {totals['mutants']:7d} {totals['killed']:6d} {totals['crashed']:7d} "
        f"{totals['equivalent']:5d} {totals['survived']:4d}"
    )
    caught = totals["killed"] + totals["crashed"]
    if totals["mutants"]:
        print(
            f"mutation score (caught / non-equivalent): {caught}/{totals['mutants'] - totals['equivalent']} = "
            f"{caught / max(1, totals['mutants'] - totals['equivalent']):.3f}; killed by a check's message: "
            f"{totals['killed']}, crashed: {totals['crashed']}"
        )
    if show:
        for record in unexplained:
            print(
                f"SURVIVED {record['notebook']} {record['exercise']} line {record['line']} "
                f"[{record['operator']}]: {record['before']!r} -> {record['after']!r}"
            )
    return 1 if unexplained or any(r["error"] for r in rows.values()) else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", help="a notebook (e.g. 01_layernorm) or an exercise's grade id (e.g. layernorm)")
    parser.add_argument("--operators", choices=["core", "all"], default="core")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per mutant")
    parser.add_argument("--survivors", action="store_true", help="print every unexplained survivor")
    parser.add_argument("--records", type=Path, help="also write every mutant's record here (JSON lines)")
    parser.add_argument("--from-records", type=Path, help="report on records written earlier; run nothing")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # one notebook, in its own process
    args = parser.parse_args()
    operators = operator_names(args.operators)
    if args.worker:

        def emit(record):
            print("RECORD " + json.dumps(record), flush=True)

        score_notebook(args.worker, args.only, operators, args.timeout, emit)
        return 0
    from mutation_equivalents import EQUIVALENTS

    if args.from_records:
        lines = args.from_records.read_text(encoding="utf-8").splitlines()
        return report([json.loads(line) for line in lines if line.strip()], EQUIVALENTS, args.survivors)
    from harness.course import notebook_names

    records = []
    sink = args.records.open("w", encoding="utf-8") if args.records else None
    for name in notebook_names():
        if args.only and not (args.only in name or _has_exercise(name, args.only)):
            continue
        command = [sys.executable, __file__, "--worker", name, "--operators", args.operators]
        command += ["--timeout", str(args.timeout)] + (["--only", args.only] if args.only else [])
        started = time.monotonic()
        run = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)
        got = [json.loads(line[7:]) for line in run.stdout.splitlines() if line.startswith("RECORD ")]
        if run.returncode != 0:
            got.append({"notebook": name, "exercise": "(notebook)", "error": run.stderr.strip()[-300:]})
        for record in got:
            if sink:
                sink.write(json.dumps(record) + "\n")
        records += got
        print(f"# {name}: {sum('outcome' in r for r in got)} mutants in {time.monotonic() - started:.0f} s", flush=True)
    if sink:
        sink.close()
    return report(records, EQUIVALENTS, args.survivors)


def _has_exercise(notebook: str, name: str) -> bool:
    from exercise_variants import exercises

    nb = json.loads((ROOT / "solutions" / f"{notebook}.ipynb").read_text(encoding="utf-8"))
    return any(re.search(re.escape(name), e["name"]) for e in exercises(nb))


if __name__ == "__main__":
    sys.exit(main())
