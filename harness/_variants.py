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
    variants = {
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
        "It matches LayerNorm without the learned shift: add self.b after multiplying by self.w.": _layer_norm(
            x, w, 0.0, eps
        ),
        "It matches LayerNorm with w and b swapped: the normalised x is multiplied by self.w, then self.b is "
        "added.": _layer_norm(x, b, w, eps),
        "It matches LayerNorm over the wrong dimension: the mean and variance are taken over each vector's "
        "features, the last dimension (dim=-1, keepdim=True), not over the positions.": _layer_norm(
            x, w, b, eps, dim=1
        ),
        "It matches LayerNorm with the variance of x itself: take the variance of the centred x (x minus its mean).": (
            x - x.mean(-1, keepdim=True)
        )
        / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()
        * w
        + b,
    }
    if abs(eps - 1e-5) > 1e-9:  # only distinguishable when the config's epsilon is not the usual one
        variants[
            "It matches LayerNorm with epsilon fixed at 1e-5: use cfg.layer_norm_eps (this check sets it to "
            f"{eps:g}), not a fixed 1e-5."
        ] = _layer_norm(x, w, b, 1e-5)
    return variants


def _attention(
    x,
    a,
    *,
    scale=None,
    mask="causal",
    fill=-1e5,
    softmax_dim=-1,
    qkv_bias=True,
    out_bias=True,
    swap_qk=False,
    v_from_q=False,
    heads="sum",
    z_over_queries=False,
):
    q = torch.einsum("bpd,hdk->bphk", x, a.W_Q) + (a.b_Q if qkv_bias else 0)
    k = torch.einsum("bpd,hdk->bphk", x, a.W_K) + (a.b_K if qkv_bias else 0)
    v = torch.einsum("bpd,hdk->bphk", x, a.W_Q if v_from_q else a.W_V) + (
        (a.b_Q if v_from_q else a.b_V) if qkv_bias else 0
    )
    if v_from_q:  # either copy-paste slip (W_Q with b_V, or W_Q with b_Q) is the same mistake
        v_b_v = torch.einsum("bpd,hdk->bphk", x, a.W_Q) + (a.b_V if qkv_bias else 0)
        return torch.stack(
            [
                _attend(x, a, q, k, vv, scale, mask, fill, softmax_dim, out_bias, heads, z_over_queries)
                for vv in (v, v_b_v)
            ]
        )
    if swap_qk:
        q, k = k, q
    return _attend(x, a, q, k, v, scale, mask, fill, softmax_dim, out_bias, heads, z_over_queries)


def _attend(x, a, q, k, v, scale, mask, fill, softmax_dim, out_bias, heads, z_over_queries):
    d_head = a.W_Q.shape[-1]
    scores = torch.einsum("bqhk,bshk->bhqs", q, k) * (1 / math.sqrt(d_head) if scale is None else scale)
    n = x.shape[1]
    ones = torch.ones(n, n, dtype=torch.bool)
    masks = {"causal": ones.triu(1), "diagonal": ones.triu(0), "none": ~ones, "flipped": ones.tril(-1)}
    scores = scores.masked_fill(masks[mask], fill)
    pattern = scores.softmax(softmax_dim)
    if z_over_queries:
        pattern = pattern.transpose(-1, -2)
    z = torch.einsum("bshk,bhqs->bqhk", v, pattern)
    per_head = torch.einsum("bqhk,hkd->bqhd", z, a.W_O)
    out = per_head.sum(2) if heads == "sum" else per_head.mean(2)
    return out + (a.b_O if out_bias else 0)


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
        "It matches attention with queries and keys swapped: the scores are q . k with q from W_Q (the query "
        "position's row) and k from W_K; swapping them transposes the pattern, so the mask hides the wrong "
        "side.": _attention(x, ref, swap_qk=True),
        "It matches attention whose heads are averaged: each head's output through W_O is summed over the heads, "
        "not averaged.": _attention(x, ref, heads="mean"),
        "It matches attention with the values computed from W_Q: v uses W_V (and b_V).": _attention(
            x, ref, v_from_q=True
        ),
        "It matches attention whose pattern is applied transposed (summed over the queries): z at query q is the "
        "sum over keys k of pattern[q, k] * v[k].": _attention(x, ref, z_over_queries=True),
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
        "It matches the MLP with the activation after W_out: apply GELU to x @ W_in + b_in, then project with "
        "W_out.": _gelu_tanh((x @ ref.W_in + ref.b_in) @ ref.W_out + ref.b_out),
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
    logits = x @ ref.W_U + ref.b_U
    return {
        "It matches the unembedding without the bias b_U.": x @ ref.W_U,
        "It matches the logits followed by a softmax: the unembedding returns logits (the loss takes the softmax).": logits.softmax(
            -1
        ),
        "It matches the logits followed by a log_softmax: the unembedding returns the logits themselves.": logits.log_softmax(
            -1
        ),
    }


def _embed_variants(ref, tokens):
    W_E = ref.W_E
    d_model = W_E.shape[-1]
    return {
        "It matches W_E[tokens] scaled by sqrt(d_model) (the original Transformer's embedding): GPT-2 does not "
        "scale its embedding, return W_E[tokens].": W_E[tokens] * math.sqrt(d_model),
        "It matches the first sequence's embeddings repeated for every row of the batch: index W_E with the whole "
        "tokens tensor, W_E[tokens].": W_E[tokens[0]].expand(tokens.shape[0], -1, -1),
    }


def _sinusoidal(n_ctx: int, d_model: int) -> Tensor:
    two_i = torch.arange(0, d_model, 2, dtype=torch.float32)
    angles = torch.arange(n_ctx, dtype=torch.float32)[:, None] / 10000 ** (two_i / d_model)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)[:, :d_model]


def _pos_embed_variants(ref, x):
    batch, pos = x.shape
    out = {}
    if pos + 1 <= ref.W_pos.shape[0]:
        out["It matches W_pos shifted by one: positions start at 0."] = ref.W_pos[1 : pos + 1].expand(batch, pos, -1)
    out[
        "It matches the fixed sinusoidal encoding: GPT-2 learns its positional embeddings, so return the rows of "
        "W_pos for positions 0..pos-1."
    ] = _sinusoidal(pos, ref.W_pos.shape[-1]).expand(batch, pos, -1)
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
    "Embed": _embed_variants,
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
        # A variant may list alternatives stacked on a new first dimension (the same slip made two ways).
        for candidate in variant if variant.dim() == out.dim() + 1 else [variant]:
            if candidate.shape == out.shape and mismatch_summary(out, candidate, atol, rtol) is None:
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


# ---------------------------------------------------------------------------------------------------------------
# Composite modules: trace the learner's own submodules and find the first place that departs from the reference.


def _trace(module, x: Tensor, names: list[str]) -> tuple[dict, list[str]]:
    """One forward pass of `module` with each named submodule's input, output and call order recorded."""
    seen: dict[str, tuple[Tensor, Tensor]] = {}
    order: list[str] = []
    handles = []

    def hook(name):
        def record(sub, inputs, output):
            if inputs and isinstance(inputs[0], Tensor) and isinstance(output, Tensor):
                seen.setdefault(name, (inputs[0].detach(), output.detach()))
                order.append(name)

        return record

    try:
        for name in names:
            sub = module.get_submodule(name)
            handles.append(sub.register_forward_hook(hook(name)))
        with torch.no_grad():
            module(x)
    except Exception:  # noqa: BLE001 -- no trace, no diagnosis: the caller reports the plain mismatch
        return {}, []
    finally:
        for handle in handles:
            handle.remove()
    return seen, order


def _same(a: Tensor, b: Tensor, atol: float, rtol: float) -> bool:
    return a.shape == b.shape and mismatch_summary(a, b, atol, rtol) is None


def _which(value: Tensor, candidates: dict[str, Tensor], atol: float, rtol: float) -> str | None:
    return next((label for label, c in candidates.items() if _same(value, c, atol, rtol)), None)


def _sublayer_problem(label: str, kind: str, ref_sub, given: Tensor, got: Tensor, atol: float, rtol: float) -> str:
    """'' when the learner's submodule agrees with the reference's on the input it received, else a diagnosis."""
    with torch.no_grad():
        expected = ref_sub(given, given, given) if kind == "Attention" else ref_sub(given)
    if _same(got, expected, atol, rtol):
        return ""
    hint = diagnose(kind, ref_sub, given, got, atol, rtol)
    return f"{label} itself differs from the reference on the input it received" + (f": {hint}" if hint else ".")


def diagnose_block(module, ref, x: Tensor, atol: float, rtol: float) -> str:
    """Where a pre-LN block's wiring or one of its sublayers departs from GPT-2's, from a trace of the learner's own
    submodules (ln1, attn, ln2, mlp); '' when the trace does not single out a place."""
    names = ["ln1", "attn", "ln2", "mlp"]
    if not all(hasattr(module, n) for n in names):
        return ""
    seen, order = _trace(module, x, names)
    if not seen:
        return ""
    missing = [n for n in names if n not in seen]
    if missing:
        if missing[0] in ("ln1", "ln2"):
            return (
                f"The block never called self.{missing[0]}: GPT-2 normalises each sublayer's input (pre-LN), ln1 "
                "before attention and ln2 before the MLP."
            )
        return f"The block never called self.{missing[0]}: each of ln1, attn, ln2 and mlp is used once per forward."
    if order.index("ln2") < order.index("ln1"):
        return (
            "The block calls ln2 before ln1: they are swapped. ln1 normalises attention's input, ln2 the MLP's "
            "(each has its own weights)."
        )
    if order.index("mlp") < order.index("attn"):
        return "The block runs the MLP before attention: GPT-2's block is attention first, then the MLP."
    ln1_in, ln1_out = seen["ln1"]
    attn_in, attn_out = seen["attn"]
    ln2_in, ln2_out = seen["ln2"]
    mlp_in, mlp_out = seen["mlp"]
    mid = x + attn_out
    values = {
        "the block's input (resid_pre)": x,
        "ln1's output": ln1_out,
        "the attention output alone": attn_out,
        "resid_pre + attention output (resid_mid)": mid,
        "ln2's output": ln2_out,
        "the MLP output alone": mlp_out,
    }
    wires = [
        ("ln1", ln1_in, "the block's input (resid_pre)"),
        ("attn", attn_in, "ln1's output"),
        ("ln2", ln2_in, "resid_pre + attention output (resid_mid)"),
        ("mlp", mlp_in, "ln2's output"),
    ]
    for name, got_in, due in wires:
        if _same(got_in, values[due], atol, rtol):
            continue
        found = _which(got_in, values, atol, rtol)
        extra = ""
        if name == "ln2" and found == "the attention output alone":
            extra = (
                " The residual connection around attention is missing: resid_mid = resid_pre + attn(ln1(resid_pre))."
            )
        if name in ("attn", "mlp") and found in (
            "the block's input (resid_pre)",
            "resid_pre + attention output (resid_mid)",
        ):
            extra = " Its LayerNorm was skipped: GPT-2 normalises the input of each sublayer (pre-LN)."
        if found:
            return f"In the block, self.{name} received {found} where {due} is due.{extra}"
        return f"In the block, self.{name} received something other than {due} (it matches none of the block's other values)."
    for label, kind, ref_sub, (given, got) in (
        ("ln1", "LayerNorm", ref.ln1, seen["ln1"]),
        ("attn", "Attention", ref.attn, seen["attn"]),
        ("ln2", "LayerNorm", ref.ln2, seen["ln2"]),
        ("mlp", "MLP", ref.mlp, seen["mlp"]),
    ):
        problem = _sublayer_problem(f"The block's {label}", kind, ref_sub, given, got, atol, rtol)
        if problem:
            return problem
    with torch.no_grad():
        out = module(x)
    if _same(out, mlp_out, atol, rtol):
        return "The block returns the MLP output alone: the residual connection around the MLP is missing (return resid_mid + mlp_out)."
    if _same(out, mid, atol, rtol):
        return "The block returns resid_mid: the MLP's output is never added to the residual stream."
    return "Every sublayer is wired and computes as in GPT-2, but the block's return value is not resid_mid + mlp_out."


def diagnose_model(module, ref, tokens: Tensor, atol: float, rtol: float) -> str:
    """The first place where a full model departs from GPT-2's order (embeddings, blocks 0..n-1, ln_final, unembed),
    from a trace of the learner's own submodules; '' when the trace does not single out a place."""
    n = len(getattr(module, "blocks", []))
    names = ["embed", "pos_embed", *[f"blocks.{i}" for i in range(n)], "ln_final", "unembed"]
    if n == 0 or not all(_has(module, name) for name in names):
        return ""
    seen, order = _trace(module, tokens, names)
    if not seen:
        return ""
    block_order = [name for name in order if name.startswith("blocks.")]
    if block_order == [f"blocks.{i}" for i in reversed(range(n))] and n > 1:
        return "The blocks run in reverse order: block 0 must come first, each fed the previous block's output."
    missing = [name for name in names if name not in seen]
    if missing:
        return f"The model never called self.{missing[0]}."
    embed_out, pos_out = seen["embed"][1], seen["pos_embed"][1]
    expected_in = embed_out + pos_out
    for i in range(n):
        given, got = seen[f"blocks.{i}"]
        if not _same(given, expected_in, atol, rtol):
            what = "the sum of the token and position embeddings" if i == 0 else f"block {i - 1}'s output"
            if i == 0 and _same(given, embed_out, atol, rtol):
                return "Block 0 received the token embeddings alone: add pos_embed(tokens) to embed(tokens)."
            d_model = embed_out.shape[-1]
            if i == 0 and _same(given, embed_out * math.sqrt(d_model) + pos_out, atol, rtol):
                return (
                    "The token embeddings are scaled by sqrt(d_model) before the position embeddings are added (the "
                    "original Transformer's convention): GPT-2 adds embed(tokens) + pos_embed(tokens) unscaled."
                )
            if i > 0:
                with torch.no_grad():
                    normalised = module.ln_final(expected_in)
                if _same(given, normalised, atol, rtol):
                    return (
                        f"Block {i} received ln_final of block {i - 1}'s output: ln_final is applied once, after "
                        "the last block; each block gets the previous block's raw output."
                    )
            return f"Block {i} did not receive {what}."
        problem = _block_problem(module.blocks[i], i, ref, given, got, atol, rtol)
        if problem:
            return problem
        expected_in = got
    given, got = seen["ln_final"]
    if not _same(given, expected_in, atol, rtol):
        return "ln_final did not receive the last block's output."
    problem = _sublayer_problem("ln_final", "LayerNorm", ref.ln_final, given, got, atol, rtol)
    if problem:
        return problem
    given, logits = seen["unembed"]
    if not _same(given, got, atol, rtol):
        if _same(given, expected_in, atol, rtol):
            return "The unembedding received the last block's output directly: apply ln_final first."
        return "The unembedding did not receive ln_final's output."
    problem = _sublayer_problem("The unembedding", "Unembed", ref.unembed, given, logits, atol, rtol)
    if problem:
        return problem
    with torch.no_grad():
        out = module(tokens)
    if _same(out, logits.softmax(-1), atol, rtol):
        return "The model returns probabilities (a softmax of the logits): return the logits themselves."
    if _same(out, logits.log_softmax(-1), atol, rtol):
        return "The model returns log-probabilities (a log_softmax of the logits): return the logits themselves."
    return "Every submodule is wired and computes as in GPT-2, but the model's return value is not the unembedding's output."


def _has(module, name: str) -> bool:
    try:
        module.get_submodule(name)
    except AttributeError:
        return False
    return True


def _block_problem(block, i: int, ref, given: Tensor, got: Tensor, atol: float, rtol: float) -> str:
    with torch.no_grad():
        expected = ref.blocks[i](given)
    if _same(got, expected, atol, rtol):
        return ""
    hint = diagnose("TransformerBlock", ref.blocks[i], given, got, atol, rtol)
    hint = hint or diagnose_block(block, ref.blocks[i], given, atol, rtol)
    return f"Block {i} differs from the reference on the input it received" + (f": {hint}" if hint else ".")
