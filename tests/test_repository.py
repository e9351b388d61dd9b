"""Repository hygiene: declared dependencies agree, the README's commands are the ones CI runs, lint is clean."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parent.parent


def _pyproject_dependencies() -> set[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {dep.replace(" ", "") for dep in data["project"]["dependencies"]}


def _environment_pip_dependencies() -> set[str]:
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "- pip:")
    deps = set()
    for line in lines[start + 1 :]:
        match = re.match(r"^\s+- (\S+)\s*$", line)
        if not match:
            break
        deps.add(match.group(1))
    return deps


def _pyproject_extra(name: str) -> set[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {dep.replace(" ", "") for dep in data["project"]["optional-dependencies"][name]}


def test_environment_matches_pyproject():
    assert _environment_pip_dependencies() == _pyproject_dependencies() | _pyproject_extra("lab")


def test_learners_get_no_instructor_or_test_tools():
    """Colab installs only the dependencies: nbgrader, nbval, pytest and JupyterLab stay in the extras."""
    names = {re.split(r"[<>=\[]", dep)[0] for dep in _pyproject_dependencies()}
    assert not names & {"nbgrader", "nbval", "pytest", "jupyterlab", "ruff", "selenium"}, names


def test_transformer_lens_pinned_to_3_9():
    assert "transformer-lens>=3.9,<3.10" in _pyproject_dependencies()


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash course.sh test" in readme and "bash course.sh open" in readme
    assert "bash course.sh test" in ci and "HF_HUB_OFFLINE=1" in ci


@pytest.mark.skipif(
    shutil.which("ruff") is None and not Path(sys.executable).with_name("ruff").exists(), reason="ruff not installed"
)
def test_ruff_clean():
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    result = subprocess.run(
        [ruff, "check", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_hint_is_a_nudge_then_a_sketch():
    """Each exercise's hints come in two steps (the idea, then a sketch in words), so that opening the first one
    leaves the learner something to do."""
    import json

    single = []
    for path in sorted((ROOT / "solutions").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text())["cells"]):
            text = "".join(cell["source"])
            if cell["cell_type"] == "markdown" and "<summary>" in text:
                summaries = re.findall(r"<summary>(.*?)</summary>", text)
                if summaries and not any(s.startswith("Hint 2") for s in summaries if "Hint" in s):
                    single.append(f"{path.name} cell {i}: {summaries}")
    assert not single, single
