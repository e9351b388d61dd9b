"""The Colab path, for real: a notebook's set-up cell in a fresh environment without the course.

Colab's runtime has torch (and a few hundred other packages) but not the course. The test builds such an
environment: a new virtual environment in which torch is importable (linked from the one running the tests, as
Colab has it preinstalled) and nothing else of the course's. It fakes `google.colab`, points the set-up cell's
repository URL at a local clone of this repository, runs the cell of a learner notebook as it ships, then imports
`harness` and runs a check. It needs the package index (as Colab does) for the course's dependencies.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest

from instructor.setup_cell import is_setup_cell

ROOT = Path(__file__).resolve().parent.parent
SITE = Path(metadata.distribution("torch").locate_file(""))


def _torch_closure() -> set[str]:
    """torch and the distributions it needs, as installed here."""
    todo, seen = ["torch"], set()
    while todo:
        name = re.split(r"[\s;<>=!~\[(]", todo.pop())[0].lower().replace("_", "-")
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        seen.add(name)
        todo += [req for req in dist.requires or [] if "extra ==" not in req]
    return seen


def _preinstalled_torch(target: Path) -> None:
    """A folder holding links to torch and its dependencies, with their metadata, so pip sees them installed."""
    target.mkdir()
    wanted = _torch_closure()
    for dist in metadata.distributions():
        if dist.metadata["Name"].lower().replace("_", "-") not in wanted:
            continue
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            source = SITE / top
            if source.exists() and not (target / top).exists() and top != "__pycache__" and not top.endswith(".pth"):
                (target / top).symlink_to(source)


def _setup_cell(notebook: str) -> str:
    nb = json.loads((ROOT / "notebooks" / notebook).read_text())
    cell = next(c for c in nb["cells"] if is_setup_cell(c))
    return "".join(cell["source"])


RUNNER = textwrap.dedent(
    """
    import importlib.machinery, sys, types
    colab = types.ModuleType("google.colab")  # what Colab's runtime has imported
    colab.__spec__ = importlib.machinery.ModuleSpec("google.colab", None)
    sys.modules["google.colab"] = colab
    cell = open(sys.argv[1]).read()
    cell = cell.replace('COURSE_REPO = ""', f'COURSE_REPO = "{sys.argv[2]}"', 1)
    cell = cell.replace('COURSE_DIR = "/content/course"', f'COURSE_DIR = "{sys.argv[3]}"', 1)
    try:
        exec(compile(cell, "set-up cell", "exec"), {"__name__": "__main__"})
    except Exception as err:
        print(f"SET-UP FAILED: {type(err).__name__}: {err}")
        sys.exit(3)
    import importlib.util
    for tool in ("nbgrader", "nbval", "pytest", "jupyterlab"):
        assert importlib.util.find_spec(tool) is None, f"{tool} was installed on Colab"
    import torch
    from torch import nn
    import harness
    from harness import rand_float_test

    class LayerNorm(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.cfg = cfg
            self.w = nn.Parameter(torch.ones(cfg.d_model))
            self.b = nn.Parameter(torch.zeros(cfg.d_model))

        def forward(self, residual):
            centred = residual - residual.mean(-1, keepdim=True)
            scale = (centred.pow(2).mean(-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt()
            return centred / scale * self.w + self.b

    rand_float_test(LayerNorm, [2, 4, 768])
    print("HARNESS FROM", harness.__file__)
    """
)


@pytest.fixture(scope="module")
def colab_like(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("colab")
    subprocess.run([sys.executable, "-m", "venv", str(tmp / "venv")], check=True)
    python = tmp / "venv" / "bin" / "python"
    site = next((tmp / "venv" / "lib").glob("python3*/site-packages"))
    _preinstalled_torch(tmp / "preinstalled")
    (site / "colab_preinstalled.pth").write_text(str(tmp / "preinstalled") + "\n")
    subprocess.run(["git", "clone", "-q", str(ROOT), str(tmp / "origin")], check=True)
    (tmp / "cell.py").write_text(_setup_cell("01_layernorm.ipynb"))
    (tmp / "runner.py").write_text(RUNNER)
    return tmp, python


def _run(python: Path, tmp: Path, url: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run(
        [str(python), str(tmp / "runner.py"), str(tmp / "cell.py"), url, str(tmp / "content-course")],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
        cwd=tmp,
    )


def test_set_up_cell_without_a_repository_says_what_to_do(colab_like):
    tmp, python = colab_like
    result = _run(python, tmp, "")
    assert result.returncode == 3, result.stdout + result.stderr
    assert "SET-UP FAILED: RuntimeError" in result.stdout
    assert "Set COURSE_REPO above to the repository's git URL" in result.stdout


@pytest.mark.slow  # a fresh environment and an install of the course (about 90 s): opt-in, run by .ci/run
def test_set_up_cell_installs_the_course_on_colab_and_a_check_runs(colab_like):
    tmp, python = colab_like
    result = _run(python, tmp, str(tmp / "origin"))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "The course is installed." in result.stdout
    assert "rand_float_test" in result.stdout or "passed" in result.stdout.lower(), output
    assert f"HARNESS FROM {tmp / 'content-course'}" in result.stdout, output
