"""The judge (`instructor.judge`): verdicts made outside the sandbox on plain tensors, without nbgrader.

The probe runner (`instructor.probe_runner`, what the sandboxed re-check child runs) is called here in-process on
a namespace standing in for the learner's notebook; the judge then reads its files as it does after the child.
"""

from __future__ import annotations

import pickle
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

from harness.course import components
from instructor import judge, probe_runner

LN = "01_layernorm"
PRELUDE = "import torch\nfrom torch import nn\n\nfrom harness import Config\n"
NO_NORMALISATION = """
class LayerNorm(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.w = nn.Parameter(torch.ones(cfg.d_model))
        self.b = nn.Parameter(torch.zeros(cfg.d_model))

    def forward(self, residual):
        return residual * self.w + self.b
"""
RENAMED = """
class LayerNorm(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.gamma = nn.Parameter(torch.ones(cfg.d_model))
        self.b = nn.Parameter(torch.zeros(cfg.d_model))

    def forward(self, residual):
        centered = residual - residual.mean(dim=-1, keepdim=True)
        return centered / (centered.pow(2).mean(dim=-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt() * self.gamma
"""


def learner(code: str) -> dict:
    namespace: dict = {}
    exec(PRELUDE + code, namespace)  # noqa: S102 - a stand-in for the learner's notebook
    return namespace


def run(notebook: str, namespace: dict, folder) -> judge.Prepared:
    """What the grader and the re-check child do, in this process: prepare, run the probes; not yet judged."""
    prepared = judge.prepare(notebook, folder / "job")
    request = probe_runner.load_request(str(prepared.folder))
    probe_runner.prepare_output(str(prepared.folder), None)
    probe_runner.run_probes(request, namespace, timeout=10, deadline=time.monotonic() + 60)
    return prepared


def outputs_path(prepared: judge.Prepared):
    return prepared.folder / probe_runner.OUT_DIR / probe_runner.OUTPUTS


@pytest.mark.parametrize("notebook", sorted(judge.PROBES))
def test_the_course_solutions_pass(notebook, tmp_path):
    prepared = run(notebook, dict(vars(components(notebook))), tmp_path)
    verdicts = judge.verdicts(prepared)
    assert set(verdicts) == set(judge.judged_tests()[notebook])
    assert all(v["passed"] for v in verdicts.values()), verdicts
    assert not prepared.folder.exists()  # the job's folder goes once judged


def test_a_layernorm_without_normalisation_fails(tmp_path):
    verdict = judge.verdicts(run(LN, learner(NO_NORMALISATION), tmp_path))["test_layernorm"]
    assert not verdict["passed"]
    assert "output differs from the course's LayerNorm on fresh inputs" in verdict["message"], verdict


def test_renamed_parameters_fail_the_strict_load(tmp_path):
    verdict = judge.verdicts(run(LN, learner(RENAMED), tmp_path))["test_layernorm"]
    assert not verdict["passed"]
    message = verdict["message"]
    assert "could not load the judge's weights strictly" in message and "'w'" in message and "'gamma'" in message


def test_a_missing_class_and_an_exception_are_reported(tmp_path):
    verdict = judge.verdicts(run(LN, learner(""), tmp_path / "a"))["test_layernorm"]
    assert "LayerNorm is not defined" in verdict["message"], verdict
    raising = NO_NORMALISATION.replace("return residual * self.w + self.b", "raise SystemExit(3)")
    verdict = judge.verdicts(run(LN, learner(raising), tmp_path / "b"))["test_layernorm"]
    assert "LayerNorm raised SystemExit" in verdict["message"], verdict


def test_a_hanging_forward_is_stopped(tmp_path):
    hang = NO_NORMALISATION.replace("return residual * self.w + self.b", "while True:\n            pass")
    prepared = judge.prepare(LN, tmp_path / "job")
    request = probe_runner.load_request(str(prepared.folder))
    probe_runner.prepare_output(str(prepared.folder), None)
    probe_runner.run_probes(request, learner(hang), timeout=0.5, deadline=time.monotonic() + 60)
    assert "ran past its" in judge.verdicts(prepared)["test_layernorm"]["message"]


def _rewrite(prepared, change):
    path = outputs_path(prepared)
    tensors = load_file(path)
    save_file({k: change(v) for k, v in tensors.items()}, path)


def test_an_output_of_the_wrong_shape_fails(tmp_path):
    prepared = run(LN, dict(vars(components(LN))), tmp_path)
    _rewrite(prepared, lambda t: t[..., :-1].contiguous())
    verdict = judge.verdicts(prepared)["test_layernorm"]
    assert not verdict["passed"] and "output has shape" in verdict["message"], verdict


def test_a_nan_output_fails(tmp_path):
    prepared = run(LN, dict(vars(components(LN))), tmp_path)
    _rewrite(prepared, lambda t: torch.where(torch.rand(t.shape) < 0.1, torch.nan, t))
    verdict = judge.verdicts(prepared)["test_layernorm"]
    assert not verdict["passed"] and "NaN" in verdict["message"], verdict


def test_a_float64_output_fails(tmp_path):
    prepared = run(LN, dict(vars(components(LN))), tmp_path)
    _rewrite(prepared, lambda t: t.double())
    verdict = judge.verdicts(prepared)["test_layernorm"]
    assert not verdict["passed"] and "dtype torch.float64" in verdict["message"], verdict


def test_a_missing_output_fails(tmp_path):
    prepared = run(LN, dict(vars(components(LN))), tmp_path)
    outputs_path(prepared).unlink()
    (outputs_path(prepared).parent / probe_runner.ERRORS).unlink()
    verdict = judge.verdicts(prepared)["test_layernorm"]
    assert verdict == {"passed": False, "message": "judge: no output returned"}


class _Trap:
    """Unpickling this would create `marker`: the judge must refuse the file without unpickling it."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_pickle_in_place_of_the_outputs_is_refused_unread(tmp_path):
    prepared = run(LN, dict(vars(components(LN))), tmp_path)
    marker = tmp_path / "unpickled"
    outputs_path(prepared).write_bytes(pickle.dumps({"p0": _Trap(marker)}))
    verdict = judge.verdicts(prepared)["test_layernorm"]
    assert not verdict["passed"] and "not a safetensors file" in verdict["message"], verdict
    assert not marker.exists()
    # torch.save writes a pickle (in a zip) too: refused the same way
    prepared = run(LN, dict(vars(components(LN))), tmp_path / "again")
    torch.save({"p0": torch.zeros(3)}, outputs_path(prepared))
    assert "not a safetensors file" in judge.verdicts(prepared)["test_layernorm"]["message"]


def test_a_symlink_in_place_of_the_outputs_is_not_followed(tmp_path):
    prepared = run(LN, dict(vars(components(LN))), tmp_path)
    real = tmp_path / "elsewhere.safetensors"
    outputs_path(prepared).rename(real)
    outputs_path(prepared).symlink_to(real)
    verdict = judge.verdicts(prepared)["test_layernorm"]
    assert not verdict["passed"] and "cannot be opened safely" in verdict["message"], verdict


def test_every_job_gets_fresh_inputs_and_weights(tmp_path):
    first = judge.prepare(LN, tmp_path / "one")
    second = judge.prepare(LN, tmp_path / "two")
    assert first.seed != second.seed
    a = probe_runner.load_request(str(first.folder))["tensors"]
    b = probe_runner.load_request(str(second.folder))["tensors"]
    assert a.keys() == b.keys() == {"p0.in0", "p0.w.w", "p0.w.b"}
    for key in a:
        assert a[key].shape != b[key].shape or not torch.equal(a[key], b[key]), key
    # the expected outputs are never written for the sandbox: only the inputs and the weights
    assert all(not torch.equal(t, first.expected["p0"]) for t in a.values() if t.shape == first.expected["p0"].shape)


def test_notebooks_without_probes_are_not_judged(tmp_path):
    assert judge.prepare("06_training", tmp_path / "job") is None
    assert not (tmp_path / "job").exists()
