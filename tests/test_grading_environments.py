"""The grader in an instructor's own environment (issue #25): a virtual environment reached through a link, a
template that cannot start, and outputs a submission can grow.

One small batch is graded from a copy of the course whose `.venv` is a symbolic link to this environment (as
conda, pyenv, uv or a shared lab install arrange): an honest notebook, a blank one, and one that prints 100 MiB
after its test. A second run uses a `bwrap` that cannot build the sandbox: it must stop after a bounded number
of attempts, say why once, and record every notebook as not graded.
"""

from __future__ import annotations

import copy
import csv
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_grading import LN, insert_after, needs_sandbox, solve

from instructor.course import REPO_ROOT, read_json
from instructor.grade import TEMPLATE_START_ATTEMPTS, prepare_course
from instructor.sandbox import python_binds
from instructor.worker import CELL_OUTPUT_CHARS, NOTEBOOK_OUTPUT_CHARS

LOUD = 'import sys\nfor _ in range(100):\n    sys.stdout.write("x" * (1 << 20))\nprint("still here")\n'


def _clone(tmp: Path) -> tuple[Path, Path]:
    """A copy of the course (what `git clone` gives) whose .venv links to this environment; its interpreter."""
    clone = tmp / "clone"
    clone.mkdir()
    for entry in ("harness", "instructor", "solutions", "notebooks", "pyproject.toml", "nbgrader_config.py"):
        source = REPO_ROOT / entry
        if source.is_dir():
            shutil.copytree(source, clone / entry, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copyfile(source, clone / entry)
    environment = Path(sys.prefix).resolve()
    (clone / ".venv").symlink_to(environment, target_is_directory=True)
    python = clone / ".venv" / "bin" / Path(sys.executable).name
    assert python.exists() and python.resolve() != python
    return clone, python


def _submissions(root: Path) -> Path:
    prepare_course(root / "setup", [LN], 20, 240)
    release = read_json(root / "setup" / "release" / LN / f"{LN}.ipynb")
    subs = root / "submissions"
    loud = solve(copy.deepcopy(release), LN, "layernorm")
    insert_after(loud, "layernorm", LOUD)  # before the test: cells after a notebook's last test are not run
    for student, nb in {
        "honest": solve(copy.deepcopy(release), LN, "layernorm"),
        "blank": copy.deepcopy(release),
        "loud": loud,
    }.items():
        (subs / student).mkdir(parents=True)
        (subs / student / f"{LN}.ipynb").write_text(json.dumps(nb))
    return subs


def _grade(python: Path, cwd: Path, subs: Path, out: Path, env: dict | None = None, timeout: int = 900):
    start = time.monotonic()
    run = subprocess.run(
        [str(python), "-m", "instructor.grade", str(subs), "--out", str(out), "--jobs", "2", "--memory-gb", "2"],
        check=False,
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env or dict(os.environ, HF_HUB_OFFLINE="1"),
        timeout=timeout,
    )
    return run, time.monotonic() - start


def _csv(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_binds_follow_links_to_the_environment(tmp_path, monkeypatch):
    """Every directory the interpreter names is bound where it names it, from the directory the link leads to."""
    env = tmp_path / "elsewhere" / "env"
    (env / "bin").mkdir(parents=True)
    (env / "lib" / "site").mkdir(parents=True)
    link = tmp_path / "project" / ".venv"
    link.parent.mkdir()
    link.symlink_to(env)
    monkeypatch.setattr(sys, "prefix", str(link))
    monkeypatch.setattr(sys, "exec_prefix", str(link))
    monkeypatch.setattr(sys, "executable", str(link / "bin" / "python"))
    monkeypatch.setattr(sys, "path", [str(link / "lib" / "site"), str(REPO_ROOT), ""])
    binds = python_binds()
    assert (str(env), str(env)) in binds and (str(env), str(link)) in binds, binds
    assert not any(dest in (str(REPO_ROOT), "/") or str(REPO_ROOT).startswith(dest + "/") for _, dest in binds)


@needs_sandbox
def test_grades_from_a_linked_environment_and_bounds_huge_outputs(tmp_path):
    clone, python = _clone(tmp_path)
    subs = _submissions(tmp_path)
    out = tmp_path / "out"
    run, took = _grade(python, clone, subs, out)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = {(r["student"], r["grade_id"]): r for r in _csv(out / "grades.csv")}
    for grade_id in {g for _, g in rows}:
        assert float(rows["honest", grade_id]["score"]) == float(rows["honest", grade_id]["max_score"]) > 0
        assert float(rows["blank", grade_id]["score"]) == 0
        # printing after its test costs nothing: the output is cut, not the grade
        assert float(rows["loud", grade_id]["score"]) == float(rows["loud", grade_id]["max_score"]), rows
    autograded = out / "course" / "autograded" / "loud" / LN / f"{LN}.ipynb"
    feedback = out / "feedback" / "loud" / f"{LN}.html"
    limit = CELL_OUTPUT_CHARS + 10_000  # one cell's output and the note that says where it was cut
    assert autograded.stat().st_size < NOTEBOOK_OUTPUT_CHARS and feedback.stat().st_size < 2 * NOTEBOOK_OUTPUT_CHARS
    cells = json.loads(autograded.read_text())["cells"]
    loud = next(c for c in cells if c["cell_type"] == "code" and "still here" in "".join(c["source"]))
    text = "".join("".join(o.get("text", "")) for o in loud["outputs"])
    assert len(text) < limit and "the grader cut this" in text, text[-300:]
    assert "the grader cut this" in feedback.read_text()
    for path in (out / "grades.csv", out / "summary.csv"):
        assert path.stat().st_size < 100_000
    print(f"graded 3 notebooks from a linked environment in {took:.0f} s")


@needs_sandbox
def test_a_template_that_cannot_start_stops_the_batch_and_says_why(tmp_path):
    """A `bwrap` that passes the grader's first probe but cannot build the real sandbox (as in a container without
    the privileges it needs): bounded attempts, one message, every notebook recorded as not graded."""
    fake = tmp_path / "bin"
    fake.mkdir()
    real = shutil.which("bwrap")
    (fake / "bwrap").write_text(
        "#!/bin/sh\n"
        f'case "$*" in *" true") exec {real} "$@";; esac\n'
        'echo "bwrap: Can\'t mount proc on /newroot/proc: Operation not permitted" >&2\nexit 1\n'
    )
    (fake / "bwrap").chmod(0o755)
    subs = _submissions(tmp_path)
    out = tmp_path / "out"
    env = dict(os.environ, HF_HUB_OFFLINE="1", PATH=f"{fake}:{os.environ['PATH']}")
    run, took = _grade(Path(sys.executable), REPO_ROOT, subs, out, env=env, timeout=600)
    assert run.returncode == 2, run.stderr[-3000:]
    assert run.stderr.count("GRADING STOPPED") == 1 and "could not start" in run.stderr, run.stderr[-3000:]
    assert "Operation not permitted" in run.stderr and "What to do" in run.stderr, run.stderr[-3000:]
    assert run.stderr.count("restarting it") == TEMPLATE_START_ATTEMPTS - 1, run.stderr[-3000:]
    summary = _csv(out / "summary.csv")
    assert {r["student"] for r in summary} == {"honest", "blank", "loud"}
    assert all(r["status"] == "not graded" for r in summary), summary
    rows = _csv(out / "grades.csv")
    assert rows and all(r["reason"].startswith("not graded:") and float(r["score"]) == 0 for r in rows), rows
    assert took < 300, took


@needs_sandbox
def test_grades_with_a_plain_interpreter_and_packages_on_pythonpath(tmp_path):
    """A Python that is no virtual environment (as conda's or a system one is), its packages found through
    PYTHONPATH (as a user site-packages or a lab's shared folder would be): the template, isolated with -I, is
    handed the grader's sys.path, and the sandbox binds each of its folders."""
    base = Path(sys.base_prefix) / "bin" / Path(sys.executable).name
    if not base.exists() or Path(sys.prefix) == Path(sys.base_prefix):
        pytest.skip("needs a virtual environment over a separate base interpreter")
    site = [p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix)]
    subs = _submissions(tmp_path)
    for student in ("blank", "loud"):
        shutil.rmtree(subs / student)
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join(site))
    run, _ = _grade(base, REPO_ROOT, subs, tmp_path / "out", env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = _csv(tmp_path / "out" / "grades.csv")
    assert rows and all(float(r["score"]) == float(r["max_score"]) for r in rows), rows
