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
import re
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
# red-team round 15: one 1 MB update written into 100 outputs of one display id, 5 MB of metadata on each of 20
# outputs, a 30 MB error name, and an image whose width nbconvert writes unquoted into its tag (a banner pinned over
# the page's header)
AMPLIFIED = (
    "from IPython.display import display, update_display\n"
    "for _ in range(100):\n    display({'text/plain': 'x'}, raw=True, display_id='d')\n"
    "update_display({'text/plain': 'y' * (1 << 20)}, raw=True, display_id='d')\n"
    "for _ in range(20):\n    display({'text/plain': 'x'}, raw=True, metadata={'m': 'z' * (5 << 20)})\n"
    "PNG = ('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==')\n"
    "display({'image/png': PNG}, raw=True, metadata={'image/png': {'width': '100% class=navbar-fixed-top id=pinned'}})\n"
    "class Loud(Exception):\n    pass\n"
    "Loud.__name__ = Loud.__qualname__ = 'E' * (30 << 20)\n"
    "print('still here')\n"
    "raise Loud('x')\n"
)


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
    amplified = insert_after(solve(copy.deepcopy(release), LN, "layernorm"), "layernorm", AMPLIFIED)
    for student, nb in {
        "honest": solve(copy.deepcopy(release), LN, "layernorm"),
        "blank": copy.deepcopy(release),
        "loud": loud,
        "amplified": amplified,
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
    # ... and what reaches the notebook by other paths than an output as it arrives is bounded too
    autograded = out / "course" / "autograded" / "amplified" / LN / f"{LN}.ipynb"
    feedback = out / "feedback" / "amplified" / f"{LN}.html"
    assert autograded.stat().st_size < NOTEBOOK_OUTPUT_CHARS + 200_000, autograded.stat().st_size
    assert feedback.stat().st_size < 2 * NOTEBOOK_OUTPUT_CHARS + 500_000, feedback.stat().st_size
    page = feedback.read_text()
    assert not re.search(r"<img[^>]*navbar-fixed-top", page) and "the grader cut this" in page
    assert float(rows["amplified", "test_layernorm"]["score"]) == float(
        rows["amplified", "test_layernorm"]["max_score"]
    )
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
    assert {r["student"] for r in summary} == {"honest", "blank", "loud", "amplified"}
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


def test_the_saved_notebook_is_bounded_however_its_outputs_got_there():
    """`bound_notebook` measures what will be saved: one 1 MB `update_display_data` written into 400 outputs of its
    display id, 5 MB of metadata on each of 20 one-character outputs, a 30 MB error name and a widget's state made
    notebooks of 400 and 500 MB (red-team round 15); an image's width written unquoted into its tag pinned a
    learner's picture over the page. Errors stay errors, shortened; image sizes stay, as numbers."""
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    from instructor.worker import bound_notebook

    shared = {"text/plain": "y" * (1 << 20)}  # an update's data, the same object in every output of its display id
    amplified = new_code_cell("update_display(...)")
    amplified.outputs = [new_output("display_data", data=shared) for _ in range(400)]
    heavy = new_code_cell("display(..., metadata=...)")
    heavy.outputs = [
        new_output("display_data", data={"text/plain": "x"}, metadata={"m": "z" * (5 << 20)}) for _ in range(20)
    ]
    image = {"image/png": {"width": "100% class=navbar-fixed-top", "height": 40.0, "unconfined": True}}
    heavy.outputs.append(new_output("display_data", data={"image/png": "iVBORw0KGgo="}, metadata=image))
    heavy.outputs.append(new_output("error", ename="E" * (30 << 20), evalue="x", traceback=["E: x"]))
    nb = new_notebook(cells=[amplified, heavy], metadata={"widgets": {"state": {"w": "s" * (16 << 20)}}})
    bound_notebook(nb)
    assert len(json.dumps(nb)) < NOTEBOOK_OUTPUT_CHARS and "widgets" not in nb.metadata
    assert "the grader cut this cell's output" in amplified.outputs[-1]["text"]
    kinds = [o["output_type"] for o in heavy.outputs]
    assert kinds[-1] == "error" and len(heavy.outputs[-1]["ename"]) == 200, kinds
    assert heavy.outputs[-2]["metadata"] == {"image/png": {"height": 40}}, heavy.outputs[-2]
    assert all(o["metadata"] == {} for o in heavy.outputs[:-2]), [o["metadata"] for o in heavy.outputs[:3]]
