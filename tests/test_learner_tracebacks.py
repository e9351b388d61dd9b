"""What a learner sees when a check fails, as IPython shows it: short, their own cell, no harness internals."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

_SHELL = textwrap.dedent(
    """
    import sys
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance(colors="nocolor")
    for cell in sys.argv[1].split("# --- next cell ---"):
        shell.run_cell(cell, store_history=True)
    """
)


def _run_cells(*cells: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", _SHELL, "# --- next cell ---".join(cells)],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"},
    )
    return result.stdout + result.stderr


PREAMBLE = """
import torch
from torch import nn
from harness import Config, rand_float_test
cfg = Config(d_model=32, n_heads=4, d_head=8, d_mlp=64, n_layers=1, n_ctx=16, d_vocab=50)
"""


LAYER_NORM_INIT = """
class LayerNorm(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.w = nn.Parameter(torch.ones(cfg.d_model))
        self.b = nn.Parameter(torch.zeros(cfg.d_model))
"""


@pytest.fixture(scope="module")
def unfinished_output() -> str:
    exercise = """
class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.W_Q = nn.Parameter(torch.empty(cfg.n_heads, cfg.d_model, cfg.d_head))
        self.W_K = nn.Parameter(torch.empty(cfg.n_heads, cfg.d_model, cfg.d_head))
        self.W_V = nn.Parameter(torch.empty(cfg.n_heads, cfg.d_model, cfg.d_head))
        self.W_O = nn.Parameter(torch.empty(cfg.n_heads, cfg.d_head, cfg.d_model))
        self.b_Q = nn.Parameter(torch.zeros(cfg.n_heads, cfg.d_head))
        self.b_K = nn.Parameter(torch.zeros(cfg.n_heads, cfg.d_head))
        self.b_V = nn.Parameter(torch.zeros(cfg.n_heads, cfg.d_head))
        self.b_O = nn.Parameter(torch.zeros(cfg.d_model))

    def forward(self, normalized_resid_pre):
        # YOUR CODE HERE
        raise NotImplementedError()
"""
    return _run_cells(PREAMBLE, exercise, "rand_float_test(Attention, [2, 5, 768])")


def test_unfinished_exercise_is_named_in_a_few_lines(unfinished_output):
    out = unfinished_output
    assert "`Attention.forward` is not written yet: complete the exercise cell above" in out, out
    assert "NotImplementedError" not in out, out
    assert "harness/" not in out, out
    assert len([line for line in out.splitlines() if line.strip()]) <= 12, out


def test_learner_exception_shows_the_learners_frame_not_the_harness():
    exercise = (
        LAYER_NORM_INIT
        + """
    def forward(self, residual):
        centred = residual - residual.mean(-1, keepdim=True)
        return centred / self.not_an_attribute
"""
    )
    out = _run_cells(PREAMBLE, exercise, "rand_float_test(LayerNorm, [2, 5, 768])")
    assert "LayerNorm.forward raised AttributeError" in out, out
    assert "centred / self.not_an_attribute" in out, out  # the learner's own line is shown
    assert "harness/" not in out, out


def test_plain_wrong_answer_shows_only_the_message():
    exercise = (
        LAYER_NORM_INIT
        + """
    def forward(self, residual):
        centred = residual - residual.mean(-1, keepdim=True)
        return centred / (centred.var(-1, keepdim=True, unbiased=True) + 1e-5).sqrt() * self.w + self.b
"""
    )
    out = _run_cells(PREAMBLE, exercise, "rand_float_test(LayerNorm, [2, 5, 768])")
    assert "CheckFailed" in out and "unbiased" in out, out
    assert "harness/" not in out, out
