"""The mutation benchmark itself (bench/mutation_score.py): what it mutates, how it counts, and one real run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import mutation_score

SOURCE = '''def scale(x, factor):
    """Given code, not mutated: 2 * 3 stays."""
    y = 2 * 3
    ### BEGIN SOLUTION
    return x * factor + 1
    ### END SOLUTION
'''


def test_only_the_solution_region_is_mutated():
    found = mutation_score.mutants(SOURCE, mutation_score.operator_names("core"))
    assert found, "no mutants of `return x * factor + 1`"
    assert {m["before"] for m in found} == {"return x * factor + 1"}
    afters = {m["after"] for m in found}
    assert "return x / factor + 1" in afters and "return x * factor - 1" in afters, afters
    assert "return x * factor + 2" in afters, afters  # cosmic-ray's NumberReplacer
    assert len({m["code"] for m in found}) == len(found)  # no mutant twice


def test_report_counts_killed_equivalent_and_unexplained(capsys):
    record = {"notebook": "nb", "exercise": "scale", "operator": "ReplaceBinaryOperator_Mul_Div", "line": 5}
    records = [
        {**record, "before": "a", "after": "b", "outcome": "killed"},
        {**record, "before": "a", "after": "c", "outcome": "crashed"},
        {**record, "before": "a", "after": "d", "outcome": "survived"},
        {**record, "before": "a", "after": "e", "outcome": "survived"},
    ]
    equivalents = [{"exercise": "scale", "before": "a", "after": "d", "why": "the same"}]
    assert mutation_score.report(records, equivalents, show=True) == 1  # "e" is unexplained
    out = capsys.readouterr().out
    assert "SURVIVED nb scale line 5" in out and "'a' -> 'e'" in out and "'a' -> 'd'" not in out
    assert mutation_score.report(records[:3], equivalents, show=True) == 0


def test_equivalents_are_well_formed():
    from mutation_equivalents import EQUIVALENTS

    for entry in EQUIVALENTS:
        assert {"exercise", "before", "after", "why"} <= set(entry), entry
        assert len(entry["why"]) > 20, entry


def test_a_real_run_kills_every_layernorm_mutant(tmp_path):
    records = tmp_path / "records.jsonl"
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "mutation_score.py"), "--only", "layernorm", "--records", str(records)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    got = [json.loads(line) for line in records.read_text().splitlines() if '"outcome"' in line]
    assert len(got) >= 10 and all(r["outcome"] == "killed" for r in got), got
    assert "mutation score" in run.stdout
