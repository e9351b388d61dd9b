"""The path most learners take: the reference at GPT-2 small's full size, loaded the online way, with no network.

A stand-in hub (tests/hub_standin.py: `GPT2LMHeadModel(GPT2Config())`, random weights, in a Hugging Face cache laid
out as the hub's) lets `load_reference_gpt2("gpt2-small")` and `"auto"` run their real code path offline.

- always: the stand-in has the hub cache's layout; both sources load it under `unshare -n` where that is allowed
  (no network interface at all) and give 124M parameters equal to the checkpoint's, mapped by hand.
- `-m fullsize` (opt-in, long: see docs/reference-models.md): notebooks 00-08 run through nbgrader's Validator
  in their default mode (COURSE_FAST unset) on it: every solution passes, every learner version fails every graded
  test, and each stays within the memory goal (4 GB).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hub_standin import FILES, REPO_ID, environment, no_network_prefix, validate_at_full_size, write_standin_hub

from instructor.course import SOLUTIONS_DIR, notebook_names

# The notebooks that load the reference with load_reference_gpt2() ("auto"): full size wherever the hub can be
# reached. 06 loads the offline model by name (its default mode trains a model of that size) and 09 none.
FULLSIZE_NOTEBOOKS = [name for name in notebook_names() if name[:2] in {"00", "01", "02", "03", "04", "05", "07", "08"}]
MEMORY_GOAL_MB = 4096


# Where the machine allows it (root or user namespaces), every run here has no network interface at all.
NO_NETWORK = bool(no_network_prefix())


@pytest.fixture(scope="session")
def standin_hub(tmp_path_factory) -> Path:
    hf_home = tmp_path_factory.mktemp("hf_home")
    write_standin_hub(hf_home)
    return hf_home


def test_standin_has_the_hub_cache_layout(standin_hub):
    repo = standin_hub / "hub" / ("models--" + REPO_ID.replace("/", "--"))
    commit = (repo / "refs" / "main").read_text()
    snapshot = repo / "snapshots" / commit
    assert sorted(p.name for p in snapshot.iterdir()) == sorted(FILES)
    for name in FILES:
        link = snapshot / name
        assert link.is_symlink() and not os.path.isabs(os.readlink(link)), name  # relative, as the hub's
        blob = link.resolve()
        assert blob.parent == (repo / "blobs").resolve(), name
    weights = (snapshot / "model.safetensors").resolve()
    assert weights.name == hashlib.sha256(weights.read_bytes()).hexdigest()  # LFS files: named by their sha256
    config = (snapshot / "config.json").resolve()
    data = config.read_bytes()
    assert config.name == hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # others: their git blob id


# Run in a fresh process: huggingface_hub reads HF_HOME and HF_HUB_OFFLINE when imported, and the reference is
# loaded once per process. Each weight is compared with the checkpoint's file read directly (safetensors), mapped
# by hand from GPT-2's Conv1D layout (c_attn's columns are Q, K, V; heads are 64-wide slices), not by the
# conversion the course uses; the logits are compared with transformers' own forward.
_LOAD_AND_COMPARE = r"""
import json, sys
import torch
from safetensors.torch import load_file
from harness.reference import load_reference_gpt2, reference_checkpoint, resolve_source

facts = {"resolved": resolve_source("auto"), "checkpoint": reference_checkpoint("auto")}
auto = load_reference_gpt2("auto")
small = load_reference_gpt2("gpt2-small")
facts["same_object"] = auto is small
facts["model_name"] = small.cfg.model_name
facts["parameters"] = sum(p.numel() for p in small.parameters())
facts["unembed_parameters"] = small.W_U.numel() + small.b_U.numel()

ckpt = load_file(sys.argv[1])
facts["checkpoint_parameters"] = sum(t.numel() for t in ckpt.values() if not t.dtype == torch.bool)
d, n_heads = small.cfg.d_model, small.cfg.n_heads
pairs = {
    "W_E": (small.W_E, ckpt["transformer.wte.weight"]),
    "W_pos": (small.W_pos, ckpt["transformer.wpe.weight"]),
    "W_U (tied)": (small.W_U, ckpt["transformer.wte.weight"].T),
    "ln_final.w": (small.ln_final.w, ckpt["transformer.ln_f.weight"]),
    "ln_final.b": (small.ln_final.b, ckpt["transformer.ln_f.bias"]),
}
for i, block in enumerate(small.blocks):
    h = f"transformer.h.{i}."
    qkv, qkv_b = ckpt[h + "attn.c_attn.weight"], ckpt[h + "attn.c_attn.bias"]
    for j, name in enumerate("QKV"):
        weight = qkv[:, j * d : (j + 1) * d].reshape(d, n_heads, -1).permute(1, 0, 2)
        pairs[f"{i}.W_{name}"] = (getattr(block.attn, f"W_{name}"), weight)
        pairs[f"{i}.b_{name}"] = (getattr(block.attn, f"b_{name}"), qkv_b[j * d : (j + 1) * d].reshape(n_heads, -1))
    pairs[f"{i}.W_O"] = (block.attn.W_O, ckpt[h + "attn.c_proj.weight"].reshape(n_heads, -1, d))
    pairs[f"{i}.b_O"] = (block.attn.b_O, ckpt[h + "attn.c_proj.bias"])
    pairs[f"{i}.W_in"] = (block.mlp.W_in, ckpt[h + "mlp.c_fc.weight"])
    pairs[f"{i}.b_in"] = (block.mlp.b_in, ckpt[h + "mlp.c_fc.bias"])
    pairs[f"{i}.W_out"] = (block.mlp.W_out, ckpt[h + "mlp.c_proj.weight"])
    pairs[f"{i}.b_out"] = (block.mlp.b_out, ckpt[h + "mlp.c_proj.bias"])
    for ln, hf_ln in (("ln1", "ln_1"), ("ln2", "ln_2")):
        pairs[f"{i}.{ln}.w"] = (getattr(block, ln).w, ckpt[h + hf_ln + ".weight"])
        pairs[f"{i}.{ln}.b"] = (getattr(block, ln).b, ckpt[h + hf_ln + ".bias"])
facts["compared"] = len(pairs)
facts["different"] = [name for name, (ours, theirs) in pairs.items() if not torch.equal(ours, theirs)]
facts["b_U_max"] = small.b_U.abs().max().item()

from transformers import GPT2LMHeadModel
hf = GPT2LMHeadModel.from_pretrained(reference_checkpoint(), dtype="float32").eval()
facts["hf_parameters"] = hf.num_parameters()
tokens = small.to_tokens("Friends, Romans, countrymen, lend me your ears;")
with torch.no_grad():
    facts["max_logit_diff"] = (small(tokens) - hf(tokens).logits).abs().max().item()
print(json.dumps(facts))
"""


def test_gpt2_small_and_auto_load_the_standin_with_no_network(standin_hub):
    snapshot = next((standin_hub / "hub").glob("models--*/snapshots/*"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(environment(standin_hub))
    command = [sys.executable, "-c", _LOAD_AND_COMPARE, str(snapshot / "model.safetensors")]
    done = subprocess.run(
        no_network_prefix() + command,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["resolved"] == "gpt2-small" and facts["checkpoint"] == REPO_ID
    assert facts["same_object"] and facts["model_name"] == "gpt2-small"
    # GPT-2 small's 124M (tied embedding counted once) plus TransformerLens's separate W_U and b_U
    assert 124e6 < facts["hf_parameters"] < 125e6
    assert facts["parameters"] == facts["hf_parameters"] + facts["unembed_parameters"]
    assert facts["checkpoint_parameters"] == facts["hf_parameters"]  # the file stores the tied matrix once
    assert facts["compared"] == 5 + 12 * 16 and not facts["different"], facts["different"]
    assert facts["b_U_max"] == 0.0
    assert facts["max_logit_diff"] < 1e-3


@pytest.fixture(scope="session")
def learner_dir(tmp_path_factory) -> Path:
    from instructor.generate import generate

    out = tmp_path_factory.mktemp("learner_fullsize")
    generate(out, FULLSIZE_NOTEBOOKS)
    return out


def _report(name: str, version: str, report: dict) -> None:
    # -s shows these: the figures docs/reference-models.md quotes come from bench/bench_fullsize.py, one run.
    print(
        f"\n{name} ({version}, full size): {report['wall_s']:.0f} s (kernel CPU {report['kernel_cpu_s']:.0f} s), "
        f"kernel peak {report['peak_rss_mb']:.0f} MiB"
    )


@pytest.mark.fullsize
@pytest.mark.parametrize("name", FULLSIZE_NOTEBOOKS)
def test_solution_notebook_at_full_size(standin_hub, name):
    report = validate_at_full_size(SOLUTIONS_DIR / f"{name}.ipynb", standin_hub, no_network=NO_NETWORK)
    _report(name, "solutions", report)
    results = report["results"]
    assert "type_changed" not in results and "changed" not in results, results
    failed = results.get("failed", [])
    assert not failed, "\n\n".join(f"{f['source']}\n{f['raw_error']}" for f in failed)
    assert report["peak_rss_mb"] < MEMORY_GOAL_MB, report["peak_rss_mb"]


@pytest.mark.fullsize
@pytest.mark.parametrize("name", FULLSIZE_NOTEBOOKS)
def test_learner_notebook_at_full_size_fails_all_its_tests(standin_hub, learner_dir, name):
    report = validate_at_full_size(learner_dir / f"{name}.ipynb", standin_hub, invert=True, no_network=NO_NETWORK)
    _report(name, "learner", report)
    results = report["results"]
    assert "type_changed" not in results and "changed" not in results, results
    assert not results.get("passed"), f"graded cells pass without any work: {results['passed']}"
