"""The reference GPT-2: offline loading, the fail-fast online path, and equality with transformers' forward."""

import json
import subprocess
import sys
import time

import pytest
import torch
from transformers import GPT2LMHeadModel

import harness.reference as reference_module
from harness import Config, load_reference_gpt2
from harness.reference import OFFLINE_MODEL_DIR


@pytest.fixture(scope="module")
def reference():
    return load_reference_gpt2("offline")


def test_offline_model_is_shipped_and_small():
    size = sum(path.stat().st_size for path in OFFLINE_MODEL_DIR.glob("*.safetensors"))
    assert 0 < size <= 20 * 2**20
    config = json.loads((OFFLINE_MODEL_DIR / "config.json").read_text())
    assert config["model_type"] == "gpt2" and config["vocab_size"] == 50257
    assert config["activation_function"] == "gelu_new"


def test_raw_weights_and_logits_match_transformers(reference):
    hf = GPT2LMHeadModel.from_pretrained(OFFLINE_MODEL_DIR, dtype="float32").eval()
    assert torch.equal(reference.W_E, hf.transformer.wte.weight)
    # No LayerNorm folding: the LN weights are GPT-2's own, not ones.
    assert torch.equal(reference.blocks[0].ln1.w, hf.transformer.h[0].ln_1.weight)
    tokens = reference.to_tokens("Friends, Romans, countrymen, lend me your ears;")
    with torch.no_grad():
        ours, theirs = reference(tokens), hf(tokens).logits
    assert (ours - theirs).abs().max() < 1e-4


def test_loaded_once_per_process(reference):
    assert load_reference_gpt2("offline") is reference
    assert Config.from_reference(reference).d_model == reference.cfg.d_model


def test_auto_falls_back_offline_quickly():
    """A fresh process with the hub marked offline decides in seconds and says so in one line on stdout."""
    code = "import time; t = time.time(); from harness import load_reference_gpt2 as l; m = l(); print(m.cfg.model_name, round(time.time() - t, 1))"
    start = time.time()
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"HF_HUB_OFFLINE": "1", "PATH": ""},
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("Hugging Face hub unreachable: using the course's offline reference model")
    assert lines[-1].startswith("offline-gpt2")
    assert time.time() - start < 120


def test_gpt2_small_fails_fast_and_clearly(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(reference_module, "_hub_cached", lambda: False)
    start = time.time()
    with pytest.raises(RuntimeError, match="not cached and the Hugging Face hub cannot be reached"):
        reference_module._load("gpt2-small")
    assert time.time() - start < 5


def test_unreachable_hub_is_decided_by_one_short_attempt(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", "https://unreachable.invalid")
    start = time.time()
    assert reference_module._hub_reachable(timeout=2.0) is False
    assert time.time() - start < 5


def test_unknown_source():
    with pytest.raises(ValueError, match="source must be one of"):
        load_reference_gpt2("gpt2-xl")


def test_offline_model_beats_ngram_baselines_on_held_out_verse(reference):
    """Recompute the shipped model's loss on held-out works and compare with n-gram models fit on the training works."""
    from harness import components, gpt2_encoding

    course = components("06_training")
    train_works, val_works = course.split_works(course.load_shakespeare())
    if reference.cfg.n_layers < 2:
        pytest.skip("placeholder offline model (not yet trained)")
    encoding = gpt2_encoding()
    train_tokens = course.tokenize_works(train_works, encoding)
    sonnets = course.tokenize_works({"sonnets": val_works["sonnets"]}, encoding)[:16384]
    windows = course.make_windows(sonnets, reference.cfg.n_ctx)
    with torch.no_grad():
        model_loss = sum(
            reference(windows[i : i + 8], return_type="loss").item() * len(windows[i : i + 8])
            for i in range(0, len(windows), 8)
        ) / len(windows)
    baselines = course.ngram_baselines(train_tokens, sonnets)
    assert model_loss < baselines["bigram"] < baselines["unigram"], (model_loss, baselines)


def _mean_loss(reference, windows) -> float:
    with torch.no_grad():
        return sum(
            reference(windows[i : i + 8], return_type="loss").item() * len(windows[i : i + 8])
            for i in range(0, len(windows), 8)
        ) / len(windows)


@pytest.mark.slow  # every window of Milton's verse through the reference (about 30 s): opt-in, run by .ci/run
def test_offline_model_beats_the_bigram_on_verse_by_another_author(reference):
    """Milton (harness/out_of_domain/) is in no part of training: the shipped model must still beat a bigram fit on
    its training text, recomputed here, and agree with the figures recorded in metrics.json."""
    import json

    from harness import components, gpt2_encoding
    from harness.reference import OFFLINE_MODEL_DIR
    from harness.train_reference import out_of_domain_tokens

    if reference.cfg.n_layers < 2:
        pytest.skip("placeholder offline model (not yet trained)")
    course = components("06_training")
    encoding = gpt2_encoding()
    train_works, _ = course.split_works(course.load_shakespeare())
    train_tokens = course.tokenize_works(train_works, encoding)
    recorded = json.loads((OFFLINE_MODEL_DIR / "metrics.json").read_text())["out_of_domain"]
    texts = out_of_domain_tokens(encoding)
    assert sorted(texts) == sorted(recorded) and len(texts) >= 2
    for name, tokens in texts.items():
        model_loss = _mean_loss(reference, course.make_windows(tokens, reference.cfg.n_ctx))
        bigram = course.ngram_baselines(train_tokens, tokens)["bigram"]
        assert model_loss < bigram, (name, model_loss, bigram)
        # float16 weights in TransformerLens vs the float32 model at the end of training: the same to ~1e-2
        assert abs(model_loss - recorded[name]["loss"]) < 0.02, (name, model_loss, recorded[name])
        assert abs(bigram - recorded[name]["bigram_loss"]) < 1e-3, (name, bigram, recorded[name])
