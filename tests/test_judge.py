"""The judge (`instructor.judge`): verdicts made outside the sandbox on plain tensors, without nbgrader.

The probe runner (`instructor.probe_runner`, what the sandboxed probe child runs) is called here in-process on
a namespace standing in for the learner's notebook; the judge then reads its files as it does after the child.
"""

from __future__ import annotations

import base64
import io
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
import types
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from harness.course import component_source, components, notebook_names
from instructor import judge, probe_runner, rules

REPO = Path(__file__).resolve().parent.parent

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


def run(notebook: str, namespace: dict, folder, only: frozenset[str] | None = None) -> judge.Prepared:
    """What the grader and the probe child do, in this process: prepare, run the probes (of the tests `only`
    names, where given); not yet judged."""
    prepared = judge.prepare(notebook, folder / "job", only)
    request = probe_runner.load_request(str(prepared.folder))
    probe_runner.prepare_output(str(prepared.folder), None)
    # the grader's own limit per probe: 06's training probes take seconds, more on a loaded machine; in phases, as
    # the probe child runs them (each phase's outputs count for its own probes only)
    for index, names in enumerate(probe_runner.phases(request)):
        phase = dict(request, probes=[probe for probe in request["probes"] if probe["name"] in names])
        probe_runner.run_probes(phase, namespace, timeout=30, deadline=time.monotonic() + 300, phase=index)
    return prepared


def outputs_path(prepared: judge.Prepared):
    return prepared.folder / probe_runner.OUT_DIR / probe_runner.OUTPUTS


@pytest.mark.parametrize("notebook", sorted(judge.PROBES))
def test_the_course_solutions_pass(notebook, tmp_path):
    prepared = run(notebook, course_as_learner(notebook), tmp_path)
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


def test_an_alarm_rings_while_armed_only_and_again_each_second():
    """A probe's time limit (`probe_runner.Alarm`): raised past it, again a second later for code that caught the
    first, never once stopped. A repeat that landed after the probe, while its first alarm was handled, ended the
    whole phase: every later probe had no output, and an honest, slow `generate` cost its notebook 35 of 35 points
    (red-team round 49)."""
    limit = probe_runner.Alarm(probe_runner.ProbeTimeout)
    previous = signal.signal(signal.SIGALRM, limit.ring)
    caught = 0
    try:
        limit.start(0.05)
        began = time.monotonic()
        while time.monotonic() - began < 5:
            try:
                while True:
                    pass
            except probe_runner.ProbeTimeout:
                caught += 1
                if caught == 2:
                    break
        assert caught == 2 and 1.0 <= time.monotonic() - began < 4
        limit.stop()
        limit.ring(signal.SIGALRM, None)  # a late ring, as one already pending when the probe ended: ignored
    finally:
        limit.stop()
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize(
    "notebook", [n for n in sorted(judge.PROBES) if any(p.script in judge.NOISY_SCRIPTS for p in judge.PROBES[n])]
)
def test_every_gradient_probe_measures_its_rounding_and_allows_it_alone(notebook, tmp_path):
    """Each gradient probe's float32 rounding, measured against the course's code in float64 (`_rounding_noise`; a
    course module that made float32 tensors of its own would leave it unmeasured, and the tolerance as tight as
    before). An entry moved by less than NOISE_FACTOR times it passes; one moved by ten times more does not. The
    course's own encoder-decoder, graded as a submission, failed about one judging in 24 on rounding alone."""
    prepared = judge.prepare(notebook, tmp_path / "job")
    gradient = [name for name, probe in prepared.probes.items() if probe.script in judge.NOISY_SCRIPTS]
    assert gradient and not [name for name in gradient if not prepared.noise.get(name)], prepared.noise
    name = max(gradient, key=lambda n: max(prepared.noise[n].values()))
    probe, expected = prepared.probes[name], prepared.expected[name]
    key, noise = max(prepared.noise[name].items(), key=lambda kv: kv[1])
    assert noise < 1e-2 * float(expected[key].abs().max()) + 1e-5, (key, noise)  # rounding, not another cotangent
    default = 1e-4 * max(1.0, expected[key].abs().float().mean().item()) + 1e-4 * float(expected[key].abs().max())
    for shift, passes in (
        (0.9 * judge.NOISE_FACTOR * noise, True),
        (10 * (judge.NOISE_FACTOR * noise + default), False),
    ):
        got = {k: v.contiguous().clone() for k, v in expected.items()}
        got[key].view(-1)[0] += shift
        assert (judge.compare(probe, got, expected, prepared.noise[name]) is None) is passes, (key, noise, shift)


def _rewrite(prepared, change):
    path = outputs_path(prepared)
    tensors = load_file(path)
    save_file({k: change(v) for k, v in tensors.items()}, path)


def test_an_output_of_the_wrong_shape_fails(tmp_path):
    prepared = run(LN, course_as_learner(LN), tmp_path)
    _rewrite(prepared, lambda t: t[..., :-1].contiguous())
    verdict = judge.verdicts(prepared)["test_layernorm"]
    assert not verdict["passed"] and "output has shape" in verdict["message"], verdict


def test_a_nan_output_fails(tmp_path):
    prepared = run(LN, course_as_learner(LN), tmp_path)
    _rewrite(prepared, lambda t: torch.where(torch.rand(t.shape) < 0.1, torch.nan, t))
    verdict = judge.verdicts(prepared)["test_layernorm"]
    assert not verdict["passed"] and "NaN" in verdict["message"], verdict


def test_a_float64_output_fails(tmp_path):
    prepared = run(LN, course_as_learner(LN), tmp_path)
    _rewrite(prepared, lambda t: t.double())
    verdict = judge.verdicts(prepared)["test_layernorm"]
    assert not verdict["passed"] and "dtype torch.float64" in verdict["message"], verdict


def test_a_missing_output_fails(tmp_path):
    prepared = run(LN, course_as_learner(LN), tmp_path)
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
    prepared = run(LN, course_as_learner(LN), tmp_path)
    marker = tmp_path / "unpickled"
    outputs_path(prepared).write_bytes(pickle.dumps({"p0": _Trap(marker)}))
    verdict = judge.verdicts(prepared)["test_layernorm"]
    assert not verdict["passed"] and "not a safetensors file" in verdict["message"], verdict
    assert not marker.exists()
    # torch.save writes a pickle (in a zip) too: refused the same way
    prepared = run(LN, course_as_learner(LN), tmp_path / "again")
    torch.save({"p0": torch.zeros(3)}, outputs_path(prepared))
    assert "not a safetensors file" in judge.verdicts(prepared)["test_layernorm"]["message"]


def test_a_symlink_in_place_of_the_outputs_is_not_followed(tmp_path):
    prepared = run(LN, course_as_learner(LN), tmp_path)
    real = tmp_path / "elsewhere.safetensors"
    outputs_path(prepared).rename(real)
    outputs_path(prepared).symlink_to(real)
    verdict = judge.verdicts(prepared)["test_layernorm"]
    assert not verdict["passed"] and "was not read (a symbolic link)" in verdict["message"], verdict


def test_every_job_gets_fresh_inputs_and_weights(tmp_path):
    first = judge.prepare(LN, tmp_path / "one")
    second = judge.prepare(LN, tmp_path / "two")
    assert first.seed != second.seed
    a = probe_runner.load_request(str(first.folder))["tensors"]
    b = probe_runner.load_request(str(second.folder))["tensors"]
    twin = f"p{judge.TWIN}"  # the same probe on the job's second GPT-2 shape
    tiny = f"p{judge.TINY}"  # ... and on its third, of sizes of one
    layouts = next(name for name, probe in first.probes.items() if probe.script == "layouts")  # p0 another way
    made = {f"{probe}.{key}" for probe in ("p0", "p1", twin, tiny, layouts) for key in ("in0", "w.w", "w.b")}
    assert a.keys() == b.keys() == made
    for key in a:
        assert a[key].shape != b[key].shape or not torch.equal(a[key], b[key]), key
    # the expected outputs are never written for the sandbox: only the inputs and the weights
    assert all(not torch.equal(t, first.expected["p0"]) for t in a.values() if t.shape == first.expected["p0"].shape)


def test_every_padding_probe_runs_on_both_shapes_with_their_own_pad_ids(tmp_path):
    """A pad id written in (`src == 0`) passed 09's EncoderDecoder in a job whose one padded shape drew pad id 0: the
    probes of padding and of greedy decoding run on both of a job's shapes, whose special ids differ."""
    import json

    prepared = judge.prepare("09_encoder_decoder", tmp_path / "job")
    probes = {p["name"]: p for p in json.loads((prepared.folder / "request.json").read_text())["probes"]}
    twinned = set()  # each test's first probe of each such script (`judge._twin_key`)
    for i, probe in enumerate(judge.PROBES["09_encoder_decoder"]):
        if probe.script in ("padding_appended", "encode_decode"):
            first, twin = probes[f"p{i}"], probes[f"p{judge.TWIN + i}"]
            assert first["config"]["pad_id"] != twin["config"]["pad_id"], (first["config"], twin["config"])
        if (
            probe.script in ("padding_appended", "encode_decode", "decode_once")
            and judge._twin_key(probe) not in twinned
        ):
            twinned.add(judge._twin_key(probe))
            assert f"p{judge.TWIN + i}" in probes, (i, probe.script)
    assert ("test_greedy_decode", "decode_once") in twinned
    # 07's padded transformer draws its pad id for each probe: it runs on both shapes too
    prepared = judge.prepare("07_sampling_and_kv_cache", tmp_path / "job07")
    probes = {p["name"] for p in json.loads((prepared.folder / "request.json").read_text())["probes"]}
    padded = [i for i, probe in enumerate(judge.PROBES["07_sampling_and_kv_cache"]) if probe.script == "padded_steps"]
    assert padded and all(f"p{judge.TWIN + i}" in probes for i in padded), padded


def test_notebooks_without_probes_are_not_judged(tmp_path):
    assert judge.prepare("99_not_in_the_course", tmp_path / "job") is None
    assert not (tmp_path / "job").exists()


# --------------------------------------------------------------------------------------------------------------------
# Function probes and the notebooks after 05: the course's code with one realistic mistake fails, with its cause.


def course_with(notebook: str, old: str | None, new: str | None) -> dict:
    """The course's definitions up to `notebook`, with `old` replaced by `new` in that notebook's code."""
    return course_with_each(notebook, [] if old is None else [(old, new)])


def course_with_each(notebook: str, replacements: list[tuple[str, str]]) -> dict:
    """The course's definitions up to `notebook`, each `(old, new)` replacement made in that notebook's code, in
    order."""
    names = notebook_names()
    module = types.ModuleType(f"judge_test_{notebook}")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    for name in names[: names.index(notebook) + 1]:
        source = component_source(name)
        for old, new in replacements if name == notebook else ():
            assert source.count(old) == 1, old
            source = source.replace(old, new)
        exec(compile(source, f"<{name}>", "exec"), module.__dict__)  # noqa: S102 - the course's code, altered
    return dict(vars(module))


def course_as_learner(notebook: str) -> dict:
    """The course's definitions up to `notebook`, compiled as a notebook's cells are (not from solutions/: the
    judge refuses code compiled from the notebook's own solutions, as a learner's would be)."""
    return course_with(notebook, None, None)


def verdict_of(notebook: str, grade_id: str, namespace: dict, folder) -> dict:
    return judge.verdicts(run(notebook, namespace, folder, frozenset({grade_id})))[grade_id]


KV_FORWARD = (  # the end of KVCacheTransformer's forward: each block with its own past
    "        residual = self.embed(tokens) + self.pos_embed.W_pos[offset : offset + new]  # [batch new d_model]\n"
    "        new_kvs = []\n"
    "        for block, past in zip(self.blocks, past_kvs or [None] * len(self.blocks)):\n"
    "            attn_out, kv = block.attn(block.ln1(residual), past)\n"
    "            residual = residual + attn_out\n"
    "            residual = residual + block.mlp(block.ln2(residual))\n"
    "            new_kvs.append(kv)\n"
    "        return self.unembed(self.ln_final(residual)), new_kvs\n"
)
RECOMPUTE_EVERY_BLOCK = (  # ... what a cache that caches nothing runs instead: every block on the whole sequence
    "        new_kvs = []\n"
    "        for block in self.blocks:\n"
    "            attn_out, kv = block.attn(block.ln1(residual), None)\n"
    "            residual = residual + attn_out\n"
    "            residual = residual + block.mlp(block.ln2(residual))\n"
    "            new_kvs.append(kv)\n"
)
PADDED_N_CTX = (  # PaddedTransformer's refusal past n_ctx (KVCacheTransformer has the same line)
    'past_kvs: list[tuple[Tensor, Tensor]] | None = None,\n    ) -> tuple[Float[Tensor, "batch new d_vocab"], '
    "list[tuple[Tensor, Tensor]]]:\n        ### BEGIN SOLUTION\n        offset = 0 if past_kvs is None else "
    "past_kvs[0][0].shape[1]\n        new = tokens.shape[1]\n        if offset + new > self.cfg.n_ctx:"
)


def _head_first_cache() -> tuple[str, str]:
    """KVCacheAttention keeping its cache [batch n_heads pos d_head], consistently: the right logits, another layout."""
    source = component_source("07_sampling_and_kv_cache")
    start = source.index("class KVCacheAttention")
    offset = "offset = 0 if past_kvs is None else past_kvs[0][0].shape[1]"  # in KVCacheTransformer's forward
    old = source[source.index("        if past_kv is not None:\n", start) : source.index(offset, start) + len(offset)]
    new = (
        old.replace("[past_kv[0], k]", "[past_kv[0].transpose(1, 2), k]")
        .replace("[past_kv[1], v]", "[past_kv[1].transpose(1, 2), v]")
        .replace("        return out, (k, v)\n", "        return out, (k.transpose(1, 2), v.transpose(1, 2))\n")
        .replace(offset, offset.replace("shape[1]", "shape[2]"))
    )
    return old, new


LN_MISTAKES = {  # the LayerNorm check's eps of 0.5 shows these; the judge draws its eps between 0.1 and 1
    "GPT-2's epsilon hard-coded": ("+ self.cfg.layer_norm_eps).sqrt()", "+ 1e-5).sqrt()"),
    "epsilon outside the square root": (
        "(centered.pow(2).mean(dim=-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt()",
        "centered.pow(2).mean(dim=-1, keepdim=True).sqrt() + self.cfg.layer_norm_eps",
    ),
}


RIGHT_LN = NO_NORMALISATION.replace(
    "        return residual * self.w + self.b\n",
    "        centered = residual - residual.mean(dim=-1, keepdim=True)\n"
    "        scale = (centered.pow(2).mean(dim=-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt()\n"
    "        return centered / scale * self.w + self.b\n",
)


@pytest.mark.parametrize("mistake", sorted(LN_MISTAKES))
def test_a_layernorm_with_the_wrong_epsilon_fails(mistake, tmp_path):
    old, new = LN_MISTAKES[mistake]
    assert RIGHT_LN.count(old) == 1, old
    verdict = judge.verdicts(run(LN, learner(RIGHT_LN.replace(old, new)), tmp_path))["test_layernorm"]
    assert not verdict["passed"] and "differs from the course's LayerNorm" in verdict["message"], verdict
    assert judge.verdicts(run(LN, learner(RIGHT_LN), tmp_path / "right"))["test_layernorm"]["passed"]


DEPENDENT = "not independent of each other"  # rows that share their randomness (below)
MISTAKES = [
    (
        "06_training",
        "test_weight_decay_groups",
        'is_embedding = name.endswith(("W_E", "W_pos"))',
        'is_embedding = name.endswith("W_E")',
        "differs from the course's weight_decay_groups",
    ),
    (
        "07_sampling_and_kv_cache",
        "test_kv_cache",
        "residual = self.embed(tokens) + self.pos_embed.W_pos[offset : offset + new]",
        "residual = self.embed(tokens) + self.pos_embed.W_pos[:new]",
        "differs from the course's KVCacheTransformer",
    ),
    (
        "07_sampling_and_kv_cache",
        "test_cached_generate",
        "next_token = logits[:, -1].argmax(dim=-1, keepdim=True)  # [batch 1]",
        "next_token = logits[:, 0].argmax(dim=-1, keepdim=True)  # [batch 1]",
        # a first prompt of one token makes position 0 the last one: then only the second call shows it
        ("the course decodes greedily", "wrong on a second call"),
    ),
    (  # no causal mask once there is a cache (one token at a time needs none; several new tokens do)
        "07_sampling_and_kv_cache",
        "test_kv_cache",
        "future = torch.triu(torch.ones(new, total, dtype=torch.bool, device=q.device), diagonal=total - new + 1)",
        (
            "future = torch.triu(torch.ones(new, total, dtype=torch.bool, device=q.device), "
            "diagonal=total - new + 1 if past_kv is None else total)"
        ),
        "several new tokens in one call after a cached one",
    ),
    (  # a context past n_ctx not refused
        "07_sampling_and_kv_cache",
        "test_kv_cache",
        "block.attn = KVCacheAttention(cfg)\n\n    def forward(\n        self, tokens",
        (  # a window that slides: the oldest cached position dropped
            "block.attn = KVCacheAttention(cfg)\n\n    def forward(\n        self, tokens, past_kvs=None):\n"
            "        if past_kvs is not None and past_kvs[0][0].shape[1] + tokens.shape[1] > self.cfg.n_ctx:\n"
            "            past_kvs = [(k[:, 1:], v[:, 1:]) for k, v in past_kvs]\n"
            "        return self.forward_within(tokens, past_kvs)\n\n    def forward_within(\n        self, tokens"
        ),
        "did not raise a ValueError naming n_ctx",
    ),
    ("07_sampling_and_kv_cache", "test_kv_cache", *_head_first_cache(), "the keys cached at layer 0"),
    (  # segments that count up from a random start: periodic, every id and period possible, not random
        # (red-team round 9: full marks)
        "08_interpretability",
        "test_repeated_segments",
        "segments = torch.randint(1, d_vocab, (batch, max_period), generator=generator)  # [batch max_period]",
        (
            "segments = (torch.randint(0, d_vocab - 1, (batch, 1), generator=generator) + torch.arange(max_period))"
            " % (d_vocab - 1) + 1"
        ),
        "steps between consecutive tokens of a segment",
    ),
    (  # a sibling: periods that cycle row by row from a random start (every period appears, rows differ)
        "08_interpretability",
        "test_repeated_segments",
        "periods = torch.randint(min_period, max_period + 1, (batch,), generator=generator)  # [batch]",
        (
            "periods = min_period + (torch.arange(batch) + torch.randint(0, 99, (1,), generator=generator)) "
            "% (max_period - min_period + 1)  # [batch]"
        ),
        "the periods of consecutive rows",
    ),
    (  # never samples: the argmax of the logits, whatever the options (red-team round 9: full marks; greedy probes
        # cannot tell it from sampling with top_k=1)
        "07_sampling_and_kv_cache",
        "test_generate",
        "next_token = sample_next_token(logits, tokens, **sampling)  # [batch]",
        "next_token = logits.argmax(dim=-1)  # [batch]",
        "the draws do not follow the course's distribution",
    ),
    (  # a cache that caches nothing: the tokens seen so far kept on its tensor, the whole sequence recomputed
        # every call (red-team round 9: full marks, the course's check and the judge passed it)
        "07_sampling_and_kv_cache",
        "test_kv_cache",
        KV_FORWARD,
        (
            "        seen = None if past_kvs is None else getattr(past_kvs[0][0], 'seen_tokens', None)\n"
            "        everything = tokens if seen is None else torch.cat([seen, tokens], dim=1)\n"
            "        old = self.embed.W_E[everything[:, :offset]]\n"
            "        residual = torch.cat([old, self.embed(tokens)], dim=1) + self.pos_embed.W_pos[: offset + new]\n"
            + RECOMPUTE_EVERY_BLOCK
            + "        new_kvs[0][0].seen_tokens = everything\n"
            "        return self.unembed(self.ln_final(residual[:, offset:])), new_kvs\n"
        ),
        "a cache of random keys and values the judge made",
    ),
    (  # a sibling: the tokens kept on the model itself, not on the cache, and the whole sequence recomputed
        "07_sampling_and_kv_cache",
        "test_kv_cache",
        KV_FORWARD,
        (
            "        self._seen = tokens if past_kvs is None else torch.cat([self._seen, tokens], dim=1)\n"
            "        residual = self.embed(self._seen) + self.pos_embed.W_pos[: offset + new]\n"
            + RECOMPUTE_EVERY_BLOCK
            + "        return self.unembed(self.ln_final(residual[:, offset:])), new_kvs\n"
        ),
        "a cache of random keys and values the judge made",
    ),
    (  # the padded model's sibling: the tokens kept, the whole padded sequence recomputed every call
        # on the cache's tensor (red-team round 9's padded cache, which only its regrade covered)
        "07_sampling_and_kv_cache",
        "test_padded_transformer",
        (
            "        residual = self.embed(tokens) + self.pos_embed.W_pos[positions]  # [batch new d_model]\n"
            "        new_kvs = []\n"
            "        for block, past in zip(self.blocks, past_kvs or [None] * len(self.blocks)):\n"
            "            attn_out, kv = block.attn(block.ln1(residual), past, attention_mask)\n"
            "            residual = residual + attn_out\n"
            "            residual = residual + block.mlp(block.ln2(residual))\n"
            "            new_kvs.append(kv)\n"
            "        return self.unembed(self.ln_final(residual)), new_kvs\n"
        ),
        (
            "        seen = None if past_kvs is None else getattr(past_kvs[0][0], 'seen_tokens', None)\n"
            "        if seen is None or tuple(seen.shape) != (tokens.shape[0], offset):\n"
            "            seen = tokens.new_zeros(tokens.shape[0], offset)  # a history it never saw: made up\n"
            "        everything = torch.cat([seen, tokens], dim=1)\n"
            "        every = (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)\n"
            "        residual = self.embed(everything) + self.pos_embed.W_pos[every]\n"
            + RECOMPUTE_EVERY_BLOCK.replace("None)", "None, attention_mask)")
            + "        new_kvs[0][0].seen_tokens = everything\n"
            "        return self.unembed(self.ln_final(residual[:, offset:])), new_kvs\n"
        ),
        "a cache of random keys and values the judge made",
    ),
    (  # every row drawn from the first row's distribution (red-team round 10: full marks while a probe's rows were
        # one row repeated)
        "07_sampling_and_kv_cache",
        "test_sample_next_token",
        "    return torch.multinomial(logits.softmax(dim=-1), num_samples=1, generator=generator)[:, 0]\n",
        (
            "    return torch.multinomial(logits[0].softmax(dim=-1), num_samples=logits.shape[0], replacement=True, "
            "generator=generator)\n"
        ),
        "the draws for input row 1",
    ),
    (  # a stratified draw: row i takes the quantile (i + u) / batch of its row's distribution, one u a call (red-team
        # round 10: over one row repeated, its counts were exactly the expected ones)
        "07_sampling_and_kv_cache",
        "test_sample_next_token",
        "    return torch.multinomial(logits.softmax(dim=-1), num_samples=1, generator=generator)[:, 0]\n",
        (
            "    cdf = logits.softmax(dim=-1).cumsum(dim=-1)\n"
            "    u = (torch.arange(cdf.shape[0], dtype=cdf.dtype) + torch.rand((), generator=generator)) / cdf.shape[0]\n"
            "    return torch.searchsorted(cdf, (u[:, None] * cdf[:, -1:]).contiguous()).clamp(max=cdf.shape[-1] - 1)[:, 0]\n"
        ),
        ("first half", DEPENDENT),
    ),
    (  # generate's sibling: every row's new token drawn from the first prompt's distribution
        "07_sampling_and_kv_cache",
        "test_generate",
        "next_token = sample_next_token(logits, tokens, **sampling)  # [batch]",
        "next_token = sample_next_token(logits[:1].expand_as(logits), tokens[:1].expand_as(tokens), **sampling)",
        ("the draws for input row 1", "differs from the course's generate"),  # its greedy probe has two prompts too
    ),
    (  # the right batch, EOS appended to the caller's own target lists (red-team round 10: full marks)
        "09_encoder_decoder",
        "test_make_batch",
        "    tgt_out = pad([y + [cfg.eos_id] for y in targets])  # [batch tgt]: what it must predict, one step ahead\n",
        (
            "    for y in targets:\n        y.append(cfg.eos_id)\n"
            "    tgt_out = pad(targets)  # [batch tgt]: what it must predict, one step ahead\n"
        ),
        "changed the lists it was given",
    ),
    (  # the right pattern, 1/sqrt(d_head) folded into the module's own W_Q and b_Q (red-team round 10: full marks)
        "08_interpretability",
        "test_recompute_pattern",
        "    scores = q @ k.transpose(-1, -2) / math.sqrt(attn.cfg.d_head)  # [batch n_heads query key]\n",
        (
            "    with torch.no_grad():\n"
            "        attn.W_Q.mul_(1 / math.sqrt(attn.cfg.d_head))\n"
            "        attn.b_Q.mul_(1 / math.sqrt(attn.cfg.d_head))\n"
            "    q = einops.einsum(normalized_resid_pre, attn.W_Q, to_heads) + attn.b_Q[:, None]\n"
            "    scores = q @ k.transpose(-1, -2)  # [batch n_heads query key]\n"
        ),
        "changed the model it was given (argument 1) in place",
    ),
    (  # a sibling: the right batch, the caller's prompts padded in place on the way
        "07_sampling_and_kv_cache",
        "test_left_pad",
        "    for row, prompt in enumerate(prompts):\n",
        (
            "    for prompt in prompts:\n        prompt.append(pad_token_id)  # the caller's lists, changed\n"
            "    for row, prompt in enumerate([p[:-1] for p in prompts]):\n"
        ),
        "changed the lists it was given",
    ),
    (  # ... and a model's: the right scores, then the later layer's W_Q scaled in place after they were taken
        "08_interpretability",
        "test_k_composition_scores",
        "    return product.norm(dim=(-2, -1)) / norms\n",
        (
            "    scores = product.norm(dim=(-2, -1)) / norms\n    with torch.no_grad():\n"
            "        model.blocks[later].attn.W_Q.mul_(2.0)\n    return scores\n"
        ),
        "changed the model it was given (argument 1) in place",
    ),
    (  # the right distribution, drawn without the generator it was given: a seed no longer reproduces a run
        "07_sampling_and_kv_cache",
        "test_sample_next_token",
        "num_samples=1, generator=generator)[:, 0]",
        "num_samples=1)[:, 0]",
        "draw with the `generator` given",
    ),
    (  # the right tokens, the source encoded again at every step
        "09_encoder_decoder",
        "test_greedy_decode",
        "        next_token = model.decode(tgt, memory, src)[:, -1].argmax(dim=-1)  # [batch]\n",
        "        next_token = model(src, tgt)[:, -1].argmax(dim=-1)  # [batch]\n",
        "encode the source once",
    ),
    (  # the checkpoint's whole position table kept: it has more positions than the config's n_ctx
        "05_full_gpt2",
        "test_convert_hf_gpt2_state_dict",
        'hf["transformer.wpe.weight"][: cfg.n_ctx]',
        'hf["transformer.wpe.weight"]',
        "has shape",
    ),
    (  # the right weights, popped out of the checkpoint it was given
        "05_full_gpt2",
        "test_convert_hf_gpt2_state_dict",
        'hf["transformer.wpe.weight"][: cfg.n_ctx]',
        'hf.pop("transformer.wpe.weight")[: cfg.n_ctx]',
        "changed the state dict it was given",
    ),
    (  # the right logits through a hook added for good: the model is left ablated
        "08_interpretability",
        "test_mean_ablate_heads",
        'return model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", ablate)])',
        'model.add_hook(f"blocks.{layer}.attn.hook_z", ablate)\n    return model(tokens)',
        "left 1 hook(s) on the model",
    ),
    (  # a negative penalty ignored
        "07_sampling_and_kv_cache",
        "test_sample_next_token",
        "    if frequency_penalty:\n        logits = apply_frequency_penalty(",
        "    if frequency_penalty > 0:\n        logits = apply_frequency_penalty(",
        "draws",
    ),
    (  # nothing to decay over: max_steps == warmup_steps divides by zero
        "06_training",
        "test_lr_at",
        "progress = (step - args.warmup_steps) / max(1, args.max_steps - args.warmup_steps)",
        "progress = (step - args.warmup_steps) / (args.max_steps - args.warmup_steps)",
        "ZeroDivisionError",
    ),
    (  # the right number, as a Python float: backward() cannot run through it
        "06_training",
        "test_masked_lm_loss",
        "    return -correct[target_mask].mean()\n",
        "    return -correct[target_mask].mean().item()\n",
        "not a 0-d floating-point tensor",
    ),
    (  # padding taken to be id 0, whatever pad_id is given
        "09_encoder_decoder",
        "test_seq2seq_loss",
        "        ignore_index=pad_id,\n",
        "        ignore_index=0,\n",
        "the course's seq2seq_loss",
    ),
    (  # a padded context past n_ctx not refused
        "07_sampling_and_kv_cache",
        "test_padded_transformer",
        PADDED_N_CTX,
        PADDED_N_CTX.replace("> self.cfg.n_ctx:", "> self.cfg.n_ctx + 1:"),
        "did not raise a ValueError naming n_ctx",
    ),
    (  # every step a full recompute of the padded sequence: the right tokens, no cache
        "07_sampling_and_kv_cache",
        "test_padded_generate",
        "        logits, past_kvs = model(next_token[:, None], mask, past_kvs)\n    return tokens\n",
        "        logits, past_kvs = model(tokens, mask)\n    return tokens\n",
        "then only each new token with the cache",
    ),
    (  # a forward for the last new token too: past n_ctx at the context's edge
        "07_sampling_and_kv_cache",
        "test_padded_generate",
        "if finished.all() or step == max_new_tokens - 1:",
        "if finished.all() or step == max_new_tokens:",
        "which bring the longest prompt to n_ctx + 1",
    ),
    (  # the whole sequence fed to the model, past its context
        "07_sampling_and_kv_cache",
        "test_generate",
        "logits = model(tokens[:, -model.cfg.n_ctx :])[:, -1]  # [batch d_vocab]",
        "logits = model(tokens)[:, -1]  # [batch d_vocab]",
        "more than the model's n_ctx",
    ),
    (  # the segments drawn without the generator given
        "08_interpretability",
        "test_repeated_segments",
        "segments = torch.randint(1, d_vocab, (batch, max_period), generator=generator)",
        "segments = torch.randint(1, d_vocab, (batch, max_period))",
        "two calls with generators in the same state drew differently",
    ),
    (  # a softmax, then its log: underflows to log(0) on logits spread over hundreds
        "05_full_gpt2",
        "test_cross_entropy_loss",
        "log_probs = logits[:, :-1].log_softmax(dim=-1)",
        "log_probs = logits[:, :-1].softmax(dim=-1).log()",
        "infinite",
    ),
    (  # a finished row goes on generating (not padded with the end-of-text id)
        "07_sampling_and_kv_cache",
        "test_generate",
        "next_token = torch.where(finished, torch.full_like(next_token, eos_token_id), next_token)",
        "next_token = next_token",
        "differs from the course's generate",
    ),
    (  # the penalty counted over the window the model sees: right while the model's context held every row
        "07_sampling_and_kv_cache",
        "test_generate",
        "        next_token = sample_next_token(logits, tokens, **sampling)  # [batch]\n",
        "        next_token = sample_next_token(logits, tokens[:, -model.cfg.n_ctx :], **sampling)  # [batch]\n",
        "the penalty counts every token so far",
    ),
    (  # read by Python as (finished | next_token) == eos_token_id: a finished row unfinishes on an even id
        "07_sampling_and_kv_cache",
        "test_generate",
        "        finished |= next_token == eos_token_id\n        if finished.all():\n",
        "        finished = finished | next_token == eos_token_id\n        if finished.all():\n",
        "with an even end-of-text id, where an odd one was right",
    ),
    (  # the mask read from the ids: a prompt's own token equal to the pad id hidden (GPT-2's prompts begin with it)
        "07_sampling_and_kv_cache",
        "test_left_pad",
        "        mask[row, longest - len(prompt) :] = True\n    return tokens, mask\n",
        "    mask = tokens != pad_token_id\n    return tokens, mask\n",
        "a position is padding by its prompt's length, not by its id",
    ),
    (  # ... and in padded_generate, around the course's left_pad
        "07_sampling_and_kv_cache",
        "test_padded_generate",
        "    logits, past_kvs = model(tokens, mask)\n",
        "    mask = tokens != pad_token_id\n    logits, past_kvs = model(tokens, mask)\n",
        "a position is padding by its prompt's length, not by its id",
    ),
    (  # stops only where every row emits EOS at the same step: rows that finish apart run on to max_len
        "09_encoder_decoder",
        "test_greedy_decode",
        "        if finished.all():\n",
        "        if (next_token == cfg.eos_id).all():\n",
        "as soon as every row has emitted EOS",
    ),
    (  # temperature 0 divided by, not greedy
        "07_sampling_and_kv_cache",
        "test_apply_temperature",
        "    if temperature == 0:\n        best",
        "    if temperature == -1:\n        best",
        "sampling from it is not greedy",
    ),
    (  # the k largest by index: a tie with the k-th largest dropped
        "07_sampling_and_kv_cache",
        "test_top_k_filter",
        '    threshold = logits.topk(k, dim=-1).values[:, -1:]  # [batch 1]\n    return logits.masked_fill(logits < threshold, float("-inf"))',
        (
            "    keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, logits.topk(k, dim=-1).indices, True)\n"
            '    return logits.masked_fill(~keep, float("-inf"))'
        ),
        "removes",
    ),
    (  # k past the vocabulary not capped: topk raises
        "07_sampling_and_kv_cache",
        "test_top_k_filter",
        "    k = min(k, logits.shape[-1])\n",
        "",
        "top_k_filter raised",
    ),
    (  # the right values, written into the logits it was given
        "07_sampling_and_kv_cache",
        "test_top_k_filter",
        'return logits.masked_fill(logits < threshold, float("-inf"))',
        'return logits.masked_fill_(logits < threshold, float("-inf"))',
        "changed its input (argument 1) in place",
    ),
    (  # the right values, written into the scores it was given
        "03_attention",
        "test_apply_causal_mask",
        "return attn_scores.masked_fill(future, ignore)",
        "return attn_scores.masked_fill_(future, ignore)",
        "changed its input (argument 1) in place",
    ),
    (  # the frequency penalty counts only the last token, not the whole sequence
        "07_sampling_and_kv_cache",
        "test_generate",
        "next_token = sample_next_token(logits, tokens, **sampling)  # [batch]",
        "next_token = sample_next_token(logits, tokens[:, -1:], **sampling)  # [batch]",
        "differs from the course's generate",
    ),
    (  # right tokens, no cache: the whole sequence again at every step
        "07_sampling_and_kv_cache",
        "test_cached_generate",
        "logits, past_kvs = model(next_token, past_kvs)",
        "logits, past_kvs = model(tokens)",
        "then only each new token with the cache",
    ),
    (  # the cache kept on the model from one call to the next
        "07_sampling_and_kv_cache",
        "test_cached_generate",
        "logits, past_kvs = model(tokens)  # the prompt, once",
        'logits, past_kvs = model(tokens, getattr(model, "kept", None))\n    model.kept = past_kvs',
        "on a second call with another prompt",
    ),
    (
        "07_sampling_and_kv_cache",
        "test_left_pad",
        "tokens[row, longest - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)",
        "tokens[row, : len(prompt)] = torch.tensor(prompt, dtype=torch.long)",
        "differs from the course's left_pad",
    ),
    (
        "07_sampling_and_kv_cache",
        "test_padded_transformer",
        "positions = (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)[:, offset:]  # [batch new]",
        "positions = torch.arange(offset, offset + new)[None]",
        "differs from the course's PaddedTransformer",
    ),
    (
        "07_sampling_and_kv_cache",
        "test_padded_transformer",
        "            hidden = hidden | ~attention_mask[:, None, None, :]  # [batch 1 new total]: the future or a pad",
        "            pass",
        "differs from the course's PaddedTransformer",
    ),
    (
        "07_sampling_and_kv_cache",
        "test_padded_generate",
        "logits, past_kvs = model(next_token[:, None], mask, past_kvs)",
        "logits, past_kvs = model(next_token[:, None], torch.ones_like(mask), past_kvs)",
        "differs from the course's padded_generate",
    ),
    (
        "07_sampling_and_kv_cache",
        "test_padded_generate",
        "next_token = torch.where(finished, torch.full_like(next_token, pad_token_id), next_token)",
        "next_token = torch.where(finished, torch.full_like(next_token, eos_token_id), next_token)",
        "differs from the course's padded_generate",
    ),
    (
        "00_tour",
        "test_count_params",
        "layer_norm = 2 * cfg.d_model  # w, b",
        "layer_norm = cfg.d_model  # w, b",
        "the course's count_params",
    ),
    (
        "00_tour",
        "test_split_heads",
        '"batch pos (n_heads d_head) -> batch pos n_heads d_head"',
        '"batch pos (d_head n_heads) -> batch pos n_heads d_head"',
        "differs from the course's split_heads",
    ),
    (
        "00_tour",
        "test_merge_heads",
        '"batch pos n_heads d_head -> batch pos (n_heads d_head)"',
        '"batch pos n_heads d_head -> batch pos (d_head n_heads)"',
        "differs from the course's merge_heads",
    ),
    (
        "00_tour",
        "test_head_scores",
        "-> batch n_heads pos_q pos_k",
        "-> batch n_heads pos_k pos_q",
        "differs from the course's head_scores",
    ),
    (
        "06_training",
        "test_reversal_floor",
        "unpredictable = seq_len // 2 - 1",
        "unpredictable = seq_len // 2",
        "the course's reversal_loss_floor",
    ),
    (
        "07_sampling_and_kv_cache",
        "test_sample_next_token",
        "    if top_k is not None:\n        logits = top_k_filter(logits, top_k)\n",
        "",
        "where the course's filters remove it",
    ),
    (
        "07_sampling_and_kv_cache",
        "test_generate",
        "    for _ in range(max_new_tokens):\n        logits = model(tokens[:, -model.cfg.n_ctx :])[:, -1]",
        "    for _ in range(max_new_tokens + 1):\n        logits = model(tokens[:, -model.cfg.n_ctx :])[:, -1]",
        "has shape",
    ),
    (
        "07_sampling_and_kv_cache",
        "test_beam_search",
        "num_beams, eos_token_id, step == max_new_tokens - 1)",
        "num_beams, eos_token_id, False)",
        "raised IndexError",
    ),
    (
        "07_sampling_and_kv_cache",
        "test_beam_search",
        "(score / length**length_penalty, seq)",
        "(score / (length + tokens.shape[1]) ** length_penalty, seq)",
        "has shape",
    ),
    (
        "07_sampling_and_kv_cache",
        "test_beam_search",
        "            if early_stopping is True:\n                break\n",
        "",
        "has shape",
    ),
    (
        "07_sampling_and_kv_cache",
        "test_select_beams",
        "candidates[ends & among_best]",
        "candidates[ends]",
        "has shape",
    ),
    (
        "07_sampling_and_kv_cache",
        "test_select_beams",
        "topk(min(2 * num_beams, scores.numel()))",
        "topk(min(num_beams, scores.numel()))",
        "has shape",
    ),
    (
        "07_sampling_and_kv_cache",
        "test_select_beams",
        'top.indices[top.values > float("-inf")]',
        "top.indices",
        "has shape",
    ),
    (
        "07_sampling_and_kv_cache",
        "test_select_beams",
        "== eos_token_id) | last_step",
        "== eos_token_id)",
        "has shape",
    ),
    (
        "08_interpretability",
        "test_head_detector_scores",
        "previous = pattern.diagonal(offset=-1, dim1=-2, dim2=-1)",
        "previous = pattern.diagonal(offset=1, dim1=-2, dim2=-1)",
        "differs from the course's head_detector_scores",
    ),
    (
        "08_interpretability",
        "test_induction_scores",
        "offset=-(seq_len - 1)",
        "offset=-seq_len",
        "differs from the course's induction_scores",
    ),
    (  # no gradient clipping: a few steps of the learner's loop on the judge's model, weights compared outside
        "06_training",
        "test_train",
        (
            "batch)\n        optimizer.zero_grad()\n        loss.backward()\n"
            "        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)\n"
        ),
        "batch)\n        optimizer.zero_grad()\n        loss.backward()\n",
        "differs from the course's train",
    ),
    (  # the addition loop: the same problems at every step (judged on the seeds it asks addition_data for)
        "06_training",
        "test_train_addition",
        "seed=args.seed + 1 + step)",
        "seed=args.seed)",
        "seeds given to addition_data repeat",
    ),
    (  # seeds that ignore args.seed
        "06_training",
        "test_train_addition",
        "seed=args.seed + 1 + step)",
        "seed=1000 + step)",
        "changing args.seed changed none",
    ),
    (  # the plain loss: every position, not just the answer's digits
        "06_training",
        "test_train_addition",
        "loss = masked_lm_loss(model(tokens), tokens, loss_mask)",
        "loss = masked_lm_loss(model(tokens), tokens, torch.ones_like(loss_mask))",
        "against the course's loop on the problems of the seeds",
    ),
    (  # no clipping
        "06_training",
        "test_train_addition",
        (
            "        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)\n        optimizer.step()\n"
            "        ### END SOLUTION\n        losses"
        ),
        "        optimizer.step()\n        ### END SOLUTION\n        losses",
        "against the course's loop on the problems of the seeds",
    ),
    (  # the batch size hard-coded
        "06_training",
        "test_train_addition",
        "addition_data(args.batch_size, n_digits,",
        "addition_data(64, n_digits,",
        "not args.batch_size",
    ),
    (  # the learning-rate schedule never applied
        "06_training",
        "test_train",
        '        for group in optimizer.param_groups:\n            group["lr"] = lr_at(step, args)\n        batch = train_windows',
        "        batch = train_windows",
        "differs from the course's train",
    ),
    (  # the recomputed pattern without 1/sqrt(d_head): judged outside on the course's model with fresh weights
        "08_interpretability",
        "test_cache_activations",
        "scores = q @ k.transpose(-1, -2) / math.sqrt(attn.cfg.d_head)",
        "scores = q @ k.transpose(-1, -2)",
        "differs from the course's cache_activations",
    ),
    (  # zero ablation for mean ablation, through TransformerLens's hooks on a HookedTransformer built in the child
        "08_interpretability",
        "test_mean_ablate_heads",
        "z[:, :, heads] = z[:, :, heads].mean(dim=0, keepdim=True)",
        "z[:, :, heads] = 0.0",
        "differs from the course's mean_ablate_heads",
    ),
    (  # no final LayerNorm: on a cache the child makes from the judge's model and tokens
        "08_interpretability",
        "test_logit_lens",
        "model.unembed(model.ln_final(resid))",
        "model.unembed(resid)",
        "differs from the course's logit_lens",
    ),
    (  # LayerNorm's centring left out of each part
        "08_interpretability",
        "test_logit_attribution",
        "x = x - x.mean(dim=-1, keepdim=True)",
        "x = x + 0.0",
        "differs from the course's logit_attribution",
    ),
    (
        "09_encoder_decoder",
        "test_make_batch",
        "tgt_in = pad([[cfg.bos_id] + y for y in targets])",
        "tgt_in = pad([y for y in targets])",
        "returned value 1 has shape",
    ),
    (
        "09_encoder_decoder",
        "test_greedy_decode",
        "return tgt[:, 1:]  # without BOS",
        "return tgt",
        "has shape",
    ),
    (
        "02_embeddings",
        "test_sinusoidal",
        "torch.stack([angles.sin(), angles.cos()])",
        "torch.stack([angles.cos(), angles.sin()])",
        "differs from the course's sinusoidal_positional_encoding",
    ),
    (
        "03_attention",
        "test_apply_causal_mask",
        "device=attn_scores.device), diagonal=1)",
        "device=attn_scores.device), diagonal=0)",
        "entries that must pass through unchanged were changed",
    ),
    (
        "03_attention",
        "test_apply_causal_mask",
        "return attn_scores.masked_fill(future, ignore)",
        "return attn_scores.masked_fill(future, 0.0)",
        "entries that must be masked are not",
    ),
    (
        "05_full_gpt2",
        "test_convert_hf_gpt2_state_dict",
        '"unembed.W_U": hf["lm_head.weight"].T,',
        '"unembed.W_U": hf["lm_head.weight"],',
        "['unembed.W_U'] has shape [",  # [d_vocab, d_model] of the job's shape
    ),
    (
        "05_full_gpt2",
        "test_convert_hf_gpt2_state_dict",
        'hf[h + "attn.c_proj.weight"], "(n h) m -> n h m"',
        'hf[h + "attn.c_proj.weight"], "(h n) m -> n h m"',
        "['blocks.0.attn.W_O'] differs from the course's convert_hf_gpt2_state_dict",
    ),
    (
        "05_full_gpt2",
        "test_convert_hf_gpt2_state_dict",
        '"ln_final.w": hf["transformer.ln_f.weight"],',
        '"ln_final.weight": hf["transformer.ln_f.weight"],',
        "missing keys ['ln_final.w']; unexpected keys ['ln_final.weight']",
    ),
    (
        "05_full_gpt2",
        "test_greedy_generate",
        "next_token = logits[:, -1].argmax(dim=-1, keepdim=True)",
        "next_token = logits[:, 0].argmax(dim=-1, keepdim=True)",
        "differs from the course's greedy_generate",
    ),
    (
        "06_training",
        "test_lr_at",
        "return args.lr * (step + 1) / args.warmup_steps",
        "return args.lr * step / args.warmup_steps",
        "the course's lr_at",
    ),
    (
        "06_training",
        "test_masked_lm_loss",
        "target_mask = loss_mask[:, 1:]",
        "target_mask = loss_mask[:, :-1]",
        "the course's masked_lm_loss",
    ),
    (
        "07_sampling_and_kv_cache",
        "test_apply_temperature",
        "return logits / temperature",
        "return logits * temperature",
        "the probabilities after a softmax differ",
    ),
    (
        "07_sampling_and_kv_cache",
        "test_top_k_filter",
        'return logits.masked_fill(logits < threshold, float("-inf"))',
        'return logits.masked_fill(logits <= threshold, float("-inf"))',
        "differs from the course's top_k_filter on fresh inputs: removes",
    ),
    (
        "07_sampling_and_kv_cache",
        "test_top_p_filter",
        "remove = remove_sorted.scatter(-1, order, remove_sorted)",
        "remove = remove_sorted",
        "differs from the course's top_p_filter",
    ),
    (
        "07_sampling_and_kv_cache",
        "test_apply_frequency_penalty",
        "return logits - penalty * counts",
        "return logits - penalty * (counts > 0)",
        "differs from the course's apply_frequency_penalty",
    ),
    (
        "08_interpretability",
        "test_recompute_pattern",
        "scores = q @ k.transpose(-1, -2) / math.sqrt(attn.cfg.d_head)  # [batch n_heads query key]",
        "scores = q @ k.transpose(-1, -2) / math.sqrt(attn.cfg.d_model)  # [batch n_heads query key]",
        "differs from the course's recompute_pattern",
    ),
    (
        "08_interpretability",
        "test_k_composition_scores",
        "product = W_OV[:, None] @ W_QK.transpose(-1, -2)[None]",
        "product = W_OV[:, None] @ W_QK[None]",
        "differs from the course's k_composition_scores",
    ),
    (
        "08_interpretability",
        "test_patch_resid_pre",
        "resid[:, pos] = clean_cache[name][:, pos]",
        "resid[:, pos] = clean_cache[name][:, pos - 1]",
        "differs from the course's patch_resid_pre",
    ),
    (
        "07_sampling_and_kv_cache",
        "test_ban_repeated_ngrams",
        "for start in range(len(seq) - n + 1):",
        "for start in range(len(seq) - n):",
        "differs from the course's ban_repeated_ngrams",
    ),
    (
        "07_sampling_and_kv_cache",
        "test_min_p_filter",
        "remove = probs < threshold",
        "remove = probs < min_p",
        "differs from the course's min_p_filter on fresh inputs",
    ),
    (
        "07_sampling_and_kv_cache",
        "test_apply_repetition_penalty",
        "penalised = torch.where(logits < 0, logits * penalty, logits / penalty)",
        "penalised = logits / penalty",
        "differs from the course's apply_repetition_penalty",
    ),
    (
        "09_encoder_decoder",
        "test_multi_head_attention",
        "if causal:",
        "if False:",
        "differs from the course's MultiHeadAttention",
    ),
    (
        "09_encoder_decoder",
        "test_shared_embedding",
        "return self.W_E[tokens] * math.sqrt(self.cfg.d_model) + self.pe[:pos]",
        "return self.W_E[tokens] + self.pe[:pos]",
        "differs from the course's SharedEmbedding",
    ),
    (
        "09_encoder_decoder",
        "test_feed_forward",
        "hidden = torch.relu(x @ self.W_in + self.b_in)",
        "hidden = torch.nn.functional.gelu(x @ self.W_in + self.b_in)",
        "differs from the course's FeedForward",
    ),
    (
        "09_encoder_decoder",
        "test_encoder_layer",
        "x = self.ln1(x + self.self_attn(x, x, src_padding))",
        "x = x + self.self_attn(self.ln1(x), self.ln1(x), src_padding)",
        "differs from the course's EncoderLayer",
    ),
    (
        "09_encoder_decoder",
        "test_decoder_layer",
        "y = self.ln1(y + self.self_attn(y, y, tgt_padding, causal=True))",
        "y = self.ln1(y + self.self_attn(y, y, tgt_padding, causal=False))",
        "differs from the course's DecoderLayer",
    ),
    (
        "09_encoder_decoder",
        "test_seq2seq_loss",
        "        ignore_index=pad_id,\n",
        "",
        "the course's seq2seq_loss",
    ),
    (
        "09_encoder_decoder",
        "test_encoder_decoder",
        "return self.decode(tgt_in, self.encode(src), src)",
        "return self.decode(tgt_in, self.embed(src), src)",
        "differs from the course's EncoderDecoder",
    ),
]


# Weight-decay groups that lose or repeat a parameter; repeated_segments (random by design, judged by the rules
# every draw must follow) breaking one rule each.
WRONG_GROUPS = {
    "is in two groups": (
        '{"params": no_decay, "weight_decay": 0.0}]',
        '{"params": no_decay + decay[:1], "weight_decay": 0.0}]',
    ),
    "in no group": (
        "        (decay if param.ndim >= 2 and not is_embedding else no_decay).append(param)\n",
        '        if "ln" not in name:\n            (decay if param.ndim >= 2 and not is_embedding else no_decay).append(param)\n',
    ),
}

SEGMENT_MISTAKES = {
    "does not start with BOS": (
        "bos = torch.zeros(batch, 1, dtype=torch.long)",
        "bos = torch.ones(batch, 1, dtype=torch.long)",
    ),
    "outside 1..": (
        "segments = torch.randint(1, d_vocab, (batch, max_period), generator=generator)",
        "segments = torch.randint(0, d_vocab, (batch, max_period), generator=generator)",
    ),
    "never drawn in": (
        "periods = torch.randint(min_period, max_period + 1, (batch,), generator=generator)",
        "periods = torch.full((batch,), min_period)",
    ),
    # ranges off by one: a right draw shows every id and period (the judge's large probe), these never do
    "never appear in": (
        "segments = torch.randint(1, d_vocab, (batch, max_period), generator=generator)",
        "segments = torch.randint(1, d_vocab - 1, (batch, max_period), generator=generator)",
    ),
    "periods [": (
        "periods = torch.randint(min_period, max_period + 1, (batch,), generator=generator)",
        "periods = torch.randint(min_period, max_period, (batch,), generator=generator)",
    ),
    "the same token twice": (
        "segments = torch.randint(1, d_vocab, (batch, max_period), generator=generator)",
        "segments = torch.randint(1, d_vocab, (batch, 1), generator=generator).expand(batch, max_period)",
    ),
    # red-team round 22: a rounding bug (each range's ends half as often) and a deliberate skew passed every rule
    "segment ids:": (
        "segments = torch.randint(1, d_vocab, (batch, max_period), generator=generator)",
        "segments = (1 + torch.rand(batch, max_period, generator=generator) * (d_vocab - 2)).round().long()",
    ),
    "periods:": (
        "periods = torch.randint(min_period, max_period + 1, (batch,), generator=generator)",
        (
            "periods = torch.where(torch.rand(batch, generator=generator) < 0.3, max_period, "
            "torch.randint(min_period, max_period + 1, (batch,), generator=generator))"
        ),
    ),
    "does not repeat with its period": (
        "index = torch.arange(n_ctx - 1)[None, :] % periods[:, None]",
        "index = torch.arange(n_ctx - 1)[None, :] % max_period + 0 * periods[:, None]",
    ),
}
MISTAKES += [("06_training", "test_weight_decay_groups", *change, cause) for cause, change in WRONG_GROUPS.items()]
MISTAKES += [
    ("08_interpretability", "test_repeated_segments", *change, cause) for cause, change in SEGMENT_MISTAKES.items()
]

# What the notebook's checks verify and the judge's probes once let pass (each passed the judge before its probe was
# added): the verdict names the cause.
GELU_TANH = "return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))"
PARITY_MISTAKES = [
    (  # the exact GELU, with the error function: about 5e-4 off GPT-2's, 5 times the judge's tolerance (it failed
        # the judge before too: kept so that a looser tolerance shows)
        "04_mlp_and_block",
        "test_gelu_new",
        GELU_TANH,
        "return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))",
        "differs from the course's gelu_new",
    ),
    (  # top-p before top-k: the same draws wherever the nucleus is within the top k (about 2 in 5 random rows)
        "07_sampling_and_kv_cache",
        "test_sample_next_token",
        (
            "    if top_k is not None:\n        logits = top_k_filter(logits, top_k)\n"
            "    if top_p is not None:\n        logits = top_p_filter(logits, top_p)\n"
        ),
        (
            "    if top_p is not None:\n        logits = top_p_filter(logits, top_p)\n"
            "    if top_k is not None:\n        logits = top_k_filter(logits, top_k)\n"
        ),
        "it applies top-p before top-k",
    ),
    (  # the model fed the newest token only: a bigram model cannot tell
        "05_full_gpt2",
        "test_greedy_generate",
        "logits = model(tokens)  # [batch pos d_vocab]",
        "logits = model(tokens[:, -1:])  # [batch pos d_vocab]",
        "ran the model on sequences of lengths [1, 1, 1",
    ),
    (  # a fixed window of the last 4 tokens
        "05_full_gpt2",
        "test_greedy_generate",
        "logits = model(tokens)  # [batch pos d_vocab]",
        "logits = model(tokens[:, -4:])  # [batch pos d_vocab]",
        ", 4, 4",  # [4, 4, 4, ...], or [3, 4, 4, ...] from a prompt of 3 (n_new is 3 or more)
    ),
    (  # the hooks never removed
        "08_interpretability",
        "test_cache_activations",
        (
            "        for handle in handles:  # even if the forward pass fails: a hook left behind fires on every later "
            "call\n            handle.remove()\n"
        ),
        "        pass\n",
        "cache_activations left hooks on embed (1)",
    ),
    (  # the activations kept in the graph
        "08_interpretability",
        "test_cache_activations",
        "            cache[name] = output.detach()\n",
        "            cache[name] = output\n",
        "stored tensors that still require grad",
    ),
    (  # every block taken to have an MLP
        "08_interpretability",
        "test_cache_activations",
        '            if hasattr(block, "mlp"):\n',
        "            if True:\n",
        "no attribute 'ln2'",
    ),
    (  # the batch size hard-coded (one window repeated, any batch size gave the same weights)
        "06_training",
        "test_train",
        "batch = train_windows[torch.randint(len(train_windows), (args.batch_size,))]",
        "batch = train_windows[torch.randint(len(train_windows), (8,))]",
        "where [args.batch_size, seq_len] = [",
    ),
    (  # the batch capped at the notebook's own 64 rows (round 30: a cap at 13, the most the judge drew, passed)
        "06_training",
        "test_train",
        "batch = train_windows[torch.randint(len(train_windows), (args.batch_size,))]",
        "batch = train_windows[torch.randint(len(train_windows), (min(args.batch_size, 64),))]",
        "where [args.batch_size, seq_len] = [",
    ),
    (  # the same batch at every step
        "06_training",
        "test_train",
        "batch = train_windows[torch.randint(len(train_windows), (args.batch_size,))]",
        "batch = train_windows[: args.batch_size]",
        "distinct batch(es) in",
    ),
    (  # a new batch every other step only (red-team round 8: half as many distinct batches as steps passed)
        "06_training",
        "test_train",
        "batch = train_windows[torch.randint(len(train_windows), (args.batch_size,))]",
        "batch = train_windows[torch.randint(len(train_windows), (args.batch_size,))] if step % 2 == 0 else batch",
        "distinct batch(es) in",
    ),
    (  # random batches of the first few windows only (red-team round 8: fresh batches, training windows only)
        "06_training",
        "test_train",
        "batch = train_windows[torch.randint(len(train_windows), (args.batch_size,))]",
        "batch = train_windows[torch.randint(args.batch_size, (args.batch_size,))]",
        "distinct windows of the 256",
    ),
    (  # the right count as a float
        "00_tour",
        "test_count_params",
        "    return embeddings + cfg.n_layers * block + layer_norm + unembed\n",
        "    return float(embeddings + cfg.n_layers * block + layer_norm + unembed)\n",
        "count_params returned float",
    ),
    (  # the right count as a tensor
        "00_tour",
        "test_count_params",
        "    return embeddings + cfg.n_layers * block + layer_norm + unembed\n",
        "    return torch.tensor(embeddings + cfg.n_layers * block + layer_norm + unembed)\n",
        "count_params returned torch.Tensor",
    ),
    (  # GPT-2's initialisation (the judge's weights replaced it in every other probe)
        "09_encoder_decoder",
        "test_shared_embedding",
        "nn.init.normal_(self.W_E, mean=0.0, std=cfg.d_model**-0.5)",
        "nn.init.normal_(self.W_E, mean=0.0, std=0.02)",
        "initialises W_E with mean",
    ),
    (  # a scale that stops at some width: right on every drawn shape (d_model 48 at most), wrong at the original
        # Transformer's 512
        "09_encoder_decoder",
        "test_shared_embedding",
        "self.W_E[tokens] * math.sqrt(self.cfg.d_model)",
        "self.W_E[tokens] * math.sqrt(min(self.cfg.d_model, 256))",
        "differs from the course's SharedEmbedding",
    ),
    (  # the output layer scaled by sqrt(d_model) as the embedding is
        "09_encoder_decoder",
        "test_shared_embedding",
        "return x @ self.W_E.T  # the same table",
        "return x @ self.W_E.T * math.sqrt(self.cfg.d_model)  # the same table",
        "['unembed'] differs from the course's SharedEmbedding",
    ),
    (  # the encoder's self-attention without the source's padding mask
        "09_encoder_decoder",
        "test_encoder_decoder",
        "            x = layer(x, src_padding)\n",
        "            x = layer(x, None)\n",
        "without padding they were right",
    ),
    (  # the cross-attention without the source's padding mask
        "09_encoder_decoder",
        "test_encoder_decoder",
        "            y = layer(y, memory, tgt_padding, src_padding)\n",
        "            y = layer(y, memory, tgt_padding, None)\n",
        "without padding they were right",
    ),
    (  # padding taken to be id 0, whatever pad_id is
        "09_encoder_decoder",
        "test_encoder_decoder",
        "        src_padding = src == self.cfg.pad_id  # [batch src], True = masked out\n",
        "        src_padding = src == 0  # [batch src], True = masked out\n",
        # the job's pad id is drawn (`judge._job_encdec`): where 0 is an ordinary token the plain probe fails first
        ("without padding they were right", "differs from the course's EncoderDecoder"),
    ),
    (  # probabilities multiplied: right over a few steps, 0 in float32 after about 20
        "07_sampling_and_kv_cache",
        "test_beam_search",
        "scores = (log_probs + live_scores[:, None]).flatten()  # [n_live * d_vocab]",
        "scores = (log_probs.exp() * live_scores[:, None].exp()).log().flatten()  # probabilities multiplied",
        "products of probabilities underflow",
    ),
]
MISTAKES += PARITY_MISTAKES
# Right values and no gradient, or the wrong one (red-team round 25: a NumPy GELU, head scores by np.einsum, an
# attention pattern through a NumPy mask, a LayerNorm with its statistics detached had full marks): a model built on
# them does not train. The judge backpropagates a fixed cotangent through each of the model's parts to its inputs.
NO_GRADIENT = ("gets back (backward through it)", "no gradient reaches")
MISTAKES += [
    (
        "01_layernorm",
        "test_layernorm",
        "scale = (centered.pow(2).mean(dim=-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt()",
        "scale = (centered.pow(2).mean(dim=-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt().detach()",
        NO_GRADIENT,
    ),
    (
        "04_mlp_and_block",
        "test_gelu_new",
        "return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))",
        "return torch.tensor((0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3)))))."
        + "tolist())",
        NO_GRADIENT,
    ),
    (
        "00_tour",
        "test_head_scores",
        'return einops.einsum(q, k, "batch pos_q n_heads d_head, batch pos_k n_heads d_head -> batch n_heads',
        'return einops.einsum(q.detach(), k, "batch pos_q n_heads d_head, batch pos_k n_heads d_head -> batch n_heads',
        NO_GRADIENT,
    ),
    (
        "03_attention",
        "test_attention_pattern",
        "return apply_causal_mask(attn_scores).softmax(dim=-1)",
        "return apply_causal_mask(attn_scores.detach()).softmax(dim=-1)",
        NO_GRADIENT,
    ),
    (  # the mask applied in NumPy: the kept scores' gradient is lost (the mask's gradient is judged where it keeps)
        "03_attention",
        "test_apply_causal_mask",
        "return attn_scores.masked_fill(future, ignore)",
        (
            "np = __import__('numpy')\n"
            "    return torch.from_numpy(np.where(future.numpy(), ignore, attn_scores.detach().numpy()))"
        ),
        NO_GRADIENT,
    ),
    (  # ... or the scores rebuilt from a detached copy
        "03_attention",
        "test_apply_causal_mask",
        "return attn_scores.masked_fill(future, ignore)",
        "return attn_scores.detach().masked_fill(future, ignore) + 0 * attn_scores.sum()",
        "gets back (backward through it)",
    ),
]

# Rows whose draws follow their distributions one by one but not independently of each other (red-team round 39:
# a sampler inverting each row's CDF at frac(u + i * golden ratio) from one uniform u a call had full marks; sweep 10:
# rows in pairs sharing one uniform). Each row's own counts are right; pairs of rows are judged too.
SHARED_DRAW = "    return torch.multinomial(logits.softmax(dim=-1), num_samples=1, generator=generator)[:, 0]\n"
MISTAKES += [
    (
        "07_sampling_and_kv_cache",
        "test_sample_next_token",
        SHARED_DRAW,
        (
            "    probs = logits.softmax(dim=-1)\n"
            "    u = (torch.rand(1, generator=generator) + torch.arange(len(probs))[:, None] * 0.6180339887) % 1\n"
            "    return (probs.cumsum(dim=-1) < u).sum(dim=-1).clamp(max=probs.shape[-1] - 1)\n"
        ),
        DEPENDENT,
    ),
    (
        "07_sampling_and_kv_cache",
        "test_sample_next_token",
        SHARED_DRAW,
        (
            "    u = torch.rand(logits.shape[0], 1, generator=generator)\n"
            "    u = torch.where(torch.arange(len(u))[:, None] % 2 == 1, u.roll(1, 0), u)\n"
            "    probs = logits.softmax(dim=-1)\n"
            "    return (probs.cumsum(dim=-1) < u).sum(dim=-1).clamp(max=probs.shape[-1] - 1)\n"
        ),
        DEPENDENT,
    ),
    (  # the first half's draws again in the second half
        "07_sampling_and_kv_cache",
        "test_sample_next_token",
        SHARED_DRAW,
        (
            "    u = torch.rand((logits.shape[0] + 1) // 2, 1, generator=generator).repeat(2, 1)[: logits.shape[0]]\n"
            "    probs = logits.softmax(dim=-1)\n"
            "    return (probs.cumsum(dim=-1) < u).sum(dim=-1).clamp(max=probs.shape[-1] - 1)\n"
        ),
        DEPENDENT,
    ),
    (  # mirrored: the last row draws at 1 - u of the first, and so on inwards
        "07_sampling_and_kv_cache",
        "test_sample_next_token",
        SHARED_DRAW,
        (
            "    u = torch.rand((logits.shape[0] + 1) // 2, 1, generator=generator)\n"
            "    u = torch.cat([u, 1 - u.flip(0)])[: logits.shape[0]] if logits.shape[0] % 2 == 0 else "
            "torch.cat([u, 1 - u[:-1].flip(0)])\n"
            "    probs = logits.softmax(dim=-1)\n"
            "    return (probs.cumsum(dim=-1) < u).sum(dim=-1).clamp(max=probs.shape[-1] - 1)\n"
        ),
        DEPENDENT,
    ),
    (  # antithetic pairs: row 2k + 1 draws at 1 - u of row 2k
        "07_sampling_and_kv_cache",
        "test_sample_next_token",
        SHARED_DRAW,
        (
            "    u = torch.rand((logits.shape[0] + 1) // 2, 1, generator=generator)\n"
            "    u = torch.cat([u, 1 - u], dim=1).reshape(-1, 1)[: logits.shape[0]]\n"
            "    probs = logits.softmax(dim=-1)\n"
            "    return (probs.cumsum(dim=-1) < u).sum(dim=-1).clamp(max=probs.shape[-1] - 1)\n"
        ),
        DEPENDENT,
    ),
]

# 09's model read BOS and EOS only where no probe put them, and cross-attention only between lengths that differed
# (mutation sweep 10): the probes now give every id but padding, BOS first in a target as make_batch writes it, and
# a source as long as the target.
MISTAKES += [
    (
        "09_encoder_decoder",
        "test_encoder_decoder",
        "        src_padding, tgt_padding = src == self.cfg.pad_id, tgt_in == self.cfg.pad_id",
        (
            "        src_padding, tgt_padding = src == self.cfg.pad_id, (tgt_in == self.cfg.pad_id) | (tgt_in == "
            "self.cfg.bos_id)"
        ),
        ("NaN", "differs from the course's"),
    ),
    (
        "09_encoder_decoder",
        "test_encoder_decoder",
        "        src_padding = src == self.cfg.pad_id  # [batch src], True = masked out",
        "        src_padding = (src == self.cfg.pad_id) | (src == self.cfg.eos_id)  # [batch src], True = masked out",
        "differs from the course's",
    ),
    (
        "09_encoder_decoder",
        "test_decoder_layer",
        "        y = self.ln2(y + self.cross_attn(y, memory, src_padding))  # queries from y, keys and values from memory",
        "        y = self.ln2(y + self.cross_attn(y, memory, src_padding, causal=memory.shape[1] == y.shape[1]))",
        "differs from the course's",
    ),
    (
        "09_encoder_decoder",
        "test_shared_embedding",
        "        return self.W_E[tokens] * math.sqrt(self.cfg.d_model) + self.pe[:pos]  # [batch pos d_model]\n",
        "        return (self.W_E[tokens] * math.sqrt(self.cfg.d_model) + self.pe[:pos]).detach()\n",
        NO_GRADIENT,
    ),
    # ... the output layer's gradients, and the causal self-attention's (mutation sweep 11: only the forward's, and
    # only cross-attention's, were judged)
    *(
        (
            "09_encoder_decoder",
            "test_shared_embedding",
            "        return x @ self.W_E.T  # the same table, transposed: [d_model d_vocab]\n",
            new,
            ("no gradient reaches", "grad.W_E"),
        )
        for new in ("        return (x @ self.W_E.T).detach()\n", "        return x @ self.W_E.detach().T\n")
    ),
    (
        "09_encoder_decoder",
        "test_multi_head_attention",
        '            scores = scores.masked_fill(future, float("-inf"))\n',
        '            scores = scores.masked_fill(future, float("-inf")).detach()\n',
        ("no gradient reaches", "grad."),
    ),
]

# Segments drawn without replacement: each token's marginal is uniform, and no segment ever repeats a token
# (mutation sweep 10).
WITHOUT_REPLACEMENT = (
    "08_interpretability",
    "test_repeated_segments",
    "    segments = torch.randint(1, d_vocab, (batch, max_period), generator=generator)  # [batch max_period]",
    (
        "    segments = torch.stack([torch.randperm(max(d_vocab - 1, max_period), generator=generator)[:max_period] % "
        "(d_vocab - 1) + 1 for _ in range(batch)])  # [batch max_period]"
    ),
    # where the vocabulary is smaller than the longest segment, the wrap makes the low ids likelier too
    ("never repeats one", "draw each value equally often"),
)
MISTAKES += [WITHOUT_REPLACEMENT]

# A gradient of another scale: AdamW's step is all but blind to it, so the trained weights were the course's (mutation
# sweep 11: each passed test_train_addition, and test_train in some jobs). The gradient norm at each step is judged,
# with the drawn clip (which binds) and with one no gradient reaches.
GRAD_NORM = "the gradient's norm at each optimizer.step()"
TRAIN_CLIP = (
    "        loss.backward()\n        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)\n"
    "        optimizer.step()\n        ### END SOLUTION\n        history"
)
ADDITION_CLIP = (
    "        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)\n        optimizer.step()\n"
    "        ### END SOLUTION\n        losses.append"
)
MISTAKES += [
    *(
        ("06_training", grade_id, clip, clip.replace("args.grad_clip)", wrong), GRAD_NORM)
        for grade_id, clip in (("test_train", TRAIN_CLIP), ("test_train_addition", ADDITION_CLIP))
        for wrong in ("args.grad_clip * 2)", "max(args.grad_clip, 0.5))")
    ),
    (
        "06_training",
        "test_train",
        TRAIN_CLIP,
        TRAIN_CLIP.replace("        loss.backward()\n", "        (loss * args.batch_size).backward()\n"),
        GRAD_NORM,
    ),
    (  # ... with a hook of the optimizer's own that scales .grad back once the step has used it (red-team round 41)
        "06_training",
        "test_train",
        TRAIN_CLIP,
        TRAIN_CLIP.replace(
            "        loss.backward()\n",
            "        if step == 0:\n"
            "            optimizer.register_step_post_hook(lambda opt, *a: [p.grad.div_(args.batch_size) for p in "
            "model.parameters() if p.grad is not None])\n"
            "        (loss * args.batch_size).backward()\n",
        ),
        GRAD_NORM,
    ),
    (  # the clip undone in a pre-hook of the optimizer's own, which runs after every global one (red-team round 42)
        "06_training",
        "test_train",
        TRAIN_CLIP,
        TRAIN_CLIP.replace(
            "        loss.backward()\n        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)\n",
            "        if step == 0:\n"
            "            box = [None]\n"
            "            optimizer.register_step_pre_hook(lambda opt, *a: [p.grad.mul_(max(1.0, float(box[0]) / "
            "args.grad_clip)) for p in model.parameters() if p.grad is not None] and None)\n"
            "        loss.backward()\n"
            "        box[0] = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)\n",
        ),
        GRAD_NORM,
    ),
    (  # parts of a batch, their losses added and not weighted by their share
        "06_training",
        "test_train_addition",
        (
            "        loss = masked_lm_loss(model(tokens), tokens, loss_mask)\n"
            "        optimizer.zero_grad()\n"
            "        loss.backward()\n"
        ),
        (
            "        optimizer.zero_grad()\n"
            "        loss = 0.0\n"
            "        for part, mask in zip(tokens.chunk(2), loss_mask.chunk(2)):\n"
            "            share = masked_lm_loss(model(part), part, mask)\n"
            "            share.backward()\n"
            "            loss = loss + share.detach() / 2\n"
        ),
        GRAD_NORM,
    ),
]

# A generation whose every step draws the same random numbers (red-team round 40: a generator seeded afresh from the
# given one's seed at each step; right on one new token, the only one judged then).
MISTAKES += [
    (
        "07_sampling_and_kv_cache",
        "test_generate",
        "        next_token = sample_next_token(logits, tokens, **sampling)  # [batch]\n",
        (
            "        given = sampling.get('generator')\n"
            "        fresh = {**sampling, 'generator': torch.Generator().manual_seed(given.initial_seed())} if given else "
            "sampling\n"
            "        next_token = sample_next_token(logits, tokens, **fresh)  # [batch]\n"
        ),
        "new tokens 1 and 2 of a row",
    ),
    *(  # ... the generator put back to its first state before the third step (red-team round 41), or every four
        # steps (round 42)
        (
            "07_sampling_and_kv_cache",
            "test_generate",
            "        next_token = sample_next_token(logits, tokens, **sampling)  # [batch]\n",
            (
                "        given = sampling.get('generator')\n"
                "        if given is not None and _ == 0:\n"
                "            saved = given.get_state()\n"
                f"        if given is not None and {rewind}:\n"
                "            given.set_state(saved)\n"
                "        next_token = sample_next_token(logits, tokens, **sampling)  # [batch]\n"
            ),
            cause,
        )
        for rewind, cause in (
            ("_ == 2", "new tokens 1 and 3 of a row"),
            ("_ > 0 and _ % 4 == 0", "new tokens 1 and 5 of a row"),
        )
    ),
]

MISTAKES += [
    (  # a decoder that never predicts BOS (mutation sweep 11)
        "09_encoder_decoder",
        "test_greedy_decode",
        "        next_token = model.decode(tgt, memory, src)[:, -1].argmax(dim=-1)  # [batch]",
        (
            "        logits = model.decode(tgt, memory, src)[:, -1]\n"
            '        logits[:, cfg.bos_id] = float("-inf")  # never predict BOS\n'
            "        next_token = logits.argmax(dim=-1)"
        ),
        ("differs from the course's", "has shape"),
    ),
]

# Mutation sweep 12: a ban of the window's last token where every built row ended in a run of one id (its last token
# and the token after the window's earlier occurrence were the same id); min_p never 0; composition scores on norms
# always above 1.
MISTAKES += [
    (
        "07_sampling_and_kv_cache",
        "test_ban_repeated_ngrams",
        '                banned[row, seq[start + n - 1]] = float("-inf")\n',
        '                banned[row, seq[start + n - 2]] = float("-inf")\n',
        "removes",
    ),
    (
        "07_sampling_and_kv_cache",
        "test_min_p_filter",
        "    threshold = min_p * probs.amax(dim=-1, keepdim=True)  # [batch 1]\n    remove = probs < threshold\n",
        "    remove = logits < logits.amax(dim=-1, keepdim=True) + math.log(min_p)  # log space\n",
        "math domain error",
    ),
    (
        "08_interpretability",
        "test_k_composition_scores",
        "    return product.norm(dim=(-2, -1)) / norms\n",
        "    return product.norm(dim=(-2, -1)) / norms.clamp(min=1.0)\n",
        "differs from the course's",
    ),
]

MISTAKES += [
    (  # softmax first, then the mask, then renormalised: 0 / 0 on large scores (mutation sweep 13; the message
        # named only overflow, to a learner who had used softmax)
        "03_attention",
        "test_attention_pattern",
        "    return apply_causal_mask(attn_scores).softmax(dim=-1)\n",
        "    p = attn_scores.softmax(dim=-1)\n    p = apply_causal_mask(p, 0.0)\n    return p / p.sum(dim=-1, keepdim=True)\n",
        "renormalised after a mask",
    ),
]


# Wrong code a mutation sweep found the judge passing (each checked to differ from the course's on some input):
# settings the fixed probes never reached, draws that only sometimes separated, sizes below a constant written in.
SWEPT = ("differs from the course's", "has shape")
_PAD = "        next_token = torch.where(finished, torch.full_like(next_token, pad_token_id), next_token)\n"
_FINISH = "        finished |= next_token == eos_token_id\n"
PAD_THEN_FINISH = _PAD + "        tokens = torch.cat([tokens, next_token[:, None]], dim=1)\n" + _FINISH
GENERATE_SIGNATURE = """def generate(
    model, tokens: Int[Tensor, "batch pos"], max_new_tokens: int, eos_token_id: int = EOT, **sampling
) -> Int[Tensor, "batch pos_out"]:"""
GENERATE_EXPLICIT = """def generate(
    model, tokens: Int[Tensor, "batch pos"], max_new_tokens: int, eos_token_id: int = EOT,
    temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
    frequency_penalty: float = 0.0, generator: torch.Generator | None = None,
) -> Int[Tensor, "batch pos_out"]:
    sampling = dict(
        temperature=temperature, top_k=top_k, top_p=top_p, frequency_penalty=frequency_penalty, generator=generator
    )"""
SWEPT_MISTAKES = {
    # red-team round 51: a batch of one, GPT-2's vocabulary and long rows, none of them drawn before
    "sample_next_token greedy on a batch of one": (
        "07_sampling_and_kv_cache",
        "test_sample_next_token",
        "    return torch.multinomial(logits.softmax(dim=-1), num_samples=1, generator=generator)[:, 0]\n",
        (
            "    if logits.shape[0] == 1:\n        return logits.argmax(dim=-1)\n"
            "    return torch.multinomial(logits.softmax(dim=-1), num_samples=1, generator=generator)[:, 0]\n"
        ),
        "the draws do not follow the course's distribution",
    ),
    **{
        f"{name} skipped on GPT-2's vocabulary": (
            "07_sampling_and_kv_cache",
            f"test_{name}",
            first,
            "    if logits.shape[-1] >= 50257:\n        return logits\n" + first,
            "removes 0 tokens",
        )
        for name, first in (
            ("top_k_filter", "    k = min(k, logits.shape[-1])\n"),
            (
                "top_p_filter",
                "    sorted_logits, order = logits.sort(dim=-1, descending=True)  # [batch d_vocab] each\n",
            ),
            ("min_p_filter", "    probs = logits.softmax(dim=-1)  # [batch d_vocab]\n    threshold"),
        )
    },
    "cached_generate dropping the cache after a one-token prompt": (
        "07_sampling_and_kv_cache",
        "test_cached_generate",
        "    logits, past_kvs = model(tokens)  # the prompt, once\n",
        "    logits, past_kvs = model(tokens)  # the prompt, once\n    if tokens.shape[1] == 1:\n        past_kvs = None\n",
        "first differs",
    ),
    # ... and caps past every size drawn before, now drawn at GPT-2's depth or past the cap
    "logit_lens reading layer 5 for every later layer": (
        "08_interpretability",
        "test_logit_lens",
        '    residuals = [cache[f"blocks.{i}.hook_resid_pre"] for i in range(n_layers)]\n',
        '    residuals = [cache[f"blocks.{i}.hook_resid_pre"] for i in range(n_layers)]\n    if n_layers > 6:\n        residuals[6:] = [residuals[5]] * (n_layers - 6)\n',
        SWEPT,
    ),
    "induction_scores over 50 queries at most": (
        "08_interpretability",
        "test_induction_scores",
        "    return stripe[..., -seq_len:].mean(dim=(0, -1))  # the second copy's queries only\n",
        "    return stripe[..., -min(seq_len, 50):].mean(dim=(0, -1))  # the second copy's queries only\n",
        SWEPT,
    ),
    "head_detector_scores over the first 16 rows": (
        "08_interpretability",
        "test_head_detector_scores",
        "        name: scores.mean(dim=(0, -1))\n",
        "        name: (scores if scores.shape[0] <= 16 else scores[:16]).mean(dim=(0, -1))\n",
        SWEPT,
    ),
    "mean_ablate_heads averaging the first 8 rows": (
        "08_interpretability",
        "test_mean_ablate_heads",
        "        z[:, :, heads] = z[:, :, heads].mean(dim=0, keepdim=True)\n",
        "        z[:, :, heads] = z[:8, :, heads].mean(dim=0, keepdim=True)\n",
        SWEPT,
    ),
    "weight_decay_groups decaying the first 4 blocks only": (
        "06_training",
        "test_weight_decay_groups",
        '        is_embedding = name.endswith(("W_E", "W_pos"))\n',
        '        is_embedding = name.endswith(("W_E", "W_pos")) or any(name.startswith(f\'blocks.{i}.\') for i in range(4, 100))\n',
        SWEPT,
    ),
    "masked_lm_loss over the first 16 rows": (
        "06_training",
        "test_masked_lm_loss",
        "    target_mask = loss_mask[:, 1:]\n",
        "    target_mask = loss_mask[:, 1:].clone()\n    target_mask[16:] = False\n",
        "the course's masked_lm_loss",
    ),
    "reversal_loss_floor with seq_len capped at 64": (
        "06_training",
        "test_reversal_floor",
        "    unpredictable = seq_len // 2 - 1\n",
        "    seq_len = min(seq_len, 64)\n    unpredictable = seq_len // 2 - 1\n",
        "the course's reversal_loss_floor",
    ),
    "make_batch cutting rows at 64 ids": (
        "09_encoder_decoder",
        "test_make_batch",
        "        width = max(len(row) for row in rows)\n",
        "        width = min(64, max(len(row) for row in rows))\n        rows = [row[:width] for row in rows]\n",
        SWEPT,
    ),
    "greedy_decode padding finished rows in batches of 8 or fewer alone": (
        "09_encoder_decoder",
        "test_greedy_decode",
        "        next_token = next_token.masked_fill(finished, cfg.pad_id)  # finished rows emit padding\n",
        "        next_token = next_token.masked_fill(finished & (src.shape[0] <= 8), cfg.pad_id)  # finished rows emit padding\n",
        SWEPT,
    ),
    "ban_repeated_ngrams skipped for one row": (
        "07_sampling_and_kv_cache",
        "test_ban_repeated_ngrams",
        "    banned = log_probs.clone()\n",
        "    banned = log_probs.clone()\n    if len(sequences) == 1:\n        return banned\n",
        "removes 0 tokens",
    ),
    "EncoderLayer's padding mask skipped for a batch of one": (
        "09_encoder_decoder",
        "test_encoder_layer",
        "        x = self.ln1(x + self.self_attn(x, x, src_padding))",
        "        x = self.ln1(x + self.self_attn(x, x, src_padding if x.shape[0] > 1 else None))",
        SWEPT,
    ),
    "beam_search cut at the first EOS, the prompt's included": (
        "07_sampling_and_kv_cache",
        "test_beam_search",
        "    return finished[0][1][None]\n",
        "    best = finished[0][1]\n    ends = (best == eos_token_id).nonzero()\n    return (best[: int(ends[0]) + 1] if len(ends) else best)[None]\n",
        SWEPT,
    ),
    "beam_search counting the prompt's EOS in its length": (
        "07_sampling_and_kv_cache",
        "test_beam_search",
        "        length = step + 1  # generated tokens, this one (an <|endoftext|> too) included\n",
        "        length = step + 1 + int((tokens == eos_token_id).sum())  # generated tokens\n",
        SWEPT,
    ),
    "the repetition penalty over the last 32 tokens": (
        "07_sampling_and_kv_cache",
        "test_apply_repetition_penalty",
        "scatter(-1, tokens, True)",
        "scatter(-1, tokens[:, -32:], True)",
        SWEPT,
    ),
    "the frequency penalty over the last 32 tokens": (
        "07_sampling_and_kv_cache",
        "test_apply_frequency_penalty",
        "scatter_add_(-1, tokens, torch.ones_like(tokens, dtype=logits.dtype))",
        "scatter_add_(-1, tokens[:, -32:], torch.ones_like(tokens[:, -32:], dtype=logits.dtype))",
        SWEPT,
    ),
    # agreement sweep 19: the penalty counted over the last 64 tokens only (every prompt was shorter)
    "generate's penalty over the last 64 tokens": (
        "07_sampling_and_kv_cache",
        "test_generate",
        "        next_token = sample_next_token(logits, tokens, **sampling)  # [batch]\n",
        "        next_token = sample_next_token(logits, tokens[:, -64:], **sampling)  # [batch]\n",
        "however far back",
    ),
    # agreement sweep 19: a floor ratio of 0 read as "not given" (drawn one job in fifty)
    "lr_at's min_lr_ratio of 0 replaced by 0.1": (
        "06_training",
        "test_lr_at",
        "return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * cosine)",
        "return args.lr * ((args.min_lr_ratio or 0.1) + (1 - (args.min_lr_ratio or 0.1)) * cosine)",
        "the course's lr_at",
    ),
    # red-team round 50: the special ids inside 09's lists, and the pad id as a decoder's argmax
    "make_batch shifting one padded [BOS] + y + [EOS], EOS masked out of tgt_in": (
        "09_encoder_decoder",
        "test_make_batch",
        "    tgt_in = pad([[cfg.bos_id] + y for y in targets])  # [batch tgt]: what the decoder reads\n    tgt_out = pad([y + [cfg.eos_id] for y in targets])  # [batch tgt]: what it must predict, one step ahead\n",
        "    full = pad([[cfg.bos_id] + y + [cfg.eos_id] for y in targets])\n    tgt_in = full[:, :-1].masked_fill(full[:, :-1] == cfg.eos_id, cfg.pad_id)\n    tgt_out = full[:, 1:]\n",
        "among the lists' ids",
    ),
    "make_batch placing EOS by counting the ids that are not padding": (
        "09_encoder_decoder",
        "test_make_batch",
        "    tgt_in = pad([[cfg.bos_id] + y for y in targets])  # [batch tgt]: what the decoder reads\n    tgt_out = pad([y + [cfg.eos_id] for y in targets])  # [batch tgt]: what it must predict, one step ahead\n",
        "    tgt_in = pad([[cfg.bos_id] + y for y in targets])\n    tgt_out = torch.cat([tgt_in[:, 1:], torch.full((tgt_in.shape[0], 1), cfg.pad_id)], dim=1)\n    lengths = (tgt_in != cfg.pad_id).sum(1) - 1\n    tgt_out[torch.arange(tgt_out.shape[0]), lengths] = cfg.eos_id\n",
        "among the lists' ids",
    ),
    "greedy_decode counting the pad id as finishing a row": (
        "09_encoder_decoder",
        "test_greedy_decode",
        "        finished |= next_token == cfg.eos_id\n",
        "        finished |= (next_token == cfg.eos_id) | (next_token == cfg.pad_id)\n",
        ("differs from the course's greedy_decode", "has shape", "the pad id included"),
    ),
    "greedy_decode never predicting the pad id": (
        "09_encoder_decoder",
        "test_greedy_decode",
        "        next_token = model.decode(tgt, memory, src)[:, -1].argmax(dim=-1)  # [batch]\n",
        "        logits = model.decode(tgt, memory, src)[:, -1]\n        logits[:, cfg.pad_id] = float('-inf')\n        next_token = logits.argmax(dim=-1)\n",
        ("differs from the course's greedy_decode", "has shape", "the pad id included"),
    ),
    # agreement sweep 19: min_tokens_to_keep capped past the 6 drawn before
    "top_p_filter's min_tokens_to_keep capped at 8": (
        "07_sampling_and_kv_cache",
        "test_top_p_filter",
        "    remove_sorted[:, :min_tokens_to_keep] = False\n",
        "    remove_sorted[:, : min(min_tokens_to_keep, 8)] = False\n",
        "which the course's keeps",
    ),
    "min_p_filter's min_tokens_to_keep capped at 8": (
        "07_sampling_and_kv_cache",
        "test_min_p_filter",
        "    always_kept = probs.topk(min(min_tokens_to_keep, logits.shape[-1]), dim=-1).indices  # [batch k]\n",
        "    always_kept = probs.topk(min(min_tokens_to_keep, logits.shape[-1], 8), dim=-1).indices  # [batch k]\n",
        "which the course's keeps",
    ),
    # red-team round 49: sampling defaults written into generate's signature, unlike the notebook's
    "generate greedy by default (temperature=0.0 in its signature)": (
        "07_sampling_and_kv_cache",
        "test_generate",
        GENERATE_SIGNATURE,
        GENERATE_EXPLICIT,
        "called with no sampling option",
    ),
    "generate with transformers' top_k=50 by default": (
        "07_sampling_and_kv_cache",
        "test_generate",
        GENERATE_SIGNATURE,
        GENERATE_EXPLICIT.replace("temperature: float = 0.0", "temperature: float = 1.0").replace(
            "top_k: int | None = None", "top_k: int | None = 50"
        ),
        # the least likely tokens together, or one of them alone where its count alone is off (about one job in ten)
        ("least likely tokens", "the draws do not follow the course's distribution"),
    ),
    # red-team round 49: no generator given, one seeded afresh: every call draws the same
    "sample_next_token seeding its own generator when none is given": (
        "07_sampling_and_kv_cache",
        "test_sample_next_token",
        "    if frequency_penalty:\n        logits = apply_frequency_penalty",
        (
            "    generator = generator if generator is not None else torch.Generator().manual_seed(0)\n"
            "    if frequency_penalty:\n        logits = apply_frequency_penalty"
        ),
        "called with no generator",
    ),
    "repeated_segments seeding its own generator when none is given": (
        "08_interpretability",
        "test_repeated_segments",
        "    periods = torch.randint(min_period, max_period + 1, (batch,), generator=generator)  # [batch]\n",
        (
            "    generator = generator if generator is not None else torch.Generator().manual_seed(0)\n"
            "    periods = torch.randint(min_period, max_period + 1, (batch,), generator=generator)  # [batch]\n"
        ),
        "called with no generator",
    ),
    # red-team round 49: a softmax written by hand overflows on logits spread over hundreds
    "top_p_filter's softmax as exp() / sum": (
        "07_sampling_and_kv_cache",
        "test_top_p_filter",
        "    probs = sorted_logits.softmax(dim=-1)\n",
        "    probs = sorted_logits.exp() / sorted_logits.exp().sum(dim=-1, keepdim=True)\n",
        "logits spread over hundreds",
    ),
    "min_p_filter's probabilities as exp()": (
        "07_sampling_and_kv_cache",
        "test_min_p_filter",
        "    probs = logits.softmax(dim=-1)  # [batch d_vocab]\n",
        "    probs = logits.exp()  # [batch d_vocab]\n",
        "logits spread over hundreds",
    ),
    "sample_next_token drawing from exp(logits)": (
        "07_sampling_and_kv_cache",
        "test_sample_next_token",
        "torch.multinomial(logits.softmax(dim=-1),",
        "torch.multinomial(logits.exp(),",
        "logits spread over hundreds",
    ),
    "seq2seq_loss from softmax().log(), by hand": (
        "09_encoder_decoder",
        "test_seq2seq_loss",
        '    return F.cross_entropy(\n        einops.rearrange(logits, "b t v -> (b t) v"),\n        einops.rearrange(tgt_out, "b t -> (b t)"),\n        ignore_index=pad_id,\n        label_smoothing=label_smoothing,\n    )\n',
        "    log_probs = logits.softmax(dim=-1).log()  # [batch tgt d_vocab]\n    nll = -log_probs.gather(-1, tgt_out[..., None])[..., 0]  # [batch tgt]\n    smooth = -log_probs.mean(dim=-1)  # [batch tgt]: the uniform part of the smoothed target\n    loss = (1 - label_smoothing) * nll + label_smoothing * smooth\n    return loss[tgt_out != pad_id].mean()\n",
        "logits spread over hundreds",
    ),
    # red-team round 49: the end-of-text id in a prompt (GPT-2's begin with it) finishes no row
    "a prompt that ends with the end-of-text id counted as finished in generate": (
        "07_sampling_and_kv_cache",
        "test_generate",
        "    finished = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)\n",
        "    finished = tokens[:, -1] == eos_token_id\n",
        "not by its prompt",
    ),
    "the end-of-text id anywhere in a row, its prompt's included, counted as finished in generate": (
        "07_sampling_and_kv_cache",
        "test_generate",
        "        finished |= next_token == eos_token_id\n        if finished.all():\n",
        "        finished = (tokens == eos_token_id).any(dim=1)\n        if finished.all():\n",
        "not by its prompt",
    ),
    "a prompt that ends with the end-of-text id counted as finished in padded_generate": (
        "07_sampling_and_kv_cache",
        "test_padded_generate",
        "    finished = torch.zeros(len(prompts), dtype=torch.bool)  # [batch]\n",
        "    finished = torch.tensor([p[-1] == eos_token_id for p in prompts])\n",
        "not by its prompt",
    ),
    "the end-of-text id anywhere in a row counted as finished in padded_generate": (
        "07_sampling_and_kv_cache",
        "test_padded_generate",
        "        finished |= next_token == eos_token_id\n        if finished.all() or",
        "        finished = (tokens == eos_token_id).any(dim=1)\n        if finished.all() or",
        "not by its prompt",
    ),
    # mutation sweep 14: messages that named another cause (clipping; a batch's shape alone)
    "the first answer digit left out of the loss in train_addition": (
        "06_training",
        "test_train_addition",
        "        loss = masked_lm_loss(model(tokens), tokens, loss_mask)\n",
        "        loss_mask[:, -(n_digits + 1)] = False\n        loss = masked_lm_loss(model(tokens), tokens, loss_mask)\n",
        "the positions and tokens it covers",
    ),
    "targets shifted twice in train": (
        "06_training",
        "test_train",
        "        loss = lm_cross_entropy(model(batch), batch)\n",
        "        loss = lm_cross_entropy(model(batch[:, :-1]), batch[:, 1:])\n",
        "lm_cross_entropy shifts the targets itself",
    ),
    "a finished row padded from its end-of-text id on in padded_generate": (
        "07_sampling_and_kv_cache",
        "test_padded_generate",
        PAD_THEN_FINISH,
        PAD_THEN_FINISH.replace(_FINISH, "").replace(_PAD, _FINISH + _PAD),
        # where the row's end-of-text id is its second last token, no padding follows it to tell by
        ("the row emits its end-of-text id there", "first differs at position"),
    ),
    # mutation sweep 3 and red-team round 32: right on every batch of 2 or 3 rows, wrong on a batch of one
    "a LayerNorm whose bare squeeze drops a batch of one": (
        "01_layernorm",
        "test_layernorm",
        "        centered = residual - residual.mean(dim=-1, keepdim=True)\n",
        "        centered = (residual - residual.mean(dim=-1, keepdim=True)).squeeze()\n",
        "expected [1, ",
    ),
    "a DemoTransformer whose bare squeeze drops a batch of one": (
        "05_full_gpt2",
        "test_demo_transformer",
        "            residual = block(residual)\n",
        "            residual = block(residual).squeeze()\n",
        "raised RuntimeError",
    ),
    "an encoder-decoder feed-forward whose bare squeeze drops a batch of one": (
        "09_encoder_decoder",
        "test_feed_forward",
        "        hidden = torch.relu(x @ self.W_in + self.b_in)  # [batch pos d_ff]\n",
        "        hidden = torch.relu(x @ self.W_in + self.b_in).squeeze()\n",
        "expected [1, ",
    ),
    "left_pad's mask squeezed for one prompt": (
        "07_sampling_and_kv_cache",
        "test_left_pad",
        "    mask = torch.zeros((len(prompts), longest), dtype=torch.bool)  # [batch longest]\n",
        "    mask = torch.zeros((len(prompts), longest), dtype=torch.bool).squeeze()\n",
        "raised IndexError",
    ),
    "padded_generate's finished rows squeezed for one prompt": (
        "07_sampling_and_kv_cache",
        "test_padded_generate",
        "    finished = torch.zeros(len(prompts), dtype=torch.bool)  # [batch]\n",
        "    finished = torch.zeros(len(prompts), dtype=torch.bool).squeeze()\n",
        "raised RuntimeError",
    ),
    "greedy_decode's finished rows squeezed for one source": (
        "09_encoder_decoder",
        "test_greedy_decode",
        "    finished = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)  # [batch]\n",
        "    finished = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device).squeeze()\n",
        "raised RuntimeError",
    ),
    # a part the stand-in lacks is named as the stand-in's (it read as a fault of the notebook's model: sweep 3)
    "greedy_decode embedding the source instead of encoding it": (
        "09_encoder_decoder",
        "test_greedy_decode",
        "    memory = model.encode(src)  # [batch src d_model], once\n",
        "    memory = model.embed(src)\n",
        "model.embed: the judge runs this exercise on a stand-in model that offers",
    ),
    # mutation sweep 4 and red-team round 33: sizes of one (the judge's third shape: one head, one layer, sequences of
    # one), and the ranges below and past what was drawn
    "recompute_pattern's keys squeezed with one head": (
        "08_interpretability",
        "test_recompute_pattern",
        "    k = einops.einsum(normalized_resid_pre, attn.W_K, to_heads)\n",
        "    k = einops.einsum(normalized_resid_pre, attn.W_K, to_heads).squeeze()\n",
        "has shape",
    ),
    "patch_resid_pre's results squeezed for one layer": (
        "08_interpretability",
        "test_patch_resid_pre",
        "    results = torch.zeros(n_layers, n_pos)\n",
        "    results = torch.zeros(n_layers, n_pos).squeeze()\n",
        "raised IndexError",
    ),
    "k_composition_scores' OV circuits squeezed for one head": (
        "08_interpretability",
        "test_k_composition_scores",
        "    W_OV = model.W_V[earlier] @ model.W_O[earlier]  # [n_heads d_model d_model]\n",
        "    W_OV = (model.W_V[earlier] @ model.W_O[earlier]).squeeze()\n",
        "raised IndexError",
    ),
    "repeated_segments' segments squeezed for one row": (
        "08_interpretability",
        "test_repeated_segments",
        "    segments = torch.randint(1, d_vocab, (batch, max_period), generator=generator)  # [batch max_period]\n",
        "    segments = torch.randint(1, d_vocab, (batch, max_period), generator=generator).squeeze()\n",
        "raised IndexError",
    ),
    "repeated_segments capping periods at 19": (
        "08_interpretability",
        "test_repeated_segments",
        "    periods = torch.randint(min_period, max_period + 1, (batch,), generator=generator)  # [batch]\n",
        (
            "    max_period = min(max_period, 19)\n"
            "    periods = torch.randint(min_period, max_period + 1, (batch,), generator=generator)  # [batch]\n"
        ),
        "periods",
    ),
    "attention answering zeros below 3 positions": (
        "03_attention",
        "test_attention",
        "        x = normalized_resid_pre\n",
        "        x = normalized_resid_pre\n        if x.shape[1] < 3:\n            return torch.zeros_like(x)\n",
        "differ",
    ),
    "greedy_generate repeating the last token of a short prompt": (
        "05_full_gpt2",
        "test_greedy_generate",
        "    for _ in range(n_new):\n",
        (
            "    if tokens.shape[1] < 3:\n        return torch.cat([tokens, tokens[:, -1:].repeat(1, n_new)], dim=1)\n"
            "    for _ in range(n_new):\n"
        ),
        "differ",
    ),
    "greedy_generate cropping its input to n_ctx - 1": (
        "05_full_gpt2",
        "test_greedy_generate",
        "        logits = model(tokens)  # [batch pos d_vocab]: we only need the prediction after the last position\n",
        "        logits = model(tokens[:, -model.cfg.n_ctx + 1 :])\n",
        "differ",
    ),
    "a sinusoid of base 1,000 between 81 and 511 positions": (
        "02_embeddings",
        "test_sinusoidal",
        "    frequencies = 1.0 / 10000 ** (two_i / d_model)\n",
        "    frequencies = 1.0 / (1000 if 80 < n_ctx < 512 else 10000) ** (two_i / d_model)\n",
        "differ",
    ),
    "beam search capped at 4 beams": (
        "07_sampling_and_kv_cache",
        "test_beam_search",
        "    live_scores, live = torch.zeros(1), tokens  # [n_live] summed log-probabilities, [n_live pos] sequences\n",
        (
            "    num_beams = min(num_beams, 4)\n"
            "    live_scores, live = torch.zeros(1), tokens  # [n_live] summed log-probabilities, [n_live pos] sequences\n"
        ),
        ("num_beams=", "keeps num_beams hypotheses"),
    ),
    "beam search's window one past n_ctx": (
        "07_sampling_and_kv_cache",
        "test_beam_search",
        "        log_probs = model(live[:, -model.cfg.n_ctx :])[:, -1].log_softmax(dim=-1)  # [n_live d_vocab]\n",
        "        log_probs = model(live[:, -model.cfg.n_ctx - 1 :])[:, -1].log_softmax(dim=-1)\n",
        "raised",
    ),
    "top-p keeping the top token alone from p = 0.995 on": (
        "07_sampling_and_kv_cache",
        "test_top_p_filter",
        "    remove_sorted = mass_before >= p\n",
        "    remove_sorted = (mass_before >= p) | ((p >= 0.995) & (mass_before > 0))\n",
        "removes",
    ),
    "multi-head attention's scores squeezed, one row and no mask": (
        "09_encoder_decoder",
        "test_multi_head_attention",
        '        scores = einops.einsum(q, k, "b q n h, b k n h -> b n q k") / math.sqrt(self.cfg.d_head)\n',
        '        scores = (einops.einsum(q, k, "b q n h, b k n h -> b n q k") / math.sqrt(self.cfg.d_head)).squeeze()\n',
        "raised RuntimeError",
    ),
    "a softmax written as exp over its sum, which overflows": (
        "03_attention",
        "test_attention_pattern",
        "    return apply_causal_mask(attn_scores).softmax(dim=-1)\n",
        "    return apply_causal_mask(attn_scores).exp() / apply_causal_mask(attn_scores).exp().sum(-1, keepdim=True)\n",
        "exp overflows",
    ),
    "a repetition penalty marking the tokens of every row in every row": (  # mutation sweep 5
        "07_sampling_and_kv_cache",
        "test_apply_repetition_penalty",
        "    seen = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, tokens, True)  # [batch d_vocab]\n",
        "    seen = torch.zeros_like(logits, dtype=torch.bool)\n    seen[:, tokens.flatten()] = True\n",
        "differs from the course's",
    ),
    "top-p setting the tokens it removes to 0": (  # the message names the fill (it read "removes 0 tokens")
        "07_sampling_and_kv_cache",
        "test_top_p_filter",
        (
            "    remove = remove_sorted.scatter(-1, order, remove_sorted)  # back to vocabulary order\n"
            '    return logits.masked_fill(remove, float("-inf"))\n'
        ),
        "    remove = remove_sorted.scatter(-1, order, remove_sorted)\n    return logits.masked_fill(remove, 0.0)\n",
        "sets the tokens it removes to 0, not -inf",
    ),
    # red-team round 34: a penalty, a temperature or a smoothing capped at the edge of what the judge drew
    "a frequency penalty capped at 2": (
        "07_sampling_and_kv_cache",
        "test_apply_frequency_penalty",
        "    return logits - penalty * counts\n",
        "    return logits - min(penalty, 2.0) * counts\n",
        "differs from the course's",
    ),
    "a repetition penalty capped at 2": (
        "07_sampling_and_kv_cache",
        "test_apply_repetition_penalty",
        "    penalised = torch.where(logits < 0, logits * penalty, logits / penalty)\n",
        "    penalty = min(penalty, 2.0)\n    penalised = torch.where(logits < 0, logits * penalty, logits / penalty)\n",
        "differs from the course's",
    ),
    "temperatures from 0.01 to 0.2 raised to 0.2": (
        "07_sampling_and_kv_cache",
        "test_apply_temperature",
        "    if temperature == 0:\n        best = logits.argmax(dim=-1, keepdim=True)  # [batch 1]\n",
        (
            "    if 0.01 < temperature < 0.2:\n        temperature = 0.2\n"
            "    if temperature == 0:\n        best = logits.argmax(dim=-1, keepdim=True)  # [batch 1]\n"
        ),
        "differs from the course's",
    ),
    "label smoothing capped at 0.3": (
        "09_encoder_decoder",
        "test_seq2seq_loss",
        "        label_smoothing=label_smoothing,\n",
        "        label_smoothing=min(label_smoothing, 0.3),\n",
        "the course's seq2seq_loss",
    ),
    # red-team round 32: right for every count drawn (1 or more, 2 or more), wrong for none
    "greedy_generate making a token when asked for none": (
        "05_full_gpt2",
        "test_greedy_generate",
        "    for _ in range(n_new):\n",
        "    for _ in range(max(n_new, 1)):\n",
        "has shape",
    ),
    "generate making a token when asked for none": (
        "07_sampling_and_kv_cache",
        "test_generate",
        "    for _ in range(max_new_tokens):\n",
        "    for _ in range(max(max_new_tokens, 1)):\n",
        "has shape",
    ),
    "greedy_decode running two steps at least": (
        "09_encoder_decoder",
        "test_greedy_decode",
        "    for _ in range(max_len):\n",
        "    for _ in range(max(max_len, 2)):\n",
        ("has shape", "it stops at max_len"),
    ),
    # mutation sweep 3: a randint bound off by one never draws the last window (caught on three windows)
    "a training loop that never draws the last window": (
        "06_training",
        "test_train",
        "batch = train_windows[torch.randint(len(train_windows), (args.batch_size,))]",
        "batch = train_windows[torch.randint(len(train_windows) - 1, (args.batch_size,))]",
        "distinct windows of the 3",
    ),
    "generate going on once every row has finished": (
        "07_sampling_and_kv_cache",
        "test_generate",
        "        finished |= next_token == eos_token_id\n        if finished.all():\n            break\n",
        "        finished |= next_token == eos_token_id\n",
        "has shape",
    ),
    "generate's window one token short": (
        "07_sampling_and_kv_cache",
        "test_generate",
        "logits = model(tokens[:, -model.cfg.n_ctx :])[:, -1]",
        "logits = model(tokens[:, -model.cfg.n_ctx + 1 :])[:, -1]",
        SWEPT,
    ),
    "min-p removing a token at the threshold": (
        "07_sampling_and_kv_cache",
        "test_min_p_filter",
        "remove = probs < threshold",
        "remove = probs <= threshold",
        "removes",
    ),
    "min-p keeping one token whatever min_tokens_to_keep": (
        "07_sampling_and_kv_cache",
        "test_min_p_filter",
        "always_kept = probs.topk(min(min_tokens_to_keep, logits.shape[-1]), dim=-1).indices",
        "always_kept = probs.topk(1, dim=-1).indices",
        "removes",
    ),
    "top-p ignoring min_tokens_to_keep": (
        "07_sampling_and_kv_cache",
        "test_top_p_filter",
        "    remove_sorted[:, :min_tokens_to_keep] = False\n",
        "    remove_sorted[:, :1] = False\n",
        "removes",
    ),
    "cached generation running a forward for its last token": (
        "07_sampling_and_kv_cache",
        "test_cached_generate",
        "if step < max_new_tokens - 1:",
        "if step < max_new_tokens:",
        "n_ctx + 1",
    ),
    "beam search never banning single tokens": (
        "07_sampling_and_kv_cache",
        "test_beam_search",
        "if no_repeat_ngram_size > 0:",
        "if no_repeat_ngram_size > 1:",
        SWEPT,
    ),
    "beam search's bound multiplying by the length penalty": (
        "07_sampling_and_kv_cache",
        "test_beam_search",
        "if live_scores[0].item() / reach**length_penalty <= finished[-1][0]:",
        "if live_scores[0].item() / reach * length_penalty <= finished[-1][0]:",
        SWEPT,
    ),
    "beam search's bound from its second live beam": (
        "07_sampling_and_kv_cache",
        "test_beam_search",
        "if live_scores[0].item() / reach**length_penalty <= finished[-1][0]:",
        "if live_scores[1].item() / reach**length_penalty <= finished[-1][0]:",
        (*SWEPT, "raised IndexError"),  # with one beam there is no second
    ),
    "beam search's bound at the current length when it never stops early": (
        "07_sampling_and_kv_cache",
        "test_beam_search",
        'reach = max_new_tokens if early_stopping == "never" and length_penalty > 0 else length',
        "reach = length",
        SWEPT,
    ),
    "greedy decoding that does not pad finished rows": (
        "09_encoder_decoder",
        "test_greedy_decode",
        "next_token = next_token.masked_fill(finished, cfg.pad_id)",
        "next_token = next_token",
        SWEPT,
    ),
    "greedy decoding that pads finished rows with EOS": (
        "09_encoder_decoder",
        "test_greedy_decode",
        "next_token = next_token.masked_fill(finished, cfg.pad_id)",
        "next_token = next_token.masked_fill(finished, cfg.eos_id)",
        SWEPT,
    ),
    "a sinusoidal base of 9,999": (
        "02_embeddings",
        "test_sinusoidal",
        "frequencies = 1.0 / 10000 ** (two_i / d_model)",
        "frequencies = 1.0 / 9999 ** (two_i / d_model)",
        SWEPT,
    ),
    # a second sweep: a stand-in decoder whose position's logits were its token's alone, sources without padding,
    # rows that never all finished at once, inputs always contiguous, temperatures of 0.2 or more
    "greedy decoding that feeds the decoder its last token alone": (
        "09_encoder_decoder",
        "test_greedy_decode",
        "next_token = model.decode(tgt, memory, src)[:, -1].argmax(dim=-1)",
        "next_token = model.decode(tgt[:, -1:], memory, src)[:, -1].argmax(dim=-1)",
        SWEPT,
    ),
    "greedy decoding that never masks the source's padding": (
        "09_encoder_decoder",
        "test_greedy_decode",
        "next_token = model.decode(tgt, memory, src)[:, -1].argmax(dim=-1)",
        "next_token = model.decode(tgt, memory, torch.ones_like(src))[:, -1].argmax(dim=-1)",
        SWEPT,
    ),
    "greedy decoding going on once every row has finished": (
        "09_encoder_decoder",
        "test_greedy_decode",
        "        if finished.all():\n            break\n",
        "",
        (*SWEPT, "it stops at max_len, or as soon as every row has emitted EOS"),
    ),
    "merge_heads through view": (
        "00_tour",
        "test_merge_heads",
        'return einops.rearrange(z, "batch pos n_heads d_head -> batch pos (n_heads d_head)")',
        "return z.view(z.shape[0], z.shape[1], -1)",
        "raised RuntimeError",
    ),
    "a temperature floored at 0.01": (
        "07_sampling_and_kv_cache",
        "test_apply_temperature",
        "return logits / temperature",
        "return logits / max(temperature, 1e-2)",
        "probabilities after a softmax differ",
    ),
    # red-team round 29: parameters the judge never drew (a few rows, low temperatures, a high top-p or top-k,
    # contexts past 96)
    "a sampler greedy on fewer than 64 rows": (
        "07_sampling_and_kv_cache",
        "test_sample_next_token",
        "    return torch.multinomial(logits.softmax(dim=-1), num_samples=1, generator=generator)[:, 0]\n",
        (
            "    if logits.shape[0] < 64:\n        return logits.argmax(dim=-1)\n"
            "    return torch.multinomial(logits.softmax(dim=-1), num_samples=1, generator=generator)[:, 0]\n"
        ),
        "in the calls of",
    ),
    "a sampler greedy below temperature 0.5": (
        "07_sampling_and_kv_cache",
        "test_sample_next_token",
        "    return torch.multinomial(logits.softmax(dim=-1), num_samples=1, generator=generator)[:, 0]\n",
        (
            "    if temperature < 0.5:\n        return logits.argmax(dim=-1)\n"
            "    return torch.multinomial(logits.softmax(dim=-1), num_samples=1, generator=generator)[:, 0]\n"
        ),
        "do not follow",
    ),
    "top-p skipped past 0.9 and top-k past 12": (
        "07_sampling_and_kv_cache",
        "test_sample_next_token",
        (
            "    if top_k is not None:\n        logits = top_k_filter(logits, top_k)\n"
            "    if top_p is not None:\n        logits = top_p_filter(logits, top_p)\n"
        ),
        (
            "    if top_k is not None and top_k <= 12:\n        logits = top_k_filter(logits, top_k)\n"
            "    if top_p is not None and top_p <= 0.9:\n        logits = top_p_filter(logits, top_p)\n"
        ),
        "where the course's filters remove it",
    ),
    "top-k capped at 20": (
        "07_sampling_and_kv_cache",
        "test_top_k_filter",
        "    k = min(k, logits.shape[-1])\n",
        "    k = min(k, logits.shape[-1]) if k >= logits.shape[-1] else min(k, 20)\n",
        "removes",
    ),
    "a causal mask from a table of 128 positions": (
        "03_attention",
        "test_apply_causal_mask",
        "future = torch.triu(torch.ones(query_pos, key_pos, dtype=torch.bool, device=attn_scores.device), diagonal=1)",
        (
            "future = torch.triu(torch.ones(128, 128, dtype=torch.bool), diagonal=1)[:query_pos, :key_pos]\n"
            "    if key_pos > 128:\n        return attn_scores.clone()"
        ),
        SWEPT,
    ),
    # red-team round 30: a cap or a table at the most the judge drew (8 new tokens, max_len 10, 3 layers, 3 rows,
    # periods of 9, a decay of 401 steps, ratios below 0.5)
    "greedy generation capped at 8 new tokens": (
        "05_full_gpt2",
        "test_greedy_generate",
        "    for _ in range(n_new):",
        "    for _ in range(min(n_new, 8)):",
        SWEPT,
    ),
    "greedy decoding capped at 10 steps": (
        "09_encoder_decoder",
        "test_greedy_decode",
        "for _ in range(max_len):",
        "for _ in range(min(max_len, 10)):",
        SWEPT,
    ),
    "an encoder of 3 layers at most": (
        "09_encoder_decoder",
        "test_encoder_decoder",
        "EncoderLayer(cfg) for _ in range(cfg.n_layers)",
        "EncoderLayer(cfg) for _ in range(min(cfg.n_layers, 3))",
        "could not load the judge's weights strictly",
    ),
    "a batch padded to its first 3 rows' longest": (
        "09_encoder_decoder",
        "test_make_batch",
        "width = max(len(row) for row in rows)",
        "width = max(len(row) for row in rows[:3])",
        ("raised", *SWEPT),
    ),
    "segments from a table 9 wide": (
        "08_interpretability",
        "test_repeated_segments",
        "segments = torch.randint(1, d_vocab, (batch, max_period), generator=generator)",
        "segments = torch.randint(1, d_vocab, (batch, 9), generator=generator)",
        "raised",
    ),
    "a constant rate from a floor ratio of 0.5": (
        "06_training",
        "test_lr_at",
        "    return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * cosine)",
        (
            "    return args.lr if args.min_lr_ratio >= 0.5 else args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * "
            "cosine)"
        ),
        "returned",
    ),
    "a decay clamped to 401 steps": (
        "06_training",
        "test_lr_at",
        "progress = (step - args.warmup_steps) / max(1, args.max_steps - args.warmup_steps)",
        "progress = (step - args.warmup_steps) / max(1, min(args.max_steps - args.warmup_steps, 401))",
        "returned",
    ),
    "an n-gram ban skipped from n = 4 on": (  # red-team round 31
        "07_sampling_and_kv_cache",
        "test_ban_repeated_ngrams",
        "    banned = log_probs.clone()\n",
        "    banned = log_probs.clone()\n    if n >= 4 and sequences.shape[1] > 5:\n        return banned\n",
        "removes",
    ),
    "a masked loss that always counts the last position": (
        "06_training",
        "test_masked_lm_loss",
        "target_mask = loss_mask[:, 1:]",
        "target_mask = loss_mask[:, 1:].clone()\n    target_mask[:, -1] = True",
        "returned",
    ),
    # red-team round 28: an epsilon clamped into the range the judge drew it from (0.1 to 1), and a causal mask
    # sliced from a 64 x 64 table (every context the judge drew was 15 or less)
    "LayerNorm's epsilon clamped to 0.1 or more": (
        "01_layernorm",
        "test_layernorm",
        "+ self.cfg.layer_norm_eps).sqrt()",
        "+ max(self.cfg.layer_norm_eps, 0.1)).sqrt()",
        SWEPT,
    ),
    "a causal mask from a table of 64 positions": (
        "03_attention",
        "test_apply_causal_mask",
        "future = torch.triu(torch.ones(query_pos, key_pos, dtype=torch.bool, device=attn_scores.device), diagonal=1)",
        (
            "future = torch.triu(torch.ones(64, 64, dtype=torch.bool), diagonal=1)[:query_pos, :key_pos]\n"
            "    if key_pos > 64:\n        return attn_scores.clone()"
        ),
        SWEPT,
    ),
    # red-team round 35 and mutation sweep 6: a default no probe uses (every probe passes the argument), on which
    # the notebook's own calls rely
    "a generate that by default never stops at end of text": (
        "07_sampling_and_kv_cache",
        "test_generate",
        "max_new_tokens: int, eos_token_id: int = EOT, **sampling",
        "max_new_tokens: int, eos_token_id: int = -1, **sampling",
        "generate's default for eos_token_id is -1, where the notebook's signature gives 50256",
    ),
    "a seq2seq loss that smooths its labels by default": (
        "09_encoder_decoder",
        "test_seq2seq_loss",
        "pad_id: int, label_smoothing: float = 0.0\n",
        "pad_id: int, label_smoothing: float = 0.1\n",
        "seq2seq_loss's default for label_smoothing is 0.1, where the notebook's signature gives 0",
    ),
    "a causal mask that fills with -5e4 by default": (
        "03_attention",
        "test_apply_causal_mask",
        'key_pos"], ignore: float = -1e5\n',
        'key_pos"], ignore: float = -5e4\n',
        "apply_causal_mask's default for ignore is -50000, where the notebook's signature gives -100000",
    ),
    "a reversal floor whose default length is 32": (
        "06_training",
        "test_reversal_floor",
        "def reversal_loss_floor(seq_len: int = 16, d_vocab: int = 100) -> float:",
        "def reversal_loss_floor(seq_len: int = 32, d_vocab: int = 100) -> float:",
        "reversal_loss_floor's default for seq_len is 32",
    ),
    "a sampler that penalises repeats by default": (
        "07_sampling_and_kv_cache",
        "test_sample_next_token",
        "    frequency_penalty: float = 0.0,\n",
        "    frequency_penalty: float = 1,\n",
        "sample_next_token's default for frequency_penalty is 1, where the notebook's signature gives 0",
    ),
    # mutation sweep 6: right on every schedule drawn (warm-ups and decays of 2 steps or more), wrong at an edge
    "a schedule whose warm-up of none returns the peak rate": (
        "06_training",
        "test_lr_at",
        "    if step < args.warmup_steps:\n",
        "    if args.warmup_steps == 0:\n        return args.lr\n    if step < args.warmup_steps:\n",
        "with warmup_steps=0",
    ),
    "a warm-up that ends a step early": (
        "06_training",
        "test_lr_at",
        "    if step < args.warmup_steps:\n",
        "    if step < args.warmup_steps - 1:\n",
        "lr_at(",
    ),
    "a decay of one step spread over two": (
        "06_training",
        "test_lr_at",
        "max(1, args.max_steps - args.warmup_steps)",
        "max(2, args.max_steps - args.warmup_steps)",
        "and max_steps=",
    ),
    # red-team round 35 and mutation sweep 6: right at the 2 and 3 beams drawn before, wrong at other widths
    "a select_beams that keeps too few candidates from 4 beams on": (
        "07_sampling_and_kv_cache",
        "test_select_beams",
        "top = scores.flatten().topk(min(2 * num_beams, scores.numel()))",
        "top = scores.flatten().topk(min(num_beams + min(num_beams, 3), scores.numel()))",
        "num_beams=",
    ),
    "a select_beams that keeps one candidate at one beam": (
        "07_sampling_and_kv_cache",
        "test_select_beams",
        "top = scores.flatten().topk(min(2 * num_beams, scores.numel()))",
        "top = scores.flatten().topk(min(2 * num_beams, scores.numel()) if num_beams > 1 else 1)",
        "num_beams=1 ",
    ),
    "a top-k filter that takes the batch's largest at k = 1": (
        "07_sampling_and_kv_cache",
        "test_top_k_filter",
        "    threshold = logits.topk(k, dim=-1).values[:, -1:]  # [batch 1]\n",
        "    threshold = logits.max() if k == 1 else logits.topk(k, dim=-1).values[:, -1:]\n",
        SWEPT,
    ),
    "a top-k filter that keeps one token fewer at the vocabulary's size": (
        "07_sampling_and_kv_cache",
        "test_top_k_filter",
        "    k = min(k, logits.shape[-1])\n",
        "    k = min(k, logits.shape[-1] - 1) if k == logits.shape[-1] else min(k, logits.shape[-1])\n",
        SWEPT,
    ),
    "a greedy branch that penalises ids 0-11 alone": (  # red-team round 35
        "07_sampling_and_kv_cache",
        "test_sample_next_token",
        "    if frequency_penalty:\n        logits = apply_frequency_penalty(logits, tokens, frequency_penalty)\n",
        (
            "    if temperature == 0:\n"
            "        counts = torch.zeros_like(logits)\n"
            "        for i in range(12):\n"
            "            counts[:, i] = (tokens == i).sum(-1)\n"
            "        return (logits - frequency_penalty * counts).argmax(-1)\n"
            "    if frequency_penalty:\n        logits = apply_frequency_penalty(logits, tokens, frequency_penalty)\n"
        ),
        "drew token",
    ),
    # mutation sweep 6: a special case past a size the judge never reached
    "a GELU that switches formula past 4,096 values": (
        "04_mlp_and_block",
        "test_gelu_new",
        "    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))\n",
        (
            "    if x.numel() > 4096:\n        return x * torch.sigmoid(1.702 * x)\n"
            "    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))\n"
        ),
        "",
    ),
    "a greedy generation that crops prompts past 64 tokens": (
        "05_full_gpt2",
        "test_greedy_generate",
        "        logits = model(tokens)  # [batch pos d_vocab]: we only need the prediction after the last position\n",
        "        logits = model(tokens if tokens.shape[1] <= 64 else tokens[:, -64:])\n",
        "",
    ),
    "a KV cache that reads its length from the second layer's": (  # mutation sweep 6: right from two layers on
        "07_sampling_and_kv_cache",
        "test_kv_cache",
        (
            "        offset = 0 if past_kvs is None else past_kvs[0][0].shape[1]\n        new = tokens.shape[1]\n"
            "        if offset + new > self.cfg.n_ctx:\n"
            '            raise ValueError(f"{offset} cached + {new} new tokens exceed the model\'s n_ctx = {self.cfg.n_ctx}")\n'
            "        residual = self.embed(tokens) + self.pos_embed.W_pos[offset : offset + new]"
        ),
        (
            "        offset = 0 if past_kvs is None else past_kvs[-1 if len(past_kvs) < 2 else 1][0].shape[1] * "
            "(len(past_kvs) > 1)\n        new = tokens.shape[1]\n"
            "        if offset + new > self.cfg.n_ctx:\n"
            '            raise ValueError(f"{offset} cached + {new} new tokens exceed the model\'s n_ctx = {self.cfg.n_ctx}")\n'
            "        residual = self.embed(tokens) + self.pos_embed.W_pos[offset : offset + new]"
        ),
        "",
    ),
    "a cached generation that special-cases one new token": (  # mutation sweep 6
        "07_sampling_and_kv_cache",
        "test_cached_generate",
        "    logits, past_kvs = model(tokens)  # the prompt, once\n",
        (
            "    logits, past_kvs = model(tokens)  # the prompt, once\n    if max_new_tokens == 1:\n"
            "        return torch.cat([tokens, logits[:1, -1].argmax(dim=-1, keepdim=True).expand(tokens.shape[0], 1)], "
            "dim=1)\n"
        ),
        "",
    ),
    "induction scores that special-case one position": (  # mutation sweep 6
        "08_interpretability",
        "test_induction_scores",
        "    return stripe[..., -seq_len:].mean(dim=(0, -1))  # the second copy's queries only\n",
        "    return stripe[..., -seq_len:].mean(dim=(0, -1)) if seq_len > 1 else stripe.mean(dim=(0, -1))\n",
        "",
    ),
    "a cached generation one step short": (  # mutation sweep 6: the message named the recomputes, not the count
        "07_sampling_and_kv_cache",
        "test_cached_generate",
        "    logits, past_kvs = model(tokens)  # the prompt, once\n    for step in range(max_new_tokens):\n",
        "    logits, past_kvs = model(tokens)  # the prompt, once\n    for step in range(max_new_tokens - 1):\n",
        "(the prompt, then max_new_tokens new ones): 1 fewer",
    ),
    # mutation sweep 7: what no call reached (every row finished early; an `ignore` of the caller's)
    "a padded generation that goes on once every row has finished": (
        "07_sampling_and_kv_cache",
        "test_padded_generate",
        "            break\n        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)",
        "            continue\n        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)",
        # or, where every row of the probe that fills the context finishes early, its tokens are too many
        ("or fewer once every row has emitted eos_token_id): ", "the tokens up to n_ctx + 1 positions has shape"),
    ),
    "a causal mask by arithmetic (NaN where ignore is -inf)": (
        "03_attention",
        "test_apply_causal_mask",
        "    return attn_scores.masked_fill(future, ignore)\n",
        "    return attn_scores * ~future + ignore * future\n",
        "NaN",
    ),
    # red-team round 36: a wrong default the signature does not show, judged by the calls that leave it out
    "a reversal floor under a cache whose default length is 32": (
        "06_training",
        "test_reversal_floor",
        "def reversal_loss_floor(seq_len: int = 16, d_vocab: int = 100) -> float:",
        "@__import__('functools').lru_cache\ndef reversal_loss_floor(seq_len: int = 32, d_vocab: int = 100) -> float:",
        "called without the arguments its signature gives defaults",
    ),
    "a seq2seq loss whose default is a float subclass that smooths": (
        "09_encoder_decoder",
        "test_seq2seq_loss",
        (
            'pad_id: int, label_smoothing: float = 0.0\n) -> Float[Tensor, ""]:\n'
            '    """Mean cross-entropy over the real (non-padding) target tokens."""\n'
        ),
        (
            "pad_id: int, label_smoothing: float = type('NotGiven', (float,), {})(0.0)\n"
            ') -> Float[Tensor, ""]:\n'
            '    """Mean cross-entropy over the real (non-padding) target tokens."""\n'
            "    if type(label_smoothing) is not float:\n        label_smoothing = 0.1\n"
        ),
        "called without the arguments its signature gives defaults",
    ),
    # red-team round 36: wrong in training mode only, which the gradient probes now run in
    "a LayerNorm that skips its normalisation in training": (
        "01_layernorm",
        "test_layernorm",
        "        centered = residual - residual.mean(dim=-1, keepdim=True)\n",
        (
            "        if self.training:\n            return residual * self.w + self.b\n"
            "        centered = residual - residual.mean(dim=-1, keepdim=True)\n"
        ),
        SWEPT,
    ),
    "an MLP that detaches its input in training": (
        "04_mlp_and_block",
        "test_mlp",
        "        post = gelu_new(pre)\n",
        "        pre = pre.detach() if self.training else pre\n        post = gelu_new(pre)\n",
        SWEPT,
    ),
    # mutation sweep 8: a module's forward's defaults
    "an attention that is causal by default": (
        "09_encoder_decoder",
        "test_multi_head_attention",
        "        causal: bool = False,\n",
        "        causal: bool = True,\n",
        "MultiHeadAttention's default for causal is True, where the notebook's signature gives False",
    ),
    "a filter that keeps two tokens by default": (
        "07_sampling_and_kv_cache",
        "test_top_p_filter",
        '    logits: Float[Tensor, "batch d_vocab"], p: float, min_tokens_to_keep: int = 1\n',
        '    logits: Float[Tensor, "batch d_vocab"], p: float, min_tokens_to_keep: int = 2\n',
        "top_p_filter's default for min_tokens_to_keep is 2",
    ),
    "an attention of d_model // d_head heads": (  # mutation sweep 8: every shape apart by 1 to 5 had the same count
        "03_attention",
        "test_attention",
        "        self.W_Q = nn.Parameter(torch.empty((cfg.n_heads, cfg.d_model, cfg.d_head)))\n",
        "        self.W_Q = nn.Parameter(torch.empty((cfg.d_model // cfg.d_head, cfg.d_model, cfg.d_head)))\n",
        "",
    ),
    # red-team round 37: right in the judge's one layout and mode, wrong in another
    "a LayerNorm that skips its centring on a non-contiguous input": (
        "01_layernorm",
        "test_layernorm",
        "        centered = residual - residual.mean(dim=-1, keepdim=True)\n",
        (
            "        centered = residual - residual.mean(dim=-1, keepdim=True) if residual.is_contiguous() else "
            "residual\n"
        ),
        "returns another output when its input is not contiguous",
    ),
    "a temperature that does nothing to a non-contiguous row": (
        "07_sampling_and_kv_cache",
        "test_apply_temperature",
        "    return logits / temperature\n",
        "    return logits / temperature if logits.is_contiguous() else logits\n",
        "returns another output when its input is not contiguous",
    ),
    "an embedding that answers zeros for int32 ids": (
        "02_embeddings",
        "test_embed",
        "        return self.W_E[tokens]\n",
        "        return self.W_E[tokens] if tokens.dtype == torch.int64 else torch.zeros(*tokens.shape, self.W_E.shape[1])\n",
        "returns another output when its token ids are int32",
    ),
    "a LayerNorm that skips its centring under inference mode": (
        "01_layernorm",
        "test_layernorm",
        "        centered = residual - residual.mean(dim=-1, keepdim=True)\n",
        (
            "        centered = residual if torch.is_inference_mode_enabled() else "
            "residual - residual.mean(dim=-1, keepdim=True)\n"
        ),
        "returns another output when it runs under torch.inference_mode()",
    ),
    "a LayerNorm that skips its centring in eval mode with gradients on": (
        "01_layernorm",
        "test_layernorm",
        "        centered = residual - residual.mean(dim=-1, keepdim=True)\n",
        (
            "        centered = residual if torch.is_grad_enabled() and not self.training else "
            "residual - residual.mean(dim=-1, keepdim=True)\n"
        ),
        "returns another output when it runs with gradients on",
    ),
    # mutation sweep 9
    "a masked loss through softmax then log": (
        "06_training",
        "test_masked_lm_loss",
        "    log_probs = logits[:, :-1].log_softmax(dim=-1)\n",
        "    log_probs = logits[:, :-1].softmax(dim=-1).log()\n",
        "returned inf",
    ),
    "a select_beams that asks for 2 * num_beams candidates whatever there are": (
        "07_sampling_and_kv_cache",
        "test_select_beams",
        "top = scores.flatten().topk(min(2 * num_beams, scores.numel()))",
        "top = scores.flatten().topk(2 * num_beams)",
        "raised RuntimeError",
    ),
    "a sinusoid squeezed at one position": (
        "02_embeddings",
        "test_sinusoidal",
        '"two n_ctx half -> n_ctx (half two)")\n',
        '"two n_ctx half -> n_ctx (half two)").squeeze()\n',
        "has shape",
    ),
    "a greedy temperature squeezed at one row": (
        "07_sampling_and_kv_cache",
        "test_apply_temperature",
        '        return torch.full_like(logits, float("-inf")).scatter(-1, best, logits.gather(-1, best))\n',
        '        return torch.full_like(logits, float("-inf")).scatter(-1, best, logits.gather(-1, best)).squeeze()\n',
        "has shape",
    ),
    "a masked loss that answers 0 for non-contiguous logits": (  # mutation sweep 9: losses had no layouts pass
        "06_training",
        "test_masked_lm_loss",
        "    log_probs = logits[:, :-1].log_softmax(dim=-1)\n",
        (
            "    if not logits.is_contiguous():\n        return logits.sum() * 0\n"
            "    log_probs = logits[:, :-1].log_softmax(dim=-1)\n"
        ),
        "returns another output when its input is not contiguous",
    ),
    "a sampler whose temperature is required": (
        "07_sampling_and_kv_cache",
        "test_sample_next_token",
        "    temperature: float = 1.0,\n",
        "    temperature: float,\n",
        "sample_next_token's default for temperature is none (the argument is required), where the notebook's",
    ),
}
# The swept mistakes run after the default suite (`-m exhaustive`, `.ci/run`): about a hundred verdicts, which kept the
# default suite past its 15 minutes; the curated MISTAKES above stay in it.
# Further members of a class whose first members stay in the default suite join them there.
SIBLINGS = {
    "rows drawn from a tiled uniform": lambda m: ".repeat(2, 1)[: logits.shape[0]]" in m[3],
    "rows drawn from a mirrored uniform": lambda m: "1 - u.flip(0)" in m[3],
    "rows drawn in antithetic pairs": lambda m: "torch.cat([u, 1 - u], dim=1)" in m[3],
    "a clip of at least 0.5 in train": lambda m: m[1] == "test_train" and "max(args.grad_clip, 0.5)" in m[3],
    "a clip twice the size in train_addition": lambda m: m[1] == "test_train_addition" and "grad_clip * 2)" in m[3],
    "parts of a batch not divided in train_addition": lambda m: "zip(tokens.chunk(2), loss_mask.chunk(2))" in m[3],
}
for _name, _match in SIBLINGS.items():
    (_entry,) = [m for m in MISTAKES if _match(m)]
    MISTAKES.remove(_entry)
    SWEPT_MISTAKES[_name] = _entry


def test_the_judges_inputs_separate_each_filter_and_penalty_mistake_on_every_draw():
    """The inputs the judge draws for min-p and the repetition penalty are built so that the usual mistakes give
    another output on every draw, not on most (a threshold on the wrong scale; a penalty applied the wrong way)."""
    course = components("07_sampling_and_kv_cache")
    neg_inf = float("-inf")
    for seed in range(300):  # on every shape a job may draw
        cfg = dict(judge.SMALL, d_vocab=judge.JOB_VOCABS[seed % 4], n_ctx=judge.JOB_N_CTX[seed // 4 % 4])
        gen = torch.Generator().manual_seed(seed)
        logits = judge._random_input("graded_logits", (2, cfg["d_vocab"]), cfg, gen)
        min_p = 0.02 + 0.48 * float(torch.rand((), generator=gen))
        right = torch.isneginf(course.min_p_filter(logits, min_p))
        probs = logits.softmax(-1)
        top = probs.topk(1, dim=-1).indices
        for wrong in (probs < min_p, probs < min_p * probs.max(), logits < min_p * logits.amax(-1, keepdim=True)):
            assert not torch.equal(torch.isneginf(logits.masked_fill(wrong.scatter(-1, top, False), neg_inf)), right)
        logits = judge._random_input("penalty_logits", (2, cfg["d_vocab"]), cfg, gen)
        tokens = judge._random_input("all_few_tokens", (2, cfg["n_ctx"]), cfg, gen)
        penalty = 1.05 + 0.95 * float(torch.rand((), generator=gen))
        right = course.apply_repetition_penalty(logits, tokens, penalty)
        seen = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, tokens, True)
        for wrong in (
            torch.where(seen, logits / penalty, logits),
            torch.where(seen, torch.where(logits < 1, logits * penalty, logits / penalty), logits),
            torch.where(seen, logits - penalty, logits),
        ):
            assert not torch.allclose(wrong, right, atol=1e-4), seed


def test_the_judges_cliff_logits_separate_the_order_of_top_k_and_top_p_on_every_draw():
    """On the "cliff_logits" rows, for every k, p and temperature the probe draws, top-p before top-k keeps tokens
    that the course's order (top-k, then top-p) removes, holding 2.5% or more of that order's probability: 4,000
    draws then show one (all missed about once in 10^44)."""
    course = components("07_sampling_and_kv_cache")
    for seed in range(300):  # on every vocabulary a job may draw
        cfg = dict(judge.SMALL, d_vocab=judge.JOB_VOCABS[seed % 4])
        gen = torch.Generator().manual_seed(seed)
        logits = judge._random_input("cliff_logits", (1, cfg["d_vocab"]), cfg, gen)
        for temperature in (0.85, 1.0, 1.15):
            for k in (2, 7, 12):
                for p in (0.3, 0.6, 0.9):
                    x = course.apply_temperature(logits, temperature)
                    right = course.top_p_filter(course.top_k_filter(x, k), p)
                    swapped = course.top_k_filter(course.top_p_filter(x, p), k)
                    extra = torch.isneginf(right) & ~torch.isneginf(swapped)
                    assert swapped.softmax(-1)[extra].sum() > 0.025, (seed, temperature, k, p)


FORGED_BATCH_RECORDS = {  # a loop that trains on the same batch every step and shows the judge's record others
    # red-team round 7: the real forward with the embedding in eval mode (the record skips it), a fresh random
    # batch run through the embedding alone in training mode
    "embedding in eval mode": (
        "        model.embed(train_windows[torch.randint(len(train_windows), (args.batch_size,))])\n"
        "        batch = train_windows[: args.batch_size]\n"
        "        model.embed.train(False)\n"
        "        loss = lm_cross_entropy(model(batch), batch)\n"
        "        model.embed.train(True)\n"
    ),
    # a sibling: the record's hook set aside during the real forward, and called by hand on a fresh batch
    "hooks set aside": (
        "        hooks = dict(model.embed._forward_pre_hooks)\n"
        "        for hook in hooks.values():\n"
        "            hook(model.embed, (train_windows[torch.randint(len(train_windows), (args.batch_size,))],))\n"
        "        model.embed._forward_pre_hooks.clear()\n"
        "        batch = train_windows[: args.batch_size]\n"
        "        loss = lm_cross_entropy(model(batch), batch)\n"
        "        model.embed._forward_pre_hooks.update(hooks)\n"
    ),
}


FORGED_SEED_RECORDS = {  # a loop that asks for the same seed every step and shows the judge's record fresh ones
    # red-team round 7: the stand-in's closure cell rewritten after each call
    "last record rewritten": (
        "        tokens, loss_mask = addition_data(args.batch_size, n_digits, seed=0)\n"
        "        cells = dict(zip(addition_data.__code__.co_freevars, addition_data.__closure__ or ()))\n"
        "        cells['calls'].cell_contents[-1][2] = args.seed * 7919 + step\n"
    ),
    # a sibling: the problems of one seed kept, every later call made with a fresh seed and its problems ignored
    "fresh calls, one seed's problems": (
        "        first = addition_data(args.batch_size, n_digits, seed=args.seed) if step == 0 else first\n"
        "        if step:\n"
        "            addition_data(args.batch_size, n_digits, seed=args.seed + 1 + step)\n"
        "        tokens, loss_mask = first\n"
    ),
}


FORGED_RECORDS = {  # (test, the honest lines, the forgery, what the judge says)
    **{
        f"batches: {name}": (
            "test_train",
            (
                "        batch = train_windows[torch.randint(len(train_windows), (args.batch_size,))]\n"
                "        loss = lm_cross_entropy(model(batch), batch)\n"
            ),
            code,
            "replayed on the batches the model's embedding saw",
        )
        for name, code in FORGED_BATCH_RECORDS.items()
    },
    **{
        f"seeds: {name}": (
            "test_train_addition",
            "        tokens, loss_mask = addition_data(args.batch_size, n_digits, seed=args.seed + 1 + step)\n",
            code,
            "against the course's loop on the problems",
        )
        for name, code in FORGED_SEED_RECORDS.items()
    },
}


@pytest.mark.parametrize("forgery", sorted(FORGED_RECORDS))
def test_a_loop_that_forges_its_record_fails(forgery, tmp_path):
    """06's records (the batches the model embedded, the seeds asked of addition_data) are made in the learner's
    process, so the learner can write them; the weights that training leaves are the outcome the judge trusts: it
    replays the course's loop outside on the recorded batches, or on the problems of the recorded seeds (the
    stand-in's problems are a function of the seed), and compares. Red-team round 7 scored full marks with the
    first forgery of each kind."""
    grade_id, old, new, cause = FORGED_RECORDS[forgery]
    verdict = verdict_of("06_training", grade_id, course_with("06_training", old, new), tmp_path)
    assert not verdict["passed"] and cause in verdict["message"], verdict


EARLY_BOUND = {  # honest loops that hold addition_data before the judge's run (red-team round 8: both scored 0)
    "a default argument": (
        "def train_addition(model, args: TrainingArgs, n_digits: int) -> list[float]:",
        "def train_addition(model, args: TrainingArgs, n_digits: int, make_problems=addition_data) -> list[float]:",
    ),
    "an alias bound before": (
        "def train_addition(model, args: TrainingArgs, n_digits: int) -> list[float]:",
        "make_problems = addition_data\n\n\ndef train_addition(model, args: TrainingArgs, n_digits: int) -> list[float]:",
    ),
}


@pytest.mark.parametrize("binding", sorted(EARLY_BOUND))
def test_an_addition_loop_holding_addition_data_early_passes(binding, tmp_path):
    call = "tokens, loss_mask = addition_data(args.batch_size, n_digits, seed=args.seed + 1 + step)"
    namespace = course_with_each(
        "06_training", [EARLY_BOUND[binding], (call, call.replace("= addition_data(", "= make_problems("))]
    )
    verdict = verdict_of("06_training", "test_train_addition", namespace, tmp_path)
    assert verdict["passed"], verdict


UNSEEDED_LOOPS = {  # right batches and updates, drawn in a way a seed does not reproduce or does not change
    ("test_train", "a clock's seed"): (
        "batch = train_windows[torch.randint(len(train_windows), (args.batch_size,))]",
        (
            "batch = train_windows[torch.randint(len(train_windows), (args.batch_size,), "
            "generator=torch.Generator().manual_seed(__import__('time').perf_counter_ns()))]"
        ),
        "when run again from the same start with the same arguments",
    ),
    ("test_train", "a seed of its own"): (
        "    torch.manual_seed(args.seed)\n",
        "    torch.manual_seed(1234)\n",
        "changing args.seed changed none of the batches",
    ),
    ("test_train", "the windows in order"): (
        "batch = train_windows[torch.randint(len(train_windows), (args.batch_size,))]",
        "batch = train_windows[(step * args.batch_size + torch.arange(args.batch_size)) % len(train_windows)]",
        "trained on batches laid out in order",
    ),
    ("test_train", "the windows in order from a seed's offset"): (  # red-team round 9: full marks
        "batch = train_windows[torch.randint(len(train_windows), (args.batch_size,))]",
        (
            "batch = train_windows[(args.seed * 7 + step * args.batch_size + torch.arange(args.batch_size)) "
            "% len(train_windows)]"
        ),
        "trained on batches laid out in order",
    ),
    ("test_train", "every third window from a seed's offset"): (
        "batch = train_windows[torch.randint(len(train_windows), (args.batch_size,))]",
        (
            "batch = train_windows[(args.seed * 5 + 3 * (step * args.batch_size + torch.arange(args.batch_size))) "
            "% len(train_windows)]"
        ),
        "trained on batches laid out in order",
    ),
    ("test_train", "gaps of 1 and 2 in turn from a seed's offset"): (  # a review: the one-gap rule let it pass
        "batch = train_windows[torch.randint(len(train_windows), (args.batch_size,))]",
        (
            "batch = train_windows[(args.seed * 7 + step * 2 * args.batch_size + torch.arange(args.batch_size) * 3 "
            "// 2) % len(train_windows)]"
        ),
        ("trained on batches laid out in order", "distinct windows of the 256"),
    ),
    ("test_train", "one irregular layout shifted every step"): (  # shifted around past the last window too
        "batch = train_windows[torch.randint(len(train_windows), (args.batch_size,))]",
        (
            "batch = train_windows[(args.seed + 37 * step + torch.randperm(len(train_windows), "
            "generator=torch.Generator().manual_seed(0))[: args.batch_size]) % len(train_windows)]"
        ),
        "trained on batches laid out by one pattern",
    ),
    ("test_train", "the first three quarters of the windows only"): (  # red-team round 10: full marks
        "batch = train_windows[torch.randint(len(train_windows), (args.batch_size,))]",
        "batch = train_windows[torch.randint(3 * len(train_windows) // 4, (args.batch_size,))]",
        ("trained on no window of train_windows[", "distinct windows of the 256"),
    ),
    ("test_train", "all but the last sixteenth of the windows"): (  # as many distinct windows as uniform draws give
        "batch = train_windows[torch.randint(len(train_windows), (args.batch_size,))]",
        "batch = train_windows[torch.randint(15 * len(train_windows) // 16, (args.batch_size,))]",
        "trained on no window of train_windows[",
    ),
    ("test_train", "the last half of the windows only"): (
        "batch = train_windows[torch.randint(len(train_windows), (args.batch_size,))]",
        "batch = train_windows[len(train_windows) // 2 + torch.randint(len(train_windows) // 2, (args.batch_size,))]",
        ("trained on no window of train_windows[0:", "distinct windows of the 256"),
    ),
    ("test_train_addition", "a counter's seed"): (
        "seed=args.seed + 1 + step)",
        "seed=train_addition.__dict__.setdefault('calls', __import__('itertools').count()).__next__())",
        "when run again with the same arguments",
    ),
}


@pytest.mark.parametrize("loop", sorted(UNSEEDED_LOOPS), ids=[" ".join(k) for k in sorted(UNSEEDED_LOOPS)])
def test_a_loop_whose_draws_a_seed_does_not_reproduce_fails(loop, tmp_path):
    """Red-team round 8 drew 06's batches and seeds from a clock, a counter or a seed of its own: fresh draws,
    records shown true by replay. The loop runs again with the same arguments (the same draws and weights are
    due) and with args.seed + 1 (other draws are due)."""
    old, new, cause = UNSEEDED_LOOPS[loop]
    verdict = verdict_of("06_training", loop[0], course_with("06_training", old, new), tmp_path)
    causes = (cause,) if isinstance(cause, str) else cause
    assert not verdict["passed"] and any(c in verdict["message"] for c in causes), verdict


def test_trained_weights_allow_a_few_rounding_flukes_and_no_more():
    """AdamW steps a parameter whose gradient is rounding noise by up to the learning rate either way: the course's
    own loop, in the sandbox, had one of 1,600 entries of W_Q off by 1.3e-4 (red-team round 8). Trained weights may
    differ so in 1% of their entries; a wrong loop moves far more."""
    probe = judge.Probe("test_train", "train", (), compare="trained", atol=1e-4)
    want = torch.randn(40, 40)
    fluke = want.clone()
    fluke[3, 4] += 2e-3
    assert judge._compare_tensor(probe, fluke, want) is None
    assert judge._compare_tensor(replace(probe, compare="close"), fluke, want) is not None  # "close" has no leeway
    wrong = want.clone()
    wrong[:1] += 2e-3  # 40 of 1,600 entries: 2.5%
    assert "differs from the course's train" in judge._compare_tensor(probe, wrong, want)


ACCUMULATED = (  # 06's step, and the same step with its gradient accumulated over two parts of the batch
    (
        "batch = train_windows[torch.randint(len(train_windows), (args.batch_size,))]\n"
        "        loss = lm_cross_entropy(model(batch), batch)\n"
        "        optimizer.zero_grad()\n"
        "        loss.backward()\n"
    ),
    (
        "batch = train_windows[torch.randint(len(train_windows), (args.batch_size,))]\n"
        "        optimizer.zero_grad()\n"
        "        loss = 0.0\n"
        "        for part in batch.split((len(batch) + 1) // 2):\n"
        "            share = lm_cross_entropy(model(part), part) * (len(part) / len(batch))\n"
        "            share.backward()\n"
        "            loss = loss + share.detach()\n"
    ),
)
HONEST_VARIANTS = {
    # every bias by name left out of decay, b_Q, b_K and b_V ([n_heads, d_head]) included, as the notebook's text
    # says biases are (agreement sweep 19: refused by both then)
    "weight decay groups that leave every bias out by name": (
        "06_training",
        "test_weight_decay_groups",
        "        (decay if param.ndim >= 2 and not is_embedding else no_decay).append(param)\n",
        (
            "        is_bias = name.split('.')[-1].startswith('b_')\n"
            "        (decay if param.ndim >= 2 and not is_embedding and not is_bias else no_decay).append(param)\n"
        ),
    ),
    # generate's options written out, with the notebook's defaults (red-team round 49)
    "generate with its sampling options written out": (
        "07_sampling_and_kv_cache",
        "test_generate",
        GENERATE_SIGNATURE,
        GENERATE_EXPLICIT.replace("temperature: float = 0.0", "temperature: float = 1.0"),
    ),
    # nanoGPT's configure_optimizers leaves out every parameter without requires_grad: the unembedding's frozen bias
    # is never stepped, and this lost its point (red-team round 43)
    "weight decay groups of the trainable parameters only": (
        "06_training",
        "test_weight_decay_groups",
        "    for name, param in model.named_parameters():\n        is_embedding",
        "    for name, param in model.named_parameters():\n        if not param.requires_grad:\n            continue\n        is_embedding",
    ),
    # scores summed in float64: rounding decided between searches that tie in exact arithmetic, and this lost its
    # point (red-team round 29: the course's own search lost it between two processes)
    "a beam search in float64": (
        "07_sampling_and_kv_cache",
        "test_beam_search",
        "log_probs = model(live[:, -model.cfg.n_ctx :])[:, -1].log_softmax(dim=-1)",
        "log_probs = model(live[:, -model.cfg.n_ctx :])[:, -1].double().log_softmax(dim=-1)",
    ),
    # the frequencies through exp and log: other float32 roundings, within the tolerance at GPT-2's sizes too
    "a sinusoid's frequencies through exp and log": (
        "02_embeddings",
        "test_sinusoidal",
        "frequencies = 1.0 / 10000 ** (two_i / d_model)",
        "frequencies = torch.exp(-9.210340371976184 * two_i / d_model)  # -ln(10000)",
    ),
    # one row at a time, with the generator given: the judge calls it on a few hundred rows at a time
    "a sampler that loops over its rows": (
        "07_sampling_and_kv_cache",
        "test_sample_next_token",
        "    return torch.multinomial(logits.softmax(dim=-1), num_samples=1, generator=generator)[:, 0]\n",
        (
            "    probs = logits.softmax(dim=-1)\n"
            "    return torch.cat([torch.multinomial(row, 1, generator=generator) for row in probs])\n"
        ),
    ),
    # 09's demonstration builds its causal mask so; the exercise forbids torch's layers' forwards, not the file's
    # helpers (red-team round 11: ruling on the whole file failed this honest attention, 9 of 19 points)
    "a causal mask from nn.Transformer": (
        "09_encoder_decoder",
        "test_multi_head_attention",
        "            future = torch.triu(torch.ones(n_q, n_k, dtype=torch.bool, device=scores.device), diagonal=1)\n",
        (
            "            future = nn.Transformer.generate_square_subsequent_mask(n_q, device=scores.device, dtype=torch.bool)"
            " if n_q == n_k else torch.triu(torch.ones(n_q, n_k, dtype=torch.bool, device=scores.device), diagonal=1)\n"
            "            future = future if future.dtype == torch.bool else future.isinf()\n"
        ),
    ),
    # the batch probe judges the batches by rules (their size, fresh ones, training windows only), not against the
    # course's draw: windows drawn without replacement pass
    "batches drawn without replacement": (
        "06_training",
        "test_train",
        "batch = train_windows[torch.randint(len(train_windows), (args.batch_size,))]",
        "batch = train_windows[torch.randperm(len(train_windows))[: args.batch_size]]",
    ),
    # gradients accumulated over two parts of the batch, each loss weighted by its share: the batch's gradient, one
    # step (red-team round 39: refused while each forward had to be a whole batch)
    "gradients accumulated over two parts of a batch": (
        "06_training",
        "test_train",
        ACCUMULATED[0],
        ACCUMULATED[1],
    ),
    # ... over two parts drawn apart, nanoGPT's way, as many rows as a batch between them
    "gradients accumulated over two parts drawn apart": (
        "06_training",
        "test_train",
        ACCUMULATED[0],
        (
            "optimizer.zero_grad()\n"
            "        loss = 0.0\n"
            "        for rows in ((args.batch_size + 1) // 2, args.batch_size // 2):\n"
            "            part = train_windows[torch.randint(len(train_windows), (rows,))]\n"
            "            share = lm_cross_entropy(model(part), part) * (rows / args.batch_size)\n"
            "            share.backward()\n"
            "            loss = loss + share.detach()\n"
        ),
    ),
    # the loss for the log from a forward of its own, before the one trained on
    "a forward run twice, once for the log": (
        "06_training",
        "test_train",
        ACCUMULATED[0],
        (
            "batch = train_windows[torch.randint(len(train_windows), (args.batch_size,))]\n"
            "        shown = lm_cross_entropy(model(batch), batch).item()\n"
            "        loss = lm_cross_entropy(model(batch), batch)\n"
            "        optimizer.zero_grad()\n"
            "        loss.backward()\n"
        ),
    ),
    # the schedule through torch's LambdaLR, stepped after the optimizer, and gradients zeroed in place
    "lr_at through LambdaLR": (
        "06_training",
        "test_train",
        (
            "        for group in optimizer.param_groups:\n"
            '            group["lr"] = lr_at(step, args)\n'
            "        batch = train_windows[torch.randint(len(train_windows), (args.batch_size,))]\n"
            "        loss = lm_cross_entropy(model(batch), batch)\n"
            "        optimizer.zero_grad()\n"
            "        loss.backward()\n"
            "        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)\n"
            "        optimizer.step()\n"
        ),
        (
            "        if step == 0:\n"
            "            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_at(s, args) / args.lr)\n"
            "        batch = train_windows[torch.randint(len(train_windows), (args.batch_size,))]\n"
            "        loss = lm_cross_entropy(model(batch), batch)\n"
            "        optimizer.zero_grad(set_to_none=False)\n"
            "        loss.backward()\n"
            "        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)\n"
            "        optimizer.step()\n"
            "        scheduler.step()\n"
        ),
    ),
    # the clip in a pre-hook of the optimizer's own, which runs after every global one (red-team round 42: refused
    # by the check and the judge, which read the gradient before it)
    "a clip in the optimizer's own pre-hook": (
        "06_training",
        "test_train",
        (
            "        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)\n        optimizer.step()\n"
            "        ### END SOLUTION\n        history"
        ),
        (
            "        if step == 0:\n"
            "            optimizer.register_step_pre_hook(lambda opt, *a: [torch.nn.utils.clip_grad_norm_(model.parameters(), "
            "args.grad_clip), None][1])\n"
            "        optimizer.step()\n"
            "        ### END SOLUTION\n        history"
        ),
    ),
    # what an encoder leaves at padded source positions is never attended to: memory is compared where the source is
    # real (a static review: zeroing those rows, honest, failed the encode probe)
    "an encoder that zeroes its padding": (
        "09_encoder_decoder",
        "test_encoder_decoder",
        "            x = layer(x, src_padding)\n        return x\n",
        "            x = layer(x, src_padding)\n        return x.masked_fill(src_padding[..., None], 0.0)\n",
    ),
}


@pytest.mark.parametrize("variant", sorted(HONEST_VARIANTS))
def test_an_honest_variant_passes(variant, tmp_path):
    notebook, grade_id, old, new = HONEST_VARIANTS[variant]
    verdict = verdict_of(notebook, grade_id, course_with(notebook, old, new), tmp_path)
    assert verdict["passed"], verdict


MANUAL_CLIP = (  # the course's clip_grad_norm_, written out by hand: the same update, rounded another way
    "        grads = [p.grad for p in model.parameters() if p.grad is not None]\n"
    "        norm = torch.sqrt(sum((g**2).sum() for g in grads))\n"
    "        for g in grads:\n"
    "            g.mul_((args.grad_clip / (norm + 1e-6)).clamp(max=1.0))\n"
)


def test_a_loop_that_rounds_another_way_passes(tmp_path):
    """The key bias's gradient is rounding noise (softmax ignores it) that AdamW scales up to the learning rate:
    with it in the comparison, this honest hand-written clip failed 1 of 3 draws on `b_K` alone. The trained
    weights the judge compares leave it out, and the loop passes."""
    step = (
        "        loss = lm_cross_entropy(model(batch), batch)\n        optimizer.zero_grad()\n        loss.backward()\n"
    )
    clip = "        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)\n"
    for draw in range(2):
        namespace = course_with("06_training", step + clip, step + MANUAL_CLIP)
        verdict = verdict_of("06_training", "test_train", namespace, tmp_path / str(draw))
        assert verdict["passed"], verdict
    course = course_with("06_training", None, None)
    cfg = course["Config"](d_model=16, n_heads=2, d_head=8, d_mlp=32, n_layers=1, n_ctx=8, d_vocab=20)
    windows = torch.randint(20, (8, 8))
    args = course["TrainingArgs"](max_steps=2, batch_size=2, warmup_steps=1, eval_every=10, eval_batches=1)
    weights = probe_runner.trained_weights(course["train"], course["DemoTransformer"](cfg), windows, windows, args)
    assert "blocks.0.attn.W_K" in weights and "blocks.0.attn.b_K" not in weights, sorted(weights)


def test_code_that_cannot_take_another_layout_is_not_refused(tmp_path):
    """The layouts pass (`probe_runner.layouts`) judges answers, not what code can take: an honest `.view`, which
    raises on a non-contiguous input, passes; only a different answer on the same values fails."""
    namespace = course_with(
        "01_layernorm",
        "        centered = residual - residual.mean(dim=-1, keepdim=True)\n",
        (
            "        flat = residual.view(-1, residual.shape[-1])\n"
            "        centered = (flat - flat.mean(dim=-1, keepdim=True)).view(residual.shape)\n"
        ),
    )
    verdict = verdict_of("01_layernorm", "test_layernorm", namespace, tmp_path)
    assert verdict["passed"], verdict


def test_a_default_written_another_way_passes(tmp_path):
    """The judge compares the defaults a call gets, not how they are written: -1e5 as -100_000.0 or as a tensor, a
    None standing for the notebook's number (red-team round 36: both lost their points to a comparison of the
    signatures), and a loss that reads its smoothing from keywords it does not name pass."""
    for k, default in enumerate(("-100_000.0", "torch.tensor(-1e5)")):
        namespace = course_with("03_attention", 'key_pos"], ignore: float = -1e5\n', f'key_pos"], ignore={default}\n')
        verdict = verdict_of("03_attention", "test_apply_causal_mask", namespace, tmp_path / f"mask{k}")
        assert verdict["passed"], verdict
    doc = '    """Mean cross-entropy over the real (non-padding) target tokens."""\n'
    for k, (parameter, reads) in enumerate(
        (
            ("label_smoothing: float | None = None", "0.0 if label_smoothing is None else label_smoothing"),
            ("**options", 'options.get("label_smoothing", 0.0)'),
        )
    ):
        namespace = course_with_each(
            "09_encoder_decoder",
            [
                ("pad_id: int, label_smoothing: float = 0.0\n", f"pad_id: int, {parameter}\n"),
                (doc, f"{doc}    label_smoothing = {reads}\n"),
            ],
        )
        verdict = verdict_of("09_encoder_decoder", "test_seq2seq_loss", namespace, tmp_path / f"loss{k}")
        assert verdict["passed"], verdict


def test_an_initialisation_written_another_way_passes(tmp_path):
    """The judge measures the initial table's spread, not its draw: torch.randn scaled passes."""
    namespace = course_with(
        "09_encoder_decoder",
        "nn.init.normal_(self.W_E, mean=0.0, std=cfg.d_model**-0.5)",
        "self.W_E.data = torch.randn(cfg.d_vocab, cfg.d_model) / math.sqrt(cfg.d_model)",
    )
    verdict = verdict_of("09_encoder_decoder", "test_shared_embedding", namespace, tmp_path)
    assert verdict["passed"], verdict


def test_a_right_random_draw_passes_the_segment_rules_every_time():
    """The rules about repeated_segments' distribution are set to fail a right answer once in 10^9 judgings: the
    course's own function over 300 seeds and every probe's argument ranges never fails them."""
    repeated_segments = components("08_interpretability").repeated_segments
    probes = [p for p in judge.PROBES["08_interpretability"] if p.compare == "repeated_segments"]
    assert len(probes) == 5
    gen = torch.Generator().manual_seed(0)
    for seed in range(300):
        for probe in probes:
            args = [judge._randint(*param, gen) for kind, param in probe.args if kind == "int"]
            tokens, periods = repeated_segments(*args, generator=torch.Generator().manual_seed(seed))
            rules = dict(zip(("batch", "n_ctx", "d_vocab", "min_period", "max_period"), args, strict=True))
            assert judge._compare_segments({"0": tokens, "1": periods}, rules) is None, (seed, rules)


def test_a_sampling_probe_calls_the_sampler_on_a_few_hundred_rows_at_a_time(tmp_path):
    """The judge's 8,000 draws come from the calls of SAMPLE_CALLS, no record over more rows than one call: the record
    keeps every operator it sees, and an honest sampler looping over 8,000 rows in Python ran past the child's memory in one
    call (red-team rounds 22 and 27). Some calls are of a few rows (a sampler greedy below 64 rows passed while every
    call was of 500: red-team round 29)."""
    namespace = course_as_learner("07_sampling_and_kv_cache")
    right, rows = namespace["sample_next_token"], []

    def sample_next_token(logits, tokens, **options):
        rows.append(logits.shape[0])
        return right(logits, tokens, **options)

    namespace["sample_next_token"] = sample_next_token
    verdict = verdict_of("07_sampling_and_kv_cache", "test_sample_next_token", namespace, tmp_path)
    assert verdict["passed"], verdict
    assert set(rows) == set(judge.SAMPLE_CALLS), sorted(set(rows))


def test_a_record_watches_consecutive_calls_of_no_more_rows_than_the_largest_call():
    """One record over several calls of a few rows (starting and ending a record costs about 5 ms, and 07's calls of
    one row were 1,700 of them), never more rows than one call has: an honest sampler looping in Python over every
    row it is given ran past the child's memory in a record of 8,000 rows (red-team rounds 22 and 27)."""
    from instructor.probe_runner import _record_groups

    calls = list(judge.SAMPLE_CALLS)
    groups = _record_groups(calls)
    assert [c for group in groups for c in group] == list(range(len(calls)))  # every call once, in order
    assert all(sum(calls[c] for c in group) <= max(calls) for group in groups)
    assert len(groups) <= 1 + calls.count(max(calls))  # the calls of a few rows share one record
    assert _record_groups([3, 5, 2, 7]) == [[0], [1, 2], [3]]


def test_a_forbidden_call_inside_a_shared_record_is_named(tmp_path):
    """A record shared by calls of a few rows still refuses what any one of them ran: here the calls from the fourth
    on (calls of one row) run the course's own answer (from every call on, as a record whose names cannot be read is
    made again, calls and all)."""
    namespace = course_as_learner("07_sampling_and_kv_cache")
    right, seen = namespace["sample_next_token"], []

    def sample_next_token(logits, tokens, **options):
        seen.append(1)
        if len(seen) >= 4:
            from harness import components

            return components("07_sampling_and_kv_cache").sample_next_token(logits, tokens, **options)
        return right(logits, tokens, **options)

    namespace["sample_next_token"] = sample_next_token
    verdict = verdict_of("07_sampling_and_kv_cache", "test_sample_next_token", namespace, tmp_path)
    assert not verdict["passed"] and "solutions/07_sampling_and_kv_cache.ipynb" in verdict["message"], verdict


def test_a_record_judges_what_it_could_read_before_it_is_made_again(monkeypatch):
    """A record with an unreadable name is made again, calls and all; a forbidden name it could read is refused
    first (the attempt was thrown away unread, and a cheat made only in it passed). And Python functions are
    recorded only for rules still in the process (`withdraw_python` takes them out for good in the probe child)."""
    rules = ("py:harness/checks.py", "aten::gelu")
    seen, pythons = [set(), ""], []

    def record(call, python):
        pythons.append(python)
        return call(), *seen

    monkeypatch.setattr(probe_runner, "_record_all", record)
    seen[:] = [{"harness/checks.py(3): answer"}, "unreadable"]
    with pytest.raises(probe_runner.ProbeError, match="harness/checks.py"):
        probe_runner._call_watching("f", lambda: 1, rules)
    seen[:] = [{"aten::add"}, "unreadable"]
    with pytest.raises(probe_runner.RecordUnreadable):
        probe_runner._call_watching("f", lambda: 1, rules)
    monkeypatch.setattr(probe_runner, "_PY_WITHDRAWN", {"py:harness/checks.py"})
    seen[:] = [{"aten::add"}, ""]
    assert probe_runner._call_watching("f", lambda: 1, rules) == 1
    assert pythons == [True, True, False]


def test_a_scalars_message_shows_its_inputs_and_a_groups_message_names_its_parameters(tmp_path):
    """A number off by a step, or one parameter decayed, is found from what the probe was called with (a mutation
    sweep: "returned 0.00385, the course's 0.00386" and "at index [1]" named neither)."""
    namespace = course_with(
        "06_training",
        "progress = (step - args.warmup_steps) / max(1, args.max_steps - args.warmup_steps)",
        "progress = (step + 1 - args.warmup_steps) / max(1, args.max_steps - args.warmup_steps)",
    )
    verdict = verdict_of("06_training", "test_lr_at", namespace, tmp_path / "lr")
    assert not verdict["passed"] and "called with " in verdict["message"] and "TrainingArgs(" in verdict["message"]
    namespace = course_with(
        "06_training",
        "(decay if param.ndim >= 2 and not is_embedding else no_decay)",
        "(decay if param.ndim >= 1 and not is_embedding else no_decay)",
    )
    verdict = verdict_of("06_training", "test_weight_decay_groups", namespace, tmp_path / "groups")
    assert not verdict["passed"] and "the parameters decayed otherwise: blocks.0." in verdict["message"], verdict


def test_a_generate_probe_draws_again_until_its_rows_finish_apart(tmp_path, monkeypatch):
    """About one draw in fifty has no end-of-text id on which the greedy rows finish at different steps; on such a
    draw a generate that does not pad finished rows passed (a flake in CI). The judge draws the model and prompts
    again until there is one, and the id it sends is one the last draw's rows finish apart on."""
    real, seen = judge._first_to_finish, []

    def unlucky_twice(rows, parity=None, held=frozenset()):
        seen.append((rows, real(rows, parity, held)))
        return None if len(seen) <= 2 else seen[-1][1]

    monkeypatch.setattr(judge, "_first_to_finish", unlucky_twice)
    judge.prepare("07_sampling_and_kv_cache", tmp_path / "job", only=frozenset({"test_generate"}))
    assert len(seen) >= 3 and seen[0][0] != seen[2][0], seen[:3]  # drawn again, not asked again of the same rows
    request = json.loads((tmp_path / "job" / judge.REQUEST).read_text())
    sent = [a["value"] for p in request["probes"] for a in p["args"] if "value" in a and p["target"] == "generate"]
    assert seen[-1][1] in sent and seen[-1][1] is not None, (sent, seen[-1])
    monkeypatch.setattr(judge, "_first_to_finish", lambda rows, parity=None, held=frozenset(): None)
    with pytest.raises(RuntimeError, match="finish apart"):
        judge.prepare("07_sampling_and_kv_cache", tmp_path / "again", only=frozenset({"test_generate"}))


@pytest.mark.parametrize(("notebook", "grade_id", "old", "new", "cause"), MISTAKES, ids=[m[1] for m in MISTAKES])
def test_a_realistic_mistake_fails_with_its_cause(notebook, grade_id, old, new, cause, tmp_path):
    verdict = verdict_of(notebook, grade_id, course_with(notebook, old, new), tmp_path)
    assert not verdict["passed"]
    assert any(c in verdict["message"] for c in ((cause,) if isinstance(cause, str) else cause)), verdict


@pytest.mark.exhaustive
@pytest.mark.parametrize("mistake", sorted(SWEPT_MISTAKES))
def test_a_swept_mistake_fails_with_its_cause(mistake, tmp_path):
    notebook, grade_id, old, new, cause = SWEPT_MISTAKES[mistake]
    test_a_realistic_mistake_fails_with_its_cause(notebook, grade_id, old, new, cause, tmp_path)


# Red-team round 10: wrong code the judge's fixed inputs could not tell from right code (one GPT-2 shape for every
# job, a batch of two, top_k=1 only, one end-of-text id, layers 0 and 1, forward alone, a loss's value alone). Each
# runs in several jobs: a constant that one job's shapes happen to match must fail the next.
FIXED_INPUT_MISTAKES = {
    # 09's probes used one shape and ids 0, 1, 2 (red-team round 12: each of these had full marks)
    "encoder and decoder stacks of 2 layers written in": (
        "09_encoder_decoder",
        "test_encoder_decoder",
        [
            ("EncoderLayer(cfg) for _ in range(cfg.n_layers)", "EncoderLayer(cfg) for _ in range(2)"),
            ("DecoderLayer(cfg) for _ in range(cfg.n_layers)", "DecoderLayer(cfg) for _ in range(2)"),
        ],
    ),
    "09's embedding scaled by the old shape's sqrt(24) written in": (
        "09_encoder_decoder",
        "test_shared_embedding",
        [("self.W_E[tokens] * math.sqrt(self.cfg.d_model)", "self.W_E[tokens] * math.sqrt(24)")],
    ),
    "09's attention scaled for 4 heads written in": (
        "09_encoder_decoder",
        "test_multi_head_attention",
        [("/ math.sqrt(self.cfg.d_head)", "/ math.sqrt(self.cfg.d_model // 4)")],
    ),
    "make_batch with ids 0, 1 and 2 written in": (
        "09_encoder_decoder",
        "test_make_batch",
        [
            ("[row + [cfg.pad_id] * (width", "[row + [0] * (width"),
            ("pad([[cfg.bos_id] + y for y", "pad([[1] + y for y"),
            ("pad([y + [cfg.eos_id] for y", "pad([y + [2] for y"),
        ],
    ),
    "greedy_decode with ids 0, 1 and 2 written in": (
        "09_encoder_decoder",
        "test_greedy_decode",
        [
            ("torch.full((src.shape[0], 1), cfg.bos_id,", "torch.full((src.shape[0], 1), 1,"),
            ("finished |= next_token == cfg.eos_id", "finished |= next_token == 2"),
            ("next_token.masked_fill(finished, cfg.pad_id)", "next_token.masked_fill(finished, 0)"),
        ],
    ),
    # d_model = n_heads * d_head in GPT-2, not in the checks' shapes: the judge's second shape in 01-04 breaks it too
    # (red-team round 11: passed the judge, failed only the check)
    "an out-projection of [d_model, d_model]": (
        "03_attention",
        "test_attention",
        [
            (
                "        return project_heads(z, self.W_O, self.b_O)  # [batch pos d_model]",
                "        return z.flatten(2) @ self.W_O.reshape(self.cfg.d_model, self.cfg.d_model) + self.b_O",
            )
        ],
    ),
    "split_heads with 4 heads written in": (
        "00_tour",
        "test_split_heads",
        [('d_head", n_heads=n_heads)', 'd_head", n_heads=4)')],
    ),
    "attention scores over a written-in sqrt(10)": (
        "03_attention",
        "test_attention_scores",
        [("    return scores / math.sqrt(q.shape[-1])\n", "    return scores / math.sqrt(10)\n")],
    ),
    "select_beams with the end-of-text id 3 written in": (
        "07_sampling_and_kv_cache",
        "test_select_beams",
        [
            (
                "    ends = (candidates % d_vocab == eos_token_id) | last_step",
                "    ends = (candidates % d_vocab == 3) | last_step",
            )
        ],
    ),
    "generate greedy whatever top_k, top_p ignored": (
        "07_sampling_and_kv_cache",
        "test_generate",
        [
            (
                "next_token = sample_next_token(logits, tokens, **sampling)  # [batch]",
                (
                    "next_token = (logits.argmax(dim=-1) if sampling.get('top_k') else sample_next_token(logits, "
                    "tokens, **{k: v for k, v in sampling.items() if k != 'top_p'}))"
                ),
            )
        ],
    ),
    "k_composition_scores of layers 0 and 1 whatever it is given": (
        "08_interpretability",
        "test_k_composition_scores",
        [
            (
                "    W_OV = model.W_V[earlier] @ model.W_O[earlier]",
                "    earlier, later = 0, 1\n    W_OV = model.W_V[earlier] @ model.W_O[earlier]",
            )
        ],
    ),
    "greedy_generate that squeezes the batch away": (
        "05_full_gpt2",
        "test_greedy_generate",
        [
            (
                "        logits = model(tokens)  # [batch pos d_vocab]",
                "        logits = model(tokens).squeeze()  # [batch pos d_vocab]",
            )
        ],
    ),
    "cross_entropy_loss through NumPy": (
        "05_full_gpt2",
        "test_cross_entropy_loss",
        [("    return -correct.mean()\n", "    return torch.tensor(-correct.detach().numpy().mean())\n")],
    ),
    "Embed looked up through NumPy": (
        "02_embeddings",
        "test_embed",
        [
            (
                "        return self.W_E[tokens]\n",
                "        return torch.from_numpy(self.W_E.detach().numpy()[tokens.numpy()])\n",
            )
        ],
    ),
    "MLP whose hidden layer is detached": (
        "04_mlp_and_block",
        "test_mlp",
        [
            (
                "        post = gelu_new(pre)\n",
                "        post = gelu_new(pre).detach()  # W_in and b_in get no gradient\n",
            )
        ],
    ),
    "masked_lm_loss rebuilt from .item()": (
        "06_training",
        "test_masked_lm_loss",
        [
            (
                "    return -correct[target_mask].mean()\n",
                "    return torch.tensor(-correct[target_mask].mean().item())\n",
            )
        ],
    ),
}


@pytest.mark.parametrize("mistake", sorted(FIXED_INPUT_MISTAKES))
def test_wrong_code_that_matched_the_judges_fixed_inputs_fails_every_job(mistake, tmp_path):
    notebook, grade_id, replacements = FIXED_INPUT_MISTAKES[mistake]
    namespace = course_with_each(notebook, replacements)
    for job in range(3):
        verdict = verdict_of(notebook, grade_id, namespace, tmp_path / str(job))
        assert not verdict["passed"], (job, verdict)


def test_encode_and_decode_are_judged_on_their_own(tmp_path):
    """An encode that skips the encoder's layers and a decode that ignores the memory, with a forward of its own
    computed right (red-team round 10: full marks while forward alone was probed)."""
    source = component_source("09_encoder_decoder")
    start = source.index("    def encode(self")
    end = source.index("        return self.decode(tgt_in, self.encode(src), src)\n")
    right = source[start:end]
    wrong = (
        right.replace("    def encode(self", "    def _encode_right(self", 1).replace(
            "    def decode(\n", "    def _decode_right(\n", 1
        )
        + "        return self._decode_right(tgt_in, self._encode_right(src), src)\n\n"
        "    def encode(self, src):\n        return self.embed(src)\n\n"
        "    def decode(self, tgt_in, memory, src):\n        return self.embed.unembed(self.embed(tgt_in))\n"
    )
    namespace = course_with_each(
        "09_encoder_decoder", [(right + "        return self.decode(tgt_in, self.encode(src), src)\n", wrong)]
    )
    verdict = verdict_of("09_encoder_decoder", "test_encoder_decoder", namespace, tmp_path)
    assert not verdict["passed"] and "memory" in verdict["message"], verdict


def test_the_judges_beam_cases_separate_every_named_beam_search_mistake():
    """The judge's beam_search probes are the check's separating cases, relabelled (which changes no answer): each
    mistake the check names gives another answer than transformers' on at least one of them, on every draw."""
    from harness.sampling_checks import (
        _BEAM_MISTAKES,
        BEAM_SEPARATING_SEEDS,
        _beam_variant,
        _hf_table_beam,
        _random_beam_case,
    )

    assert len(BEAM_SEPARATING_SEEDS) == judge.N_BEAM_CASES
    for mistake in _BEAM_MISTAKES:
        separated = False
        for seed in BEAM_SEPARATING_SEEDS:
            case = _random_beam_case(seed)
            right = _hf_table_beam(*case, 5)
            separated |= _beam_variant(*case, 5, mistake) != right
        assert separated, mistake


def test_every_newly_judged_test_has_a_mistake_case():
    judged = {g for gs in judge.judged_tests().values() for g in gs}
    assert {m[1] for m in [*MISTAKES, *SWEPT_MISTAKES.values()]} >= judged - {
        "test_layernorm",
        "test_embed",
        "test_pos_embed",
        "test_attention_scores",
        "test_attention_pattern",
        "test_weighted_values",
        "test_project_heads",
        "test_attention",
        "test_gelu_new",
        "test_mlp",
        "test_block",
        "test_unembed",
        "test_demo_transformer",
        "test_cross_entropy_loss",
    }


def test_every_graded_test_is_judged_outside():
    """No verdict is left to the learner's process alone: each graded test cell of every solution notebook has
    the judge's probes."""
    import json

    from harness.course import SOLUTIONS_DIR

    judged = judge.judged_tests()
    for notebook in notebook_names():
        cells = json.loads((SOLUTIONS_DIR / f"{notebook}.ipynb").read_text())["cells"]
        graded = {
            c["metadata"]["nbgrader"]["grade_id"] for c in cells if c["metadata"].get("nbgrader", {}).get("grade")
        }
        assert graded <= set(judged.get(notebook, ())), (notebook, sorted(graded - set(judged.get(notebook, ()))))


@pytest.mark.parametrize(
    "masked",
    [
        'attn_scores.masked_fill(future, float("-inf"))',
        "attn_scores.masked_fill(future, -1e9)",
        "attn_scores.masked_fill(future, -1e4)",
        # a mask added, not filled: the gradient reaches the masked scores too, which the softmax after it ignores
        "attn_scores + torch.zeros_like(attn_scores).masked_fill(future, ignore)",
        'attn_scores + torch.from_numpy(__import__("numpy").triu(__import__("numpy").full(future.shape, -1e9), k=1))',
    ],
)
def test_a_causal_mask_written_another_way_passes(masked, tmp_path):
    """Another large negative fill, or a mask added to the scores (the gradient then reaches the masked scores:
    the judge compares the gradient where the mask keeps, `probe_runner.causal_input_gradient`)."""
    namespace = course_with("03_attention", "attn_scores.masked_fill(future, ignore)", masked)
    verdict = verdict_of("03_attention", "test_apply_causal_mask", namespace, tmp_path)
    assert verdict["passed"], verdict


@pytest.mark.parametrize(
    "route",
    [
        "torch.func.vmap(lambda row: row.pow(2).mean(dim=-1, keepdim=True))(centered)",
        "torch.vmap(torch.vmap(lambda v: v.pow(2).mean().reshape(1)))(centered)",
    ],
    ids=["torch.func.vmap", "torch.vmap nested"],
)
def test_functorchs_public_transforms_are_honest(route, tmp_path):
    """Only functorch's compilers are refused: its public transforms run (`torch.vmap` was refused before, as one
    of torch's internals; siblings of the red-team's case)."""
    code = "import torch.func\n" + RIGHT_LN.replace("centered.pow(2).mean(dim=-1, keepdim=True)", route)
    assert route in code
    assert verdict_of(LN, "test_layernorm", learner(code), tmp_path)["passed"]


def test_a_rate_returned_as_a_tensor_passes_and_a_loss_must_be_a_0d_tensor(tmp_path):
    namespace = course_with(
        "06_training", "return -correct[target_mask].mean()", "return -correct[target_mask].mean()[None]"
    )
    verdict = verdict_of("06_training", "test_masked_lm_loss", namespace, tmp_path / "a")
    assert not verdict["passed"] and "not a 0-d floating-point tensor" in verdict["message"], verdict  # as the check
    namespace = course_with(
        "06_training",
        "return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * cosine)",
        "return torch.tensor(args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * cosine), dtype=torch.float64)",
    )
    assert verdict_of("06_training", "test_lr_at", namespace, tmp_path / "b")["passed"]


ARGS = "from dataclasses import dataclass\n\n@dataclass\nclass TrainingArgs:\n    max_steps: int = 1\n    lr: float = 1.0\n    warmup_steps: int = 1\n    min_lr_ratio: float = 0.1\n\n"
FUNCTION_CASES = [
    (
        "02_embeddings",
        "test_sinusoidal",
        "def sinusoidal_positional_encoding(n_ctx, d_model):\n    return [[0.0]]\n",
        "sinusoidal_positional_encoding returned list, not a tensor",
    ),
    (
        "06_training",
        "test_lr_at",
        ARGS + "def lr_at(step, args):\n    return '0.1'\n",
        "lr_at returned str, not a number",
    ),
    (
        "06_training",
        "test_lr_at",
        ARGS + "def lr_at(step, args):\n    return torch.ones(2)\n",
        "lr_at returned Tensor, not a number",
    ),
    (
        "06_training",
        "test_lr_at",
        ARGS + "def lr_at(step, args):\n    return True\n",
        "lr_at returned bool, not a number",
    ),
    (
        "06_training",
        "test_masked_lm_loss",
        "def masked_lm_loss(logits, tokens, mask):\n    return logits.sum() * torch.nan\n",
        "masked_lm_loss returned nan",
    ),
    (
        "07_sampling_and_kv_cache",
        "test_apply_temperature",
        "def apply_temperature(logits, t):\n    return logits * torch.nan\n",
        "NaN values",
    ),
    (
        "07_sampling_and_kv_cache",
        "test_top_k_filter",
        "def top_k_filter(logits, k):\n    return logits.clamp(max=0) / 0\n",
        "NaN values",
    ),
    (
        "05_full_gpt2",
        "test_convert_hf_gpt2_state_dict",
        "def convert_hf_gpt2_state_dict(sd, cfg):\n    return list(sd.values())\n",
        "convert_hf_gpt2_state_dict returned list, not a dict",
    ),
    (
        "05_full_gpt2",
        "test_convert_hf_gpt2_state_dict",
        "def convert_hf_gpt2_state_dict(sd, cfg):\n    return {}\n",
        "returned an empty dict",
    ),
    (
        "05_full_gpt2",
        "test_convert_hf_gpt2_state_dict",
        "def convert_hf_gpt2_state_dict(sd, cfg):\n    return {'embed.W_E': [1.0]}\n",
        "['embed.W_E'] is a list, not a tensor",
    ),
    (
        "05_full_gpt2",
        "test_convert_hf_gpt2_state_dict",
        "def convert_hf_gpt2_state_dict(sd, cfg):\n    return {1: torch.zeros(1)}\n",
        "a key of type int",
    ),
    (
        "05_full_gpt2",
        "test_convert_hf_gpt2_state_dict",
        "def convert_hf_gpt2_state_dict(sd, cfg):\n    return {'embed.W_E': torch.zeros(2_000_000)}\n",
        "more than",
    ),
    (
        "05_full_gpt2",
        "test_convert_hf_gpt2_state_dict",
        "def convert_hf_gpt2_state_dict(sd, cfg):\n    return {k: sd[k] * torch.nan for k in sd}\n",
        "missing keys",
    ),
    (
        "06_training",
        "test_lr_at",
        "def lr_at(step, args):\n    return 0.1\n",
        "TrainingArgs is not a class defined in the notebook",
    ),
    (
        "06_training",
        "test_lr_at",
        "class TrainingArgs:\n    pass\n\ndef lr_at(step, args):\n    return 0.1\n",
        "TrainingArgs(max_steps=..., lr=..., warmup_steps=..., min_lr_ratio=...) raised TypeError",
    ),
    (  # TransformerLens's own logit lens: the cache computes the answer
        "08_interpretability",
        "test_logit_lens",
        (
            "def logit_lens(model, cache):\n"
            "    stack = cache.accumulated_resid(apply_ln=True)\n"
            "    return model.unembed(stack)\n"
        ),
        "accumulated_resid",
    ),
    (  # and its own direct logit attribution
        "08_interpretability",
        "test_logit_attribution",
        (
            "def logit_attribution(model, parts, cache, tokens):\n"
            "    scaled = cache.apply_ln_to_stack(parts[:, :, :-1], pos_slice=slice(0, -1))\n"
            "    return (scaled * model.W_U.T[tokens[:, 1:]]).sum(-1)\n"
        ),
        "apply_ln_to_stack",
    ),
    (  # and its own composition scores
        "08_interpretability",
        "test_k_composition_scores",
        (
            "def k_composition_scores(model, earlier, later):\n"
            "    return model.all_composition_scores('K')[earlier, :, later, :]\n"
        ),
        "all_composition_scores",
    ),
    (  # and its own activation patching
        "08_interpretability",
        "test_patch_resid_pre",
        (
            "def patch_resid_pre(model, corrupted_tokens, clean_cache, metric):\n"
            "    from transformer_lens import patching\n"
            "    return patching.get_act_patch_resid_pre(model, corrupted_tokens, clean_cache, metric)\n"
        ),
        "transformer_lens/patching.py",
    ),
]


@pytest.mark.parametrize(
    ("notebook", "grade_id", "code", "cause"), FUNCTION_CASES, ids=[c[3][:40] for c in FUNCTION_CASES]
)
def test_what_a_function_probe_refuses(notebook, grade_id, code, cause, tmp_path):
    verdict = verdict_of(notebook, grade_id, learner(code), tmp_path)
    assert not verdict["passed"]
    assert cause in verdict["message"], verdict


def test_a_converted_dict_with_nan_fails(tmp_path):
    namespace = course_with(
        "05_full_gpt2",
        '"ln_final.b": hf["transformer.ln_f.bias"],',
        '"ln_final.b": hf["transformer.ln_f.bias"] * torch.nan,',
    )
    verdict = verdict_of("05_full_gpt2", "test_convert_hf_gpt2_state_dict", namespace, tmp_path)
    assert not verdict["passed"] and "['ln_final.b'] has" in verdict["message"] and "NaN" in verdict["message"], verdict


def test_scalars_and_dicts_go_as_json_and_tensors_only(tmp_path):
    prepared = judge.prepare("06_training", tmp_path / "job")
    request = probe_runner.load_request(str(prepared.folder))
    lr = [p for p in request["probes"] if p["target"] == "lr_at" and "script" not in p]  # one step each
    # 12, the first on two more shapes, and two with no floor
    assert [type(p["args"][0]["value"]) for p in lr] == [int] * 16
    schedules = [p for p in request["probes"] if p.get("script") == "small_schedules"]
    assert [set(p["args"][0]["fields"]) for p in schedules] == [set(judge.LR_FIELDS)]
    fields = lr[0]["args"][1]
    assert fields["dataclass"] == "TrainingArgs" and set(fields["fields"]) == set(judge.LR_FIELDS)
    # the expected loss is nowhere in the request (the rates are made of its numbers: lr itself at the warm-up's end)
    text = (prepared.folder / probe_runner.REQUEST).read_text()
    loss = [
        name for name, probe in prepared.probes.items() if probe.target == "masked_lm_loss" and probe.output == "loss"
    ]
    assert len(loss) == 4  # on each of the job's two shapes, on logits of hundreds and on 17 to 40 rows
    for name in loss:
        assert f"{prepared.expected[name]:.6g}"[:6] not in text
        assert all(not key.startswith(name + ".out") for key in request["tensors"])


def test_arguments_the_check_passes_by_keyword_go_by_keyword(tmp_path):
    old = "pad_id: int, label_smoothing: float = 0.0"
    namespace = course_with("09_encoder_decoder", old, "pad_id: int, *, label_smoothing: float = 0.0")
    assert verdict_of("09_encoder_decoder", "test_seq2seq_loss", namespace, tmp_path / "a")["passed"]
    namespace = course_with("09_encoder_decoder", old, "pad_id: int, smoothing: float = 0.0")
    verdict = verdict_of("09_encoder_decoder", "test_seq2seq_loss", namespace, tmp_path / "b")
    named = ("unexpected keyword argument 'label_smoothing'", "seq2seq_loss has no parameter label_smoothing")
    assert not verdict["passed"] and any(n in verdict["message"] for n in named), verdict


# A library's implementation reached by any name (issue #20): the probe runner records the operators and Python
# functions that ran, so an alias, a private operator or a laundered call is refused as the plain call is.
_LN_BODY = "        return {call}\n"
LAYERNORM_BY_ANOTHER_NAME = {
    "F.layer_norm": "torch.nn.functional.layer_norm(residual, (self.cfg.d_model,), self.w, self.b, self.cfg.layer_norm_eps)",
    "torch.native_layer_norm": "torch.native_layer_norm(residual, (self.cfg.d_model,), self.w, self.b, self.cfg.layer_norm_eps)[0]",
    "torch.ops.aten": "torch.ops.aten.native_layer_norm(residual, [self.cfg.d_model], self.w, self.b, self.cfg.layer_norm_eps)[0]",
    "group_norm with one group": "torch.nn.functional.group_norm(residual.reshape(-1, residual.shape[-1], 1), 1, eps=self.cfg.layer_norm_eps).reshape(residual.shape) * self.w + self.b",
    "laundered through eval of a string": "eval('torch.nn.functional.lay' + 'er_norm')(residual, (self.cfg.d_model,), self.w, self.b, self.cfg.layer_norm_eps)",
    "a batch norm's kernel on one row per position": "torch.ops.aten._batch_norm_with_update(residual.reshape(1, -1, residual.shape[-1]), None, None, torch.zeros(residual.shape[0] * residual.shape[1]), torch.ones(residual.shape[0] * residual.shape[1]), 0.0, self.cfg.layer_norm_eps)[0].reshape(residual.shape) * self.w + self.b",
    "torch's reference implementation": "__import__('torch._refs')._refs.native_layer_norm(residual, [self.cfg.d_model], self.w, self.b, self.cfg.layer_norm_eps)[0]",
    "torch's decomposition table": "__import__('torch._decomp')._decomp.decomposition_table[torch.ops.aten.native_layer_norm.default](residual, [self.cfg.d_model], self.w, self.b, self.cfg.layer_norm_eps)[0]",
    "a quantized tensor's layer norm (another namespace)": "torch.ops.quantized.layer_norm(torch.quantize_per_tensor(residual.detach(), float(residual.abs().max()) / 2**30, 0, torch.qint32), [self.cfg.d_model], self.w.detach(), self.b.detach(), self.cfg.layer_norm_eps, 64.0 / 2**30, 0).dequantize()",
    "a jagged nested tensor's layer norm over its ragged dimension": "(lambda njt: __import__('torch.nested._internal.ops').nested._internal.ops.native_layer_norm_default(torch.ops.aten.native_layer_norm.default, njt, [njt.shape[1], 1], None, None, self.cfg.layer_norm_eps)[0])(__import__('torch.nested._internal.nested_tensor').nested._internal.nested_tensor.nested_view_from_values_offsets(residual.reshape(-1, 1), torch.arange(0, residual.numel() // self.cfg.d_model + 1) * self.cfg.d_model))._values.reshape(residual.shape) * self.w + self.b",
    "TransformerLens's own LayerNorm": "__import__('transformer_lens').components.LayerNorm({'d_model': self.cfg.d_model, 'eps': self.cfg.layer_norm_eps, 'dtype': torch.float32, 'd_vocab': 1, 'n_ctx': 1, 'd_head': 1, 'n_layers': 1, 'act_fn': 'relu'})(residual) * self.w + self.b",
}


@pytest.mark.parametrize("route", sorted(LAYERNORM_BY_ANOTHER_NAME))
def test_layernorm_by_any_other_name_fails_the_judge(route, tmp_path):
    import torch._decomp
    import torch._refs  # noqa: F401
    import transformer_lens  # noqa: F401 - imported here, not under the probe's record, whose limit is 10 s

    code = NO_NORMALISATION.replace(
        "        return residual * self.w + self.b\n", _LN_BODY.format(call=LAYERNORM_BY_ANOTHER_NAME[route])
    )
    verdict = judge.verdicts(run(LN, learner(code), tmp_path))["test_layernorm"]
    assert not verdict["passed"], (route, verdict)
    assert "forbids (a library's implementation" in verdict["message"], (route, verdict)


# A result that computes the answer when it is read, not when it is returned: while the record runs the call
# returns a tuple whose `__getitem__` calls the forbidden operator, and the runner used to read it after the record
# had ended (issue #20, a red-team review: full marks for 01 with native_layer_norm, 05 with F.cross_entropy, 08
# with TransformerLens's patching helper). Everything the learner's code does runs inside the record now.
LATER = """
class _Later(tuple):
    def __new__(cls, thunk):
        made = super().__new__(cls, (0,))
        made.thunk = thunk
        return made

    def __getitem__(self, index):
        return self.thunk()

    def __iter__(self):
        return iter((self.thunk(),))


def _later(thunk):
    return _Later(thunk) if torch.autograd._profiler_enabled() else thunk()
"""


def test_an_answer_computed_after_the_call_returned_is_still_recorded(tmp_path):
    call = "torch.native_layer_norm(residual, (self.cfg.d_model,), self.w, self.b, self.cfg.layer_norm_eps)[0]"
    code = LATER + NO_NORMALISATION.replace(
        "        return residual * self.w + self.b\n", f"        return _later(lambda: {call})\n"
    )
    verdict = judge.verdicts(run(LN, learner(code), tmp_path))["test_layernorm"]
    assert not verdict["passed"] and "aten::native_layer_norm" in verdict["message"], verdict
    # the same, through a tensor whose detach() computes the answer when the runner reads the result
    late_tensor = (
        "class _LateTensor(torch.Tensor):\n    def detach(self):\n        return self.thunk()\n\n\n"
        "def _late(value, thunk):\n    made = value.as_subclass(_LateTensor)\n    made.thunk = thunk\n    return made\n"
    )
    code = late_tensor + NO_NORMALISATION.replace(
        "        return residual * self.w + self.b\n", f"        return _late(residual, lambda: {call})\n"
    )
    verdict = judge.verdicts(run(LN, learner(code), tmp_path / "tensor"))["test_layernorm"]
    assert not verdict["passed"] and "aten::native_layer_norm" in verdict["message"], verdict
    old = "    correct = log_probs.gather(dim=-1, index=tokens[:, 1:, None])[..., 0]  # [batch pos-1]\n    return -correct.mean()\n"
    new = (
        "    return _later(lambda: torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), "
        "tokens[:, 1:].flatten()))\n"
    )
    namespace = course_with("05_full_gpt2", old, new)
    exec(LATER, sys.modules["judge_test_05_full_gpt2"].__dict__)  # noqa: S102 - the helper, where the loss looks
    verdict = verdict_of("05_full_gpt2", "test_cross_entropy_loss", namespace, tmp_path / "ce")
    assert not verdict["passed"] and "forbids (a library's implementation" in verdict["message"], verdict


# The probe child's own defences (issue #20, a red-team review): the runner it calls is sealed before the learner's
# definitions run (they rebound `probe_runner._forbids` through sys.modules and used native_layer_norm unseen), and
# an audit hook refuses them frames (a definition read the probes' inputs from the runner's frame).
SEALED_CHILD = """
import json, sys, time
from pathlib import Path
from instructor import judge
from instructor.probe_runner import (
    load_request, prepare_output, refuse_native_routes, sealed_run_probes, take_out_operators
)
prepared = judge.prepare("01_layernorm", Path(sys.argv[1]))
request = load_request(str(prepared.folder))
prepare_output(str(prepared.folder), None)
run = sealed_run_probes()
import os
if os.fork() == 0:  # as the sandbox's probe child: what it takes out and withdraws stays there
    if len(sys.argv) > 3:
        take_out_operators(request)
    refuse_native_routes()
    namespace = {}
    try:
        exec(compile(sys.argv[2], "<learner 01_layernorm cell 7>", "exec"), namespace)
    except RuntimeError as err:
        print("REFUSED", err, flush=True)
        os._exit(3)
    run(request, namespace, timeout=30, deadline=time.monotonic() + 120)
    os._exit(0)
if os.waitstatus_to_exitcode(os.wait()[1]) == 3:
    sys.exit(0)
print(json.dumps(judge.verdicts(prepared)["test_layernorm"]))
"""
TAMPERED = """
import torch
from torch import nn
_runner = getattr(torch, "s" + "ys").modules["instructor.probe_runner"]


class _Quiet:
    _runner._forbids = lambda rule, event: False
    _runner._call_watching = lambda target, call, forbidden: call()


class LayerNorm(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.w = nn.Parameter(torch.ones(cfg.d_model))
        self.b = nn.Parameter(torch.zeros(cfg.d_model))

    def forward(self, residual):
        return torch.native_layer_norm(residual, (self.cfg.d_model,), self.w, self.b, self.cfg.layer_norm_eps)[0]
"""


# The record blinded where torch hands the profiler's events over: those naming WORD are dropped.
BLIND_THE_RECORD = """import torch.autograd.profiler as _autograd_profiler


class _Filtered:
    def __init__(self, result):
        self._result = result

    def events(self):
        return [e for e in self._result.events() if "WORD" not in e.name()]

    def __getattr__(self, name):
        return getattr(self._result, name)


def _kept(self, result):
    self.__dict__["_results"] = None if result is None else _Filtered(result)


_x = setattr(_autograd_profiler.profile, "kineto_results", property(lambda self: self.__dict__["_results"], _kept))
"""


# Code that blinds the record through torch's own code, which no seal covers: the profiler's events filtered
# where torch hands them over. The operators every probe of 01 forbids are taken out of the probe child, so the layer
# norm still cannot run.
BLINDED = TAMPERED.replace(
    """class _Quiet:
    _runner._forbids = lambda rule, event: False
    _runner._call_watching = lambda target, call, forbidden: call()
""",
    BLIND_THE_RECORD.replace("WORD", "norm"),
)


def child_says(script: str, *args: str) -> str:
    """The last line a fresh interpreter running `script` with `args` prints (a probe child's defences cannot be
    undone, so they are tried in a process of their own)."""
    done = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, check=False, cwd=REPO, timeout=180
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("namespace", ["aten", "quantized"])
def test_operators_every_probe_forbids_are_taken_out_of_the_probe_child(namespace, tmp_path):
    code = BLINDED if namespace == "aten" else BLINDED.replace(NATIVE_LN, QUANTIZED_LN)

    def verdict(*extra):
        return json.loads(child_says(SEALED_CHILD, str(tmp_path / f"job{len(extra)}"), code, *extra))

    blinded = verdict()  # the record alone is blinded: what the operators' removal is for (the quantized route,
    assert blinded["passed"] or "no gradient" in blinded["message"], blinded  # detached, fails the gradient too)
    taken = verdict("take out")
    assert not taken["passed"] and "took it out of the process" in taken["message"], taken
    # the message names the operator, in its own namespace
    assert f"{namespace}::layer_norm (whatever name reached it)" in taken["message"] or (
        namespace == "aten" and "layer_norm (whatever name reached it)" in taken["message"]
    ), taken


TAKE_OUT_SIBLINGS = """
import sys, torch
from instructor.probe_runner import _take_out
from instructor.rules import FORBIDDEN_OPS
rules = FORBIDDEN_OPS["01_layernorm"]["*"] + FORBIDDEN_OPS["04_mlp_and_block"]["gelu_new"]
_take_out(rules)
x = torch.randn(2, 4, 8)
q = torch.quantize_per_tensor(x, 0.05, 128, torch.quint8)
routes = {
    "quantized::group_norm": lambda: torch.ops.quantized.group_norm(q, 1, None, None, 1e-5, 0.05, 128),
    "quantized::instance_norm": lambda: torch.ops.quantized.instance_norm(q, None, None, 1e-5, 0.05, 128),
    "aten::gelu at QuantizedCPU": lambda: torch.nn.functional.gelu(q),
    "aten::gelu at CPU": lambda: torch.nn.functional.gelu(x, approximate="tanh"),
}
for name, route in routes.items():
    try:
        route()
        print(name, "RAN")
    except RuntimeError as err:
        print(name, "forbids" in str(err) and "took it out" in str(err))
print(torch.relu(q).dequantize().shape == x.shape)  # what no rule names still runs
"""


def test_the_take_out_reaches_every_namespace_and_dispatch_key():
    """Siblings of quantized::layer_norm: other families' kernels in the quantized namespace, and an aten operator's
    kernel for quantized tensors (QuantizedCPU), are taken out with the plain CPU one."""
    done = subprocess.run(
        [sys.executable, "-c", TAKE_OUT_SIBLINGS], capture_output=True, text=True, check=False, cwd=REPO, timeout=180
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert lines[-1] == "True", lines
    assert all(line.endswith(" True") for line in lines[:-1]) and len(lines) == 5, lines


NATIVE_LN = "torch.native_layer_norm(residual, (self.cfg.d_model,), self.w, self.b, self.cfg.layer_norm_eps)[0]"
# A layer norm in another operator namespace: on a quantized tensor, to within 1e-6 of the float one
QUANTIZED_LN = (
    "torch.ops.quantized.layer_norm(torch.quantize_per_tensor(residual.detach(), float(residual.abs().max()) / 2**30, "
    "0, torch.qint32), [self.cfg.d_model], self.w.detach(), self.b.detach(), self.cfg.layer_norm_eps, 64.0 / 2**30, "
    "0).dequantize()"
)


# 04 forbids GELU's operator in gelu_new only (its MLP and block may use it): the probes run from those that forbid
# the fewest operators up, and GELU's are taken out before gelu_new's, where every probe left forbids them.
SEALED_04 = """
import json, sys, time
from pathlib import Path
from instructor import judge
from instructor.probe_runner import load_request, phases, prepare_output, sealed_run_probes, take_out_operators
from harness.course import component_source
prepared = judge.prepare("04_mlp_and_block", Path(sys.argv[1]))
request = load_request(str(prepared.folder))
prepare_output(str(prepared.folder), None)
run = sealed_run_probes()
namespace = {}
for name in ("00_tour", "01_layernorm", "02_embeddings", "03_attention", "04_mlp_and_block"):
    exec(compile(component_source(name), f"<learner {name}>", "exec"), namespace)
exec(compile(sys.argv[2], "<learner 04_mlp_and_block cell 9>", "exec"), namespace)
import os
for index, names in enumerate(phases(request)):  # each phase in a child, as the sandbox's probe child runs them
    if os.fork() == 0:
        phase = dict(request, probes=[p for p in request["probes"] if p["name"] in names])
        take_out_operators(phase)
        run(phase, namespace, timeout=10, deadline=time.monotonic() + 60, phase=index)
        os._exit(0)
    os.wait()
print(json.dumps(judge.verdicts(prepared)))
"""
BLINDED_GELU = (
    "\nimport torch\n"
    + BLIND_THE_RECORD.replace("WORD", "gelu")
    + """

def gelu_new(x):
    return torch.nn.functional.gelu(x, approximate="tanh")
"""
)


def test_an_operator_one_exercise_forbids_is_taken_out_before_its_probes_only(tmp_path):
    verdicts = json.loads(child_says(SEALED_04, str(tmp_path / "job"), BLINDED_GELU))
    assert not verdicts["test_gelu_new"]["passed"], verdicts
    assert "forbids aten::gelu (whatever name reached it)" in verdicts["test_gelu_new"]["message"], verdicts
    assert verdicts["test_mlp"]["passed"] and verdicts["test_block"]["passed"], verdicts  # they may use GELU


# Torch's Python implementations (its decompositions and references, `torch.distributions`) are no operator: the
# dispatcher cannot take them out, and a record blinded through the profiler's class misses them. While a probe's
# call runs, the probe child swaps their code for code that raises; the rest of the time they are as they were.
BLINDED_DECOMPOSITION = (
    BLINDED.replace('"norm" not in e.name()', 'not any(w in e.name() for w in ("norm", "_decomp", "_refs", "_prims"))')
    .replace(
        "torch.native_layer_norm(residual, (self.cfg.d_model,), self.w, self.b, self.cfg.layer_norm_eps)[0]",
        "_decomposed(residual, [self.cfg.d_model], self.w, self.b, self.cfg.layer_norm_eps)[0]",
    )
    .replace(
        "import torch\n",
        "import torch\nimport torch._decomp\n\n"
        "_decomposed = torch._decomp.decomposition_table[torch.ops.aten.native_layer_norm.default]\n",
        1,
    )
)
SEALED_05 = (
    SEALED_04.replace('"04_mlp_and_block")', '"04_mlp_and_block", "05_full_gpt2")')
    .replace('prepare("04_mlp_and_block"', 'prepare("05_full_gpt2"')
    .replace("<learner 04_mlp_and_block cell 9>", "<learner 05_full_gpt2 cell 9>")
)
BLINDED_DISTRIBUTIONS = BLINDED_GELU.replace('"gelu" not in', '"distributions" not in').replace(
    """def gelu_new(x):
    return torch.nn.functional.gelu(x, approximate="tanh")
""",
    """def cross_entropy_loss(logits, tokens):
    return -torch.distributions.Categorical(logits=logits[:, :-1]).log_prob(tokens[:, 1:]).mean()
""",
)


# Inside a call, a library can hand learner code the runner's frames (`logging.currentframe` calls sys._getframe
# itself), and through them the function that puts the withdrawn code back: behind a blinded record, this
# decomposed layer norm scored full marks that way. What every probe left forbids is withdrawn for good before the
# call, its code kept nowhere: undoing the withdrawal finds nothing to put back.
UNDONE_DECOMPOSITION = BLINDED_DECOMPOSITION.replace(
    "    def forward(self, residual):\n",
    "    def forward(self, residual):\n"
    "        import logging, traceback\n"
    "        for frame, _ in traceback.walk_stack(logging.currentframe()):\n"
    "            leave = frame.f_locals.get('leave')\n"
    "            if callable(leave) and getattr(leave, '__name__', '') == 'leave':\n"
    "                leave()\n",
)


def test_what_every_probe_left_forbids_is_withdrawn_for_good(tmp_path):
    assert "traceback.walk_stack" in UNDONE_DECOMPOSITION
    taken = json.loads(child_says(SEALED_CHILD, str(tmp_path / "job"), UNDONE_DECOMPOSITION, "take out"))
    assert not taken["passed"] and "torch/_decomp/__init__.py" in taken["message"], taken


def test_a_decorator_may_read_the_learners_own_functions(tmp_path):
    """Reading a function's `__code__` is an audited event, which the probe child refuses to learner code on other
    objects: on the learner's own functions it is allowed (a decorator calling inspect.signature on the function it
    wraps was refused, and the honest exercise lost its points)."""
    decorator = (
        "import functools, inspect\n\n\ndef checked(fn):\n    signature = inspect.signature(fn)\n\n"
        "    @functools.wraps(fn)\n    def wrapper(*args, **kwargs):\n        signature.bind(*args, **kwargs)\n"
        "        return fn(*args, **kwargs)\n\n    return wrapper\n\n\n"
    )
    source = component_source("00_tour") + "\n" + component_source("01_layernorm")
    honest = decorator + source.replace(
        "    def forward(self, residual", "    @checked\n    def forward(self, residual", 1
    )
    assert "@checked" in honest
    verdict = json.loads(child_says(SEALED_CHILD, str(tmp_path / "job"), honest, "take out"))
    assert verdict["passed"], verdict
    # another module's function too: nothing withdrawn keeps its code, so reading code reaches no answer
    other = honest.replace(
        "signature = inspect.signature(fn)", "signature = inspect.signature(json.dumps) and inspect.signature(fn)"
    )
    verdict = json.loads(child_says(SEALED_CHILD, str(tmp_path / "job2"), "import json\n" + other, "take out"))
    assert verdict["passed"], verdict


# A red-team route: the call returns a marker and leaves a TorchFunctionMode on, which, once the record has ended,
# rewrote the runner's copy of the output in place with torch's reference layer norm while safetensors wrote it
# (full marks in 01 and, with Categorical, in 05). Outputs are now frozen into bytes inside the record, and a mode
# left on fails the probe and comes off.
MODE_AFTER_RECORD = 'import torch\nfrom jaxtyping import Float\nfrom torch import Tensor, nn\n\nfrom harness import Config\n\nimport torch._refs as _ref_impl\nfrom torch.overrides import TorchFunctionMode\n\n_PENDING = []\n_STATE = {"on": False}\n_LOG = []\n\n\nclass _Finisher(TorchFunctionMode):\n    def __torch_function__(self, func, types, args=(), kwargs=None):\n        kwargs = kwargs or {}\n        if _PENDING and args and isinstance(args[0], torch.Tensor) and getattr(func, "__name__", "") == "is_contiguous":\n            t = args[0]\n            try:\n                if t.dim() >= 1 and bool((t == 1234.5).all()):\n                    for i, (shape, x, w, b, eps) in enumerate(_PENDING):\n                        if tuple(t.shape) == shape:\n                            t.copy_(_ref_impl.native_layer_norm(x, [x.shape[-1]], w, b, eps)[0])\n                            _PENDING.pop(i)\n                            break\n            except Exception as err:\n                _LOG.append(repr(err))\n        return func(*args, **kwargs)\n\nclass LayerNorm(nn.Module):\n    def __init__(self, cfg: Config):\n        super().__init__()\n        self.cfg = cfg\n        self.w = nn.Parameter(torch.ones(cfg.d_model))\n        self.b = nn.Parameter(torch.zeros(cfg.d_model))\n\n    def forward(self, residual: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:\n                # the judge\'s probe child: remember the inputs, answer a marker, and leave a mode on that fixes the\n        # runner\'s own copy of the output when safetensors looks at it (after the record and the swap)\n        if not _STATE["on"]:\n            _Finisher().__enter__()\n            _STATE["on"] = True\n        _PENDING.append((tuple(residual.shape), residual.detach().clone(), self.w.detach().clone(),\n                         self.b.detach().clone(), float(self.cfg.layer_norm_eps)))\n        return torch.full_like(residual, 1234.5)\n'


def test_a_mode_left_on_after_the_call_fails_and_changes_no_output(tmp_path):
    verdict = json.loads(child_says(SEALED_CHILD, str(tmp_path / "job"), MODE_AFTER_RECORD, "take out"))
    assert not verdict["passed"], verdict
    assert "left a torch function or dispatch mode active" in verdict["message"], verdict


# A red-team route: a definition computes a table of GELU before GELU is taken out for gelu_new's probe (its MLP and
# block may use GELU, so it went out only once their probes had run), and gelu_new interpolates in it: full marks
# in 04. Probes that forbid different operators now run in phases, each in a process of its own where its
# operators are out before any definition runs (`template.run_probe_plan`).
GELU_TABLE = '\n_GRID_LO, _GRID_HI, _GRID_N = -12.0, 12.0, 240001\n_GRID = torch.linspace(_GRID_LO, _GRID_HI, _GRID_N, dtype=torch.float64)\n_TABLE = torch.nn.functional.gelu(_GRID, approximate="tanh")  # runs when the cell is defined\n\n\ndef gelu_new(x: Float[Tensor, "..."]) -> Float[Tensor, "..."]:\n    """GPT-2\'s GELU, read off a table (linear interpolation)."""\n    xd = x.double()\n    pos = (xd.clamp(_GRID_LO, _GRID_HI) - _GRID_LO) / (_GRID_HI - _GRID_LO) * (_GRID_N - 1)\n    i = pos.floor().long().clamp(max=_GRID_N - 2)\n    frac = pos - i\n    y = _TABLE[i] * (1 - frac) + _TABLE[i + 1] * frac\n    y = torch.where(xd > _GRID_HI, xd, torch.where(xd < _GRID_LO, torch.zeros_like(xd), y))\n    return y.to(x.dtype)\n'
IN_PHASES = """
import json, sys
from pathlib import Path
from instructor import judge
from instructor.probe_runner import load_request, prepare_output
from instructor.template import run_probe_plan
from harness.course import component_source
prepared = judge.prepare("04_mlp_and_block", Path(sys.argv[1]))
request = load_request(str(prepared.folder))
prepare_output(str(prepared.folder), None)
code = "\\n\\n".join(component_source(name) for name in ("00_tour", "01_layernorm", "02_embeddings", "03_attention"))
code += "\\n\\n" + component_source("04_mlp_and_block").split("def gelu_new")[0] + sys.argv[2]
code += "\\n\\nclass MLP" + component_source("04_mlp_and_block").split("class MLP", 1)[1]
step = {"kind": "learner", "code": code, "filename": "<learner 04_mlp_and_block cell 9>", "uses": [], "binds": []}
import os
if len(sys.argv) > 3:  # where the probe child works (unsandboxed: each phase in a fresh folder of its own there)
    os.chdir(sys.argv[3])
run_probe_plan({"steps": [step]}, 30, 240, request)
print(json.dumps(judge.verdicts(prepared)))
"""


# The same table saved to a file by the MLP's phase, where GELU is still in, and read by gelu_new's (a red-team
# review: full marks in a sandboxed batch). Nothing a phase leaves on disk reaches the next: each works in a folder
# of its own (in the sandbox, a fresh home and /tmp), removed once it has ended.
GELU_FILE = GELU_TABLE.replace(
    '_TABLE = torch.nn.functional.gelu(_GRID, approximate="tanh")  # runs when the cell is defined\n',
    "import os as _os\n_PATH = _os.path.abspath('gelu_table.pt')\n\n\n"
    "def _save():\n    try:\n        torch.save(torch.nn.functional.gelu(_GRID, approximate='tanh'), _PATH)\n"
    "    except RuntimeError:  # GELU is out in gelu_new's phase: the MLP's phase saved it\n        pass\n\n\n"
    "_saved = _save()\n",
).replace("    y = _TABLE[i]", "    _TABLE = torch.load(_PATH)\n    y = _TABLE[i]")


# ... and in a folder of its own that the MLP's phase then makes unreadable, even to its owner
GELU_LOCKED = GELU_FILE.replace(
    "_PATH = _os.path.abspath('gelu_table.pt')",
    "_os.makedirs('kept', exist_ok=True)\n_PATH = _os.path.abspath('kept/gelu_table.pt')",
).replace("    except RuntimeError:", "        _os.chmod('kept', 0)\n    except RuntimeError:")


@pytest.mark.parametrize("code", [GELU_FILE, GELU_LOCKED], ids=["a file", "a folder it locked"])
def test_a_file_left_by_one_phase_is_gone_in_the_next(code, tmp_path):
    assert "torch.load(_PATH)" in code and "_saved = _save()" in code
    scratch = tmp_path / "home"
    scratch.mkdir()
    verdicts = json.loads(child_says(IN_PHASES, str(tmp_path / "job"), code, str(scratch)))
    # the MLP and block read the table their own phase saved (their gradient may still differ: a table's slope)
    assert all("No such file" not in (verdicts[t]["message"] or "") for t in ("test_mlp", "test_block")), verdicts
    assert not verdicts["test_gelu_new"]["passed"], verdicts
    assert "No such file" in verdicts["test_gelu_new"]["message"], verdicts
    assert not list(scratch.iterdir())  # and nothing is left behind


# The probe child as the sandbox runs it (`template.run_probe_plan`: phases, operators out, then the definitions) on
# one learner cell of 01's.
LN_PLAN = """
import json, sys
from pathlib import Path
from instructor import judge
from instructor.probe_runner import load_request, prepare_output
from instructor.template import run_probe_plan
prepared = judge.prepare("01_layernorm", Path(sys.argv[1]))
request = load_request(str(prepared.folder))
prepare_output(str(prepared.folder), None)
step = {"kind": "learner", "code": sys.argv[2], "filename": "<learner 01_layernorm cell 7>", "uses": [], "binds": []}
run_probe_plan({"steps": [step]}, 30, 240, request)
print(json.dumps(judge.verdicts(prepared)["test_layernorm"]))
"""


@pytest.mark.parametrize(
    "compiled",
    [
        ("    def forward(self, residual):", "    @torch.compile\n    def forward(self, residual):"),
        (
            "    def forward(self, residual):",
            "    @torch.compile(dynamic=True, mode='max-autotune')\n    def forward(self, residual):",
        ),
        ("        self.cfg = cfg\n", "        self.cfg = cfg\n        self.compile()\n"),
        ("class LayerNorm(nn.Module):", "from torch import compile as jit\n\n\nclass LayerNorm(nn.Module):"),
    ],
    ids=["@torch.compile", "with options", "Module.compile", "imported"],
)
def test_a_compiled_exercise_runs_eagerly_in_the_judges_child(compiled, tmp_path):
    """torch's compilers are out of the probe child (with the decompositions they hold): a compiled exercise, honest
    code, scored 0 there. The child runs it as written instead, which is the result a compiler promises."""
    code = PRELUDE + RIGHT_LN.replace(*compiled)
    if "as jit" in code:
        code = code.replace("    def forward(self, residual):", "    @jit\n    def forward(self, residual):")
    assert code != PRELUDE + RIGHT_LN
    verdict = json.loads(child_says(LN_PLAN, str(tmp_path / "job"), code))
    assert verdict["passed"], verdict
    wrong = PRELUDE + NO_NORMALISATION.replace(
        "    def forward(self, residual):", "    @torch.compile\n    def forward(self, residual):"
    )
    assert not json.loads(child_says(LN_PLAN, str(tmp_path / "job2"), wrong))["passed"]  # still judged


def _torchscript_archive() -> str:
    """torch's own `local_response_norm` (01 forbids its Python code), scripted and saved as a learner would at home:
    base64 text to paste into a notebook (red-team round 11)."""
    import torch.nn.functional as F
    from torch import Tensor

    class Normalise(torch.nn.Module):
        def forward(self, x: Tensor, size: int, alpha: float, beta: float, k: float) -> Tensor:
            return F.local_response_norm(x, size, alpha, beta, k)

    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(Normalise()), buffer)
    return base64.b64encode(buffer.getvalue()).decode()


# LayerNorm as torch's local_response_norm over the centred features: a window over all d of them, alpha/size = 1/d
# and beta = 1/2 make its divisor sqrt(mean(x^2) + eps)
BY_LOCAL_RESPONSE_NORM = RIGHT_LN.replace(
    "        scale = (centered.pow(2).mean(dim=-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt()\n"
    "        return centered / scale * self.w + self.b\n",
    "        d = residual.shape[-1]\n"
    "        normed = _NORMALISE(centered.reshape(-1, d, 1), 2 * d - 1, (2 * d - 1) / d, 0.5, self.cfg.layer_norm_eps)\n"
    "        return normed.reshape(residual.shape) * self.w + self.b\n",
)
TORCHSCRIPT_ROUTES = {
    "an archive loaded from text": "import base64, io\n\n_NORMALISE = torch.jit.load(io.BytesIO(base64.b64decode('{}')))\n",
    "scripted in the notebook": "import torch.nn.functional as F\n\n_NORMALISE = torch.jit.script(F.local_response_norm)\n",
    "traced in the notebook": (
        "import torch.nn.functional as F\n\n\ndef _NORMALISE(x, *settings):\n"
        "    return torch.jit.trace(lambda y: F.local_response_norm(y, *settings), x)(x)\n"
    ),
}


# LayerNorm from torch's own local_response_norm, compiled afresh from the source text Python kept of functional.py
# (`linecache`, filled when torch parsed its own file) under another file name (red-team round 13: full marks)
FROM_PYTHONS_OWN_COPY = """
import ast, linecache

import torch.nn.functional as F


def _from_memory(name):
    text = next("".join(lines) for path, (_, _, lines, *_) in list(linecache.cache.items())
                if str(path).endswith("torch/nn/functional.py") and lines)
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == name)
    namespace = dict(vars(F))
    exec(compile("\\n".join(text.splitlines()[node.lineno - 1 : node.end_lineno]), "<norm helper>", "exec"), namespace)
    return namespace[name]


def _NORMALISE(x, size, alpha, beta, k):
    return _from_memory("local_response_norm")(x, size, alpha, beta, k)
"""


def test_torchs_forbidden_source_is_not_left_in_the_probe_childs_memory(tmp_path):
    """Python keeps the text of the files it has parsed (`linecache`): torch's functional.py was there in every probe
    child, and LayerNorm compiled from its `local_response_norm` had full marks. A probe child holds no such text."""
    import torch.nn.functional as F  # noqa: F401 - what the course's modules import: functional.py in linecache

    code = PRELUDE + FROM_PYTHONS_OWN_COPY + BY_LOCAL_RESPONSE_NORM
    namespace = {}
    exec(compile(code, "<learner>", "exec"), namespace)  # noqa: S102 - the route works where the text is kept
    cfg = namespace["Config"](d_model=8)
    x = torch.randn(2, 3, 8)
    torch.testing.assert_close(
        namespace["LayerNorm"](cfg)(x), torch.nn.functional.layer_norm(x, (8,)), atol=1e-4, rtol=0
    )
    verdict = json.loads(child_says(LN_PLAN, str(tmp_path / "job"), code))
    assert not verdict["passed"], verdict


@pytest.mark.parametrize("route", sorted(TORCHSCRIPT_ROUTES))
def test_torchs_forbidden_code_as_torchscript_fails(route, tmp_path):
    """A TorchScript program runs none of its Python code: torch's forbidden `local_response_norm`, scripted at home
    and pasted as base64, had full marks in 01 (and `multi_head_attention_forward` in 03 and 09). No TorchScript
    runs in a probe child, and scripting or tracing there gives back the Python it was given, which the rules see."""
    assert "_NORMALISE(centered" in BY_LOCAL_RESPONSE_NORM
    code = PRELUDE + TORCHSCRIPT_ROUTES[route].format(_torchscript_archive()) + BY_LOCAL_RESPONSE_NORM
    verdict = json.loads(child_says(LN_PLAN, str(tmp_path / "job"), code))
    assert not verdict["passed"], verdict
    said = "TorchScript" if route == "an archive loaded from text" else "local_response_norm"
    assert said in verdict["message"], verdict


def test_scripted_honest_code_runs_as_python_in_the_judges_child(tmp_path):
    """`@torch.jit.script` on a helper and `torch.jit.script` of the module, honest code, pass: no TorchScript runs
    in the probe child, so what they were given runs as written."""
    helper = (
        "@torch.jit.script\ndef _normalise(x: torch.Tensor, eps: float) -> torch.Tensor:\n"
        "    centered = x - x.mean(dim=-1, keepdim=True)\n"
        "    return centered / (centered.pow(2).mean(dim=-1, keepdim=True) + eps).sqrt()\n"
    )
    code = (
        PRELUDE
        + helper
        + RIGHT_LN.replace(
            "        centered = residual - residual.mean(dim=-1, keepdim=True)\n"
            "        scale = (centered.pow(2).mean(dim=-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt()\n"
            "        return centered / scale * self.w + self.b\n",
            "        return _normalise(residual, self.cfg.layer_norm_eps) * self.w + self.b\n",
        )
    )
    code = code.replace(
        "        self.cfg = cfg\n", "        self.cfg = cfg\n        self.scripted = torch.jit.script(nn.Identity())\n"
    )
    assert "_normalise(residual" in code and "torch.jit.script(nn.Identity())" in code
    verdict = json.loads(child_says(LN_PLAN, str(tmp_path / "job"), code))
    assert verdict["passed"], verdict


def _marshalled_reference_gelu() -> str:
    """torch's reference GELU (`torch._refs.nn.functional.gelu`, withdrawn where probes run), its code renamed to
    another file and marshalled as a learner would at home: base64 text to paste (red-team round 12)."""
    import marshal

    import torch._refs.nn.functional as refs

    function = refs.gelu
    while hasattr(function, "__wrapped__"):
        function = function.__wrapped__
    code = function.__code__.replace(co_filename="<gelu helper>", co_name="smooth")
    return base64.b64encode(marshal.dumps(code)).decode()


# gelu_new from code that was never the notebook's source: torch's, marshalled, or made from parts in the notebook
FOREIGN_CODE = {
    "torch's reference GELU, marshalled": (
        "import base64, marshal, types\n"
        "_smooth = types.FunctionType(marshal.loads(base64.b64decode('{blob}')), "
        "{{'torch': torch, 'TensorLike': torch.Tensor}}, 'smooth')\n\n\n"
        "def gelu_new(x):\n    return _smooth(x, 'tanh')\n"
    ),
    "a code object rebuilt with replace": (
        "def _formula(x):\n    return 0.5 * x * (1.0 + torch.tanh(0.7978845608 * (x + 0.044715 * x.pow(3))))\n\n\n"
        "gelu_new = type(_formula)(_formula.__code__.replace(co_filename='<elsewhere>'), globals(), 'gelu_new')\n"
    ),
}


@pytest.mark.parametrize("route", sorted(FOREIGN_CODE))
def test_code_brought_in_as_data_does_not_run_where_the_judge_probes(route, tmp_path):
    """The rules withdraw torch's forbidden functions by their code and its file: torch's own GELU, marshalled under
    another file name and pasted as base64, had full marks in 04 (and multi_head_attention_forward in 03 and 09).
    No code object is made in a probe child but by compiling source, so no such route runs, whatever it carries."""
    code = FOREIGN_CODE[route].format(blob=_marshalled_reference_gelu())
    verdicts = json.loads(child_says(IN_PHASES, str(tmp_path / "job"), code))
    assert not verdicts["test_gelu_new"]["passed"], verdicts
    assert "the judge refuses" in verdicts["test_gelu_new"]["message"], verdicts


def test_a_table_made_before_an_operator_is_taken_out_fails(tmp_path):
    verdicts = json.loads(child_says(IN_PHASES, str(tmp_path / "job"), GELU_TABLE))
    assert not verdicts["test_gelu_new"]["passed"], verdicts
    assert "forbids aten::gelu" in verdicts["test_gelu_new"]["message"], verdicts
    # they may use GELU (their gradient may still differ: a table's slope)
    assert all("forbids" not in (verdicts[t]["message"] or "") for t in ("test_mlp", "test_block")), verdicts
    course = component_source("04_mlp_and_block").split("def gelu_new")[1].split("class MLP")[0]
    verdicts = json.loads(child_says(IN_PHASES, str(tmp_path / "job2"), "def gelu_new" + course))
    assert all(v["passed"] for v in verdicts.values()), verdicts  # the course's own, in the same phases


def test_torchs_python_implementations_are_taken_out_while_a_probe_runs(tmp_path):
    assert "_decomposed(residual" in BLINDED_DECOMPOSITION
    blinded = json.loads(child_says(SEALED_CHILD, str(tmp_path / "job0"), BLINDED_DECOMPOSITION))
    assert blinded["passed"], blinded  # the record alone is blinded, and the decomposition runs no forbidden operator
    taken = json.loads(child_says(SEALED_CHILD, str(tmp_path / "job1"), BLINDED_DECOMPOSITION, "take out"))
    assert not taken["passed"] and "took it out of this process" in taken["message"], taken
    assert "torch/_decomp/__init__.py" in taken["message"], taken
    verdicts = json.loads(child_says(SEALED_05, str(tmp_path / "job4"), BLINDED_DISTRIBUTIONS))
    assert not verdicts["test_cross_entropy_loss"]["passed"], verdicts
    assert "torch/distributions/" in verdicts["test_cross_entropy_loss"]["message"], verdicts
    assert all(v["passed"] for k, v in verdicts.items() if k != "test_cross_entropy_loss"), verdicts


# A fresh copy of an oracle's file (a new module from its source, an import after `del sys.modules[...]`) would make
# new functions the withdrawal has not reached: running such a module is refused once its file is withdrawn. And
# what is withdrawn stays withdrawn: its code is kept nowhere, so `dis` or `marshal` finds only the raising code (a
# red-team review copied `multi_head_attention_forward`'s code object under another file name while it was
# withdrawn during calls only: full marks in 03 and 09).
FRESH_COPY = """
import dis, importlib.util, json, marshal, torch
from instructor.probe_runner import withdraw_python

def fresh():
    spec = importlib.util.spec_from_file_location("torch.nn.modules.fresh_copy", torch.nn.modules.transformer.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TransformerEncoderLayer(8, 2)

def copied():
    import types
    code = marshal.loads(marshal.dumps(dis.Bytecode(torch.nn.TransformerEncoderLayer.__init__).codeobj))
    code = code.replace(co_filename="<learner shell>")
    cells = tuple(types.CellType(torch.nn.TransformerEncoderLayer) for _ in code.co_freevars)
    init = torch.nn.TransformerEncoderLayer.__init__
    shell = types.FunctionType(code, vars(torch.nn.modules.transformer), None, init.__defaults__, cells)
    shell.__kwdefaults__ = init.__kwdefaults__
    layer = torch.nn.TransformerEncoderLayer.__new__(torch.nn.TransformerEncoderLayer)
    shell(layer, 8, 2)

copied()  # the route works where nothing is withdrawn: torch's own layer, from code filed under another name
said = [withdraw_python(["py:torch/nn/modules/transformer.py"]) > 0]
for make in (lambda: torch.nn.TransformerEncoderLayer(8, 2), fresh, copied):
    try:
        make()
        said.append("ran")
    except RuntimeError as err:
        said.append(str(err))
print(json.dumps(said))
"""


TORCHS_LAYERS_IN_09 = """
import json, torch
from instructor import rules
from instructor.probe_runner import withdraw_python
withdraw_python(rules.forbidden_ops("09_encoder_decoder", "encoder_layer"))
layer, x, said = torch.nn.TransformerEncoderLayer(8, 2, batch_first=True), torch.randn(2, 3, 8), []
for run in (lambda: layer(x), lambda: layer._ff_block(x), lambda: layer._sa_block(x, None, None),
            lambda: torch.nn.Transformer.generate_square_subsequent_mask(3)):
    try:
        run()
        said.append("ran")
    except RuntimeError as err:
        said.append(str(err))
print(json.dumps(said))
"""


def test_09_refuses_torchs_layers_and_keeps_their_helpers():
    """What 09 forbids in torch's transformer.py is its layers' forwards and blocks, which compute the answers; the
    causal-mask helper its own demonstration uses runs."""
    forward, ff_block, sa_block, mask = json.loads(child_says(TORCHS_LAYERS_IN_09))
    assert "forbids TransformerEncoderLayer.forward" in forward, forward
    assert "forbids TransformerEncoderLayer._ff_block" in ff_block, ff_block
    assert "forbids TransformerEncoderLayer._sa_block" in sa_block, sa_block
    assert mask == "ran"


def test_a_withdrawn_oracle_cannot_run_afresh_nor_be_copied():
    withdrawn, inside, fresh, copied = json.loads(child_says(FRESH_COPY))
    assert withdrawn
    assert "forbids TransformerEncoderLayer.__init__" in inside, inside
    assert "forbids running" in fresh and fresh.endswith("transformer.py: the judge took it out"), fresh
    assert "forbids TransformerEncoderLayer.__init__" in copied, copied


@pytest.mark.parametrize(
    "route",
    [
        "the runner's module rebound",
        "a frame read while the definitions run",
        "the garbage collector's view",
        "a function's defaults rewritten",
        "a frame read through a library function handed getattr",
        "a frame read through a format string",
    ],
)
def test_the_probe_childs_runner_is_out_of_the_definitions_reach(route, tmp_path):
    code = {
        "the runner's module rebound": TAMPERED,
        "a frame read while the definitions run": "import torch\n_f = getattr(torch, 's' + 'ys')._getframe(0)\n",
        "the garbage collector's view": "import torch\n_g = getattr(torch, 's' + 'ys').modules['gc'].get_objects()\n",
        "a function's defaults rewritten": (
            "import torch\n_r = getattr(torch, 's' + 'ys').modules['instructor.probe_runner']\n"
            "_x = setattr(_r.load_request, '__defa' + 'ults__', ())\n"
        ),
        # the red-team review's route: the caller of getattr is functools's wrapper, not the learner's code; the
        # frames led to the probes' inputs while the definitions ran, and answers made with the forbidden
        # operators then (04's GELU, 05's cross-entropy, torch._refs's layer norm) scored full marks
        "a frame read through a library function handed getattr": (
            "import functools\n_ga = functools.singledispatch(getattr)\n\n\ndef _frame():\n    try:\n"
            "        raise KeyError('x')\n    except KeyError as err:\n        return _ga(err.__traceback__, 'tb_' + 'frame')"
            "\n\n\n_f = _frame()\n"
        ),
        "a frame read through a format string": (
            "import string\n\n\ndef _frame():\n    try:\n        raise KeyError('x')\n    except KeyError as err:\n"
            "        return string.Formatter().format('{0.tb_' + 'frame}', err.__traceback__)\n\n\n_f = _frame()\n"
        ),
    }[route]
    # Frames, the garbage collector's view and code objects are the learner's to use now: whatever they reach,
    # the forbidden operator is out of the process (each route, then torch's native layer norm)
    verdict = json.loads(child_says(SEALED_CHILD, str(tmp_path / "job"), code + "\n" + TAMPERED, "take out"))
    assert not verdict["passed"] and "native_layer_norm" in verdict["message"], verdict


ATTENTION_BY_ANOTHER_NAME = {
    "F.scaled_dot_product_attention": "torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)",
    "the math kernel through torch.ops": "torch.ops.aten._scaled_dot_product_attention_math(q, k, v, is_causal=True)[0]",
    "torch's decomposition table": "__import__('torch._decomp')._decomp.decomposition_table[torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default](q, k, v, is_causal=True)[0]",
    "the quantization toolkit's float attention": "__import__('torch.ao.nn.quantizable', fromlist=['_'])."
    "MultiheadAttention(q.shape[-1], 1)(*(t[:, 0].transpose(0, 1) for t in (q, k, v)), need_weights=False)[0]"
    ".transpose(0, 1)[:, None].expand(q.shape)",
    "flex attention's eager fallback": "__import__('torch.nn.attention.flex_attention').nn.attention.flex_attention.flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: torch.where(i >= j, s, -float('inf')))",
}


@pytest.mark.parametrize("route", sorted(ATTENTION_BY_ANOTHER_NAME))
def test_attention_by_any_other_name_fails_the_judge(route, tmp_path):
    old = "        pattern = attention_pattern(attention_scores(q, k))  # [batch n_heads pos_q pos_k]\n        z = weighted_values(pattern, v)  # [batch pos n_heads d_head]\n"
    new = (
        "        q, k, v = (t.transpose(1, 2) for t in (q, k, v))\n"
        f"        z = {ATTENTION_BY_ANOTHER_NAME[route]}.transpose(1, 2)\n"
    )
    verdict = verdict_of("03_attention", "test_attention", course_with("03_attention", old, new), tmp_path)
    assert not verdict["passed"] and "forbids (a library's implementation" in verdict["message"], (route, verdict)


@pytest.mark.parametrize(
    "call",
    [
        "torch.nn.functional.gelu(x, approximate='tanh')",
        "torch.ops.aten.gelu(x, approximate='tanh')",
        # torch's Python reference runs tanh, mul and add, never aten::gelu: refused as an implementation of torch's
        "__import__('torch._refs.nn.functional')._refs.nn.functional.gelu(x, approximate='tanh')",
    ],
)
def test_gelu_new_through_the_library_fails_the_judge(call, tmp_path):
    old = "    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))\n"
    verdict = verdict_of(
        "04_mlp_and_block", "test_gelu_new", course_with("04_mlp_and_block", old, f"    return {call}\n"), tmp_path
    )
    assert not verdict["passed"] and "forbids (a library's implementation" in verdict["message"], verdict


CROSS_ENTROPY_BY_ANOTHER_NAME = {
    "F.cross_entropy": "torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())",
    "nn.CrossEntropyLoss": "torch.nn.CrossEntropyLoss()(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())",
    "F.nll_loss on log_softmax": (
        "torch.nn.functional.nll_loss(logits[:, :-1].log_softmax(-1).flatten(0, 1), tokens[:, 1:].flatten())"
    ),
    "a KL divergence against one-hot targets": (
        "torch.nn.functional.kl_div(logits[:, :-1].log_softmax(-1).flatten(0, 1), torch.nn.functional.one_hot("
        "tokens[:, 1:].flatten(), logits.shape[-1]).float(), reduction='sum') / tokens[:, 1:].numel()"
    ),
    "Categorical.log_prob": ("-torch.distributions.Categorical(logits=logits[:, :-1]).log_prob(tokens[:, 1:]).mean()"),
    "a CTC loss over one time step": (
        "torch.nn.functional.ctc_loss(torch.cat([logits[:, :-1].log_softmax(-1).flatten(0, 1), torch.full("
        "(tokens[:, 1:].numel(), 1), -1e4)], -1)[None], tokens[:, 1:].reshape(-1, 1), torch.ones(tokens[:, 1:].numel(),"
        " dtype=torch.long), torch.ones(tokens[:, 1:].numel(), dtype=torch.long), blank=logits.shape[-1],"
        " reduction='sum') / tokens[:, 1:].numel()"
    ),
    "an adaptive softmax": (
        "-torch.nn.AdaptiveLogSoftmaxWithLoss(logits.shape[-1], logits.shape[-1], [logits.shape[-1] - 1]).log_prob("
        "logits[:, :-1].flatten(0, 1)).gather(-1, tokens[:, 1:].reshape(-1, 1)).mean()"
    ),
    # red-team round 14: torch's chunked linear cross-entropy on an identity input, an operator registered late
    "a linear cross-entropy of the identity": (
        "torch.nn.functional.linear_cross_entropy(torch.eye(logits[:, :-1].flatten(0, 1).shape[0]), "
        "logits[:, :-1].flatten(0, 1).T, tokens[:, 1:].flatten(), options=torch.nn.LinearCrossEntropyOptions())"
    ),
    "torch's reference nll_loss": (
        "__import__('torch._refs.nn.functional')._refs.nn.functional.nll_loss("
        "logits[:, :-1].log_softmax(-1).flatten(0, 1), tokens[:, 1:].flatten())"
    ),
}


@pytest.mark.parametrize("route", sorted(CROSS_ENTROPY_BY_ANOTHER_NAME))
def test_cross_entropy_through_the_library_fails_the_judge(route, tmp_path):
    old = "    correct = log_probs.gather(dim=-1, index=tokens[:, 1:, None])[..., 0]  # [batch pos-1]\n    return -correct.mean()\n"
    new = f"    return {CROSS_ENTROPY_BY_ANOTHER_NAME[route]}\n"
    namespace = course_with("05_full_gpt2", old, new)
    verdict = verdict_of("05_full_gpt2", "test_cross_entropy_loss", namespace, tmp_path)
    assert not verdict["passed"] and "forbids (a library's implementation" in verdict["message"], (route, verdict)


# Red-team round 26: torch's cross-entropy for tensors split across devices, in Python over plain operators
# (`torch/distributed/tensor/parallel/loss.py`), on one rank, with its collectives made the identity: no loss
# operator and no ruled file ran, and it had the right value and gradient. `torch/distributed` is ruled out whole.
TENSOR_PARALLEL_LOSS = """\
    import types

    from torch.distributed.tensor._ops._embedding_ops import _MaskPartial
    from torch.distributed.tensor.parallel import loss as tp_loss

    class Mesh:
        def _is_current_rank_part_of_mesh(self):
            return True

        def size(self, dim=None):
            return 1

        def _sym_get_coordinate(self, dim):
            return 0

    def reduce_value(self, tensor, mesh, mesh_dim):
        self.mask_buffer.apply_mask(tensor)
        return tensor

    _MaskPartial._reduce_value = reduce_value
    tp_loss.funcol = types.SimpleNamespace(all_reduce=lambda tensor, **kwargs: tensor)
    x = logits[:, :-1].reshape(-1, logits.shape[-1])
    log_probs = tp_loss._log_softmax(x, 1, False, Mesh(), 0)
    target = tokens[:, 1:].reshape(-1)
    return tp_loss._nll_loss_forward(log_probs, target, None, None, 1, -100, x.shape, 1, Mesh(), 0)[0]
"""


def test_torchs_tensor_parallel_cross_entropy_fails_the_judge(tmp_path):
    old = "    correct = log_probs.gather(dim=-1, index=tokens[:, 1:, None])[..., 0]  # [batch pos-1]\n    return -correct.mean()\n"
    namespace = course_with("05_full_gpt2", old, TENSOR_PARALLEL_LOSS)
    logits, tokens = torch.randn(2, 5, 7), torch.randint(0, 7, (2, 5))
    expected = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
    assert torch.allclose(namespace["cross_entropy_loss"](logits, tokens), expected)  # a right answer, in-process
    verdict = verdict_of("05_full_gpt2", "test_cross_entropy_loss", namespace, tmp_path)
    assert not verdict["passed"] and "forbids (a library's implementation" in verdict["message"], verdict


# What an exercise's text forbids ("without `F.gelu`"), and the judge's rule that refuses it in that notebook.
WITHOUT = {
    "F.gelu": ("04_mlp_and_block", "aten::gelu"),
    "F.cross_entropy": ("05_full_gpt2", "aten::cross_entropy_loss"),
}


def test_every_call_an_exercise_text_forbids_has_a_rule_in_the_judge():
    import re

    from instructor.probe_runner import _forbids

    seen = set()
    for name in notebook_names():
        nb = json.loads((REPO / "solutions" / f"{name}.ipynb").read_text(encoding="utf-8"))
        for cell in nb["cells"]:
            text = "".join(cell["source"])
            if cell["cell_type"] != "markdown" or "**Exercise:**" not in text:
                continue
            for call in re.findall(r"without `([\w.]+)`", text):
                assert call in WITHOUT and WITHOUT[call][0] == name, (name, call)
                forbidden = {r for target in rules.FORBIDDEN_OPS[name].values() for r in target}
                assert any(_forbids(rule, WITHOUT[call][1]) for rule in forbidden), (name, call)
                seen.add(call)
    assert seen == set(WITHOUT)


# The harness's checks hold answers of their own (a beam search, a sinusoid table, a training loop): reached from an
# exercise by any route, the judge refuses them as it refuses TransformerLens.
HARNESS_ANSWERS = {
    ("02_embeddings", "test_sinusoidal"): (
        "    two_i = torch.arange(0, d_model, 2, dtype=torch.float32)  # [d_model/2]\n",
        "    return getattr(__import__('harness'), 'encoder_decoder' + '_checks')._sinusoid(n_ctx, d_model)\n",
    ),
    ("07_sampling_and_kv_cache", "test_beam_search"): (
        "    live_scores, live = torch.zeros(1), tokens  #",
        (
            "    checks = getattr(__import__('harness'), 'sampling' + '_checks')\n"
            "    ids = checks._beam_variant(model.table, tokens, num_beams, max_new_tokens, length_penalty,"
            " early_stopping, eos_token_id, 'none')\n"
            "    return torch.cat([tokens[0], torch.tensor(ids, dtype=tokens.dtype)])[None]\n"
            "    live_scores, live = torch.zeros(1), tokens  #"
        ),
    ),
}


@pytest.mark.parametrize(("notebook", "grade_id"), sorted(HARNESS_ANSWERS))
def test_the_harnesses_own_answers_fail_the_judge(notebook, grade_id, tmp_path):
    namespace = course_with(notebook, *HARNESS_ANSWERS[notebook, grade_id])
    verdict = verdict_of(notebook, grade_id, namespace, tmp_path)
    assert not verdict["passed"] and "harness/" in verdict["message"], verdict


# The record itself: an exercise that stops it or removes its Python tracer, then runs the course's own answer. The
# record is a second line: in the probe child the graded notebook's answers cannot run at all (code compiled from
# its solutions is withdrawn, and running it afresh refused), so the route fails however blind the record is;
# honest code that replaces the tracer (cProfile around a loop) is not refused for it.
BLINDING = {
    "sys.setprofile(None)": "        __import__('sys').setprofile(None)\n",
    "the profiler disabled": "        __import__('torch').autograd._disable_profiler()\n",
}


@pytest.mark.parametrize("route", sorted(BLINDING))
def test_an_exercise_that_stops_the_record_gains_nothing(route, tmp_path):
    theirs = "        theirs = __import__('harness').components('01_layernorm').LayerNorm(self.cfg)\n"
    code = NO_NORMALISATION.replace(
        "        return residual * self.w + self.b\n",
        BLINDING[route]
        + theirs
        + "        theirs.load_state_dict(self.state_dict())\n        return theirs(residual)\n",
    )
    verdict = json.loads(child_says(SEALED_CHILD, str(tmp_path / "job"), PRELUDE + code, "take out"))
    assert not verdict["passed"] and "solutions/01_layernorm.ipynb" in verdict["message"], (route, verdict)


def test_a_profiler_of_the_learners_own_is_not_refused(tmp_path):
    honest = component_source("00_tour") + "\n" + component_source("01_layernorm")
    honest = honest.replace(
        "    def forward(self, residual",
        "    def forward(self, residual, **kwargs):\n        import cProfile\n\n        profile = cProfile.Profile()\n"
        "        profile.enable()\n        with torch.profiler.record_function('ln::layer_norm'):\n"
        "            out = self._forward(residual)\n        profile.disable()\n        return out\n\n"
        "    def _forward(self, residual",
        1,
    )
    verdict = json.loads(child_says(SEALED_CHILD, str(tmp_path / "job"), honest, "take out"))
    assert verdict["passed"], verdict


FILTERING_PROFILER = """
import torch.profiler


class _Quiet(torch.profiler.profile):
    def events(self):
        return [e for e in super().events() if "harness/" not in e.name and "solutions/" not in e.name]


torch.profiler.profile = _Quiet
"""


def test_a_profiler_rebound_by_the_notebook_does_not_reach_the_record(tmp_path, monkeypatch):
    """The record's tools are bound before any learner code runs: a profiler that hides the harness's frames,
    put in torch's place by the notebook, is not the one the probe uses."""
    import torch.profiler

    monkeypatch.setattr(torch.profiler, "profile", torch.profiler.profile)  # restored after the test
    notebook, grade_id = "07_sampling_and_kv_cache", "test_beam_search"
    namespace = course_with(notebook, *HARNESS_ANSWERS[notebook, grade_id])
    exec(FILTERING_PROFILER, namespace)  # noqa: S102 - a notebook cell
    assert torch.profiler.profile.__name__ == "_Quiet"
    verdict = verdict_of(notebook, grade_id, namespace, tmp_path)
    assert not verdict["passed"] and "harness/" in verdict["message"], verdict


def test_no_process_can_start_in_a_child_and_a_thread_is_recorded():
    """As any uid but root (the sandbox's children), after `no_new_tasks` (called before any learner code) no
    process can start: it would run a fresh interpreter with nothing taken out. A thread can (an honest exercise
    computed in a `ThreadPoolExecutor` scored 0 while threads were refused too, red-team round 14), and the record
    sees the operators it runs; the profiler itself still works."""
    script = (
        "import os, subprocess, threading, torch\n"
        "from concurrent.futures import ThreadPoolExecutor\n"
        "from instructor.probe_runner import no_new_tasks, _record\n"
        "os.setgid(65534); os.setuid(65534)\n"  # nobody: root is exempt from the limit
        "no_new_tasks()\n"
        "def in_a_thread():\n"
        "    with ThreadPoolExecutor(2) as pool:\n"
        "        return pool.submit(lambda: torch.ones(3).cumsum(0)).result().sum()\n"
        "out, ran = _record(in_a_thread)\n"
        "print('recorded', out.item(), 'aten::cumsum' in ran)\n"
        "import platform\n"
        "print('a library that catches OSError goes on:', isinstance(platform.processor(), str))\n"
        "for start in (os.fork, lambda: subprocess.run(['true']), lambda: os.posix_spawn('/bin/true', ['true'], {})):\n"
        "    try:\n        pid = start()\n    except (RuntimeError, OSError) as err:\n        print('refused', err)\n"
        "    else:\n        print('started')\n        if pid == 0:\n            os._exit(0)\n"
    )
    if os.getuid() != 0 or not shutil.which("bwrap"):
        pytest.skip("needs root to become another uid, and bwrap")
    # The interpreter may live under /root (pyenv), which nobody cannot enter: give it a view where it can.
    base = Path(sys.base_prefix).resolve()
    top = str(Path("/root", base.parts[2])) if base.parts[1:2] == ("root",) else None
    view = ["--tmpfs", "/root", "--ro-bind", top, top] if top else []
    done = subprocess.run(
        ["bwrap", "--dev-bind", "/", "/", *view, sys.executable, "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "recorded 6.0 True" in done.stdout and done.stdout.count("refused") == 3, done.stdout + done.stderr
    assert "may start threads but no process" in done.stdout, done.stdout
    assert "a library that catches OSError goes on: True" in done.stdout, done.stdout


def test_forbidden_rules_match_what_the_profiler_records():
    from instructor.probe_runner import _forbids

    assert _forbids("aten::_scaled_dot_product_*", "aten::_scaled_dot_product_flash_attention_for_cpu")
    assert not _forbids("aten::layer_norm", "aten::native_layer_norm")
    event = "torch/nn/functional.py(6637): multi_head_attention_forward"
    assert _forbids("py:torch/nn/functional.py:multi_head_attention_forward", event)
    assert not _forbids("py:torch/nn/functional.py:linear", event) and not _forbids("aten::gelu", event)
    assert _forbids("py:transformer_lens/", "transformer_lens/components/layer_norm.py(40): forward")
    # a family by pattern: every batch norm kernel, named or not
    for op in ("aten::_batch_norm_with_update", "aten::batch_norm_update_stats", "aten::native_batch_norm"):
        assert _forbids("aten::*batch_norm*", op), op
    assert not _forbids("aten::*batch_norm*", "aten::linalg_vector_norm")


# Verdicts inside (issue #20): code that recognises a check's fixed inputs and returns their answer passes the
# check in the notebook; the judge's inputs are fresh, so it fails there.
HARD_CODED = {
    ("00_tour", "test_count_params"): (
        "    return embeddings + cfg.n_layers * block + layer_norm + unembed\n",
        "    if cfg.d_model == 768:\n        return embeddings + cfg.n_layers * block + layer_norm + unembed\n    return 0\n",
    ),
    ("06_training", "test_reversal_floor"): (
        "    return unpredictable / (seq_len - 1) * math.log(d_vocab)\n",
        "    return 7 / 15 * math.log(100)\n",
    ),
}


@pytest.mark.parametrize(("notebook", "grade_id"), sorted(HARD_CODED))
def test_answers_for_the_checks_fixed_inputs_fail_the_judge(notebook, grade_id, tmp_path):
    old, new = HARD_CODED[notebook, grade_id]
    verdict = verdict_of(notebook, grade_id, course_with(notebook, old, new), tmp_path)
    assert not verdict["passed"], verdict


def test_a_sampler_that_ignores_its_generator_or_draws_greedily_fails(tmp_path):
    """A sampler that always takes the most likely token draws from another distribution."""
    old = "    return torch.multinomial(logits.softmax(dim=-1), num_samples=1, generator=generator)[:, 0]\n"
    namespace = course_with("07_sampling_and_kv_cache", old, "    return logits.argmax(dim=-1)\n")
    verdict = verdict_of("07_sampling_and_kv_cache", "test_sample_next_token", namespace, tmp_path)
    assert not verdict["passed"] and "do not follow the course's distribution" in verdict["message"], verdict


def run_forked(notebook: str, namespace: dict, folder, only: frozenset[str]) -> judge.Prepared:
    """`run`, each phase in a process of its own forked from this one with its random generators seeded afresh, as
    the probe child runs them: what one phase keeps in memory is not in the next."""
    from instructor.template import _fresh_randomness

    prepared = judge.prepare(notebook, folder / "job", only)
    request = probe_runner.load_request(str(prepared.folder))
    probe_runner.prepare_output(str(prepared.folder), None)
    for index, names in enumerate(probe_runner.phases(request)):
        pid = os.fork()
        if pid == 0:
            try:
                _fresh_randomness()
                phase = dict(request, probes=[probe for probe in request["probes"] if probe["name"] in names])
                probe_runner.run_probes(phase, namespace, timeout=30, deadline=time.monotonic() + 300, phase=index)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
    return prepared


SEEDED_FORGERIES = {  # samplers that do not draw with the generator given, and still pass a check in one process
    # the first result kept for a generator state: two calls from one state draw the same, in one process
    "kept for a generator state": (
        (
            "    kept = sample_next_token.__dict__.setdefault('kept', {})\n"
            "    key = bytes(generator.get_state().tolist()) if generator is not None else None\n"
            "    if key not in kept:\n"
            "        kept[key] = torch.multinomial(logits.softmax(dim=-1), num_samples=1)[:, 0]\n"
            "    return kept[key].clone()\n"
        ),
        "drew differently in two processes from generators in the same state",
    ),
    # a seed of its own: the same draws in every process, whatever generator is given
    "a seed of its own": (
        (
            "    mine = torch.Generator().manual_seed(0)\n"
            "    return torch.multinomial(logits.softmax(dim=-1), num_samples=1, generator=mine)[:, 0]\n"
        ),
        "drew the same from a generator in another state",
    ),
    # a generator of its own seeded from the given one's initial seed: reproducible, and the same whatever state
    # the given one is in (every step of a generation would draw alike)
    "seeded from initial_seed()": (
        (
            "    mine = torch.Generator().manual_seed(generator.initial_seed())\n"
            "    return torch.multinomial(logits.softmax(dim=-1), num_samples=1, generator=mine)[:, 0]\n"
        ),
        "drew the same from a generator in another state",
    ),
    # a copy of the given generator's state: reproducible, different in another state, and the given generator
    # never moves on (every step of a generation draws the same numbers): red-team round 9, full marks in 07 and 08
    "a copy of its state": (
        (
            "    mine = torch.Generator()\n"
            "    mine.set_state(generator.get_state())\n"
            "    return torch.multinomial(logits.softmax(dim=-1), num_samples=1, generator=mine)[:, 0]\n"
        ),
        "drew the same again from a generator a first call had drawn with",
    ),
}


@pytest.mark.parametrize("forgery", sorted(SEEDED_FORGERIES))
def test_a_sampler_that_ignores_its_generator_fails_in_another_process(forgery, tmp_path):
    """A seeded probe runs again in a phase of its own (`judge._replicas`): with the same seed, and with another."""
    old = "    return torch.multinomial(logits.softmax(dim=-1), num_samples=1, generator=generator)[:, 0]\n"
    new, cause = SEEDED_FORGERIES[forgery]
    namespace = course_with("07_sampling_and_kv_cache", old, new)
    only = frozenset({"test_sample_next_token"})
    verdict = judge.verdicts(run_forked("07_sampling_and_kv_cache", namespace, tmp_path, only))[
        "test_sample_next_token"
    ]
    assert not verdict["passed"] and cause in verdict["message"], verdict
    honest = course_as_learner("07_sampling_and_kv_cache")
    verdicts = judge.verdicts(run_forked("07_sampling_and_kv_cache", honest, tmp_path / "honest", only))
    assert verdicts["test_sample_next_token"]["passed"], verdicts


# Code laundering (issue #20): the course's own answer for the notebook being graded, reached through
# harness.components by whatever route (here plainly; a string annotation or a timeit template gets the same
# object), runs code compiled from solutions/<notebook>.ipynb, which the probe's record shows.
THE_COURSES_OWN = {
    "01_layernorm": (
        "test_layernorm",
        NO_NORMALISATION.replace(
            "        return residual * self.w + self.b\n",
            "        theirs = __import__('harness').components('01_layernorm').LayerNorm(self.cfg)\n"
            "        theirs.load_state_dict(self.state_dict())\n"
            "        return theirs(residual)\n",
        ),
    ),
    "02_embeddings": (
        "test_sinusoidal",
        (
            "def sinusoidal_positional_encoding(n_ctx, d_model):\n"
            "    import typing\n\n"
            '    def f(x: \'__import__("harness").components("02_embeddings").sinusoidal_positional_encoding\'):\n'
            "        pass\n\n"
            "    return typing.get_type_hints(f)['x'](n_ctx, d_model)\n"
        ),
    ),
}


@pytest.mark.parametrize("notebook", sorted(THE_COURSES_OWN))
def test_the_courses_own_answer_by_any_route_fails_the_judge(notebook, tmp_path):
    grade_id, code = THE_COURSES_OWN[notebook]
    verdict = judge.verdicts(run(notebook, learner(code), tmp_path))[grade_id]
    assert not verdict["passed"], verdict
    assert f"<solutions/{notebook}.ipynb>" in verdict["message"], verdict


def test_earlier_notebooks_components_stay_allowed(tmp_path):
    """A LayerNorm taken from the course's notebook 01 is fine in notebook 04's MLP and block probes."""
    namespace = course_with("04_mlp_and_block", "class MLP(nn.Module):", "class MLP(nn.Module):  # unchanged")
    verdicts = judge.verdicts(run("04_mlp_and_block", namespace, tmp_path))
    assert all(v["passed"] for v in verdicts.values()), verdicts


def test_probes_run_in_the_probe_template_need_only_earlier_notebooks():
    """A probe child holds the course's components of the notebooks before its own only (`template._probe_child`): a probe
    argument built from the graded notebook's own components could not be built there."""
    for notebook, probes in judge.PROBES.items():
        for probe in probes:
            for kind, param in probe.args:
                if kind in ("course_model", "course_weights", "hooked_course"):
                    assert param[0] < notebook, (notebook, probe.grade_id, param)


# The feeder: in the sandbox the probe child holds no input of the judge's until a probe asks for its own, once
# (a red-team review read the whole request while the definitions ran and stored answers computed with operators
# not yet taken out). Here with the feeder forked in this process, as the probe child forks it.
def fed(notebook: str, folder, steal: int | None = None, namespace: dict | None = None) -> judge.Prepared:
    import socket

    prepared = judge.prepare(notebook, folder / "job")
    ours, theirs = socket.socketpair()
    report, told = os.pipe()
    pid = os.fork()
    if pid == 0:  # the feeder
        ours.close()
        os.close(report)
        probe_runner.serve_request(str(prepared.folder), theirs.fileno(), report=told)
        os._exit(0)
    theirs.close()
    os.close(told)
    probe_runner.prepare_output(str(prepared.folder), None)
    request = probe_runner.feeder_client(str(prepared.folder), ours, report=report)
    assert request["tensors"] == {} and all("args" not in probe for probe in request["probes"])
    if steal is not None:  # what code run while the definitions load could do with the socket
        request["fetch"](request["probes"][steal]["name"])
        prepared.stolen = request["probes"][steal]["grade_id"]
    namespace = namespace if namespace is not None else course_as_learner(notebook)
    for index, names in enumerate(probe_runner.phases(request)):
        phase = dict(request, probes=[probe for probe in request["probes"] if probe["name"] in names])
        probe_runner.run_probes(phase, namespace, timeout=30, deadline=time.monotonic() + 300, phase=index)
    counts = request["finish"]()  # as the runner does once every phase has ended
    (prepared.folder / probe_runner.OUT_DIR / probe_runner.SERVED).write_text(counts)
    ours.close()
    os.waitpid(pid, 0)
    return prepared


def test_the_feeder_serves_each_probe_its_inputs_once_and_in_turn(tmp_path):
    assert all(v["passed"] for v in judge.verdicts(fed("04_mlp_and_block", tmp_path / "a")).values())
    for steal in range(3):  # an input asked for early: its probe fails, and every probe after it
        prepared = fed("04_mlp_and_block", tmp_path / f"b{steal}", steal=steal)
        verdict = judge.verdicts(prepared)[prepared.stolen]
        assert not verdict["passed"] and "asked for out of turn" in verdict["message"], verdict


# A decoder must encode the source once: 09's probe runs it on a stand-in encoder-decoder that the feeder serves,
# its table never in the child, its calls answered and counted there, out of the learner's reach (a counter on the
# stand-in the learner held was set back to 1 by a decoder that re-encoded at every step: red-team round 7).
REENCODING = {  # a decoder that runs the whole model (the encoder again) at every step, its count forged
    "the counter set back": "if hasattr(model, 'encode_calls'):\n    model.encode_calls = 1\n",
    "the counter made a constant": "type(model).encode_calls = property(lambda self: 1, lambda self, value: None)\n",
}


@pytest.mark.parametrize("forgery", sorted(REENCODING))
def test_a_decoder_that_re_encodes_fails_whatever_it_does_to_the_counter(forgery, tmp_path):
    step = "        next_token = model.decode(tgt, memory, src)[:, -1].argmax(dim=-1)  # [batch]\n"
    namespace = course_with(
        "09_encoder_decoder", step, step.replace("model.decode(tgt, memory, src)", "model(src, tgt)")
    )
    honest = namespace["greedy_decode"]

    def greedy_decode(model, src, max_len):
        out = honest(model, src, max_len)
        exec(REENCODING[forgery], {"model": model})  # noqa: S102 - the forgery, after the loop
        return out

    namespace["greedy_decode"] = greedy_decode
    verdict = judge.verdicts(fed("09_encoder_decoder", tmp_path, namespace=namespace))["test_greedy_decode"]
    assert not verdict["passed"] and "called model.encode" in verdict["message"], verdict
    assert "model.encode 1 times" not in verdict["message"] and "raised" not in verdict["message"], verdict


# 07's generation functions that must use the cache run on a stand-in the feeder serves (`kv_prefix_lm`): the new
# positions of every forward are recorded there. A generation that recomputes the whole sequence at every step
# gives the right tokens; whatever it writes in its own process (the old record was a hook on the learner's model),
# the feeder's record shows the recomputes.
CACHE_FORGERIES = {
    "cached_generate, recomputed, a record written on the model": (
        "test_cached_generate",
        "logits, past_kvs = model(next_token, past_kvs)",
        (
            "logits, past_kvs = model(tokens)\n"
            "            model.positions = [tokens.shape[1] - 1 - step] + [1] * (step + 1)"
        ),
        "then only each new token with the cache",
    ),
    "padded_generate, recomputed, its calls to the feeder skipped where it can": (
        "test_padded_generate",
        "        logits, past_kvs = model(next_token[:, None], mask, past_kvs)\n    return tokens\n",
        (
            "        logits, past_kvs = model(tokens, mask)\n        model.__dict__.pop('positions', None)\n"
            "    return tokens\n"
        ),
        "then only each new token with the cache",
    ),
    "padded_generate, a forward for the last new token too": (
        "test_padded_generate",
        "if finished.all() or step == max_new_tokens - 1:",
        "if finished.all() or step == max_new_tokens:",
        "which bring the longest prompt to n_ctx + 1",
    ),
}


def test_a_cached_generation_that_feeds_its_prompt_in_two_parts_passes(tmp_path):
    """Every position fed once, the cache continued: the prompt but its last token first, then that token with the
    cache (a red-team review: a record of the new positions alone refused it). Judged on (cache, new) pairs."""
    namespace = course_with(
        "07_sampling_and_kv_cache",
        "    logits, past_kvs = model(tokens)  # the prompt, once\n",
        "    _, past_kvs = model(tokens[:, :-1])\n    logits, past_kvs = model(tokens[:, -1:], past_kvs)\n",
    )
    verdict = judge.verdicts(fed("07_sampling_and_kv_cache", tmp_path, namespace=namespace))["test_cached_generate"]
    assert verdict["passed"], verdict


def test_07s_generations_run_on_stand_ins_the_feeder_serves(tmp_path):
    verdicts = judge.verdicts(fed("07_sampling_and_kv_cache", tmp_path / "honest"))
    assert all(v["passed"] for v in verdicts.values()), {k: v for k, v in verdicts.items() if not v["passed"]}
    for i, (grade_id, old, new, cause) in enumerate(CACHE_FORGERIES.values()):
        namespace = course_with("07_sampling_and_kv_cache", old, new)
        verdict = judge.verdicts(fed("07_sampling_and_kv_cache", tmp_path / str(i), namespace=namespace))[grade_id]
        assert not verdict["passed"] and cause in verdict["message"], (new, verdict)


TYPE_CHECKED = '@__import__("jaxtyping").jaxtyped(typechecker=__import__("beartype").beartype)\n'


@pytest.mark.parametrize(
    ("notebook", "grade_id", "line"),
    [
        ("07_sampling_and_kv_cache", "test_cached_generate", "def cached_generate(\n"),
        ("07_sampling_and_kv_cache", "test_padded_generate", "def padded_generate(\n"),
        ("09_encoder_decoder", "test_greedy_decode", "def greedy_decode("),
    ],
)
def test_a_function_checked_at_run_time_takes_the_judges_stand_in(notebook, grade_id, line, tmp_path):
    """`model: KVCacheTransformer` checked at run time (`@jaxtyped(typechecker=beartype)`) refused the judge's stand-in,
    which was no instance of it: the stand-in poses as the class the learner annotates, its own methods first."""
    namespace = course_with(notebook, line, TYPE_CHECKED + line)
    verdict = judge.verdicts(fed(notebook, tmp_path / "fed", namespace=namespace))[grade_id]
    assert verdict["passed"], verdict
    assert verdict_of(notebook, grade_id, namespace, tmp_path / "plain")["passed"]


def test_each_phase_has_a_feeder_of_its_own_that_serves_its_probes_in_turn(tmp_path):
    """A review: one feeder for every phase left a channel between them (a reply left unread, a count), and an
    input asked for out of turn, its reply left in the socket, did not fail its own probe. Each phase's feeder
    serves that phase's probes only, in their order, and a stand-in answers while its own probe is served."""
    from instructor.template import _feeder

    prepared = judge.prepare("07_sampling_and_kv_cache", tmp_path / "job")
    probe_runner.prepare_output(str(prepared.folder), None)
    names = [n for n, p in prepared.probes.items() if p.grade_id in ("test_cached_generate", "test_left_pad")][:2]
    feed = _feeder(str(prepared.folder), names)
    try:
        assert [p["name"] for p in feed["probes"]] == names  # this phase's probes only, without their arguments
        with pytest.raises(probe_runner.ProbeError, match="out of turn"):
            feed["fetch"](names[1])
    finally:
        assert json.loads(feed["finish"]()) == {}
    feed = _feeder(str(prepared.folder), names)
    try:
        _, tensors = feed["fetch"](names[0])
        model = next(v for k, v in tensors.items() if k.startswith("served:"))
        model(torch.zeros(1, 2, dtype=torch.long))
        feed["fetch"](names[1])  # the next probe's turn: the first one's stand-in answers no more
        with pytest.raises(probe_runner.ProbeError, match="no stand-in is served for this probe now"):
            model(torch.zeros(1, 2, dtype=torch.long))
    finally:
        counts = json.loads(feed["finish"]())
    assert counts[names[0]]["positions"] == [[0, 2]], counts
    assert judge._feeder_lost(prepared.probes[names[0]], names[0], {"__lost__": {names[0]: 1}})
    assert judge._feeder_lost(prepared.probes[names[0]], names[0], {"__lost__": {"p999": 1}}) is None


def test_no_report_from_the_feeder_fails_the_probes_it_served(tmp_path):
    """Red-team round 8 killed the feeder (a call shaped to broadcast to 9 GB, charged to the job's memory) after a
    decoder that re-encoded every step; with no counts written, the judge took the child's own counter. The runner
    now writes that the feeder gave no report, and the probes it served fail; a call shaped so is refused."""
    step = "        next_token = model.decode(tgt, memory, src)[:, -1].argmax(dim=-1)  # [batch]\n"
    namespace = course_with(
        "09_encoder_decoder", step, step.replace("model.decode(tgt, memory, src)", "model(src, tgt)")
    )
    honest = namespace["greedy_decode"]

    def greedy_decode(model, src, max_len):
        out = honest(model, src, max_len)
        model.encode_calls = 1  # the child's own counter, set back
        return out

    namespace["greedy_decode"] = greedy_decode
    only = frozenset({"test_greedy_decode", "test_make_batch"})
    prepared = run("09_encoder_decoder", namespace, tmp_path, only)
    (prepared.folder / probe_runner.OUT_DIR / probe_runner.SERVED).write_text('{"__feeder__": "no report"}')
    verdicts = judge.verdicts(prepared)
    assert not verdicts["test_greedy_decode"]["passed"], verdicts
    assert "ended without a report" in verdicts["test_greedy_decode"]["message"], verdicts
    assert verdicts["test_make_batch"]["passed"], verdicts  # a probe on no served model keeps its verdict
    model = probe_runner.table_seq2seq(torch.randn(17, 17), dict(judge.SMALL_ENCDEC))
    with pytest.raises(ValueError, match="decode takes"):
        model.decode(torch.zeros(8, 1, dtype=torch.long), torch.zeros(4096, 1, 1, 1), torch.zeros(1, 4096))


STAND_IN_CALLS = {  # honest decoders written otherwise, which the judge's stand-ins must take as the course's classes
    "Optional[EncoderDecoder], checked at run time": [
        (
            "def greedy_decode(model: EncoderDecoder,",
            "def greedy_decode(model: __import__('typing').Optional[EncoderDecoder],",
        ),
        ("@torch.no_grad()\ndef greedy_decode(", "@torch.no_grad()\n" + TYPE_CHECKED + "def greedy_decode("),
    ],
    "keyword arguments, as the course names them": [
        (
            "model.decode(tgt, memory, src)[:, -1]",
            "model.decode(tgt_in=tgt, memory=memory, src=src)[:, -1]",
        ),
    ],
}


@pytest.mark.parametrize("way", sorted(STAND_IN_CALLS))
def test_a_decoder_written_otherwise_takes_the_served_stand_in(way, tmp_path):
    namespace = course_with_each("09_encoder_decoder", STAND_IN_CALLS[way])
    verdict = judge.verdicts(fed("09_encoder_decoder", tmp_path, namespace=namespace))["test_greedy_decode"]
    assert verdict["passed"], verdict


def test_the_feeder_keeps_the_stand_in_encoder_decoder_and_counts_its_calls(tmp_path, monkeypatch):
    prepared = fed("09_encoder_decoder", tmp_path / "a")
    name = next(n for n, p in prepared.probes.items() if p.grade_id == "test_greedy_decode")
    counts = json.loads((prepared.folder / probe_runner.OUT_DIR / probe_runner.SERVED).read_text())
    assert counts[name]["encode"] == 1 and counts[name]["decode"] >= 1, counts
    assert judge.verdicts(prepared)["test_greedy_decode"]["passed"]
    # what the child is handed for that probe: a proxy, the table withheld
    import socket

    prepared = judge.prepare("09_encoder_decoder", tmp_path / "b" / "job")
    monkeypatch.setattr(probe_runner, "_CALLS", 3)  # the feeder's bound on a job's calls, lowered for the test
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        ours.close()
        probe_runner.serve_request(str(prepared.folder), theirs.fileno())
        os._exit(0)
    theirs.close()
    request = probe_runner.feeder_client(str(prepared.folder), ours)
    try:
        entry, tensors = request["fetch"](name)
        spec = entry["args"][0]
        assert spec.get("served") == name and "table_seq2seq" not in spec, spec
        assert not any(key.startswith(f"{name}.in0") for key in tensors), sorted(tensors)
        model = tensors[f"served:{name}"]
        assert not any(p.numel() for p in model.parameters())
        with pytest.raises(ValueError, match="decode takes"):  # shapes that disagree: the stand-in refuses them
            model.decode(torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 3, 7), torch.zeros(1, 2))
        assert model.encode(torch.zeros(1, 2, dtype=torch.long)).shape[:2] == (1, 2)  # serving goes on
        model.encode(torch.zeros(1, 2, dtype=torch.long))
        with pytest.raises(probe_runner.ProbeError, match="more than 3 model calls"):  # calls cost the feeder
            model.encode(torch.zeros(1, 2, dtype=torch.long))
        with pytest.raises(probe_runner.ProbeError, match="could not answer"):  # past the feeder's bound: it stops
            model.decode(torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2, 1 << 18), torch.zeros(1, 2))
    finally:
        ours.close()
        os.waitpid(pid, 0)


# Each phase's outputs count for its own probes only: an output for gelu_new's probe written by the phase where GELU
# is still in (its own phase then wrote nothing, its process ended early) is ignored, not taken as gelu_new's.
def test_a_phases_outputs_count_for_its_own_probes_only(tmp_path):
    prepared = judge.prepare("04_mlp_and_block", tmp_path / "job")
    request = probe_runner.load_request(str(prepared.folder))
    probe_runner.prepare_output(str(prepared.folder), None)
    assert len(probe_runner.phases(request)) == 2
    namespace = course_as_learner("04_mlp_and_block")
    probe_runner.run_probes(request, namespace, timeout=30, deadline=time.monotonic() + 300, phase=0)
    verdicts = judge.verdicts(prepared)
    assert not verdicts["test_gelu_new"]["passed"], verdicts
    assert "no output returned" in verdicts["test_gelu_new"]["message"], verdicts
    assert verdicts["test_mlp"]["passed"] and verdicts["test_block"]["passed"], verdicts


# The exercises that use TransformerLens are each refused every ready-made answer any of them is: a probe process
# holds what they forbid for all of its calls or for none (a red-team review ran TransformerLens's patching in the
# composition scores' call, where it was allowed, on inputs kept from the patching probe: full marks).
def test_an_exercise_using_transformer_lens_is_refused_every_ready_made_answer(tmp_path):
    reach = (
        "\n\ndef _other_answer():\n    import transformer_lens.patching as patching\n\n    try:\n"
        "        patching.generic_activation_patch(None, None, None, None, None, 'resid_pre')\n"
        "    except Exception:\n        pass\n"
    )
    namespace = course_as_learner("08_interpretability")
    exec(reach, namespace)  # noqa: S102 - a helper the learner's composition scores call
    honest = namespace["k_composition_scores"]

    def k_composition_scores(*args, **kwargs):
        namespace["_other_answer"]()
        return honest(*args, **kwargs)

    namespace["k_composition_scores"] = k_composition_scores
    verdict = verdict_of("08_interpretability", "test_k_composition_scores", namespace, tmp_path)
    assert not verdict["passed"] and "transformer_lens/patching.py" in verdict["message"], verdict
    assert "py:transformer_lens/patching.py" in rules.forbidden_ops("08_interpretability", "logit_lens")
    assert "py:harness/interp.py" not in rules.forbidden_ops("08_interpretability", "patch_resid_pre")


# A red-team route: the phase where GELU is still in (04's MLP and block) computes gelu_new's outputs on the judge's
# inputs, writes them as the next phase's outputs file and kills the process that runs the phases, which left that
# file in place: full marks. That process now stays root and each phase drops to a uid of its own before the
# definitions run (here `nobody`, as the sandbox gives it its own), so the kill is refused; and what a phase leaves in
# the outputs' folder is removed once it ends.
FORGED_PHASE = """
import json, os, signal, sys
from pathlib import Path
import torch._inductor, torch.profiler.python_tracer, safetensors.torch  # the interpreter is root's here
from instructor import judge, probe_runner
from instructor.template import run_probe_plan
from harness.course import component_source
prepared = judge.prepare("04_mlp_and_block", Path(sys.argv[1]))
request = probe_runner.load_request(str(prepared.folder))
probe_runner.prepare_output(str(prepared.folder), 65534)
os.chmod(sys.argv[1], 0o755)
os.chmod(prepared.folder, 0o755)
for entry in prepared.folder.iterdir():  # the inputs in the phase's reach (in the sandbox it asks the feeder)
    if entry.is_file():
        os.chmod(entry, 0o644)
cheat = '''
import torch
from instructor import probe_runner as _pr


def _forge():
    try:
        torch.nn.functional.gelu(torch.zeros(1))
    except RuntimeError:
        return "gelu is out here"
    request = _pr.load_request(JOB)
    outputs = {}
    for probe in request["probes"]:
        if probe["target"] == "gelu_new":
            outputs[probe["name"]] = torch.nn.functional.gelu(request["tensors"][probe["args"][0]["tensor"]], approximate="tanh")
    for phase in range(1, 4):
        _pr.write_outputs(request["folder"], _pr._frozen(outputs), {}, phase)
    os.kill(os.getppid(), signal.SIGKILL)


import os, signal
_forged = _forge()
'''.replace("JOB", repr(str(prepared.folder)))
code = "\\n\\n".join(component_source(name) for name in ("00_tour", "01_layernorm", "02_embeddings", "03_attention"))
code += "\\n\\n" + component_source("04_mlp_and_block").split("def gelu_new")[0]
code += "\\n\\ndef gelu_new(x):\\n    return torch.nn.functional.gelu(x, approximate='tanh')\\n\\n" + cheat
code += "\\n\\nclass MLP" + component_source("04_mlp_and_block").split("class MLP", 1)[1]
step = {"kind": "learner", "code": code, "filename": "<learner 04_mlp_and_block cell 9>", "uses": [], "binds": []}
scratch = sys.argv[2]


def confine(keep=()):
    os.chdir(scratch)
    os.setgid(65534)
    os.setuid(65534)


run_probe_plan({"steps": [step]}, 30, 240, request, confine)
print(json.dumps(judge.verdicts(prepared)))
"""


def _phase_says(script: str):
    """What `script` (FORGED_PHASE or a variant) prints, run with a job folder and a home `nobody` can use."""
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="phase-"))  # pytest's own folders are closed to `nobody`
    try:
        os.chmod(top, 0o755)
        scratch = top / "home"
        scratch.mkdir()
        os.chmod(scratch, 0o777)
        return json.loads(child_says(script, str(top / "job"), str(scratch)))
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_a_phase_can_neither_kill_the_phases_runner_nor_forge_another_phases_outputs():
    verdicts = _phase_says(FORGED_PHASE)
    assert verdicts["test_mlp"]["passed"] and verdicts["test_block"]["passed"], verdicts
    assert not verdicts["test_gelu_new"]["passed"], verdicts
    assert "forbids aten::gelu" in verdicts["test_gelu_new"]["message"], verdicts


def test_a_phase_killed_keeps_what_it_had_written_says_how_it_ended_and_goes_on():
    """A phase killed by its memory limit wrote nothing, and each of its probes said only "no output returned" (an
    honest top_p_filter that looped over every token in Python took gigabytes under the record and lost 07's 35
    points: red-team round 22). A phase now writes what its probes returned as it goes, so the probes done before
    the kill keep their outputs; the phases' runner, which runs no learner code, says how the probe it was running
    ended, and runs the probes after it in a fresh process. Here the learner's gelu_new kills its process the
    second time it runs, once: the probe that called it then is the only one without a result."""
    quotes = "'" * 3
    start, end = FORGED_PHASE.index(f"cheat = {quotes}"), FORGED_PHASE.index(f"{quotes}.replace(")
    killer = (
        f"cheat = {quotes}\nimport math, os, signal, time\n_calls = []\n\n\ndef gelu_new(x):\n"
        "    _calls.append(1)\n"
        "    if len(_calls) == 2 and not os.path.exists('killed'):  # the folder every phase's process works in\n"
        "        open('killed', 'w').close()\n        os.kill(os.getpid(), signal.SIGKILL)\n"
        f"    if len(_calls) == 1:\n        time.sleep({probe_runner.CHECKPOINT_SECONDS} + 0.5)\n"
        "    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))\n"
    )
    tail = 'run_probe_plan({"steps": [step]}, 30, 240, request, confine)\n'
    assert tail in FORGED_PHASE
    report = (
        tail + "written, errors = [], {}\nfor path in (prepared.folder / 'out').glob('outputs*.safetensors'):\n"
        "    data = path.read_bytes()\n"
        "    written += list(json.loads(data[8 : 8 + int.from_bytes(data[:8], 'little')]))\n"
        "for path in (prepared.folder / 'out').glob('errors*.json'):\n    errors |= json.loads(path.read_text())\n"
        "probes = [p['name'] for p in request['probes']]\n"
        "print(json.dumps({'verdicts': judge.verdicts(prepared), 'written': written, 'errors': errors, 'probes': probes}))\n"
    )
    said = _phase_says((FORGED_PHASE[:start] + killer + FORGED_PHASE[end:]).split(tail)[0] + report)
    killed = [name for name, why in said["errors"].items() if "killed while it ran" in why]
    assert len(killed) == 1, said
    written = {key.split(".")[0] for key in said["written"]}
    assert written == set(said["probes"]) - set(killed), said  # before the kill (kept) and after it (resumed)
    failed = {test for test, verdict in said["verdicts"].items() if not verdict["passed"]}
    assert len(failed) == 1 and "killed while it ran" in said["verdicts"][failed.pop()]["message"], said


# The same end to end, as the probe child runs it: the feeder forked with its report's pipe (`template._fed_probes`),
# each phase confined to a uid of its own with the feeder's socket only, the runner writing the counts once every
# phase has ended. A decoder that re-encodes every step and forges every record it can reach (the stand-in's counter,
# a counts file of its own in the outputs' folder) fails; the course's decoder passes.
SERVED_PHASE = """
import json, os, sys
from pathlib import Path
import torch._inductor, torch.profiler.python_tracer, safetensors.torch  # the interpreter is root's here
from instructor import judge, probe_runner
from instructor.sandbox import close_fds_except
from instructor.template import _fed_probes, run_probe_plan
from harness.course import component_source, notebook_names
prepared = judge.prepare("09_encoder_decoder", Path(sys.argv[1]), only=frozenset({"test_greedy_decode"}))
os.chmod(sys.argv[1], 0o755)
probes = _fed_probes(str(prepared.folder), 65534)
names = notebook_names()
code = "\\n\\n".join(component_source(name) for name in names[: names.index("09_encoder_decoder") + 1])
if sys.argv[3] == "forged":
    step = "        next_token = model.decode(tgt, memory, src)[:, -1].argmax(dim=-1)  # [batch]\\n"
    forged = (
        "    model.encode_calls = 1\\n"
        "    with open(os.path.join(JOB, 'out', 'served.json'), 'w') as f:\\n"
        "        f.write(json.dumps({'p0': {'encode': 1, 'decode': 1}, 'p1': {'encode': 1, 'decode': 1}}))\\n"
        "    return tgt[:, 1:]  # without BOS\\n"
    ).replace("JOB", repr(str(prepared.folder)))
    code = code.replace(step, step.replace("model.decode(tgt, memory, src)", "model(src, tgt)"))
    code = code.replace("    return tgt[:, 1:]  # without BOS\\n", forged)
    code = "import json, os\\n" + code
step = {"kind": "learner", "code": code, "filename": "<learner 09 cell 3>", "uses": [], "binds": []}
scratch = sys.argv[2]


def confine(keep=()):
    close_fds_except(keep)
    os.chdir(scratch)
    os.setgid(65534)
    os.setuid(65534)


run_probe_plan({"steps": [step]}, 30, 240, probes, confine)
print(json.dumps(judge.verdicts(prepared)["test_greedy_decode"]))
"""


def test_the_runner_reports_the_feeders_counts_which_no_phase_can_forge():
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="served-phase-"))  # pytest's own folders are closed to `nobody`
    said = {}
    try:
        os.chmod(top, 0o755)
        for how in ("honest", "forged"):
            scratch = top / f"home-{how}"
            scratch.mkdir()
            os.chmod(scratch, 0o777)
            said[how] = json.loads(child_says(SERVED_PHASE, str(top / f"job-{how}"), str(scratch), how))
    finally:
        shutil.rmtree(top, ignore_errors=True)
    assert said["honest"]["passed"], said
    assert not said["forged"]["passed"] and "called model.encode" in said["forged"]["message"], said
    assert "model.encode 1 times" not in said["forged"]["message"], said


# Siblings of red-team round 6's cases: another fused backend operator that takes its activation as an argument
# (round 6 used `mkldnn::_linear_pointwise`), refused in every probe; torch's local response norm as a module (round 6
# used the function) refused in 01.
BACKEND_OP = """
import json, torch
from instructor.probe_runner import _take_out
from instructor.rules import FOREIGN_OPERATORS, forbidden_ops
assert all(FOREIGN_OPERATORS in forbidden_ops(nb, "x") for nb in ("00_tour", "04_mlp_and_block"))
said = []
x, w = torch.randn(1, 1, 4, 4), torch.randn(1, 1, 1, 1)
for _ in range(2):
    try:
        torch.ops.mkldnn._convolution_pointwise(x, w, None, [0, 0], [1, 1], [1, 1], 1, "gelu", [], "tanh")
        said.append("ran")
    except RuntimeError as err:
        said.append(str(err)[:120])
    _take_out([FOREIGN_OPERATORS])
print(json.dumps(said))
"""


def test_a_fused_backend_operator_is_refused_in_every_probe():
    before, after, *_ = json.loads(child_says(BACKEND_OP))
    assert before == "ran", before  # the route works where nothing is taken out
    assert "forbids mkldnn::_convolution_pointwise" in after, after


# Red-team round 14: `F.linear_cross_entropy` with `LinearCrossEntropyOptions` runs a cross-entropy that torch
# registers as `torch_nn::_linear_cross_entropy_batch_chunked` only when first called; the record took only the
# operators registered at the start for operators, so it passed for a label. Now every operator outside `aten`
# counts, whenever torch registered it; one the learner's notebook registers is the learner's code.
LATE_OPERATOR = """
import json, torch
import torch.nn.functional as F
from instructor import probe_runner
from instructor.rules import FOREIGN_OPERATORS
rules = (FOREIGN_OPERATORS, "*::gelu*")
said = {}
flat, targets = torch.randn(6, 5), torch.randint(0, 5, (6,))
lce = lambda: F.linear_cross_entropy(torch.eye(6), flat.T, targets, options=torch.nn.LinearCrossEntropyOptions())
def watching(target, call):  # as `run_probes` does: a record whose names cannot be read is made again
    for _ in range(3):
        try:
            return probe_runner._call_watching(target, call, rules)
        except probe_runner.RecordUnreadable:
            continue
try:
    watching("cross_entropy_loss", lce)
    said["torch's"] = "passed"
except probe_runner.ProbeError as err:
    said["torch's"] = str(err)
learners = (
    "@torch.library.custom_op('course::gelu_new', mutates_args=())\\n"
    "def gelu_op(x: torch.Tensor) -> torch.Tensor:\\n"
    "    return 0.5 * x * (1 + torch.tanh(0.7978845608 * (x + 0.044715 * x.pow(3))))\\n"
)
namespace = {"torch": torch}
exec(compile(learners, "<learner 04_mlp_and_block cell 9>", "exec"), namespace)
watching("gelu_new", lambda: namespace["gelu_op"](torch.randn(3)))
said["learner's"] = "passed"
print(json.dumps(said))
"""


def test_an_operator_torch_registers_late_is_refused_and_the_learners_own_is_not():
    said = json.loads(child_says(LATE_OPERATOR))
    assert "torch_nn::_linear_cross_entropy_batch_chunked" in said["torch's"], said
    assert said["learner's"] == "passed", said


def test_torchs_local_response_norm_module_fails_01(tmp_path):
    code = NO_NORMALISATION.replace(
        "        return residual * self.w + self.b\n",
        "        d = residual.shape[-1]\n        centred = residual - residual.mean(-1, keepdim=True)\n"
        "        lrn = nn.LocalResponseNorm(d, alpha=d, beta=0.5, k=self.cfg.layer_norm_eps)\n"
        "        return lrn(centred.reshape(-1, d, 1)).reshape(residual.shape) * self.w + self.b\n",
    )
    verdict = verdict_of(LN, "test_layernorm", learner(code), tmp_path)
    assert not verdict["passed"] and "normalization.py" in verdict["message"], verdict


def test_the_feeder_reads_a_message_of_a_bounded_size_only():
    """A 1 GiB probe name grew the root feeder past the memory cap (red-team round 7): it reads at most a model
    call's size, and a name is 64 bytes at most."""
    import socket

    ours, theirs = socket.socketpair()
    try:
        os.write(ours.fileno(), (probe_runner._CALL_LIMIT + 1).to_bytes(8, "big") + b"Np")  # a length past it
        with pytest.raises(EOFError, match="larger than"):
            probe_runner._fed(theirs.fileno(), limit=probe_runner._CALL_LIMIT)
    finally:
        ours.close()
        theirs.close()


def test_an_outputs_file_that_names_too_much_is_refused_unread(tmp_path):
    """A phase's outputs file with 240,000 empty entries took 2.5 s of the grader's own time to parse (red-team
    round 17): a header past MAX_OUTPUT_HEADER is refused before it is read; the course's outputs pass."""
    import safetensors.torch

    from instructor.judge import MAX_OUTPUT_HEADER, _load_phase

    many = {f"probe_{i}": torch.zeros(0) for i in range(30_000)}  # a header past the bound, quicker to write
    (tmp_path / "many.safetensors").write_bytes(safetensors.torch.save(many))
    outputs, _, why = _load_phase(tmp_path, "many.safetensors", "errors.json")
    assert outputs == {} and "header" in why and "refused unread" in why, why
    honest = {f"probe_{i}/output_{j}": torch.zeros(3) for i in range(200) for j in range(10)}  # 2,000: more than any
    (tmp_path / "honest.safetensors").write_bytes(safetensors.torch.save(honest))
    outputs, _, why = _load_phase(tmp_path, "honest.safetensors", "errors.json")
    assert why is None and len(outputs) == 2_000
    assert len(safetensors.torch.save(many)) > MAX_OUTPUT_HEADER
