"""Checks for notebook 09, the encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

`torch.nn` is the oracle: the learner's parameters are copied into `nn.MultiheadAttention`,
`nn.TransformerEncoderLayer`, `nn.TransformerDecoderLayer` (post-LN, ReLU, dropout 0) and `nn.Transformer` (with its
final LayerNorms removed: the paper's stacks end with the last layer's own LayerNorm). When an output is wrong, the
usual mistakes are recomputed from the same parameters by a small functional reference (`_attention`, `_encoder_layer`,
`_decoder_layer`) and the one that matches is named; behavioural probes (padding appended, a future token changed, the
source changed) name what the model may or may not see.

Masks follow nn.MultiheadAttention's and nn.Transformer's convention throughout (not F.scaled_dot_product_attention's, where True means "takes part"): a bool `key_padding_mask [batch, key]`, True = a padding key, masked out.
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness._assertions import (
    as_tensor_output,
    assert_unchanged,
    call,
    check_tensor,
    defaults_as_given,
    fail,
    mismatch_summary,
)
from harness.config import EncoderDecoderConfig

__all__ = [
    "EncoderDecoderConfig",
    "decoder_layer_test",
    "encoder_decoder_test",
    "encoder_layer_test",
    "feed_forward_test",
    "greedy_decode_test",
    "make_batch_test",
    "multi_head_attention_test",
    "seq2seq_loss_test",
    "shared_embedding_test",
]


# Small and odd-sized enough that a transposed weight or a wrong broadcast shows; n_heads * d_head == d_model, as
# nn.MultiheadAttention requires.
# The special ids sit inside the vocabulary, not at 0, 1, 2: a test against `<= pad_id` or a hard-coded 0 then shows.
CHECK_CFG = EncoderDecoderConfig(
    d_model=16, n_heads=4, d_head=4, d_ff=24, n_layers=2, d_vocab=13, n_ctx=32, pad_id=5, bos_id=3, eos_id=8
)
ATOL, RTOL = 1e-5, 1e-4


def _ordinary_ids(cfg, shape, gen) -> Tensor:
    """Random token ids that are none of pad, BOS and EOS, from both sides of them."""
    ordinary = torch.tensor([t for t in range(cfg.d_vocab) if t not in (cfg.pad_id, cfg.bos_id, cfg.eos_id)])
    return ordinary[torch.randint(0, len(ordinary), shape, generator=gen)]


NEG_INF = float("-inf")


def _kcall(fn, *args, what: str, **kwargs):
    """`call` with keyword arguments."""
    return call(functools.partial(fn, **kwargs), *args, what=what)


def _build(cls, cfg: EncoderDecoderConfig, name: str) -> nn.Module:
    if not callable(cls):
        fail(f"Expected the class itself, e.g. {name}, got {type(cls).__name__}.")
    try:
        module = cls(cfg)
    except Exception as err:
        raise AssertionError(f"{name}(cfg) raised {type(err).__name__} in __init__: {err}") from err
    if not isinstance(module, nn.Module):
        fail(f"{name}(cfg) returned a {type(module).__name__}, not an nn.Module.")
    return module


def _randomize(module: nn.Module, seed: int, skip: tuple[str, ...] = ()) -> None:
    """Random weights of unit-ish scale: non-zero biases, LayerNorm gains away from 1, so that each one matters."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.split(".")[-1] in skip:
                continue
            noise = torch.randn(p.shape, generator=gen)
            if p.ndim == 1 and name.split(".")[-1] in ("w", "weight"):  # LayerNorm gains
                p.copy_(1.0 + 0.3 * noise)
            elif p.ndim == 1 or name.split(".")[-1].startswith("b_"):
                p.copy_(0.3 * noise)
            else:
                fan_in = p.shape[-2] if p.ndim >= 2 else p.shape[-1]
                p.copy_(noise / math.sqrt(fan_in))


def _params(module: nn.Module, name: str) -> dict[str, Tensor]:
    return {k: v.detach() for k, v in module.named_parameters()}


def _need(params: dict[str, Tensor], key: str, shape: tuple[int, ...], name: str) -> Tensor:
    if key not in params:
        fail(
            f"{name} has no parameter `{key}` (it has {sorted(params)}): keep the __init__ given in the notebook, "
            "whose parameter names the check copies into torch.nn's modules."
        )
    if tuple(params[key].shape) != tuple(shape):
        fail(f"{name}.{key} has shape {list(params[key].shape)}, expected {list(shape)}.")
    return params[key]


def _ln_params(params: dict[str, Tensor], prefix: str, d_model: int, name: str) -> tuple[Tensor, Tensor]:
    for w, b in (("w", "b"), ("weight", "bias")):
        if f"{prefix}.{w}" in params:
            return _need(params, f"{prefix}.{w}", (d_model,), name), _need(params, f"{prefix}.{b}", (d_model,), name)
    fail(f"{name} has no LayerNorm `{prefix}` with parameters w and b: keep the __init__ given in the notebook.")


# --------------------------------------------------------------------------------------------------------------------
# A functional reference, for recomputing mistakes from the learner's own parameters
# --------------------------------------------------------------------------------------------------------------------


def _attn_params(params: dict[str, Tensor], prefix: str, cfg: EncoderDecoderConfig, name: str) -> dict[str, Tensor]:
    n, m, h = cfg.n_heads, cfg.d_model, cfg.d_head
    shapes = {"W_Q": (n, m, h), "W_K": (n, m, h), "W_V": (n, m, h), "W_O": (n, h, m)}
    shapes |= {"b_Q": (n, h), "b_K": (n, h), "b_V": (n, h), "b_O": (m,)}
    return {k: _need(params, prefix + k, s, name) for k, s in shapes.items()}


def _attention(
    p: dict[str, Tensor],
    x_q: Tensor,
    x_kv: Tensor,
    mask: Tensor | None,
    causal: bool,
    *,
    scale: str = "d_head",
    polarity: str = "pad",
    causal_diagonal: int = 1,
    softmax_dim: int = -1,
) -> Tensor:
    """Multi-head attention; the keywords reproduce mistakes (scale "none" or "d_model", mask polarity "keep" or
    "add", a causal mask that also hides the diagonal, a softmax over the queries)."""
    d_head = p["W_Q"].shape[-1]
    q = torch.einsum("bqm,nmh->bqnh", x_q, p["W_Q"]) + p["b_Q"]
    k = torch.einsum("bkm,nmh->bknh", x_kv, p["W_K"]) + p["b_K"]
    v = torch.einsum("bkm,nmh->bknh", x_kv, p["W_V"]) + p["b_V"]
    scores = torch.einsum("bqnh,bknh->bnqk", q, k)
    if scale == "d_head":
        scores = scores / math.sqrt(d_head)
    elif scale == "d_model":
        scores = scores / math.sqrt(x_q.shape[-1])
    if mask is not None:
        if polarity == "pad":
            scores = scores.masked_fill(mask[:, None, None, :], NEG_INF)
        elif polarity == "keep":
            scores = scores.masked_fill(~mask[:, None, None, :], NEG_INF)
        elif polarity == "add":
            scores = scores + mask[:, None, None, :].to(scores.dtype)
    if causal:
        n_q, n_k = scores.shape[-2:]
        future = torch.triu(torch.ones(n_q, n_k, dtype=torch.bool), diagonal=causal_diagonal)
        scores = scores.masked_fill(future, -1e9 if causal_diagonal < 1 else NEG_INF)
    pattern = scores.softmax(dim=softmax_dim)
    z = torch.einsum("bnqk,bknh->bqnh", pattern, v)
    return torch.einsum("bqnh,nhm->bqm", z, p["W_O"]) + p["b_O"]


def _layer_norm(x: Tensor, wb: tuple[Tensor, Tensor], eps: float) -> Tensor:
    return F.layer_norm(x, x.shape[-1:], wb[0], wb[1], eps)


def _ff(p: dict[str, Tensor], x: Tensor, act=torch.relu) -> Tensor:
    return act(x @ p["W_in"] + p["b_in"]) @ p["W_out"] + p["b_out"]


def _ff_params(params: dict[str, Tensor], prefix: str, cfg: EncoderDecoderConfig, name: str) -> dict[str, Tensor]:
    m, f = cfg.d_model, cfg.d_ff
    shapes = {"W_in": (m, f), "b_in": (f,), "W_out": (f, m), "b_out": (m,)}
    return {k: _need(params, prefix + k, s, name) for k, s in shapes.items()}


def _sublayer(x: Tensor, f, ln, order: str) -> Tensor:
    """One residual sub-layer in the paper's post-LN order, or a mistaken one."""
    if order == "post":
        return ln(x + f(x))
    if order == "pre":  # GPT-2's
        return x + f(ln(x))
    if order == "no_residual":
        return ln(f(x))
    if order == "norm_inside":  # x + LN(f(x))
        return x + ln(f(x))
    raise ValueError(order)


def _encoder_layer(P: dict, x: Tensor, mask: Tensor | None, eps: float, *, order="post", act=torch.relu, causal=False):
    x = _sublayer(
        x, lambda h: _attention(P["attn"], h, h, mask, causal), lambda h: _layer_norm(h, P["ln1"], eps), order
    )
    return _sublayer(x, lambda h: _ff(P["ff"], h, act), lambda h: _layer_norm(h, P["ln2"], eps), order)


def _decoder_layer(
    P: dict,
    y: Tensor,
    memory: Tensor,
    tgt_mask: Tensor | None,
    src_mask: Tensor | None,
    eps: float,
    *,
    order="post",
    act=torch.relu,
    self_causal=True,
    cross="memory",
    cross_causal=False,
):
    def cross_attention(h):
        if cross == "memory":
            return _attention(P["cross"], h, memory, src_mask, cross_causal)
        if cross == "decoder":  # keys and values from the decoder itself
            return _attention(P["cross"], h, h, src_mask, cross_causal)
        if cross == "swapped":  # queries from the encoder, keys and values from the decoder
            return _attention(P["cross"], memory, h, tgt_mask, cross_causal)
        raise ValueError(cross)

    y = _sublayer(
        y, lambda h: _attention(P["self"], h, h, tgt_mask, self_causal), lambda h: _layer_norm(h, P["ln1"], eps), order
    )
    y = _sublayer(y, cross_attention, lambda h: _layer_norm(h, P["ln2"], eps), order)
    return _sublayer(y, lambda h: _ff(P["ff"], h, act), lambda h: _layer_norm(h, P["ln3"], eps), order)


def _gelu(x: Tensor) -> Tensor:
    return F.gelu(x)


def _gelu_tanh(x: Tensor) -> Tensor:
    return F.gelu(x, approximate="tanh")


# --------------------------------------------------------------------------------------------------------------------
# Copying the learner's parameters into torch.nn's modules
# --------------------------------------------------------------------------------------------------------------------


def _to_mha(p: dict[str, Tensor], cfg: EncoderDecoderConfig, mha: nn.MultiheadAttention | None = None):
    if mha is None:
        mha = nn.MultiheadAttention(cfg.d_model, cfg.n_heads, dropout=0.0, batch_first=True)
    with torch.no_grad():
        # nn.MultiheadAttention holds W_Q, W_K, W_V stacked as [3 d_model, d_model] rows (head, d_head), for x @ W.T.
        mha.in_proj_weight.copy_(
            torch.cat([p[w].permute(0, 2, 1).reshape(-1, cfg.d_model) for w in ("W_Q", "W_K", "W_V")])
        )
        mha.in_proj_bias.copy_(torch.cat([p[b].reshape(-1) for b in ("b_Q", "b_K", "b_V")]))
        mha.out_proj.weight.copy_(p["W_O"].reshape(-1, cfg.d_model).T)
        mha.out_proj.bias.copy_(p["b_O"])
    return mha


def _copy_ff(p: dict[str, Tensor], layer) -> None:
    with torch.no_grad():
        layer.linear1.weight.copy_(p["W_in"].T)
        layer.linear1.bias.copy_(p["b_in"])
        layer.linear2.weight.copy_(p["W_out"].T)
        layer.linear2.bias.copy_(p["b_out"])


def _copy_ln(wb: tuple[Tensor, Tensor], norm: nn.LayerNorm) -> None:
    with torch.no_grad():
        norm.weight.copy_(wb[0])
        norm.bias.copy_(wb[1])


def _torch_layer_kwargs(cfg: EncoderDecoderConfig) -> dict:
    return {
        "d_model": cfg.d_model,
        "nhead": cfg.n_heads,
        "dim_feedforward": cfg.d_ff,
        "dropout": 0.0,
        "activation": "relu",
        "layer_norm_eps": cfg.layer_norm_eps,
        "batch_first": True,
        "norm_first": False,
    }


def _encoder_params(params: dict, prefix: str, cfg: EncoderDecoderConfig, name: str) -> dict:
    return {
        "attn": _attn_params(params, prefix + "self_attn.", cfg, name),
        "ln1": _ln_params(params, prefix + "ln1", cfg.d_model, name),
        "ff": _ff_params(params, prefix + "ff.", cfg, name),
        "ln2": _ln_params(params, prefix + "ln2", cfg.d_model, name),
    }


def _decoder_params(params: dict, prefix: str, cfg: EncoderDecoderConfig, name: str) -> dict:
    return {
        "self": _attn_params(params, prefix + "self_attn.", cfg, name),
        "ln1": _ln_params(params, prefix + "ln1", cfg.d_model, name),
        "cross": _attn_params(params, prefix + "cross_attn.", cfg, name),
        "ln2": _ln_params(params, prefix + "ln2", cfg.d_model, name),
        "ff": _ff_params(params, prefix + "ff.", cfg, name),
        "ln3": _ln_params(params, prefix + "ln3", cfg.d_model, name),
    }


def _torch_encoder_layer(P: dict, cfg: EncoderDecoderConfig, layer=None) -> nn.TransformerEncoderLayer:
    layer = layer or nn.TransformerEncoderLayer(**_torch_layer_kwargs(cfg))
    _to_mha(P["attn"], cfg, layer.self_attn)
    _copy_ff(P["ff"], layer)
    _copy_ln(P["ln1"], layer.norm1)
    _copy_ln(P["ln2"], layer.norm2)
    return layer


def _torch_decoder_layer(P: dict, cfg: EncoderDecoderConfig, layer=None) -> nn.TransformerDecoderLayer:
    layer = layer or nn.TransformerDecoderLayer(**_torch_layer_kwargs(cfg))
    _to_mha(P["self"], cfg, layer.self_attn)
    _to_mha(P["cross"], cfg, layer.multihead_attn)
    _copy_ff(P["ff"], layer)
    for i in (1, 2, 3):
        _copy_ln(P[f"ln{i}"], getattr(layer, f"norm{i}"))
    return layer


def _causal(n: int) -> Tensor:
    return torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)


def _sinusoid(n_ctx: int, d_model: int) -> Tensor:
    pos = torch.arange(n_ctx, dtype=torch.float64)[:, None]
    dim = torch.arange(d_model, dtype=torch.float64)
    angle = pos / 10000.0 ** (2 * torch.div(dim, 2, rounding_mode="floor") / d_model)
    return torch.where(dim % 2 == 0, angle.sin(), angle.cos()).float()


def _inputs(seed: int, *shape: int) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _padding(lengths: list[int], width: int) -> Tensor:
    """[batch, width] bool, True after each row's length (right padding)."""
    return torch.arange(width)[None, :] >= torch.tensor(lengths)[:, None]


def _run(fn, args: tuple, what: str, shape: tuple[int, ...]) -> Tensor:
    inputs = [a.clone() if isinstance(a, Tensor) else a for a in args]
    out = as_tensor_output(call(fn, *inputs, what=what), what)
    for given, kept in zip(inputs, args):
        if isinstance(kept, Tensor) and not torch.equal(given, kept):
            fail(f"{what} modified one of its inputs in place: compute into new tensors.")
    nan_rows = out.isnan().any(-1) if out.ndim == 3 else None
    if nan_rows is not None and nan_rows.any():
        return out  # the caller says what the NaN rows mean
    check_tensor(out, shape, what)
    return out


def _same(out: Tensor, expected: Tensor) -> bool:
    return out.shape == expected.shape and mismatch_summary(out, expected, ATOL, RTOL) is None


def _name_variant(out: Tensor, variants, what: str) -> None:
    """Fail naming the first variant `out` matches."""
    for cause, compute in variants:
        try:
            candidate = compute()
        except Exception:  # noqa: BLE001, S112 -- a variant that cannot run on this input (shapes) is not the one
            continue
        if torch.isfinite(candidate).all() and _same(out, candidate):
            fail(f"{cause} ({what} matches that computation exactly).")


# --------------------------------------------------------------------------------------------------------------------
# Exercise 1: multi-head attention with a key padding mask and an optional causal mask
# --------------------------------------------------------------------------------------------------------------------


def _nan_message(out: Tensor, mask: Tensor | None, causal: bool, what: str) -> None:
    """Fail with what the NaN rows of `out` [batch query d_model] say, if there are any."""
    rows = out.isnan().any(-1)  # [batch query]
    if not rows.any():
        return
    if causal and torch.equal(rows, torch.zeros_like(rows).index_fill_(1, torch.tensor([0]), True)):
        fail(
            f"The causal mask also hides the diagonal: {what} is NaN at query 0 only, which then sees no key at all. "
            "Query i may see keys 0..i: torch.triu(..., diagonal=1) masks the strict upper triangle."
        )
    if mask is not None and rows.shape == mask.shape and torch.equal(rows, mask):
        fail(
            f"The key padding mask hides whole query rows instead of key columns: {what} is NaN exactly at the padded "
            "positions as queries. The mask [batch, key] must broadcast over heads and queries: mask[:, None, None, :] "
            "against scores [batch, n_heads, query, key]."
        )
    if mask is not None and rows.all():
        fail(
            f"{what} is NaN everywhere: every score row was masked entirely. Is the mask broadcast against the right "
            "dimensions of the scores [batch, n_heads, query, key] (mask[:, None, None, :])?"
        )
    fail(
        f"{what} has NaN at {int(rows.sum())} of {rows.numel()} query rows: a row of scores masked entirely gives "
        "softmax 0/0. Check which entries your masks hide."
    )


def multi_head_attention_test(MultiHeadAttention) -> None:
    """Checks `MultiHeadAttention(cfg).forward(x_q, x_kv, key_padding_mask=None, causal=False)` against
    `nn.MultiheadAttention(batch_first=True)` holding the same weights: cross-attention with different query and key
    lengths, with and without padding, and causal self-attention; then that a float mask and a mis-shaped mask are
    refused with an error. Twice: with a second configuration (other head sizes) no size can be hard-coded."""
    name = "MultiHeadAttention"
    _multi_head_attention_case(MultiHeadAttention, CHECK_CFG, name)
    other = replace(CHECK_CFG, d_model=12, n_heads=2, d_head=6)
    _multi_head_attention_case(MultiHeadAttention, other, f"{name} (d_model=12, n_heads=2, d_head=6)")
    print(
        f"{name} passed: matches nn.MultiheadAttention (cross-attention 3 queries x 5 keys, padding, causal "
        "self-attention) for two configurations, and refuses float and mis-shaped masks."
    )


def _multi_head_attention_case(MultiHeadAttention, cfg, name: str) -> None:
    attn = _build(MultiHeadAttention, cfg, name)
    _randomize(attn, seed=1)
    p = _attn_params(_params(attn, name), "", cfg, name)
    mha = _to_mha(p, cfg).eval()
    batch, n_q, n_k = 2, 3, 5
    x_q, x_kv = _inputs(2, batch, n_q, cfg.d_model), _inputs(3, batch, n_k, cfg.d_model)
    pad_kv = _padding([3, 4], n_k)  # every row has a pad key and a real key, so that a reversed mask stays finite
    x_self = _inputs(4, batch, n_k, cfg.d_model)
    cases = [
        ("cross-attention, no mask", x_q, x_kv, None, False),
        ("self-attention with a key padding mask", x_self, x_self, pad_kv, False),
        ("cross-attention with a key padding mask", x_q, x_kv, pad_kv, False),
        ("causal self-attention with a key padding mask", x_self, x_self, pad_kv, True),
    ]
    for label, xq, xkv, mask, causal in cases:
        what = f"{name} ({label}: x_q {list(xq.shape)}, x_kv {list(xkv.shape)})"
        fn = functools.partial(attn.forward, key_padding_mask=mask, causal=causal)
        with torch.no_grad():
            out = _run(fn, (xq, xkv), what, (batch, xq.shape[1], cfg.d_model))
            _nan_message(out, mask, causal, what)
            expected = mha(
                xq,
                xkv,
                xkv,
                key_padding_mask=mask,
                attn_mask=_causal(xq.shape[1]) if causal else None,
                need_weights=False,
            )[0]
        if _same(out, expected):
            continue
        variants = [
            (
                (
                    "The key padding mask is applied with the wrong polarity: True means a padding key, masked out "
                    "(nn.MultiheadAttention's convention), so fill the scores where the mask is True"
                ),
                functools.partial(_attention, p, xq, xkv, mask, causal, polarity="keep"),
            ),
            (
                (
                    "The key padding mask is added to the scores: it is a bool mask (True = masked out), not an additive "
                    "float mask; use scores.masked_fill(mask[:, None, None, :], float('-inf'))"
                ),
                functools.partial(_attention, p, xq, xkv, mask, causal, polarity="add"),
            ),
            (
                "The key padding mask has no effect: padded keys must get zero attention",
                functools.partial(_attention, p, xq, xkv, None, causal),
            ),
            (
                "The causal mask is missing: with causal=True query i may only see keys 0..i",
                functools.partial(_attention, p, xq, xkv, mask, False),
            ),
            (
                "The causal mask also hides the diagonal: query i may see keys 0..i (torch.triu(..., diagonal=1))",
                functools.partial(_attention, p, xq, xkv, mask, causal, causal_diagonal=0),
            ),
            (
                "The scores are not scaled: divide q·k by sqrt(d_head) before the softmax",
                functools.partial(_attention, p, xq, xkv, mask, causal, scale="none"),
            ),
            (
                "The scores are divided by sqrt(d_model) instead of sqrt(d_head)",
                functools.partial(_attention, p, xq, xkv, mask, causal, scale="d_model"),
            ),
            (
                (
                    "The keys and values come from x_q: in cross-attention the queries come from x_q (the decoder) and "
                    "the keys and values from x_kv (the encoder's output)"
                ),
                functools.partial(_attention, p, xq, xq, None, causal),
            ),
            (
                "The softmax runs over the queries: each query's weights over the keys must sum to 1 (dim=-1)",
                functools.partial(_attention, p, xq, xkv, mask, causal, softmax_dim=-2),
            ),
        ]
        _name_variant(out, variants, what)
        fail(
            f"{what} differs from nn.MultiheadAttention with the same weights: "
            f"{mismatch_summary(out, expected, ATOL, RTOL)}."
        )
    # The mask convention is stated once and enforced: the other kinds must be refused up front, not misread.
    float_mask = torch.zeros(batch, n_k).masked_fill(pad_kv, NEG_INF)
    keep_mask = (~pad_kv).int()  # transformers' attention_mask: 1 = keep
    wrong_shape = _padding([2, 3], n_q)  # [batch query]: one entry per query, not per key
    probes = (
        ("an additive float mask (0 / -inf)", float_mask),
        ("a 0/1 int mask (1 = keep, transformers' convention)", keep_mask),
        ("a mask of shape [batch, query]", wrong_shape),
    )
    for label, bad in probes:
        try:
            with torch.no_grad():
                attn(x_q.clone(), x_kv.clone(), bad, False)
        except (TypeError, ValueError):
            continue
        except RuntimeError as err:
            fail(
                f"{name} given {label} as key_padding_mask failed only deep inside PyTorch ({type(err).__name__}: "
                f"{str(err).splitlines()[0]}): refuse it up front with a message that says which mask is due; keep "
                "the call to validate_key_padding_mask at the top of forward."
            )
        fail(
            f"{name} accepted {label} as key_padding_mask without an error. Only a bool [batch, key] mask with True "
            "at the padding keys is valid: keep the call to validate_key_padding_mask at the top of forward."
        )


# --------------------------------------------------------------------------------------------------------------------
# Exercise 2: the shared embedding
# --------------------------------------------------------------------------------------------------------------------


def shared_embedding_test(SharedEmbedding) -> None:
    """Checks `SharedEmbedding(cfg)`: W_E initialised with std d_model^-0.5, `forward(tokens)` = W_E[tokens] *
    sqrt(d_model) + the sinusoidal encoding, and `unembed(x)` = x @ W_E.T (the tied output layer)."""
    name = "SharedEmbedding"
    # three sizes, the last the original Transformer's width: none can be written in
    for d_model, d_vocab in ((64, 500), (36, 300), (512, 40)):
        cfg = replace(CHECK_CFG, d_model=d_model, d_vocab=d_vocab)
        _shared_embedding_case(SharedEmbedding, cfg, name if d_model == 64 else f"{name} (d_model={d_model})")
    print(f"{name} passed: std d_model^-0.5 at initialisation, W_E[tokens] * sqrt(d_model) + pe[:pos], x @ W_E.T.")


def _shared_embedding_case(SharedEmbedding, cfg, name: str) -> None:
    torch.manual_seed(0)
    emb = _build(SharedEmbedding, cfg, name)
    params = _params(emb, name)
    W_E = _need(params, "W_E", (cfg.d_vocab, cfg.d_model), name)
    others = sorted(set(params) - {"W_E"})
    if others:
        fail(
            f"{name} has parameters besides W_E ({others}): the sinusoidal encoding is fixed (a buffer, not learned) "
            "and the output layer reuses W_E, so one table is all it learns."
        )
    std, want = W_E.std().item(), cfg.d_model**-0.5
    if abs(std - want) > 0.1 * want or abs(W_E.mean().item()) > 0.1 * want:
        if abs(std - 1.0) < 0.1:
            cause = "standard deviation 1 (nn.Embedding's default)"
        elif abs(std - 0.02) < 0.002:
            cause = "standard deviation 0.02 (GPT-2's)"
        elif W_E.abs().max().item() == 0:
            cause = "zeros"
        else:
            cause = f"standard deviation {std:.3g} (mean {W_E.mean().item():.3g})"
        fail(
            f"W_E is initialised with {cause}; it must be normal with mean 0 and standard deviation d_model ** -0.5 "
            f"= {want:.4f} for d_model = {cfg.d_model}: then W_E * sqrt(d_model) has entries of unit scale, like the "
            "sinusoidal encoding's, and the tied output layer starts with logits of unit scale."
        )
    _randomize(emb, seed=5)
    W_E = emb.W_E.detach()
    pe = _sinusoid(cfg.n_ctx, cfg.d_model)
    tokens = torch.randint(0, cfg.d_vocab, (2, 7), generator=torch.Generator().manual_seed(6))
    what = f"{name}.forward(tokens {list(tokens.shape)})"
    with torch.no_grad():
        out = _run(emb.forward, (tokens,), what, (2, 7, cfg.d_model))
    root = math.sqrt(cfg.d_model)
    expected = W_E[tokens] * root + pe[:7]
    if not _same(out, expected):
        variants = [
            (
                "The embedding is not scaled: multiply W_E[tokens] by sqrt(d_model) before adding the encoding",
                lambda: W_E[tokens] + pe[:7],
            ),
            ("The embedding is divided by sqrt(d_model): multiply by it", lambda: W_E[tokens] / root + pe[:7]),
            (
                "The embedding is multiplied by d_model: the factor is sqrt(d_model)",
                lambda: W_E[tokens] * cfg.d_model + pe[:7],
            ),
            (
                "The positional encoding is scaled too: only W_E[tokens] is multiplied by sqrt(d_model)",
                lambda: (W_E[tokens] + pe[:7]) * root,
            ),
            (
                "The positional encoding is missing: add the sinusoidal encoding of positions 0..pos-1",
                lambda: W_E[tokens] * root,
            ),
            (
                "The positional encoding is indexed by the token ids: index it by position, pe[:pos]",
                lambda: W_E[tokens] * root + pe[tokens],
            ),
            ("The positions start at 1: the first token has position 0", lambda: W_E[tokens] * root + pe[1:8]),
        ]
        _name_variant(out, variants, what)
        fail(
            f"{what} differs from W_E[tokens] * sqrt(d_model) + pe[:pos]: {mismatch_summary(out, expected, ATOL, RTOL)}."
        )
    x = _inputs(7, 2, 7, cfg.d_model)
    what = f"{name}.unembed(x {list(x.shape)})"
    unembed = getattr(emb, "unembed", None)
    if unembed is None:
        fail(f"{name} has no method `unembed`: keep the one given in the notebook.")
    with torch.no_grad():
        out = _run(unembed, (x,), what, (2, 7, cfg.d_vocab))
    expected = x @ W_E.T
    if not _same(out, expected):
        variants = [
            (
                "The output layer multiplies by sqrt(d_model) too: only the embedding is scaled; logits are x @ W_E.T",
                lambda: x @ W_E.T * root,
            ),
            ("The output layer divides by sqrt(d_model): logits are x @ W_E.T", lambda: x @ W_E.T / root),
            ("The output layer adds the positional encoding: logits are x @ W_E.T", lambda: (x - pe[:7]) @ W_E.T),
        ]
        _name_variant(out, variants, what)
        fail(f"{what} differs from x @ W_E.T: {mismatch_summary(out, expected, ATOL, RTOL)}.")


# --------------------------------------------------------------------------------------------------------------------
# Exercise 3: the feed-forward network and the post-LN layers
# --------------------------------------------------------------------------------------------------------------------


def feed_forward_test(FeedForward) -> None:
    """Checks `FeedForward(cfg).forward(x)` = ReLU(x @ W_in + b_in) @ W_out + b_out, as in nn.TransformerEncoderLayer."""
    cfg = CHECK_CFG
    name = "FeedForward"
    ff = _build(FeedForward, cfg, name)
    _randomize(ff, seed=8)
    p = _ff_params(_params(ff, name), "", cfg, name)
    layer = nn.TransformerEncoderLayer(**_torch_layer_kwargs(cfg))
    _copy_ff(p, layer)
    x = 2 * _inputs(9, 2, 5, cfg.d_model)
    what = f"{name}(x {list(x.shape)})"
    with torch.no_grad():
        out = _run(ff.forward, (x,), what, (2, 5, cfg.d_model))
        expected = layer.linear2(torch.relu(layer.linear1(x)))  # nn.TransformerEncoderLayer._ff_block, dropout 0
    if _same(out, expected):
        print(f"{name} passed: matches nn.TransformerEncoderLayer's feed-forward block (ReLU, d_ff = {cfg.d_ff}).")
        return
    variants = [
        (
            "It uses GELU (GPT-2's activation): the paper's feed-forward network uses ReLU, max(0, x W1 + b1) W2 + b2",
            lambda: _ff(p, x, _gelu),
        ),
        ("It uses GPT-2's tanh GELU: the paper's feed-forward network uses ReLU", lambda: _ff(p, x, _gelu_tanh)),
        ("The activation is missing: ReLU between the two linear maps", lambda: _ff(p, x, lambda h: h)),
        (
            "The ReLU is applied after the second linear map too (or only there): ReLU(x W1 + b1) W2 + b2",
            lambda: torch.relu(_ff(p, x)),
        ),
        ("The biases are missing", lambda: torch.relu(x @ p["W_in"]) @ p["W_out"]),
    ]
    _name_variant(out, variants, what)
    fail(f"{what} differs from ReLU(x @ W_in + b_in) @ W_out + b_out: {mismatch_summary(out, expected, ATOL, RTOL)}.")


_ORDER_CAUSES = {
    "pre": "The layer is pre-LN (GPT-2's order, notebook 04: x + f(LN(x))): the paper's layers are post-LN, "
    "x = LayerNorm(x + Sublayer(x)), 'Add & Norm' after each sub-layer",
    "no_residual": "The residual connection is missing: x = LayerNorm(x + Sublayer(x)), not LayerNorm(Sublayer(x))",
    "norm_inside": "The LayerNorm is applied to the sub-layer's output before the residual sum (x + LN(f(x))): "
    "the paper normalises the sum, x = LayerNorm(x + Sublayer(x))",
}


def encoder_layer_test(EncoderLayer) -> None:
    """Checks `EncoderLayer(cfg).forward(x [batch src d_model], src_padding [batch src])` against
    `nn.TransformerEncoderLayer(norm_first=False, activation="relu", dropout=0)` holding the same weights."""
    cfg = CHECK_CFG
    name = "EncoderLayer"
    layer = _build(EncoderLayer, cfg, name)
    _randomize(layer, seed=10)
    P = _encoder_params(_params(layer, name), "", cfg, name)
    oracle = _torch_encoder_layer(P, cfg).train()  # train mode (dropout 0): no fast path, padded rows computed too
    eps = cfg.layer_norm_eps
    x = _inputs(11, 3, 6, cfg.d_model)
    for mask in (_padding([6, 6, 6], 6), _padding([6, 4, 2], 6)):
        what = f"{name}(x {list(x.shape)}, src_padding with {int(mask.sum())} padded positions)"
        with torch.no_grad():
            out = _run(layer.forward, (x, mask), what, tuple(x.shape))
            _nan_message(out, mask, False, what)
            expected = oracle(x, src_key_padding_mask=mask)
        if _same(out, expected):
            continue
        variants = [
            (cause, functools.partial(_encoder_layer, P, x, mask, eps, order=o)) for o, cause in _ORDER_CAUSES.items()
        ]
        variants += [
            (
                "It uses GELU (GPT-2's activation) in the feed-forward network: the paper's uses ReLU",
                functools.partial(_encoder_layer, P, x, mask, eps, act=_gelu),
            ),
            (
                "The source padding mask is not passed to the self-attention: padded source positions must be ignored",
                functools.partial(_encoder_layer, P, x, None, eps),
            ),
            (
                "The encoder's self-attention is causal: the encoder sees the whole source, in both directions",
                functools.partial(_encoder_layer, P, x, mask, eps, causal=True),
            ),
        ]
        _name_variant(out, variants, what)
        from harness._evidence import unused_note

        unused = unused_note(layer, lambda x=x, mask=mask: layer.forward(x, mask))
        fail(
            f"{what} differs from nn.TransformerEncoderLayer (post-LN, ReLU) with the same weights.{unused} "
            f"{mismatch_summary(out, expected, ATOL, RTOL)}."
        )
    print(f"{name} passed: matches nn.TransformerEncoderLayer(norm_first=False, activation='relu'), with padding.")


def decoder_layer_test(DecoderLayer) -> None:
    """Checks `DecoderLayer(cfg).forward(y [batch tgt d_model], memory [batch src d_model], tgt_padding [batch tgt],
    src_padding [batch src])` against `nn.TransformerDecoderLayer(norm_first=False, activation="relu", dropout=0)`."""
    cfg = CHECK_CFG
    name = "DecoderLayer"
    layer = _build(DecoderLayer, cfg, name)
    _randomize(layer, seed=12)
    P = _decoder_params(_params(layer, name), "", cfg, name)
    oracle = _torch_decoder_layer(P, cfg).train()
    eps = cfg.layer_norm_eps
    # First as long a target as source (so that a cross-attention on the wrong inputs still runs and can be named),
    # then a shorter target than source.
    for n_tgt, n_src, tgt_lengths, src_lengths in ((5, 5, [5, 3, 4], [4, 5, 2]), (4, 7, [4, 2, 3], [7, 5, 3])):
        y, memory = _inputs(13 + n_tgt, 3, n_tgt, cfg.d_model), _inputs(14 + n_src, 3, n_src, cfg.d_model)
        tgt_mask, src_mask = _padding(tgt_lengths, n_tgt), _padding(src_lengths, n_src)
        what = f"{name}(y {list(y.shape)}, memory {list(memory.shape)}, tgt_padding, src_padding)"
        with torch.no_grad():
            out = _run(layer.forward, (y, memory, tgt_mask, src_mask), what, tuple(y.shape))
            _nan_message(out, None, False, what)
            expected = oracle(
                y,
                memory,
                tgt_mask=_causal(n_tgt),
                tgt_key_padding_mask=tgt_mask,
                memory_key_padding_mask=src_mask,
                tgt_is_causal=True,
            )
        if _same(out, expected):
            continue
        args = (P, y, memory, tgt_mask, src_mask, eps)
        variants = [
            (
                (
                    "The cross-attention takes its keys and values from the decoder: queries come from the decoder (y), "
                    "keys and values from the encoder's output (memory)"
                ),
                functools.partial(_decoder_layer, *args, cross="decoder"),
            ),
            (
                (
                    "The cross-attention's queries come from the encoder: queries from the decoder (y), keys and values from "
                    "memory, cross_attn(y, memory, src_padding)"
                ),
                functools.partial(_decoder_layer, *args, cross="swapped"),
            ),
            (
                (
                    "The decoder's self-attention is not causal: a target position must not see the positions after it "
                    "(causal=True)"
                ),
                functools.partial(_decoder_layer, *args, self_causal=False),
            ),
            (
                "The cross-attention is causal: every target position may see every source position",
                functools.partial(_decoder_layer, *args, cross_causal=True),
            ),
            (
                (
                    "The source padding mask is not passed to the cross-attention: padded source positions must get no "
                    "attention"
                ),
                functools.partial(_decoder_layer, P, y, memory, tgt_mask, None, eps),
            ),
            (
                "The two masks are swapped: the self-attention takes tgt_padding, the cross-attention src_padding",
                functools.partial(_decoder_layer, P, y, memory, src_mask, tgt_mask, eps),
            ),
        ]
        variants += [(cause, functools.partial(_decoder_layer, *args, order=o)) for o, cause in _ORDER_CAUSES.items()]
        variants.append(
            (
                "It uses GELU (GPT-2's activation) in the feed-forward network: the paper's uses ReLU",
                functools.partial(_decoder_layer, *args, act=_gelu),
            )
        )
        _name_variant(out, variants, what)
        wrong = ((out - expected).abs() > ATOL + RTOL * expected.abs()).any(-1)  # [batch tgt]
        if wrong.any() and not (wrong & ~tgt_mask).any():
            fail(
                f"{what} differs from nn.TransformerDecoderLayer only at padded target positions (where tgt_padding "
                "is True): under the causal mask no real position sees the padding after it, so a self-attention "
                "without the target's padding mask shows only there. Pass tgt_padding to the self-attention."
            )
        from harness._evidence import unused_note

        unused = unused_note(layer, lambda a=(y, memory, tgt_mask, src_mask): layer.forward(*a))
        fail(
            f"{what} differs from nn.TransformerDecoderLayer (post-LN, ReLU) with the same weights.{unused} "
            f"{mismatch_summary(out, expected, ATOL, RTOL, ('batch row', 'target position', 'feature'))}."
        )
    print(
        f"{name} passed: matches nn.TransformerDecoderLayer(norm_first=False, activation='relu'): masked "
        "self-attention, cross-attention on memory, padding on both sides."
    )


# --------------------------------------------------------------------------------------------------------------------
# Exercise 4: the whole model, the batch, the loss
# --------------------------------------------------------------------------------------------------------------------


def _torch_transformer(model: nn.Module, cfg: EncoderDecoderConfig, name: str) -> nn.Transformer:
    params = _params(model, name)
    oracle = nn.Transformer(
        d_model=cfg.d_model,
        nhead=cfg.n_heads,
        num_encoder_layers=cfg.n_layers,
        num_decoder_layers=cfg.n_layers,
        dim_feedforward=cfg.d_ff,
        dropout=0.0,
        activation="relu",
        layer_norm_eps=cfg.layer_norm_eps,
        batch_first=True,
        norm_first=False,
    )
    # nn.Transformer ends each stack with one more LayerNorm; the paper's (and ours) end with the last layer's own.
    oracle.encoder.norm = None
    oracle.decoder.norm = None
    for i in range(cfg.n_layers):
        _torch_encoder_layer(_encoder_params(params, f"encoder_layers.{i}.", cfg, name), cfg, oracle.encoder.layers[i])
        _torch_decoder_layer(_decoder_params(params, f"decoder_layers.{i}.", cfg, name), cfg, oracle.decoder.layers[i])
    return oracle.train()  # dropout is 0; train mode keeps the encoder off its fast path (zeros at padded positions)


def _oracle_logits(oracle, W_E: Tensor, src: Tensor, tgt_in: Tensor, cfg: EncoderDecoderConfig):
    pe = _sinusoid(cfg.n_ctx, cfg.d_model)

    def embed(tokens):
        return W_E[tokens] * math.sqrt(cfg.d_model) + pe[: tokens.shape[1]]

    src_pad, tgt_pad = src == cfg.pad_id, tgt_in == cfg.pad_id
    memory = oracle.encoder(embed(src), src_key_padding_mask=src_pad)
    out = oracle(  # nn.Transformer.forward: the encoder, then the decoder on its output
        embed(src),
        embed(tgt_in),
        tgt_mask=_causal(tgt_in.shape[1]),
        src_key_padding_mask=src_pad,
        tgt_key_padding_mask=tgt_pad,
        memory_key_padding_mask=src_pad,
        tgt_is_causal=True,
    )
    return memory, out @ W_E.T


def encoder_decoder_test(EncoderDecoder) -> None:
    """Checks `EncoderDecoder(cfg)`: `forward(src, tgt_in)` -> logits against `nn.Transformer` holding the same
    weights (its final LayerNorms removed) with the shared, scaled embedding and the tied output layer;
    `encode(src)` against the encoder; and behavioural probes: padding appended to the source or the target changes
    nothing, a future target token changes nothing before it, the last source token changes the first position."""
    cfg = CHECK_CFG
    name = "EncoderDecoder"
    model = _build(EncoderDecoder, cfg, name)
    _randomize(model, seed=20, skip=("W_E",))
    params = _params(model, name)
    tables = [
        k for k, v in params.items() if tuple(v.shape) in ((cfg.d_vocab, cfg.d_model), (cfg.d_model, cfg.d_vocab))
    ]
    if tables != ["embed.W_E"]:
        fail(
            f"{name} has {len(tables)} vocabulary-sized weights ({tables}) where one, embed.W_E, is due: the source "
            "and target embeddings and the output layer share one table (section 3.4 of the paper)."
        )
    W_E = params["embed.W_E"]
    oracle = _torch_transformer(model, cfg, name)
    gen = torch.Generator().manual_seed(21)
    src_lengths, tgt_lengths = [6, 3, 5], [4, 5, 2]
    src = _ordinary_ids(cfg, (3, 6), gen).masked_fill(_padding(src_lengths, 6), cfg.pad_id)
    tgt_in = _ordinary_ids(cfg, (3, 5), gen).masked_fill(_padding(tgt_lengths, 5), cfg.pad_id)
    tgt_in[:, 0] = cfg.bos_id
    what = f"{name}(src {list(src.shape)}, tgt_in {list(tgt_in.shape)})"
    model.eval()

    def logits_of(s, t, label=what):
        with torch.no_grad():
            return _run(model.forward, (s, t), label, (s.shape[0], t.shape[1], cfg.d_vocab))

    out = logits_of(src, tgt_in)
    _nan_message(out, None, False, what)
    # Behavioural probes first: each names what the model may or may not see.
    pad_col = torch.full((3, 2), cfg.pad_id)
    more_src = logits_of(torch.cat([src, pad_col], 1), tgt_in, f"{name} with two more padding columns in src")
    if not _same(more_src, out):
        fail(
            "Appending padding to the source changes the logits: padded source positions must be masked out, in the "
            "encoder's self-attention and in every decoder layer's cross-attention (src == pad_id, True = masked)."
        )
    more_tgt = logits_of(src, torch.cat([tgt_in, pad_col], 1), f"{name} with two more padding columns in tgt_in")
    if not _same(more_tgt[:, : tgt_in.shape[1]], out):
        fail("Appending padding to the target changes the logits of the real positions: mask the target's padding.")
    future = tgt_in.clone()
    future[:, 3] = torch.where(future[:, 3] == 5, 6, 5)
    changed = logits_of(src, future, f"{name} with tgt_in[:, 3] changed")
    if not _same(changed[:, :3], out[:, :3]):
        fail(
            "Changing target token 3 changes the logits at positions 0-2: the decoder sees the future. Its "
            "self-attention must be causal (each position predicts the next token from the tokens up to itself)."
        )
    last = src.clone()
    rows = torch.arange(3)
    last[rows, torch.tensor(src_lengths) - 1] = torch.where(last[rows, torch.tensor(src_lengths) - 1] == 7, 8, 7)
    moved = logits_of(last, tgt_in, f"{name} with the last source token changed")
    if torch.allclose(moved[:, 0], out[:, 0], atol=1e-6):
        fail(
            "Changing the last source token does not change the logits at the first decoder position: the decoder "
            "does not read the source. Each decoder layer's cross-attention must take its keys and values from the "
            "encoder's output (memory)."
        )
    with torch.no_grad():
        memory, expected = _oracle_logits(oracle, W_E, src, tgt_in, cfg)
        got_memory = as_tensor_output(call(model.encode, src.clone(), what=f"{name}.encode(src)"), f"{name}.encode")
    real = ~(src == cfg.pad_id)
    if got_memory.shape == memory.shape and mismatch_summary(got_memory[real], memory[real], ATOL, RTOL) is not None:
        fail(
            f"{name}.encode(src) differs from nn.TransformerEncoder's layers holding the same weights, at the real "
            f"(non-padding) positions: {mismatch_summary(got_memory[real], memory[real], ATOL, RTOL)}. Embed with "
            "the shared table (scaled, plus the encoding), then run every encoder layer with src == pad_id as mask."
        )
    if not _same(out, expected):
        final_ln = (
            " (nn.Transformer would add one more LayerNorm at the end of each stack by default: the paper does not)"
        )
        fail(
            f"{what} differs from nn.Transformer with the same weights, embedding and tied output layer: "
            f"{mismatch_summary(out, expected, ATOL, RTOL)}{final_ln}. The encoder matches, so look at decode: "
            "embed tgt_in, every decoder layer with the target and source masks, then embed.unembed."
        )
    # A source and a target of one length, padded apart: nothing may tell them apart by their shapes (cross-attention
    # that read the decoder's own stream where the shapes matched passed the case above: agreement sweep 19)
    even_src = _ordinary_ids(cfg, (2, 5), gen).masked_fill(_padding([5, 3], 5), cfg.pad_id)
    even_tgt = _ordinary_ids(cfg, (2, 5), gen).masked_fill(_padding([4, 5], 5), cfg.pad_id)
    even_tgt[:, 0] = cfg.bos_id
    with torch.no_grad():
        even_want = _oracle_logits(oracle, W_E, even_src, even_tgt, cfg)[1]
    even = logits_of(even_src, even_tgt, f"{name}(src [2, 5], tgt_in [2, 5])")
    if not _same(even, even_want):
        fail(
            f"{name}(src [2, 5], tgt_in [2, 5]), a source and a target of the same length where the case above had "
            f"them differ, differs from nn.Transformer with the same weights: {mismatch_summary(even, even_want, ATOL, RTOL)}."
        )
    print(
        f"{name} passed: logits match nn.Transformer (its final LayerNorms removed) with the shared, tied "
        "embedding; padding, future target tokens and the source act as they must."
    )


def _long_batch(make_batch, cfg, name: str) -> None:
    """Four rows up to 70 ids long, the longest inside the batch, once three short rows were right: every length is padded to
    the batch's longest (targets cut at 8, and a width taken from the first row, passed the short rows: sweep 19)."""
    ordinary = [t for t in range(cfg.d_vocab) if t not in (cfg.pad_id, cfg.bos_id, cfg.eos_id)]
    # past 64 ids too (a batch cut at 64 passed: red-team round 51)
    src_lengths, tgt_lengths = (2, 70, 1, 10), (3, 69, 1, 9)
    sources = [[ordinary[(3 * i + j) % len(ordinary)] for j in range(n)] for i, n in enumerate(src_lengths)]
    targets = [[ordinary[(5 * i + j) % len(ordinary)] for j in range(n)] for i, n in enumerate(tgt_lengths)]
    P, B, E = cfg.pad_id, cfg.bos_id, cfg.eos_id
    width = max(len(t) for t in targets) + 1
    want = (
        [s + [P] * (max(src_lengths) - len(s)) for s in sources],
        [[B, *t] + [P] * (width - 1 - len(t)) for t in targets],
        [[*t, E] + [P] * (width - 1 - len(t)) for t in targets],
    )
    out = call(make_batch, [list(x) for x in sources], [list(x) for x in targets], cfg, what=f"{name}(4 long rows)")
    for key, value, due in zip(("src", "tgt_in", "tgt_out"), out, want):
        got = as_tensor_output(value, f"{name}'s {key}").tolist()
        if got != due:
            fail(
                f"{name} on four rows, sources of lengths {list(src_lengths)} and targets of {list(tgt_lengths)}, where three "
                f"short rows were right: {key} has {len(got[0]) if got else 0} columns where {len(due[0])} are due, "
                f"or other ids ({key} row 0 {got[0] if got else []}, due {due[0]}): pad every row to the batch's "
                "longest, with nothing cut."
            )


def _special_ids_batch(make_batch, cfg, name: str) -> None:
    """Lists that hold EOS, the pad id and BOS among their ids, once ordinary ones were right: each list is copied
    as it is (a batch shifted from one padded [BOS] + y + [EOS] with EOS masked out of tgt_in, and EOS placed by
    counting the ids that are not padding, passed lists of ordinary ids: red-team round 50)."""
    P, B, E = cfg.pad_id, cfg.bos_id, cfg.eos_id
    a, b, c = [t for t in range(cfg.d_vocab) if t not in (P, B, E)][:3]
    sources, targets = [[a, E, b], [P, c], [B]], [[b, E, c], [c, P, a, b], [B, a]]
    want = (
        [[a, E, b], [P, c, P], [B, P, P]],
        [[B, b, E, c, P], [B, c, P, a, b], [B, B, a, P, P]],
        [[b, E, c, E, P], [c, P, a, b, E], [B, a, E, P, P]],
    )
    what = f"{name}(sources {sources}, targets {targets}, cfg) (pad {P}, BOS {B}, EOS {E})"
    out = call(make_batch, [list(x) for x in sources], [list(x) for x in targets], cfg, what=what)
    for key, value, due in zip(("src", "tgt_in", "tgt_out"), out, want):
        got = as_tensor_output(value, f"{name}'s {key}").tolist()
        if got != due:
            fail(
                f"{what}: {key} is {got}, due {due}, where lists of ordinary ids were right. The lists hold EOS, "
                "the pad id and BOS among their ids here: copy each list as it is, then add BOS, EOS and the "
                "padding around it (never find them by value)."
            )


def make_batch_test(make_batch) -> None:
    """Checks `make_batch(sources, targets, cfg)` -> `(src, tgt_in, tgt_out)`: right padding with pad_id,
    tgt_in = [BOS] + y, tgt_out = y + [EOS]."""
    cfg = CHECK_CFG
    name = "make_batch"
    # ordinary ids on both sides of the special ones (pad 5, BOS 3, EOS 8 here)
    sources, targets = [[6, 7, 9], [10], [11, 12]], [[9], [0, 4, 10, 2], [6, 6]]
    P, B, E = cfg.pad_id, cfg.bos_id, cfg.eos_id
    want = {
        "src": [[6, 7, 9], [10, P, P], [11, 12, P]],
        "tgt_in": [[B, 9, P, P, P], [B, 0, 4, 10, 2], [B, 6, 6, P, P]],
        "tgt_out": [[9, E, P, P, P], [0, 4, 10, 2, E], [6, 6, E, P, P]],
    }
    given = ([list(s) for s in sources], [list(t) for t in targets])
    out = call(make_batch, *given, cfg, what=f"{name}(sources, targets, cfg)")
    if given != (sources, targets):
        fail(f"{name} modified the lists it was given: build new lists (y + [EOS], not y.append(EOS)).")
    if not isinstance(out, tuple) or len(out) != 3:
        fail(f"{name} must return a tuple (src, tgt_in, tgt_out) of three tensors, got {type(out).__name__}.")
    got = {}
    for key, value in zip(want, out):
        tensor = as_tensor_output(value, f"{name}'s {key}")
        if tensor.dtype != torch.long:
            fail(
                f"{name}'s {key} has dtype {tensor.dtype}: token ids are torch.long (nn.Embedding and indexing need it)."
            )
        got[key] = tensor.tolist()
    example = f"sources {sources}, targets {targets} (pad {P}, BOS {B}, EOS {E})"
    if got == want:
        _long_batch(make_batch, cfg, name)
        _special_ids_batch(make_batch, cfg, name)
        print(f"{name} passed: right padding with pad_id, tgt_in = [BOS] + y, tgt_out = y + [EOS].")
        return
    if got["src"] != want["src"]:
        if got["src"] == [[P] * (3 - len(s)) + s for s in sources]:
            fail(f"{name} pads on the left: pad on the right, after the tokens. For {example}, src is {got['src']}.")
        fail(f"{name}'s src is {got['src']} where {want['src']} is due for {example}: the sources, right-padded.")
    tin, tout = got["tgt_in"], got["tgt_out"]
    if tin == want["tgt_out"] and tout == want["tgt_in"]:
        fail(f"{name} swaps tgt_in and tgt_out: the decoder reads [BOS] + y and predicts y + [EOS].")
    if tin == tout:
        fail(
            f"The target is not shifted: tgt_in and tgt_out are the same ({tin}), so the decoder could copy its input. "
            "The decoder reads tgt_in = [BOS] + y and must predict tgt_out = y + [EOS], one step ahead."
        )
    full = [[B] + t + [E] + [P] * (4 - len(t)) for t in targets]
    if tin == [row[:-1] for row in full] and tout == [row[1:] for row in full]:
        fail(
            f"{name} pads [BOS] + y + [EOS] and then slices, so shorter rows' tgt_in contains EOS ({tin}): build "
            "tgt_in = [BOS] + y and tgt_out = y + [EOS] per row, then pad each."
        )
    if [[v for v in row if v != P] for row in tout] == targets:
        fail(f"tgt_out does not end with EOS ({tout}): y + [EOS], so that the model learns to stop.")
    if tin != want["tgt_in"]:
        fail(f"{name}'s tgt_in is {tin} where {want['tgt_in']} is due for {example}: [BOS] + y, right-padded.")
    fail(f"{name}'s tgt_out is {tout} where {want['tgt_out']} is due for {example}: y + [EOS], right-padded.")


def seq2seq_loss_test(seq2seq_loss) -> None:
    """Checks `seq2seq_loss(logits [batch tgt d_vocab], tgt_out [batch tgt], pad_id, label_smoothing=0.0)`: the mean
    cross-entropy over the real target tokens, as F.cross_entropy(..., ignore_index=pad_id, label_smoothing=...)."""
    name = "seq2seq_loss"
    defaults_as_given(seq2seq_loss, "09_encoder_decoder", "seq2seq_loss", name)
    gen = torch.Generator().manual_seed(30)
    logits = 2 * torch.randn(3, 5, 11, generator=gen)
    real_ids = torch.randint(0, 10, (3, 5), generator=gen)
    real_ids[0, 0] = real_ids[1, 1] = 0  # a real target 0 (with pad_id 5): leaving out 0 is then visible
    # pad_id 5, in the middle of the vocabulary, then 0: ids on both sides of it are real targets
    for pad, smoothing in ((5, 0.0), (5, 0.1), (0, 0.0)):
        tgt_out = torch.where(real_ids >= pad, real_ids + 1, real_ids).masked_fill(_padding([5, 2, 3], 5), pad)
        flat_logits, flat_tgt = logits.reshape(-1, 11), tgt_out.reshape(-1)
        what = f"{name}(logits {list(logits.shape)}, tgt_out, pad_id={pad}, label_smoothing={smoothing})"
        given_logits, given_tgt = logits.clone(), tgt_out.clone()
        out = as_tensor_output(
            _kcall(seq2seq_loss, given_logits, given_tgt, pad, what=what, label_smoothing=smoothing), what
        )
        assert_unchanged(logits, given_logits, f"{what} (its logits)")  # the caller's tensors are the caller's
        assert_unchanged(tgt_out, given_tgt, f"{what} (its tgt_out)")
        if out.numel() != 1:
            fail(f"{what} returned shape {list(out.shape)}: return the mean loss, one number.")
        expected = F.cross_entropy(flat_logits, flat_tgt, ignore_index=pad, label_smoothing=smoothing)
        if abs(out.item() - expected.item()) < 1e-5:
            continue
        per_token = F.cross_entropy(flat_logits, flat_tgt, reduction="none", label_smoothing=smoothing).view(3, 5)
        real = (tgt_out != pad).float()
        variants = {
            "The loss counts the padding positions: average over the real target tokens only (ignore_index=pad_id)": per_token.mean(),
            "The loss is a sum: average over the real target tokens": (per_token * real).sum(),
            "The loss averages each sequence first, then the sequences: average over all real tokens of the batch": (
                (per_token * real).sum(1) / real.sum(1)
            ).mean(),
            "The label smoothing is ignored: pass label_smoothing to F.cross_entropy": F.cross_entropy(
                flat_logits, flat_tgt, ignore_index=pad
            ),
            "The logits and targets are shifted by one (GPT-2's next-token shift): tgt_out is already one step ahead of "
            "tgt_in, so logits[:, t] predicts tgt_out[:, t]": F.cross_entropy(
                logits[:, :-1].reshape(-1, 11), tgt_out[:, 1:].reshape(-1), ignore_index=pad, label_smoothing=smoothing
            ),
        }
        for other in (0, 5):
            if other != pad:
                variants[
                    f"The loss left out the targets equal to {other}, not pad_id={pad}: use the pad_id argument"
                ] = F.cross_entropy(flat_logits, flat_tgt, ignore_index=other, label_smoothing=smoothing)
        for cause, value in variants.items():
            if abs(out.item() - value.item()) < 1e-5:
                fail(f"{cause} ({what} returned {out.item():.5f}, due {expected.item():.5f}).")
        from harness._evidence import scale_note

        n_real = int((tgt_out != pad).sum())
        sizes = {"real target tokens": n_real, "target positions": tgt_out.numel(), "batch": tgt_out.shape[0]}
        scale = scale_note(out.item(), expected.item(), sizes)
        observed = f" Compared with it, {scale}." if scale else ""
        fail(
            f"{what} returned {out.item():.5f}, due {expected.item():.5f} (cross-entropy over the real tokens)."
            f"{observed}"
        )
    # logits spread over hundreds, as a model's can be, after every case near 0 was right
    big, tgt_out = 60 * logits, torch.where(real_ids >= 5, real_ids + 1, real_ids)
    what = f"{name}(logits spread over hundreds, tgt_out, pad_id=5, label_smoothing=0.1)"
    out = as_tensor_output(_kcall(seq2seq_loss, big.clone(), tgt_out.clone(), 5, what=what, label_smoothing=0.1), what)
    expected = F.cross_entropy(big.reshape(-1, 11), tgt_out.reshape(-1), ignore_index=5, label_smoothing=0.1)
    if out.numel() != 1 or not math.isclose(out.item(), expected.item(), rel_tol=1e-5, abs_tol=1e-5):
        fail(
            f"{what} returned {out.reshape(-1)[0].item():.5g}, due {expected.item():.5g}, where every case with "
            "logits near 0 was right: exp() of a float32 overflows past about 88 and underflows below about -103; "
            "use F.cross_entropy or log_softmax (they subtract each row's largest first), not softmax().log()."
        )
    print(f"{name} passed: mean cross-entropy over the real target tokens, padding ignored, label smoothing applied.")


# --------------------------------------------------------------------------------------------------------------------
# Exercise 5: greedy decoding
# --------------------------------------------------------------------------------------------------------------------


class _ScriptedSeq2Seq(nn.Module):
    """A stand-in model whose greedy output is known: row r of the source (its first token) picks an answer; the
    decoder's last position proposes the answer's next token, and after the answer a non-padding token (JUNK), so a
    decoder that does not stop finished rows shows. Earlier positions propose EARLY, to catch logits[:, 0]."""

    JUNK, EARLY = 7, 4

    def __init__(self, answers: dict[int, list[int]]):
        super().__init__()
        self.cfg = replace(CHECK_CFG, d_vocab=12)
        self.answers = answers
        self.encode_calls = 0
        self.bad_prefix = None
        self.memories = []

    def encode(self, src: Tensor) -> Tensor:
        self.encode_calls += 1
        memory = src[:, :, None].float().expand(-1, -1, self.cfg.d_model).clone()
        self.memories.append(memory)
        return memory

    def decode(self, tgt_in: Tensor, memory: Tensor, src: Tensor) -> Tensor:
        batch, t = tgt_in.shape
        logits = torch.zeros(batch, t, self.cfg.d_vocab)
        logits[:, :, self.EARLY] = 1.0
        for r in range(batch):
            answer = self.answers[int(src[r, 0])]
            if int(tgt_in[r, 0]) != self.cfg.bos_id and self.bad_prefix is None:
                self.bad_prefix = f"tgt_in's first token is {int(tgt_in[r, 0])}, not BOS = {self.cfg.bos_id}"
            done = self.cfg.eos_id in tgt_in[r, 1:].tolist()
            if not done and tgt_in[r, 1:].tolist() != answer[: t - 1] and self.bad_prefix is None:
                self.bad_prefix = f"row {r} was given tgt_in {tgt_in[r].tolist()}, not [BOS] + its tokens so far"
                self.bad_fed = (r, tgt_in[r, 1:].tolist())
            token = answer[t - 1] if t - 1 < len(answer) and not done else self.JUNK
            logits[r, -1] = 0.0
            logits[r, -1, token] = 5.0
        return logits

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        return self.decode(tgt_in, self.encode(src), src)


def greedy_decode_test(greedy_decode) -> None:
    """Checks `greedy_decode(model, src [batch src], max_len)` -> `[batch out]` (without BOS): the source is encoded
    once, the decoder is run on [BOS] + the tokens so far and its last position's argmax appended, a row that emitted
    EOS emits padding after it, and decoding stops when every row is done or after max_len tokens."""
    name = "greedy_decode"
    E, P = CHECK_CFG.eos_id, CHECK_CFG.pad_id
    # answers use ids on both sides of EOS (8) and padding (5); none holds EARLY (4) or JUNK (7)
    answers = {0: [6, 9, E], 1: [2, 9, 10, 11, 0, E], 2: [E], 6: [9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9]}
    cases = [([0, 1, 2], 10), ([1], 10), ([6, 0], 5)]
    for firsts, max_len in cases:
        model = _ScriptedSeq2Seq(answers)
        src = torch.tensor([[f, 9, 10] for f in firsts])
        what = f"{name}(model, src {list(src.shape)}, max_len={max_len})"
        out = as_tensor_output(call(greedy_decode, model, src.clone(), max_len, what=what), what)
        if model.encode_calls != 1:
            fail(
                f"{name} called model.encode {model.encode_calls} times: encode the source once, before the loop, and "
                "pass the same memory to model.decode at every step (the source does not change)."
            )
        rows = []
        for f in firsts:
            answer = answers[f][:max_len]
            rows.append(answer)
        width = max(len(r) for r in rows)
        want = [r + [P] * (width - len(r)) for r in rows]
        got = out.tolist() if out.ndim == 2 else None
        if got is None or out.shape[0] != len(firsts):
            fail(f"{what} returned shape {list(out.shape)}, expected [batch, out] = [{len(firsts)}, ...].")
        if any(_ScriptedSeq2Seq.EARLY in row for row in got):  # no answer holds it: only earlier positions give it
            fail(
                f"{name} picks tokens from an earlier position than the decoder's last one: the next token is "
                "logits[:, -1].argmax(-1), the prediction after the last token so far."
            )
        if model.bad_prefix is not None:
            r, fed = getattr(model, "bad_fed", (None, None))
            answer = answers[firsts[r]] if r is not None else []
            step = next((k for k, (a, b) in enumerate(zip(fed or [], answer)) if a != b), None)
            if step is not None and got is not None and got[r][: len(fed)] == fed:  # its own tokens, one not the argmax
                fail(
                    f"{what}: row {r} emitted {fed[step]} at step {step}, where the decoder's last position gave "
                    f"{answer[step]} the largest logit (the tokens it fed back were its own): append each step's "
                    "argmax as it is, whatever the step and the id."
                )
            fail(f"{name} feeds the decoder the wrong prefix: {model.bad_prefix}.")
        if got and all(row and row[0] == CHECK_CFG.bos_id for row in got):
            fail(f"{what} starts every row with BOS: return the generated tokens only, without BOS.")
        if out.shape[1] > max_len:
            fail(f"{what} returned {out.shape[1]} tokens per row, more than max_len = {max_len}.")
        trimmed = [row[:width] for row in got]
        extra = [row[width:] for row in got]
        if trimmed == want and all(t == P for row in extra for t in row):
            if extra and extra[0]:
                fail(
                    f"{what} went on for {len(extra[0])} more steps of padding after every row had emitted EOS "
                    f"(got {out.shape[1]} tokens per row, expected {width}): stop as soon as every row is done."
                )
            continue
        after_eos = [row[len(w) :] for row, w in zip(got, rows) if w and w[-1] == E and row[: len(w)] == w]
        if any(_ScriptedSeq2Seq.JUNK in tail for tail in after_eos):
            fail(
                f"Rows that finished keep generating: after a row emits EOS it must emit padding (pad_id = {P}), "
                f"while the other rows go on. Expected {want}, got {got}."
            )
        if out.shape[1] < width:
            fail(f"{name} stopped after {out.shape[1]} tokens although some rows had not emitted EOS: {got}.")
        fail(f"{what} returned {got}, expected {want} (rows padded with {P} after EOS).")
    # An answer that holds the pad id before its EOS, once answers without it were right (a decoder that never
    # predicted pad, or counted it as finishing a row, passed: red-team round 50)
    answers[10] = [6, P, 9, E]
    model = _ScriptedSeq2Seq(answers)
    src = torch.tensor([[10, 9, 10], [1, 9, 10]])
    what = f"{name}(model, src {list(src.shape)}, max_len=10)"
    got = as_tensor_output(call(greedy_decode, model, src.clone(), 10, what=what), what).tolist()
    want = [answers[10] + [P] * 2, answers[1]]
    if got != want:
        fail(
            f"{what} returned {got}, expected {want}, where answers without the pad id were right: the first row's "
            f"answer holds the pad id ({P}) before its EOS. The decoder emits its argmax, the pad id included; only "
            "EOS finishes a row."
        )
    print(f"{name} passed: encodes once, decodes step by step, finished rows emit padding, stops when all are done.")
