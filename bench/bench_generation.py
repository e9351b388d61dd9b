"""Tokens per second of notebook 07's generation: uncached, with the KV cache, and transformers' cached generate.

    python bench/bench_generation.py [--new-tokens 200] [--repeat 1]

Two models with the same weights in all three: GPT-2 small's size with random weights, and the offline reference.
Prints tokens/s and the ratios measured in this one run (targets: cached >= 5x uncached at GPT-2 small's size,
cached >= 1.0x transformers).
"""

from __future__ import annotations

import argparse
import os
import time

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from harness import Config, components, load_reference_gpt2


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _hf_from(model, cfg: Config):
    """A GPT2LMHeadModel holding `model`'s weights (the course's own export, notebook 05's conversion reversed)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    hf = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=cfg.d_vocab,
            n_positions=cfg.n_ctx,
            n_embd=cfg.d_model,
            n_layer=cfg.n_layers,
            n_head=cfg.n_heads,
            n_inner=cfg.d_mlp,
            layer_norm_epsilon=cfg.layer_norm_eps,
            activation_function="gelu_new",
            tie_word_embeddings=False,
        )
    ).eval()
    sd = model.state_dict()
    hf_sd = {"transformer.wte.weight": sd["embed.W_E"], "transformer.wpe.weight": sd["pos_embed.W_pos"]}
    hf_sd["transformer.ln_f.weight"], hf_sd["transformer.ln_f.bias"] = sd["ln_final.w"], sd["ln_final.b"]
    hf_sd["lm_head.weight"] = sd["unembed.W_U"].T
    for i in range(cfg.n_layers):
        h, b = f"transformer.h.{i}.", f"blocks.{i}."
        hf_sd[h + "ln_1.weight"], hf_sd[h + "ln_1.bias"] = sd[b + "ln1.w"], sd[b + "ln1.b"]
        hf_sd[h + "ln_2.weight"], hf_sd[h + "ln_2.bias"] = sd[b + "ln2.w"], sd[b + "ln2.b"]
        qkv = [sd[b + f"attn.W_{x}"].permute(1, 0, 2).reshape(cfg.d_model, -1) for x in "QKV"]
        hf_sd[h + "attn.c_attn.weight"] = torch.cat(qkv, dim=1)
        hf_sd[h + "attn.c_attn.bias"] = torch.cat([sd[b + f"attn.b_{x}"].reshape(-1) for x in "QKV"])
        hf_sd[h + "attn.c_proj.weight"] = sd[b + "attn.W_O"].reshape(-1, cfg.d_model)
        hf_sd[h + "attn.c_proj.bias"] = sd[b + "attn.b_O"]
        hf_sd[h + "mlp.c_fc.weight"], hf_sd[h + "mlp.c_fc.bias"] = sd[b + "mlp.W_in"], sd[b + "mlp.b_in"]
        hf_sd[h + "mlp.c_proj.weight"], hf_sd[h + "mlp.c_proj.bias"] = sd[b + "mlp.W_out"], sd[b + "mlp.b_out"]
    missing, unexpected = hf.load_state_dict(hf_sd, strict=False)
    assert not unexpected and all(".attn.bias" in k or "masked_bias" in k for k in missing), (missing, unexpected)
    return hf


def bench(label: str, cfg: Config, state_dict: dict | None, n_new: int, repeat: int) -> None:
    course = components("07_sampling_and_kv_cache")
    model = course.DemoTransformer(cfg).eval()
    cached = course.KVCacheTransformer(cfg).eval()
    if state_dict is None:
        torch.manual_seed(0)
        for p in model.parameters():
            torch.nn.init.normal_(p, std=0.02)
        state_dict = model.state_dict()
    model.load_state_dict(state_dict)
    cached.load_state_dict(state_dict)
    hf = _hf_from(model, cfg)
    prompt = torch.randint(0, cfg.d_vocab, (1, 8), generator=torch.Generator().manual_seed(0))
    n_new = min(n_new, cfg.n_ctx - prompt.shape[1])
    with torch.no_grad():
        out = {}
        times = {}
        for _ in range(repeat):
            for name, fn in {
                "uncached": lambda: course.generate(model, prompt, n_new, eos_token_id=-1, temperature=0.0),
                "cached": lambda: course.cached_generate(cached, prompt, n_new),
                "transformers": lambda: hf.generate(
                    prompt,
                    attention_mask=torch.ones_like(prompt),
                    max_new_tokens=n_new,
                    min_new_tokens=n_new,
                    do_sample=False,
                    use_cache=True,
                    pad_token_id=0,
                ),
            }.items():
                start = time.perf_counter()
                out[name] = fn()
                times[name] = min(times.get(name, float("inf")), time.perf_counter() - start)
    agree = torch.equal(out["uncached"], out["cached"])
    agree_hf = torch.equal(out["cached"], out["transformers"])
    rate = {name: n_new / t for name, t in times.items()}
    print(f"{label}: {n_new} new tokens from an 8-token prompt, greedy, best of {repeat}")
    for name, r in rate.items():
        print(f"  {name:13s} {r:8.1f} tokens/s")
    print(f"  cached / uncached      = {rate['cached'] / rate['uncached']:.2f}x (target >= 5x at GPT-2 small's size)")
    print(f"  cached / transformers  = {rate['cached'] / rate['transformers']:.2f}x (target >= 1.0x)")
    print(f"  outputs identical: uncached vs cached {agree}; cached vs transformers {agree_hf}")
    if not agree_hf:
        print("  (transformers' min_new_tokens bans <|endoftext|> until the end, and random weights give near-ties)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--new-tokens", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    small = Config(d_model=768, n_heads=12, d_head=64, d_mlp=3072, n_layers=12, n_ctx=1024, d_vocab=50257)
    bench("GPT-2 small's size (random weights)", small, None, args.new_tokens, args.repeat)
    reference = load_reference_gpt2()
    cfg = Config.from_reference(reference)
    bench(
        f"offline reference ({reference.cfg.model_name})",
        cfg,
        dict(reference.named_parameters()),
        args.new_tokens,
        args.repeat,
    )


if __name__ == "__main__":
    main()
