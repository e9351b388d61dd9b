"""`yours_or_course`: later notebooks use the learner's own earlier classes when they pass their checks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness import components, yours_or_course

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _full_mode(monkeypatch):
    monkeypatch.delenv("COURSE_FAST", raising=False)


def _folder(tmp_path, source: str) -> Path:
    for path in (ROOT / source).glob("0[0-3]_*.ipynb"):
        shutil.copy(path, tmp_path / path.name)
    return tmp_path


def test_finished_notebooks_are_used(tmp_path, capsys):
    LayerNorm, _ = yours_or_course("03_attention", "LayerNorm", "Attention", folder=_folder(tmp_path, "solutions"))
    assert LayerNorm is not components("03_attention").LayerNorm
    assert LayerNorm.__module__ == "harness.course.yours"
    assert capsys.readouterr().out.strip() == "Using your LayerNorm, Attention."


def test_unwritten_exercises_fall_back_with_one_line(tmp_path, capsys):
    LayerNorm, Attention = yours_or_course(
        "03_attention", "LayerNorm", "Attention", folder=_folder(tmp_path, "notebooks")
    )
    assert (LayerNorm, Attention) == (components("03_attention").LayerNorm, components("03_attention").Attention)
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "LayerNorm (yours is not written yet)" in out


def test_a_wrong_class_falls_back_and_says_why(tmp_path, capsys):
    folder = _folder(tmp_path, "solutions")
    path = folder / "01_layernorm.ipynb"
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        source = "".join(cell["source"])
        if "class LayerNorm" in source:
            cell["source"] = source.replace("+ self.b", "")  # the bias left out
    path.write_text(json.dumps(nb))
    LayerNorm, Attention = yours_or_course("03_attention", "LayerNorm", "Attention", folder=folder)
    assert LayerNorm is components("03_attention").LayerNorm and Attention.__module__ == "harness.course.yours"
    out = capsys.readouterr().out
    assert "your Attention" in out and "LayerNorm (yours does not pass its check yet" in out


def test_missing_notebooks_and_fast_mode_use_the_course(tmp_path, capsys, monkeypatch):
    (LayerNorm,) = yours_or_course("03_attention", "LayerNorm", folder=tmp_path)
    assert LayerNorm is components("03_attention").LayerNorm
    assert "not found in your notebooks" in capsys.readouterr().out
    monkeypatch.setenv("COURSE_FAST", "1")
    (LayerNorm,) = yours_or_course("03_attention", "LayerNorm", folder=_folder(tmp_path, "solutions"))
    assert LayerNorm is components("03_attention").LayerNorm
    assert capsys.readouterr().out.startswith("Fast mode")
