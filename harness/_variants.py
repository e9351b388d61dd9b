"""Known mistakes, recomputed from the reference's own weights, so a failing check can name the likely one.

Also the two probes that a random input cannot replace: the causal mask on crafted scores, and the activation
function read off directly on a grid of pre-activations.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from harness._assertions import as_tensor_output, call, fail, mismatch_summary


def _layer_norm(x, w, b, eps, *, unbiased=False, eps_outside=False, center=True, affine=True, dim=-1):
    mean = x.mean(dim, keepdim=True) if center else 0.0
    centered = x - mean
    var = centered.var(dim, unbiased=True, keepdim=True) if unbiased else centered.pow(2).mean(dim, keepdim=True)
    scale = var.sqrt() + eps if eps_outside else (var + eps).sqrt()
    out = centered / scale
    return out * w + b if affine else out


def _layer_norm_variants(ref, x):
    w, b, eps = ref.w, ref.b, ref.eps
    return {
        "It matches LayerNorm with the unbiased variance (dividing by d_model - 1): GPT-2 uses the population "
        "variance, x.var(dim=-1, unbiased=False) or the mean of squared deviations.": _layer_norm(
            x, w, b, eps, unbiased=True
        ),
        "It matches LayerNorm with epsilon added outside the square root: divide by sqrt(var + eps), "
        "not sqrt(var) + eps.": _layer_norm(x, w, b, eps, eps_outside=True),
        "It matches LayerNorm without epsilon: add cfg.layer_norm_eps to the variance.": _layer_norm(x, w, b, 0.0),
        "It matches LayerNorm without the learned scale and shift: multiply by self.w and add self.b.": _layer_norm(
            x, w, b, eps, affine=False
        ),
        "It matches RMS normalisation (the mean is never subtracted): centre x first.": _layer_norm(
            x, w, b, eps, center=False
        ),
        "It matches LayerNorm with the variance of the centred x taken unbiased and no epsilon.": _layer_norm(
            x, w, b, 0.0, unbiased=True
        ),
    }


def _attention(x, a, *, scale=None, mask="causal", fill=-1e5, softmax_dim=-1, qkv_bias=True, out_bias=True):
    q = torch.einsum("bpd,hdk->bphk", x, a.W_Q) + (a.b_Q if qkv_bias else 0)
    k = torch.einsum("bpd,hdk->bphk", x, a.W_K) + (a.b_K if qkv_bias else 0)
    v = torch.einsum("bpd,hdk->bphk", x, a.W_V) + (a.b_V if qkv_bias else 0)
    d_head = a.W_Q.shape[-1]
    scores = torch.einsum("bqhk,bshk->bhqs", q, k) * (1 / math.sqrt(d_head) if scale is None else scale)
    n = x.shape[1]
    ones = torch.ones(n, n, dtype=torch.bool)
    masks = {"causal": ones.triu(1), "diagonal": ones.triu(0), "none": ~ones, "flipped": ones.tril(-1)}
    scores = scores.masked_fill(masks[mask], fill)
    pattern = scores.softmax(softmax_dim)
    z = torch.einsum("bshk,bhqs->bqhk", v, pattern)
    return torch.einsum("bqhk,hkd->bqd", z, a.W_O) + (a.b_O if out_bias else 0)


def _attention_variants(ref, x):
    d_head, d_model = ref.W_Q.shape[-1], ref.W_Q.shape[1]
    return {
        "It matches attention without the 1/sqrt(d_head) scaling of the scores.": _attention(x, ref, scale=1.0),
        "It matches attention scaled by 1/d_head instead of 1/sqrt(d_head).": _attention(x, ref, scale=1 / d_head),
        "It matches attention scaled by 1/sqrt(d_model) instead of 1/sqrt(d_head).": _attention(
            x, ref, scale=1 / math.sqrt(d_model)
        ),
        "It matches attention with no causal mask: each position must not see later ones.": _attention(
            x, ref, mask="none"
        ),
        "It matches attention whose mask also covers the diagonal: a token must be able to attend to itself "
        "(torch.triu(..., diagonal=1)).": _attention(x, ref, mask="diagonal"),
        "It matches attention with the mask flipped: mask the future (above the diagonal), keep the past.": _attention(
            x, ref, mask="flipped"
        ),
        "It matches attention whose masked scores are set to 0: softmax still gives them weight; use a large "
        "negative number.": _attention(x, ref, fill=0.0),
        "It matches attention with softmax over the query dimension: normalise over the keys (the last "
        "dimension of the scores).": _attention(x, ref, softmax_dim=-2),
        "It matches attention without the biases b_Q, b_K, b_V.": _attention(x, ref, qkv_bias=False),
        "It matches attention without the output bias b_O.": _attention(x, ref, out_bias=False),
    }


def _gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def _mlp(x, m, act=_gelu_tanh, b_in=True, b_out=True):
    pre = x @ m.W_in + (m.b_in if b_in else 0)
    return act(pre) @ m.W_out + (m.b_out if b_out else 0)


def _mlp_variants(ref, x):
    return {
        "It matches the MLP with the exact (erf) GELU: GPT-2 uses the tanh approximation.": _mlp(x, ref, act=F.gelu),
        "It matches the MLP with ReLU: GPT-2 uses GELU (tanh approximation).": _mlp(x, ref, act=F.relu),
        "It matches the MLP without the activation function.": _mlp(x, ref, act=lambda t: t),
        "It matches the MLP with the sigmoid approximation of GELU, x * sigmoid(1.702 x): GPT-2 uses the tanh "
        "approximation.": _mlp(x, ref, act=lambda t: t * torch.sigmoid(1.702 * t)),
        "It matches the MLP without b_in.": _mlp(x, ref, b_in=False),
        "It matches the MLP without b_out.": _mlp(x, ref, b_out=False),
    }


def _block_variants(ref, x):
    attn = lambda t: ref.attn(t, t, t)
    ln1, ln2, mlp = ref.ln1, ref.ln2, ref.mlp
    mid_post = ln1(x + attn(x))
    mid = x + attn(ln1(x))
    return {
        "It matches a post-LN block (LayerNorm after each residual addition, as in the original Transformer): "
        "GPT-2 is pre-LN: resid_mid = resid_pre + attn(ln1(resid_pre)).": ln2(mid_post + mlp(mid_post)),
        "It matches a block without the residual connections: add each sublayer's output to its input.": mlp(
            ln2(attn(ln1(x)))
        ),
        "It matches a block whose attention output is not added to the residual stream.": attn(ln1(x))
        + mlp(ln2(attn(ln1(x)))),
        "It matches a block whose MLP reads resid_pre instead of resid_mid.": mid + mlp(ln2(x)),
        "It matches a block that uses ln1 before the MLP too: the MLP has its own LayerNorm, ln2.": mid + mlp(ln1(mid)),
        "It matches a block without LayerNorms.": (x + attn(x)) + mlp(x + attn(x)),
    }


def _unembed_variants(ref, x):
    return {"It matches the unembedding without the bias b_U.": x @ ref.W_U}


def _pos_embed_variants(ref, x):
    batch, pos = x.shape
    out = {}
    if pos + 1 <= ref.W_pos.shape[0]:
        out["It matches W_pos shifted by one: positions start at 0."] = ref.W_pos[1 : pos + 1].expand(batch, pos, -1)
    return out


def _full_variants(ref, tokens):
    embed = ref.embed(tokens)
    pos = ref.pos_embed(tokens)

    def blocks(resid):
        for block in ref.blocks:
            resid = block(resid)
        return resid

    return {
        "It matches the model without the final LayerNorm (ln_final) before the unembedding.": ref.unembed(
            blocks(embed + pos)
        ),
        "It matches the model without positional embeddings: add pos_embed(tokens) to embed(tokens).": ref.unembed(
            ref.ln_final(blocks(embed))
        ),
        "It matches the model with only the last block applied: loop over all blocks, feeding each the previous "
        "one's output.": ref.unembed(ref.ln_final(ref.blocks[-1](embed + pos))),
    }


_VARIANTS = {
    "LayerNorm": _layer_norm_variants,
    "Attention": _attention_variants,
    "MLP": _mlp_variants,
    "TransformerBlock": _block_variants,
    "Unembed": _unembed_variants,
    "PosEmbed": _pos_embed_variants,
    "DemoTransformer": _full_variants,
}


def diagnose(kind: str, reference, x: Tensor, out: Tensor, atol: float, rtol: float) -> str:
    """The name of the known mistake that reproduces `out`, or '' when none does."""
    make = _VARIANTS.get(kind)
    if make is None:
        return ""
    with torch.no_grad():
        try:
            variants = make(reference, x)
        except Exception:  # noqa: BLE001 -- a variant that cannot be computed for these shapes is simply not a candidate
            return ""
    for message, variant in variants.items():
        if variant.shape == out.shape and mismatch_summary(out, variant, atol, rtol) is None:
            return message
    return ""


def causal_mask_probe(module) -> None:
    """`apply_causal_mask` on crafted scores: the past and the diagonal kept, the future pushed far negative."""
    apply = getattr(module, "apply_causal_mask", None)
    if apply is None:  # masking inline in forward is fine; the forward comparisons test it
        return
    gen = torch.Generator().manual_seed(7)
    scores = torch.randn((2, 3, 5, 5), generator=gen) * 3
    expected_kept = torch.ones(5, 5, dtype=torch.bool).tril()
    out = as_tensor_output(call(apply, scores.clone(), what="apply_causal_mask"), "apply_causal_mask")
    if tuple(out.shape) != tuple(scores.shape):
        fail(f"apply_causal_mask returned shape {list(out.shape)} for scores of shape {list(scores.shape)}.")
    diagonal = torch.eye(5, dtype=torch.bool)
    kept_ok = torch.isclose(out, scores) | (out.isnan() & scores.isnan())
    if not kept_ok[..., diagonal].all():
        fail(
            "apply_causal_mask changes the diagonal: a token must be able to attend to itself, so mask only "
            "key positions after the query (torch.triu(..., diagonal=1)). Masking the diagonal also leaves the "
            "first row fully masked, which softmax turns into NaNs or a uniform pattern."
        )
    if not kept_ok[..., expected_kept & ~diagonal].all():
        if (out[..., ~expected_kept] == scores[..., ~expected_kept]).all():
            fail("apply_causal_mask masks the past and keeps the future: the mask is flipped (use triu, not tril).")
        fail("apply_causal_mask changes scores at or before the query position: only later key positions are masked.")
    future = out[..., ~expected_kept]
    if (future == 0).all():
        fail(
            "apply_causal_mask sets future scores to 0: after softmax they still get weight e^0 = 1. "
            "Fill them with a large negative number (e.g. self.IGNORE = -1e5) or -inf."
        )
    if torch.isclose(future, scores[..., ~expected_kept]).all():
        fail("apply_causal_mask leaves the future scores unchanged: nothing is masked.")
    if not (future <= -1e4).all():
        fail(
            f"apply_causal_mask leaves future scores as large as {future.max().item():.3g}: they must be so negative "
            "that softmax gives them no weight (at most -1e4, e.g. -1e5 or -inf)."
        )
    pattern = out.softmax(-1)
    if not torch.isfinite(pattern).all():
        fail("softmax of the masked scores has NaNs: some row is masked entirely.")


def gelu_probe(cls) -> None:
    """Reads the MLP's activation directly: W_in = 0, b_in = a grid of pre-activations, W_out = identity."""
    from harness._assertions import build
    from harness.config import Config

    n = 64
    cfg = Config(d_model=n, d_mlp=n, d_head=8, n_heads=8, n_layers=1, n_ctx=8, d_vocab=16)
    module = build(cls, cfg)
    grid = torch.linspace(-6, 6, n)
    with torch.no_grad():
        params = dict(module.named_parameters())
        params["W_in"].zero_()
        params["b_in"].copy_(grid)
        params["W_out"].copy_(torch.eye(n))
        params["b_out"].zero_()
        x = torch.randn(1, 3, n, generator=torch.Generator().manual_seed(3))
        out = as_tensor_output(call(module, x, what="MLP.forward"), "MLP.forward")[0, 0]
    expected = _gelu_tanh(grid)
    if mismatch_summary(out, expected, 2e-6, 1e-5) is None:
        return
    candidates = {
        "exact (erf) GELU, F.gelu(x); GPT-2 uses the tanh approximation, F.gelu(x, approximate='tanh') "
        "(the two differ by up to about 5e-4)": F.gelu(grid),
        "ReLU": F.relu(grid),
        "no activation at all": grid,
        "sigmoid-approximated GELU, x * sigmoid(1.702 x)": grid * torch.sigmoid(1.702 * grid),
    }
    for name, values in candidates.items():
        if mismatch_summary(out, values, 2e-6, 1e-5) is None:
            fail(f"The MLP's activation is {name}.")
    worst = int((out - expected).abs().argmax())
    fail(
        f"The MLP's activation differs from GPT-2's tanh GELU: at pre-activation {grid[worst].item():.2f} it gives "
        f"{out[worst].item():.6g}, expected {expected[worst].item():.6g}."
    )
