"""The learner notebooks: generated from the solutions by nbgrader, up to date, and validated like `nbgrader validate`.

- `notebooks/` must be what `python -m instructor.generate` makes from `solutions/` now (regenerate, compare);
- every solution notebook passes all of its graded tests (nbgrader's Validator);
- every generated learner notebook fails all of them (the Validator with invert=True: no graded cell passes).

`nbgrader validate` exits 0 even when tests fail, so its Python API is used and its results are inspected. The
validations run two at a time (each executes a whole notebook in a fresh kernel).
"""

from __future__ import annotations

import json
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from instructor.course import cell_kind, cell_source, nbgrader_meta, notebook_names, read_json
from instructor.generate import check, generate

NAMES = notebook_names()
CELL_TIMEOUT = 120


def _validate(path: str, invert: bool) -> dict:
    """nbgrader's Validator on one notebook, in a fresh process; its results dict."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.environ.setdefault("COURSE_FAST", "1")  # the notebooks' fast mode, as in CI
    from nbgrader.preprocessors import ClearOutput
    from nbgrader.validator import Validator
    from traitlets.config import Config

    from instructor import nbconfig

    c = Config()
    nbconfig.configure(c, cell_timeout=CELL_TIMEOUT, notebook_timeout=900)
    c.Validator.invert = invert
    validator = Validator(config=c)
    # the grader's execution (time limits, harmless stderr); Validator.preprocessors is not configurable
    validator.preprocessors = [ClearOutput, nbconfig.GuardedExecute, nbconfig.HarmlessStderr]
    return validator.validate(path)


@pytest.fixture(scope="module")
def learner_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("learner")
    generate(out, NAMES)
    return out


def _validate_all(jobs: list[tuple[str, str, bool]]) -> dict:
    with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {(name, invert): pool.submit(_validate, path, invert) for name, path, invert in jobs}
        return {key: future.result() for key, future in futures.items()}


@pytest.fixture(scope="module")
def solution_validations(tmp_path_factory) -> dict:
    """The solutions run as grading runs them: the course's demonstrations no graded cell needs left out."""
    from instructor.collect import normalise
    from instructor.course import SOLUTIONS_DIR
    from instructor.dataflow import cells_to_run

    out = tmp_path_factory.mktemp("solutions")
    for name in NAMES:
        solution = read_json(SOLUTIONS_DIR / f"{name}.ipynb")
        nb, _ = normalise(solution, solution, name)  # the course's own cells marked, as the grader marks them
        left_out = len([c for c in nb["cells"] if c["cell_type"] == "code"]) - len(cells_to_run(_nodes(nb["cells"])))
        assert left_out > 0, name  # the run below is not the full run nbval makes
        (out / f"{name}.ipynb").write_text(json.dumps(nb))
    return _validate_all([(name, str(out / f"{name}.ipynb"), False) for name in NAMES])


def _nodes(cells: list[dict]) -> list:
    import nbformat

    return [nbformat.from_dict({**c, "source": cell_source(c)}) for c in cells]


@pytest.fixture(scope="module")
def learner_validations(learner_dir) -> dict:
    return _validate_all([(name, str(learner_dir / f"{name}.ipynb"), True) for name in NAMES])


def test_committed_learner_notebooks_are_up_to_date():
    problems = check()
    assert not problems, "\n".join(problems) + "\nRun `python -m instructor.generate`."


def test_generation_is_deterministic(learner_dir, tmp_path):
    generate(tmp_path, NAMES[:2])
    for name in NAMES[:2]:
        assert (tmp_path / f"{name}.ipynb").read_bytes() == (learner_dir / f"{name}.ipynb").read_bytes()


@pytest.mark.parametrize("name", NAMES)
def test_learner_notebook_has_no_solution_code(learner_dir, name):
    nb = read_json(learner_dir / f"{name}.ipynb")
    source = read_json(Path(__file__).resolve().parent.parent / "solutions" / f"{name}.ipynb")
    assert len(nb["cells"]) == len(source["cells"])
    for cell in nb["cells"]:
        text = cell_source(cell)
        assert "BEGIN SOLUTION" not in text and "END SOLUTION" not in text
        assert "BEGIN HIDDEN TESTS" not in text
        assert not cell.get("outputs")
        if cell_kind(cell) == "solution" and cell["cell_type"] == "code":
            assert "raise NotImplementedError()" in text
        if cell_kind(cell) == "test":
            meta = nbgrader_meta(cell)
            assert meta.get("locked") and meta.get("points", 0) > 0 and cell["metadata"].get("editable") is False


@pytest.mark.parametrize("name", NAMES)
def test_solution_notebook_conventions(name):
    nb = read_json(Path(__file__).resolve().parent.parent / "solutions" / f"{name}.ipynb")
    ids = [nbgrader_meta(c)["grade_id"] for c in nb["cells"] if nbgrader_meta(c).get("grade_id")]
    assert len(ids) == len(set(ids)), f"duplicate grade_ids in {name}: {ids}"
    previous_code = None
    for cell in nb["cells"]:
        kind = cell_kind(cell)
        if kind == "solution":
            assert "### BEGIN SOLUTION" in cell_source(cell) and "### END SOLUTION" in cell_source(cell)
        if kind == "test":
            meta = nbgrader_meta(cell)
            assert meta.get("locked") and meta.get("points", 0) > 0, meta
            assert previous_code in ("solution", "test"), f"{meta['grade_id']} does not follow an exercise"
            assert "BEGIN SOLUTION" not in cell_source(cell)
        if kind != "markdown":
            previous_code = kind


# nbval runs every solution notebook end to end in the default suite, where a failing test cell fails it; this is
# the grader's run under nbgrader's Validator (its execution, the demonstrations no graded cell needs left out):
# opt-in, run by .ci/run
@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_solution_notebook_passes_all_its_tests(solution_validations, name):
    results = solution_validations[(name, False)]
    assert "type_changed" not in results and "changed" not in results, results
    failed = results.get("failed", [])
    assert not failed, "\n\n".join(f"{f['source']}\n{f['raw_error']}" for f in failed)


@pytest.mark.parametrize("name", NAMES)
def test_learner_notebook_fails_all_its_tests(learner_validations, name):
    results = learner_validations[(name, True)]
    assert "type_changed" not in results and "changed" not in results, results
    assert not results.get("passed"), f"graded cells pass without any work: {results['passed']}"
