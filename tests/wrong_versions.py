"""The catalogue of realistic wrong implementations: one place, used by the tests and by bench/naming_rate.py.

Each entry is a wrong version of one exercise, built from the course's own components (a small subclass or
function with one realistic mistake), a short label, and the phrases whose presence in the first 300 characters of
the check's message means the mistake is named; entries without phrases are correct versions, which no check may
refuse. tests/test_wrong_versions.py runs every entry (each wrong one caught, each correct one passed, the named
share held); `python bench/naming_rate.py` prints the rates per check.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("COURSE_FAST", "1")

import einops
import torch
import torch.nn.functional as F

import harness
from harness import Config, components

MESSAGE_HEAD = 300  # a mistake counts as named only if the learner reads its name first


@dataclasses.dataclass
class Case:
    check: str  # the check's call as the learner writes it
    label: str  # the mistake, in a few words ("" for a correct implementation)
    run: Callable[[], None]
    phrases: tuple[str, ...] = ()  # any one of them (case-insensitive) in the message's head names the mistake

    @property
    def correct(self) -> bool:
        return not self.phrases


CASES: list[Case] = []


def case(check: str, label: str, *phrases: str):
    """Decorator: register `fn` (no arguments, runs the check) as one entry; no phrases = a correct version."""

    def register(fn):
        CASES.append(Case(check, label, fn, tuple(p.lower() for p in phrases)))
        return fn

    return register


# Small configurations: the checks' own probes use their own sizes; these keep the random-weights pass fast.
SMALL = Config(d_model=48, n_layers=2, n_heads=4, d_head=12, d_mlp=96, n_ctx=16, d_vocab=97)
c00 = components("00_tour")
c02 = components("02_embeddings")
c03 = components("03_attention")
c04 = components("04_mlp_and_block")
c05 = components("05_full_gpt2")
c07 = components("07_sampling_and_kv_cache")


def rand_float(cls):
    return lambda: harness.rand_float_test(cls, [2, 5, SMALL.d_model], SMALL)


def rand_int(cls):
    return lambda: harness.rand_int_test(cls, [2, 5], SMALL)


def add(check: str, label: str, run: Callable[[], None], *phrases: str) -> None:
    CASES.append(Case(check, label, run, tuple(p.lower() for p in phrases)))


# ---------------------------------------------------------------------------------------------------------------
# 00: parameter count and the einops primer


def count_params_with(**drop):
    def count(cfg):
        d, v, h, dh, m = cfg.d_model, cfg.d_vocab, cfg.n_heads, cfg.d_head, cfg.d_mlp
        emb = v * d + (0 if drop.get("pos") else cfg.n_ctx * d)
        ln = 2 * d
        attn = 4 * h * d * dh + (0 if drop.get("qkv_bias") else 3 * h * dh) + d
        if drop.get("attn_square"):
            attn = 4 * d * d + 4 * d
        mlp = 2 * d * m + m + d
        block = (ln if drop.get("one_ln") else 2 * ln) + attn + mlp
        final = 0 if drop.get("ln_final") else ln
        unembed = (0 if drop.get("tied") else d * v) + (0 if drop.get("b_U") else v)
        return emb + cfg.n_layers * block + final + unembed

    return count


add("param_count_test", "", lambda: harness.param_count_test(c00.count_params))
add(
    "param_count_test",
    "forgets the final LayerNorm",
    lambda: harness.param_count_test(count_params_with(ln_final=1)),
    "ln_final",
    "final layernorm",
)
add(
    "param_count_test",
    "forgets b_Q, b_K, b_V",
    lambda: harness.param_count_test(count_params_with(qkv_bias=1)),
    "b_q",
    "query, key and value bias",
    "biases of q",
)
add(
    "param_count_test",
    "attention as four d_model x d_model matrices",
    lambda: harness.param_count_test(count_params_with(attn_square=1)),
    "d_head",
    "n_heads * d_head",
)
add(
    "param_count_test",
    "one LayerNorm per block",
    lambda: harness.param_count_test(count_params_with(one_ln=1)),
    "two layernorm",
    "ln1",
    "ln2",
    "layernorms per block",
)


def split_heads_ok(x, n_heads):
    return einops.rearrange(x, "b p (n h) -> b p n h", n=n_heads)


add("split_heads_test", "", lambda: harness.split_heads_test(split_heads_ok))
add(
    "split_heads_test",
    "groups (d_head n_heads)",
    lambda: harness.split_heads_test(lambda x, n: einops.rearrange(x, "b p (h n) -> b p n h", n=n)),
    "(n_heads d_head)",
    "(d_head n_heads)",
)
add(
    "split_heads_test",
    "uses d_head as n_heads (reshape(b, p, -1, n_heads))",
    lambda: harness.split_heads_test(lambda x, n: x.reshape(*x.shape[:2], -1, n)),
    "swapped",
    "n_heads d_head",
)
add("merge_heads_test", "", lambda: harness.merge_heads_test(lambda z: einops.rearrange(z, "b p n h -> b p (n h)")))
add(
    "merge_heads_test",
    "merges (d_head n_heads)",
    lambda: harness.merge_heads_test(lambda z: einops.rearrange(z, "b p n h -> b p (h n)")),
    "(d_head n_heads)",
    "(n_heads d_head)",
)
add(
    "merge_heads_test",
    "sums the heads instead of concatenating",
    lambda: harness.merge_heads_test(lambda z: z.sum(2)),
    "sum",
    "concatenat",
)
add("head_scores_test", "", lambda: harness.head_scores_test(lambda q, k: torch.einsum("bqnh,bknh->bnqk", q, k)))
add(
    "head_scores_test",
    "scaled by sqrt(d_head)",
    lambda: harness.head_scores_test(lambda q, k: torch.einsum("bqnh,bknh->bnqk", q, k) / q.shape[-1] ** 0.5),
    "sqrt(d_head)",
)
add(
    "head_scores_test",
    "output keys before queries",
    lambda: harness.head_scores_test(lambda q, k: torch.einsum("bqnh,bknh->bnkq", q, k)),
    "swapped",
    "pos_q pos_k",
)
add(
    "head_scores_test",
    "contracts over heads too",
    lambda: harness.head_scores_test(lambda q, k: torch.einsum("bqnh,bknh->bqk", q, k)),
    "summed away",
    "n_heads",
)

# ---------------------------------------------------------------------------------------------------------------
# 01: LayerNorm

LN = c05.LayerNorm


class LNUnbiased(LN):
    def forward(self, x):
        return (x - x.mean(-1, keepdim=True)) / (
            x.var(-1, keepdim=True) + self.cfg.layer_norm_eps
        ).sqrt() * self.w + self.b


class LNStd(LN):  # x.std is unbiased by default; eps added to the std
    def forward(self, x):
        return (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + self.cfg.layer_norm_eps) * self.w + self.b


class LNNoBias(LN):
    def forward(self, x):
        c = x - x.mean(-1, keepdim=True)
        return c / (c.pow(2).mean(-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt() * self.w


class LNRms(LN):
    def forward(self, x):
        return x / (x.pow(2).mean(-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt() * self.w + self.b


class LNWrongDim(LN):  # normalises over the positions
    def forward(self, x):
        c = x - x.mean(1, keepdim=True)
        return c / (c.pow(2).mean(1, keepdim=True) + self.cfg.layer_norm_eps).sqrt() * self.w + self.b


class LNHardEps(LN):  # F.layer_norm with eps hard-coded to 1e-5
    def forward(self, x):
        return F.layer_norm(x, (self.cfg.d_model,), self.w, self.b, eps=1e-5)


class LNInPlace(LN):
    def forward(self, x):
        x -= x.mean(-1, keepdim=True)
        return x / (x.pow(2).mean(-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt() * self.w + self.b


class LNMeanNoKeepdim(LN):  # mean over the last dim without keepdim, then broadcast over the wrong axis
    def forward(self, x):
        c = x - x.mean(-1).mean()
        return c / (c.pow(2).mean(-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt() * self.w + self.b


class LNSwappedAffine(LN):  # (x * b + w)
    def forward(self, x):
        c = x - x.mean(-1, keepdim=True)
        return c / (c.pow(2).mean(-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt() * self.b + self.w


class LNVarNotCentred(LN):  # the variance as the mean of x**2 (not of the centred x)
    def forward(self, x):
        c = x - x.mean(-1, keepdim=True)
        return c / (x.pow(2).mean(-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt() * self.w + self.b


T = "rand_float_test(LayerNorm)"
add(T, "", rand_float(LN))
add(T, "unbiased variance", rand_float(LNUnbiased), "unbiased")
add(T, "x.std (unbiased) + eps", rand_float(LNStd), "unbiased", "outside the square root")
add(T, "no bias b", rand_float(LNNoBias), "self.b", "shift")
add(T, "RMS norm (not centred)", rand_float(LNRms), "rms", "centre", "mean is never subtracted")
add(T, "normalises over positions (dim=1)", rand_float(LNWrongDim), "last dimension", "dim=-1", "over the positions")
add(T, "eps hard-coded 1e-5", rand_float(LNHardEps), "cfg.layer_norm_eps", "epsilon", "hard-coded")


class LNTorchs(LN):  # right values, from the operator the notebook forbids (agreement sweep 17)
    def forward(self, x):
        return F.layer_norm(x, (self.cfg.d_model,), self.w, self.b, eps=self.cfg.layer_norm_eps)


add(T, "F.layer_norm", rand_float(LNTorchs), "ran aten::layer_norm")
add(T, "x -= mean (in place)", rand_float(LNInPlace), "in place")
add(T, "mean without keepdim", rand_float(LNMeanNoKeepdim), "keepdim")
add(T, "w and b swapped", rand_float(LNSwappedAffine), "swapped", "w and b")
add(T, "variance of x, not of centred x", rand_float(LNVarNotCentred), "centred x", "variance of x")


class LNDetachedMean(LN):  # right values; the mean cut from the graph (agreement sweep 16: the check passed it)
    def forward(self, x):
        c = x - x.mean(-1, keepdim=True).detach()
        return c / (c.pow(2).mean(-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt() * self.w + self.b


class LNDataWeights(LN):  # right values; w and b read through .data, so they never train
    def forward(self, x):
        c = x - x.mean(-1, keepdim=True)
        return c / (c.pow(2).mean(-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt() * self.w.data + self.b.data


add(T, "the mean detached", rand_float(LNDetachedMean), "gradient that reaches its input differs")
add(T, "w and b through .data", rand_float(LNDataWeights), "no gradient reaches its parameter")

# ---------------------------------------------------------------------------------------------------------------
# 02: embeddings


class EmbedScaled(c05.Embed):
    def forward(self, tokens):
        return self.W_E[tokens] * math.sqrt(self.cfg.d_model)


class EmbedOneHot(c05.Embed):  # correct: one-hot times W_E
    def forward(self, tokens):
        return F.one_hot(tokens, self.cfg.d_vocab).float() @ self.W_E


class EmbedFirstRow(c05.Embed):  # W_E[tokens[0]] broadcast over the batch
    def forward(self, tokens):
        return self.W_E[tokens[0]].expand(tokens.shape[0], -1, -1)


add("rand_int_test(Embed)", "", rand_int(c05.Embed))
add("rand_int_test(Embed)", "", rand_int(EmbedOneHot))
add("rand_int_test(Embed)", "scaled by sqrt(d_model)", rand_int(EmbedScaled), "sqrt(d_model)")


class EmbedData(c05.Embed):  # right values; W_E read through .data, so it never trains
    def forward(self, tokens):
        return self.W_E.data[tokens]


add("rand_int_test(Embed)", "W_E through .data", rand_int(EmbedData), "carries no gradient")
add(
    "rand_int_test(Embed)",
    "first sequence's tokens for every row",
    rand_int(EmbedFirstRow),
    "first row",
    "first sequence",
    "row 0",
)


class PosByToken(c05.PosEmbed):
    def forward(self, tokens):
        return self.W_pos[tokens]


class PosFromOne(c05.PosEmbed):
    def forward(self, tokens):
        b, p = tokens.shape
        return self.W_pos[1 : p + 1].expand(b, -1, -1)


class PosUsesBatch(c05.PosEmbed):  # seq_len taken from tokens.shape[0]
    def forward(self, tokens):
        b = tokens.shape[0]
        return self.W_pos[:b].unsqueeze(0).expand(b, -1, -1)


class PosNoBatch(c05.PosEmbed):
    def forward(self, tokens):
        return self.W_pos[: tokens.shape[1]]


class PosSinusoidal(c05.PosEmbed):
    def forward(self, tokens):
        b, p = tokens.shape
        pe = c02.sinusoidal_positional_encoding(self.cfg.n_ctx, self.cfg.d_model)
        return pe[:p].expand(b, -1, -1)


T = "rand_int_test(PosEmbed)"
add(T, "", rand_int(c05.PosEmbed))
add(T, "indexed by token ids", rand_int(PosByToken), "token ids", "by position")
add(T, "positions start at 1", rand_int(PosFromOne), "start at 0", "shifted")
add(T, "length from tokens.shape[0] (batch)", rand_int(PosUsesBatch), "shape[1]", "sequence length", "seq_len")
add(T, "not repeated over the batch", rand_int(PosNoBatch), "batch dimension")
add(T, "sinusoidal in place of W_pos", rand_int(PosSinusoidal), "sinusoid", "learned")


def sin_variant(kind):
    def fn(n_ctx, d_model):
        two_i = torch.arange(0, d_model, 2, dtype=torch.float32)
        base = 1000.0 if kind == "base" else 10000.0
        if kind == "i":
            two_i = two_i / 2
        freq = 1.0 / base ** (two_i / d_model)
        start = 1 if kind == "from1" else 0
        ang = torch.arange(start, n_ctx + start, dtype=torch.float32)[:, None] * freq
        if kind == "concat":
            return torch.cat([ang.sin(), ang.cos()], dim=-1)
        first, second = (ang.cos(), ang.sin()) if kind == "swap" else (ang.sin(), ang.cos())
        if kind == "deg":
            first, second = torch.sin(torch.rad2deg(ang)), torch.cos(torch.rad2deg(ang))
        return torch.stack([first, second], dim=-1).flatten(-2)

    return lambda: harness.sinusoidal_test(fn)


T = "sinusoidal_test"
add(T, "", lambda: harness.sinusoidal_test(c02.sinusoidal_positional_encoding))
add(T, "sin and cos swapped", sin_variant("swap"), "swap", "cos")
add(T, "halves concatenated, not interleaved", sin_variant("concat"), "interleav", "concatenat")
add(T, "exponent i/d_model instead of 2i/d_model", sin_variant("i"), "2i")
add(T, "base 1000", sin_variant("base"), "10000", "base")
add(T, "positions from 1", sin_variant("from1"), "position 0", "start at 0", "from 1")

# ---------------------------------------------------------------------------------------------------------------
# 03: attention steps and the Attention module


def mask_with(diagonal=1, fill=-1e5, inplace=False, lower=False):
    def apply(scores, ignore=-1e5):
        n_q, n_k = scores.shape[-2:]
        ones = torch.ones(n_q, n_k, dtype=torch.bool)
        m = ones.tril(-1) if lower else ones.triu(diagonal)
        if inplace:
            scores[..., m] = fill
            return scores
        return scores.masked_fill(m, fill)

    return apply


T = "causal_mask_test"
add(T, "", lambda: harness.causal_mask_test(c03.apply_causal_mask))
add(T, "masks the diagonal", lambda: harness.causal_mask_test(mask_with(diagonal=0)), "diagonal")
add(
    T,
    "flipped (tril)",
    lambda: harness.causal_mask_test(mask_with(lower=True)),
    "flipped",
    "past instead of the future",
)
add(T, "fills 0", lambda: harness.causal_mask_test(mask_with(fill=0.0)), "to 0", "e^0")
add(T, "fills -100", lambda: harness.causal_mask_test(mask_with(fill=-100.0)), "negative")
add(T, "masks in place", lambda: harness.causal_mask_test(mask_with(inplace=True)), "in place")

T = "attention_scores_test"


def scores(scale="sqrt", order="bnqk"):
    def fn(q, k):
        s = torch.einsum(f"bqnh,bknh->{order}", q, k)
        return s / {"sqrt": math.sqrt(q.shape[-1]), "none": 1.0, "dh": q.shape[-1], "n": math.sqrt(q.shape[-2])}[scale]

    return lambda: harness.attention_scores_test(fn)


add(T, "", lambda: harness.attention_scores_test(c03.attention_scores))
add(T, "no scaling", scores(scale="none"), "sqrt(d_head)", "scal")
add(T, "divides by d_head", scores(scale="dh"), "d_head")
add(T, "divides by sqrt(n_heads)", scores(scale="n"), "sqrt(d_head)", "n_heads")
add(T, "keys before queries", scores(order="bnkq"), "swap", "transpos", "pos_q pos_k")

T = "attention_pattern_test"
add(T, "", lambda: harness.attention_pattern_test(c03.attention_pattern))


def pattern_exp_over_sum(s):  # right on small scores; inf / inf on scores of hundreds (agreement sweep 17)
    e = c03.apply_causal_mask(s).exp()
    return e / e.sum(-1, keepdim=True)


def pattern_renormalised(s):  # softmax, mask to 0, renormalise: 0 / 0 where a row's kept keys underflow
    future = torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool).triu(1)
    p = s.softmax(-1).masked_fill(future, 0.0)
    return p / p.sum(-1, keepdim=True)


add(T, "exp over its sum", lambda: harness.attention_pattern_test(pattern_exp_over_sum), "exp overflows")
add(T, "renormalised after the mask", lambda: harness.attention_pattern_test(pattern_renormalised), "0/0")
add(
    T,
    "softmax over queries",
    lambda: harness.attention_pattern_test(lambda s: c03.apply_causal_mask(s).softmax(-2)),
    "quer",
    "keys",
)
add(T, "no mask", lambda: harness.attention_pattern_test(lambda s: s.softmax(-1)), "mask")
add(
    T,
    "the scores returned for one position",
    lambda: harness.attention_pattern_test(lambda s: c03.attention_pattern(s) if s.shape[-1] > 1 else s),
    "1 position(s)",
)
add(
    T,
    "mask after softmax",
    lambda: harness.attention_pattern_test(lambda s: c03.apply_causal_mask(s.softmax(-1), 0.0)),
    "after",
    "before the softmax",
)
add(
    T,
    "softmax over all keys and queries (flattened)",
    lambda: harness.attention_pattern_test(lambda s: c03.apply_causal_mask(s).flatten(-2).softmax(-1).view_as(s)),
    "sum to 1",
    "each query",
    "row",
)

T = "weighted_values_test"
add(T, "", lambda: harness.weighted_values_test(c03.weighted_values))
add(
    T,
    "pattern transposed (sums over queries)",
    lambda: harness.weighted_values_test(lambda p, v: torch.einsum("bnqk,bqnh->bknh", p, v)),
    "transpos",
    "quer",
    "keys",
)
add(
    T,
    "pattern averaged over heads",
    lambda: harness.weighted_values_test(lambda p, v: torch.einsum("bqk,bknh->bqnh", p.mean(1), v)),
    "head",
)

T = "project_heads_test"
add(T, "", lambda: harness.project_heads_test(c03.project_heads))
add(
    T,
    "heads averaged",
    lambda: harness.project_heads_test(lambda z, W_O, b_O: torch.einsum("bpnh,nhd->bpnd", z, W_O).mean(2) + b_O),
    "averag",
    "mean",
)
add(T, "no b_O", lambda: harness.project_heads_test(lambda z, W_O, b_O: torch.einsum("bpnh,nhd->bpd", z, W_O)), "b_o")
add(
    T,
    "b_O added per head",
    lambda: harness.project_heads_test(lambda z, W_O, b_O: (torch.einsum("bpnh,nhd->bpnd", z, W_O) + b_O).sum(2)),
    "b_o",
    "per head",
    "once",
)

A = c05.Attention


def attn_forward(
    self,
    x,
    *,
    scale=None,
    mask="causal",
    fill=None,
    softmax_dim=-1,
    swap_qk=False,
    heads="sum",
    v_from_q=False,
    no_qkv_bias=False,
):
    q = torch.einsum("bpd,ndh->bpnh", x, self.W_Q) + (0 if no_qkv_bias else self.b_Q)
    k = torch.einsum("bpd,ndh->bpnh", x, self.W_K) + (0 if no_qkv_bias else self.b_K)
    v = torch.einsum("bpd,ndh->bpnh", x, self.W_Q if v_from_q else self.W_V) + (0 if no_qkv_bias else self.b_V)
    if swap_qk:
        q, k = k, q
    s = torch.einsum("bqnh,bknh->bnqk", q, k) * (self.cfg.d_head**-0.5 if scale is None else scale)
    n = x.shape[1]
    ones = torch.ones(n, n, dtype=torch.bool)
    m = {"causal": ones.triu(1), "diag": ones.triu(0), "none": ~ones}[mask]
    s = s.masked_fill(m, -1e5 if fill is None else fill)
    p = s.softmax(softmax_dim)
    z = torch.einsum("bnqk,bknh->bqnh", p, v)
    out = torch.einsum("bqnh,nhd->bqnd", z, self.W_O)
    out = out.sum(2) if heads == "sum" else out.mean(2)
    return out + self.b_O


def attention_variant(**kw):
    return type("Attention", (A,), {"forward": lambda self, x: attn_forward(self, x, **kw)})


class AttnSumsOverQuery(A):  # z from the pattern transposed
    def forward(self, x):
        q = torch.einsum("bpd,ndh->bpnh", x, self.W_Q) + self.b_Q
        k = torch.einsum("bpd,ndh->bpnh", x, self.W_K) + self.b_K
        v = torch.einsum("bpd,ndh->bpnh", x, self.W_V) + self.b_V
        p = c03.attention_pattern(c03.attention_scores(q, k))
        z = torch.einsum("bnqk,bqnh->bknh", p, v)
        return c03.project_heads(z, self.W_O, self.b_O)


class AttnMaskInPlaceOnParam(A):  # self.IGNORE overwritten in forward: -1e5 becomes -inf, harmless; here 0
    def forward(self, x):
        self.IGNORE = torch.tensor(0.0)
        return super().forward(x)


T = "rand_float_test(Attention)"
add(T, "", rand_float(A))


class AttnTorchs(A):  # right values, from torch's own attention, which 03 forbids (a sibling of F.layer_norm's)
    def forward(self, x):
        q = einops.einsum(x, self.W_Q, "b p m, n m h -> b n p h") + self.b_Q[:, None]
        k = einops.einsum(x, self.W_K, "b p m, n m h -> b n p h") + self.b_K[:, None]
        v = einops.einsum(x, self.W_V, "b p m, n m h -> b n p h") + self.b_V[:, None]
        z = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return einops.einsum(z, self.W_O, "b n p h, n h m -> b p m") + self.b_O


add(T, "F.scaled_dot_product_attention", rand_float(AttnTorchs), "ran aten::")


class AttnNoKeyBias(A):  # right: b_K adds q . b_K to every score of a query, which the softmax ignores (sweep 19)
    def forward(self, x):
        q = einops.einsum(x, self.W_Q, "b p m, n m h -> b p n h") + self.b_Q
        k = einops.einsum(x, self.W_K, "b p m, n m h -> b p n h")
        v = einops.einsum(x, self.W_V, "b p m, n m h -> b p n h") + self.b_V
        scores = einops.einsum(q, k, "b q n h, b k n h -> b n q k") / self.cfg.d_head**0.5
        causal = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).triu(1)
        pattern = scores.masked_fill(causal, float("-inf")).softmax(dim=-1)
        z = einops.einsum(pattern, v, "b n q k, b k n h -> b q n h")
        return einops.einsum(z, self.W_O, "b q n h, n h m -> b q m") + self.b_O


add(T, "", rand_float(AttnNoKeyBias))
add(T, "no 1/sqrt(d_head)", rand_float(attention_variant(scale=1.0)), "sqrt(d_head)", "scaling")
add(T, "1/sqrt(d_model)", rand_float(attention_variant(scale=48**-0.5)), "d_model")
add(T, "mask hides the diagonal", rand_float(attention_variant(mask="diag")), "diagonal")
add(T, "no mask", rand_float(attention_variant(mask="none")), "causal mask", "no mask")
add(T, "masked scores set to 0", rand_float(attention_variant(fill=0.0)), "set to 0", "to 0")
add(T, "softmax over queries", rand_float(attention_variant(softmax_dim=-2)), "query dimension", "quer")
add(T, "Q and K swapped", rand_float(attention_variant(swap_qk=True)), "swap", "w_q", "queries and keys")
add(T, "heads averaged", rand_float(attention_variant(heads="mean")), "averag", "mean")
add(T, "V computed with W_Q", rand_float(attention_variant(v_from_q=True)), "w_v")
add(T, "no b_Q, b_K, b_V", rand_float(attention_variant(no_qkv_bias=True)), "b_q")
add(T, "pattern applied over queries", rand_float(AttnSumsOverQuery), "transpos", "over the queries")

# ---------------------------------------------------------------------------------------------------------------
# 04: GELU, MLP, block


SQRT_2_OVER_PI = math.sqrt(2 / math.pi)


def gelu_with(c=0.044715, k=SQRT_2_OVER_PI, half=0.5, power=3):
    return lambda: harness.gelu_new_test(lambda x: half * x * (1 + torch.tanh(k * (x + c * x.pow(power)))))


T = "gelu_new_test"
add(T, "", lambda: harness.gelu_new_test(c04.gelu_new))
add(T, "exact erf GELU", lambda: harness.gelu_new_test(F.gelu), "erf", "exact")
add(  # right values from the operator the exercise forbids (agreement sweep 17: the check passed it)
    T, "F.gelu's tanh GELU", lambda: harness.gelu_new_test(lambda x: F.gelu(x, approximate="tanh")), "ran aten::gelu"
)
add(T, "ReLU", lambda: harness.gelu_new_test(F.relu), "relu")
add(T, "sigmoid approximation", lambda: harness.gelu_new_test(lambda x: x * torch.sigmoid(1.702 * x)), "sigmoid")
add(T, "missing 0.5", gelu_with(half=1.0), "0.5", "twice", "half")
add(T, "sqrt(pi/2) in place of sqrt(2/pi)", gelu_with(k=math.sqrt(math.pi / 2)), "sqrt(2/pi)", "sqrt(2 / pi)")
add(T, "x**2 in place of x**3", gelu_with(power=2), "x^3", "x**3", "cube", "x.pow(3)")
add(T, "coefficient 0.0447", gelu_with(c=0.0447), "0.044715")


def _gelu_in_place(x):
    y = c04.gelu_new(x.clone())
    x.copy_(y)  # the learner's x.mul_(...) chain: the caller's tensor is overwritten
    return x


add(T, "in place", lambda: harness.gelu_new_test(_gelu_in_place), "in place")


M = c05.MLP


class MLPAct(M):
    act = staticmethod(F.gelu)
    b_out_on = True

    def forward(self, x):
        h = self.act(x @ self.W_in + self.b_in)
        return h @ self.W_out + (self.b_out if self.b_out_on else 0)


class MLPActAfter(M):  # the activation after W_out
    def forward(self, x):
        return c04.gelu_new((x @ self.W_in + self.b_in) @ self.W_out + self.b_out)


class MLPNoBOut(MLPAct):
    act = staticmethod(c04.gelu_new)
    b_out_on = False


class MLPRelu(MLPAct):
    act = staticmethod(F.relu)


class MLPNoBIn(M):
    def forward(self, x):
        return c04.gelu_new(x @ self.W_in) @ self.W_out + self.b_out


T = "rand_float_test(MLP)"
add(T, "", rand_float(M))
add(T, "exact GELU", rand_float(MLPAct), "erf", "exact")
add(T, "ReLU", rand_float(MLPRelu), "relu")
add(T, "no b_out", rand_float(MLPNoBOut), "b_out")
add(T, "no b_in", rand_float(MLPNoBIn), "b_in")
add(T, "activation after W_out", rand_float(MLPActAfter), "activation after", "after w_out")


class MLPDetachedPre(M):  # right values; the GELU's input cut from the graph
    def forward(self, x):
        return c04.gelu_new((x @ self.W_in + self.b_in).detach()) @ self.W_out + self.b_out


add(T, "the GELU's input detached", rand_float(MLPDetachedPre), "no gradient reaches its input")

B = c05.TransformerBlock


class BlockPostLN(B):
    def forward(self, x):
        mid = self.ln1(x + self.attn(x))
        return self.ln2(mid + self.mlp(mid))


class BlockNoResidual(B):
    def forward(self, x):
        return self.mlp(self.ln2(self.attn(self.ln1(x))))


class BlockNoMlpResidual(B):
    def forward(self, x):
        mid = x + self.attn(self.ln1(x))
        return self.mlp(self.ln2(mid))


class BlockSkipsLn2(B):
    def forward(self, x):
        mid = x + self.attn(self.ln1(x))
        return mid + self.mlp(mid)


class BlockParallel(B):
    def forward(self, x):
        return x + self.attn(self.ln1(x)) + self.mlp(self.ln2(x))


class BlockExactGelu(B):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.mlp = MLPAct(cfg)


class BlockUnscaledAttention(B):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.attn = attention_variant(scale=1.0)(cfg)


class BlockLnSwapped(B):
    def forward(self, x):
        mid = x + self.attn(self.ln2(x))
        return mid + self.mlp(self.ln1(mid))


class BlockNormalisedResidual(B):  # x = self.ln1(x) then residual added to the normalised stream
    def forward(self, x):
        x = self.ln1(x)
        mid = x + self.attn(x)
        return mid + self.mlp(self.ln2(mid))


T = "rand_float_test(TransformerBlock)"
add(T, "", rand_float(B))
add(T, "post-LN", rand_float(BlockPostLN), "post-ln")
add(T, "no residuals", rand_float(BlockNoResidual), "residual")
add(T, "no residual around the MLP", rand_float(BlockNoMlpResidual), "residual")
add(T, "ln2 skipped", rand_float(BlockSkipsLn2), "ln2", "layernorm")
add(
    T,
    "parallel attention and MLP",
    rand_float(BlockParallel),
    "resid_pre instead of resid_mid",
    "ln2 received",
    "parallel",
    "resid_mid",
)
add(T, "exact GELU inside", rand_float(BlockExactGelu), "gelu")
add(T, "unscaled attention inside", rand_float(BlockUnscaledAttention), "sqrt(d_head)")
add(T, "ln1 and ln2 swapped", rand_float(BlockLnSwapped), "swapped", "ln2 before ln1")
add(
    T,
    "residual added to the normalised stream",
    rand_float(BlockNormalisedResidual),
    "ln1's output",
    "resid_pre",
    "residual",
)

# ---------------------------------------------------------------------------------------------------------------
# 05: unembedding, full model, conversion, loss, greedy generation

U = c05.Unembed


class UnembedNoBias(U):
    def forward(self, x):
        return x @ self.W_U


class UnembedSoftmax(U):
    def forward(self, x):
        return (x @ self.W_U + self.b_U).softmax(-1)


class UnembedLastOnly(U):  # only the last position's logits, broadcast
    def forward(self, x):
        return (x[:, -1:] @ self.W_U + self.b_U).expand(-1, x.shape[1], -1)


T = "rand_float_test(Unembed)"
add(T, "", rand_float(U))
add(T, "no b_U", rand_float(UnembedNoBias), "b_u")
add(T, "softmax", rand_float(UnembedSoftmax), "softmax")
add(T, "last position only", rand_float(UnembedLastOnly), "last position", "every position")

DT = c05.DemoTransformer


class ModelNoFinalLN(DT):
    def forward(self, tokens):
        r = self.embed(tokens) + self.pos_embed(tokens)
        for block in self.blocks:
            r = block(r)
        return self.unembed(r)


class ModelReverse(DT):
    def forward(self, tokens):
        r = self.embed(tokens) + self.pos_embed(tokens)
        for block in reversed(self.blocks):
            r = block(r)
        return self.unembed(self.ln_final(r))


class ModelPostLN(DT):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.blocks = torch.nn.ModuleList([BlockPostLN(cfg) for _ in range(cfg.n_layers)])


class ModelUnscaled(DT):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.blocks = torch.nn.ModuleList([BlockUnscaledAttention(cfg) for _ in range(cfg.n_layers)])


class ModelSoftmax(DT):
    def forward(self, tokens):
        return super().forward(tokens).softmax(-1)


class ModelEmbedScaled(DT):
    def forward(self, tokens):
        r = self.embed(tokens) * math.sqrt(self.cfg.d_model) + self.pos_embed(tokens)
        for block in self.blocks:
            r = block(r)
        return self.unembed(self.ln_final(r))


class ModelSinusoidal(DT):
    def forward(self, tokens):
        pe = c02.sinusoidal_positional_encoding(self.cfg.n_ctx, self.cfg.d_model)[: tokens.shape[1]]
        r = self.embed(tokens) + pe
        for block in self.blocks:
            r = block(r)
        return self.unembed(self.ln_final(r))


class ModelTiedUnembed(DT):  # logits from W_E.T instead of the unembedding
    def forward(self, tokens):
        r = self.embed(tokens) + self.pos_embed(tokens)
        for block in self.blocks:
            r = block(r)
        return self.ln_final(r) @ self.embed.W_E.T + self.unembed.b_U


class ModelLnFinalEachBlock(DT):
    def forward(self, tokens):
        r = self.embed(tokens) + self.pos_embed(tokens)
        for block in self.blocks:
            r = self.ln_final(block(r))
        return self.unembed(r)


class ModelBlock0Twice(DT):  # range(1, n) after an extra block 0 call: off-by-one loop
    def forward(self, tokens):
        r = self.embed(tokens) + self.pos_embed(tokens)
        for i in range(len(self.blocks) - 1):
            r = self.blocks[i](r)
        return self.unembed(self.ln_final(r))


T = "rand_int_test(DemoTransformer)"
add(T, "", rand_int(DT))
add(T, "no ln_final", rand_int(ModelNoFinalLN), "ln_final")
add(T, "blocks in reverse order", rand_int(ModelReverse), "reverse")
add(T, "post-LN blocks", rand_int(ModelPostLN), "post-ln")
add(T, "unscaled attention", rand_int(ModelUnscaled), "sqrt(d_head)")
add(T, "returns probabilities", rand_int(ModelSoftmax), "softmax", "probabilities")
add(T, "embedding scaled by sqrt(d_model)", rand_int(ModelEmbedScaled), "sqrt(d_model)")
add(T, "sinusoidal positions", rand_int(ModelSinusoidal), "sinusoid", "pos_embed")
add(T, "logits from W_E.T", rand_int(ModelTiedUnembed), "unembed", "w_e")
add(T, "ln_final after every block", rand_int(ModelLnFinalEachBlock), "ln_final")
add(T, "last block skipped (range(n - 1))", rand_int(ModelBlock0Twice), "never called self.blocks", "last block")


# load_gpt2_test: with the offline reference (loaded once, lazily)
_REF: dict = {}


def reference():
    if not _REF:
        ref = harness.load_reference_gpt2("offline")
        tokens = ref.to_tokens("It is a truth universally acknowledged, that a single man in possession")
        _, cache = ref.run_with_cache(tokens)
        _REF.update(ref=ref, tokens=tokens, cache=cache)
    return _REF


def load_lazy(kind, cls):
    def run():
        r = reference()
        ref, cache, tokens = r["ref"], r["cache"], r["tokens"]
        args = {
            "LayerNorm": (ref.ln_final, cache["resid_post", -1]),
            "Attention": (ref.blocks[0].attn, ref.blocks[0].ln1(cache["resid_pre", 0])),
            "MLP": (ref.blocks[0].mlp, ref.blocks[0].ln2(cache["resid_mid", 0])),
            "TransformerBlock": (ref.blocks[0], cache["resid_pre", 0]),
            "DemoTransformer": (ref, tokens),
            "PosEmbed": (ref.pos_embed, tokens),
        }[kind]
        harness.load_gpt2_test(cls, *args)

    return run


add("load_gpt2_test(LayerNorm)", "", load_lazy("LayerNorm", LN))
add("load_gpt2_test(LayerNorm)", "unbiased variance", load_lazy("LayerNorm", LNUnbiased), "unbiased")
add("load_gpt2_test(Attention)", "", load_lazy("Attention", A))
add(
    "load_gpt2_test(Attention)",
    "no 1/sqrt(d_head)",
    load_lazy("Attention", attention_variant(scale=1.0)),
    "sqrt(d_head)",
)
add("load_gpt2_test(MLP)", "exact GELU", load_lazy("MLP", MLPAct), "erf", "exact")
add("load_gpt2_test(TransformerBlock)", "post-LN", load_lazy("TransformerBlock", BlockPostLN), "post-ln")
add(
    "load_gpt2_test(TransformerBlock)",
    "no residual around the MLP",
    load_lazy("TransformerBlock", BlockNoMlpResidual),
    "residual",
)
add("load_gpt2_test(DemoTransformer)", "", load_lazy("DemoTransformer", DT))
add("load_gpt2_test(DemoTransformer)", "no ln_final", load_lazy("DemoTransformer", ModelNoFinalLN), "ln_final")
add("load_gpt2_test(DemoTransformer)", "blocks reversed", load_lazy("DemoTransformer", ModelReverse), "reverse")
add("load_gpt2_test(PosEmbed)", "positions start at 1", load_lazy("PosEmbed", PosFromOne), "start at 0", "shifted")


def conversion(mistake):
    def convert(hf, cfg):
        sd = c05.convert_hf_gpt2_state_dict(hf, cfg)
        n, dh = cfg.n_heads, cfg.d_head
        for i in range(cfg.n_layers):
            h, b = f"transformer.h.{i}.", f"blocks.{i}."
            W, bias = hf[h + "attn.c_attn.weight"], hf[h + "attn.c_attn.bias"]
            if mistake == "reshape":  # reshape without the permute
                for name, w in zip("QKV", W.split(n * dh, dim=1)):
                    sd[b + f"attn.W_{name}"] = w.reshape(n, cfg.d_model, dh)
            elif mistake == "split0":  # the transposed weight split along its input dimension
                for name, w in zip("QKV", W.T.split(n * dh, dim=0)):  # [n*dh, d_model] each, never transposed back
                    sd[b + f"attn.W_{name}"] = einops.rearrange(w, "m (n h) -> n m h", n=n)
            elif mistake == "wo_heads":  # W_O's rows grouped (d_head n_heads)
                sd[b + "attn.W_O"] = einops.rearrange(hf[h + "attn.c_proj.weight"], "(h n) m -> n h m", n=n)
            elif mistake == "mlp_T":  # Conv1D treated as nn.Linear: transposed (square when d_mlp == d_model? no)
                sd[b + "mlp.W_in"] = hf[h + "mlp.c_fc.weight"].T.reshape(cfg.d_model, cfg.d_mlp)
            elif mistake == "kv_swapped":
                sd[b + "attn.W_K"], sd[b + "attn.W_V"] = sd[b + "attn.W_V"], sd[b + "attn.W_K"]
            elif mistake == "bias_heads":  # bias grouped (h n)
                for name, bb in zip("QKV", bias.split(n * dh, dim=0)):
                    sd[b + f"attn.b_{name}"] = einops.rearrange(bb, "(h n) -> n h", n=n)
            elif mistake == "ln_swapped":
                sd[b + "ln1.w"], sd[b + "ln2.w"] = sd[b + "ln2.w"], sd[b + "ln1.w"]
        if mistake == "W_U_no_T":  # lm_head.weight reshaped instead of transposed
            sd["unembed.W_U"] = hf["lm_head.weight"].reshape(cfg.d_model, cfg.d_vocab)
        return sd

    return lambda: harness.hf_conversion_test(convert)


T = "hf_conversion_test"
add(T, "", lambda: harness.hf_conversion_test(c05.convert_hf_gpt2_state_dict))
add(T, "reshape without the permute", conversion("reshape"), "permute", "rearrange", "reshape")
add(T, "c_attn split along the input dimension", conversion("split0"), "dim=1", "split")
add(T, "W_O grouped (d_head n_heads)", conversion("wo_heads"), "w_o")
add(T, "c_fc weight transposed-and-reshaped", conversion("mlp_T"), "w_in", "conv1d")
add(T, "W_K and W_V swapped", conversion("kv_swapped"), "w_k", "w_v", "swap")
add(T, "q/k/v bias grouped (d_head n_heads)", conversion("bias_heads"), "b_q")
add(T, "ln_1 and ln_2 swapped", conversion("ln_swapped"), "ln1.w", "ln_1", "ln2.w")
add(T, "lm_head reshaped, not transposed", conversion("W_U_no_T"), "w_u", "lm_head")


def loss_fn(kind):
    def fn(logits, tokens):
        if kind == "noshift":
            lp = logits.log_softmax(-1)
            return -lp.gather(-1, tokens[..., None])[..., 0].mean()
        if kind == "roll":
            lp = logits.log_softmax(-1)
            return -lp.gather(-1, tokens.roll(-1, dims=1)[..., None])[..., 0].mean()
        lp = logits[:, :-1].log_softmax(1 if kind == "dim1" else -1)
        correct = lp.gather(-1, tokens[:, 1:, None])[..., 0]
        if kind == "count":
            return -correct.sum() / tokens.numel()
        if kind == "sum":
            return -correct.sum()
        if kind == "sign":
            return correct.mean()
        if kind == "batchmean":
            return -correct.sum(1).mean()
        if kind == "softmaxlog":
            return -logits[:, :-1].softmax(-1).log().gather(-1, tokens[:, 1:, None]).mean()
        if kind == "shift_wrong_side":
            lp2 = logits[:, 1:].log_softmax(-1)
            return -lp2.gather(-1, tokens[:, :-1, None]).mean()
        return -correct.mean()

    return lambda: harness.cross_entropy_test(fn)


T = "cross_entropy_test"
add(T, "", lambda: harness.cross_entropy_test(c05.cross_entropy_loss))
add(  # right values from a loss the exercise forbids (agreement sweep 17)
    T,
    "F.cross_entropy",
    lambda: harness.cross_entropy_test(
        lambda lg, tk: F.cross_entropy(lg[:, :-1].reshape(-1, lg.shape[-1]), tk[:, 1:].reshape(-1))
    ),
    "ran aten::cross_entropy_loss",
)
add(T, "no shift", loss_fn("noshift"), "shift", "same position")
add(T, "roll wraps around", loss_fn("roll"), "roll", "wrap")
add(T, "divides by batch * pos", loss_fn("count"), "divides by", "pos - 1", "batch * pos")
add(T, "log_softmax over dim 1", loss_fn("dim1"), "dim=-1", "vocabulary dimension", "over the positions")
add(T, "sum, not mean", loss_fn("sum"), "is the sum", "a sum")
add(T, "sign flipped", loss_fn("sign"), "sign", "negative", "minus")
add(T, "summed over positions, mean over batch", loss_fn("batchmean"), "sums over positions")
add(T, "softmax().log()", loss_fn("softmaxlog"), "log_softmax", "overflow", "underflow", "-inf", "nan", "log(0)")
add(T, "logits shifted the wrong way", loss_fn("shift_wrong_side"), "shift", "previous", "wrong way", "direction")


def greedy(kind):
    @torch.no_grad()
    def fn(model, tokens, n_new):
        for step in range(n_new - 1 if kind == "short" else n_new):
            logits = model(tokens)
            if kind == "first_pos":
                nxt = logits[:, 0].argmax(-1, keepdim=True)
            elif kind == "first_row":
                nxt = logits[0, -1].argmax(-1).expand(tokens.shape[0], 1)
            elif kind == "dim":
                nxt = logits.argmax(-1)[:, -1:]  # correct, different route
            elif kind == "prob_sample":
                nxt = torch.multinomial(logits[:, -1].softmax(-1), 1, generator=torch.Generator().manual_seed(step))
            elif kind == "argmax_pos":
                nxt = logits.argmax(1)[:, -1:]  # argmax over positions
            else:
                nxt = logits[:, -1].argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, nxt], 1)
        return tokens if kind != "new_only" else tokens[:, -n_new:]

    return lambda: harness.greedy_generate_test(fn)


T = "greedy_generate_test"
add(T, "", lambda: harness.greedy_generate_test(c05.greedy_generate))
add(T, "", greedy("dim"))
add(T, "first position's logits", greedy("first_pos"), "last position", "first* position")
add(T, "first row's token for every row", greedy("first_row"), "first row", "row 0", "every row the same")
add(T, "one token short", greedy("short"), "n_new tokens", "one too few", "one token short")
add(T, "samples instead of argmax", greedy("prob_sample"), "sampl", "random")
add(T, "argmax over positions", greedy("argmax_pos"), "over the positions", "dim=-1")
add(T, "returns only the new tokens", greedy("new_only"), "prompt", "new tokens", "followed")

# ---------------------------------------------------------------------------------------------------------------
# 07: sampling, beam search, KV cache

T = "temperature_test"
add(T, "", lambda: harness.temperature_test(c07.apply_temperature))
add(
    T,
    "greedy below temperature 0.05",
    lambda: harness.temperature_test(lambda logits, t: c07.apply_temperature(logits, 0.0 if t < 0.05 else t)),
    "only temperature 0 is greedy",
)
add(
    T,
    "multiplies by temperature",
    lambda: harness.temperature_test(lambda logits, t: logits * t if t else c07.apply_temperature(logits, t)),
    "multipl",
    "divide",
)
add(
    T,
    "temperature 0 not handled",
    lambda: harness.temperature_test(lambda logits, t: logits / t),
    "temperature 0",
    "temperature=0",
    "zero",
)
add(
    T,
    "temperature 0 as argmax one-hot 0/1",
    lambda: harness.temperature_test(
        lambda logits, t: logits / t if t else F.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    ),
    "-inf",
    "temperature 0",
)


def _wide_skipped(fn):  # a filter skipped from GPT-2's width on (red-team round 51)
    return lambda logits, *args, **kwargs: logits.clone() if logits.shape[-1] >= 50257 else fn(logits, *args, **kwargs)


def _single_skipped(fn):  # a filter skipped for a batch of one (red-team round 51)
    return lambda logits, *args, **kwargs: logits.clone() if logits.shape[0] == 1 else fn(logits, *args, **kwargs)


def _recent_only(fn):  # a penalty that counts the last 32 tokens alone (red-team round 51)
    return lambda logits, tokens, penalty: fn(logits, tokens[:, -32:], penalty)


T = "top_k_test"
add(T, "skipped on GPT-2's vocabulary", lambda: harness.top_k_test(_wide_skipped(c07.top_k_filter)), "50,257 logits")


def top_k_with(kind):
    def fn(logits, k):
        if kind == "k_plus":
            thr = logits.topk(min(k + 1, logits.shape[-1]), -1).values[:, -1:]
            return logits.masked_fill(logits < thr, float("-inf"))
        if kind == "zero":
            thr = logits.topk(k, -1).values[:, -1:]
            return logits.masked_fill(logits < thr, 0.0)
        if kind == "global":
            thr = logits.flatten().topk(k).values[-1]
            return logits.masked_fill(logits < thr, float("-inf"))
        if kind == "le":
            thr = logits.topk(k, -1).values[:, -1:]
            return logits.masked_fill(logits <= thr, float("-inf"))
        if kind == "nokclamp":
            thr = logits.topk(k, -1).values[:, -1:]
            return logits.masked_fill(logits < thr, float("-inf"))
        raise ValueError(kind)

    return lambda: harness.top_k_test(fn)


add(T, "", lambda: harness.top_k_test(c07.top_k_filter))
add(T, "keeps k + 1", top_k_with("k_plus"), "k + 1", "k+1", "one too many", "kept")
add(T, "fills 0", top_k_with("zero"), "-inf, not 0")
add(T, "threshold over the whole batch", top_k_with("global"), "whole batch", "each row separately", "per row")
add(T, "drops the k-th (<=)", top_k_with("le"), "k-th", "k - 1", "<=")
add(T, "k larger than d_vocab crashes", top_k_with("nokclamp"), "d_vocab", "larger than", "min(k")


def top_p_with(kind):
    def fn(logits, p, min_tokens_to_keep=1):
        sl, order = logits.sort(-1, descending=True)
        probs = sl.softmax(-1)
        cum = probs.cumsum(-1)
        if kind == "no_crossing":
            remove = cum > p
        elif kind == "logit_cumsum":
            remove = sl.cumsum(-1) - sl >= p
        elif kind == "unsorted":
            pr = logits.softmax(-1)
            rem = pr.cumsum(-1) - pr >= p
            rem[:, :min_tokens_to_keep] = False
            return logits.masked_fill(rem, float("-inf"))
        elif kind == "gather_back":  # sorted mask applied without un-sorting
            rem = cum - probs >= p
            rem[:, :min_tokens_to_keep] = False
            return logits.masked_fill(rem, float("-inf"))
        elif kind == "no_min":
            remove = cum - probs >= p
            return logits.masked_fill(remove.scatter(-1, order, remove), float("-inf"))
        remove[:, :min_tokens_to_keep] = False
        return logits.masked_fill(remove.scatter(-1, order, remove), float("-inf"))

    return lambda: harness.top_p_test(fn)


def sample_fixed_default(
    logits, tokens, temperature=1.0, top_k=None, top_p=None, frequency_penalty=0.0, generator=None
):
    """No generator given: one seeded afresh, the same draws every call (red-team round 49)."""
    generator = generator if generator is not None else torch.Generator().manual_seed(0)
    return c07.sample_next_token(logits, tokens, temperature, top_k, top_p, frequency_penalty, generator)


def top_p_exp(logits, p, min_tokens_to_keep=1):
    """A softmax written as exp() / sum: it overflows on logits spread over hundreds (red-team round 49)."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.exp() / sorted_logits.exp().sum(dim=-1, keepdim=True)
    remove = (probs.cumsum(dim=-1) - probs) >= p
    remove[:, :min_tokens_to_keep] = False
    return logits.masked_fill(remove.scatter(-1, order, remove), float("-inf"))


def min_p_exp(logits, min_p, min_tokens_to_keep=1):
    """Probabilities as exp(logits), unnormalised and unshifted (red-team round 49)."""
    probs = logits.exp()
    remove = probs < min_p * probs.amax(dim=-1, keepdim=True)
    kept = probs.topk(min(min_tokens_to_keep, logits.shape[-1]), dim=-1).indices
    return logits.masked_fill(remove.scatter(-1, kept, False), float("-inf"))


def sample_exp(logits, tokens, temperature=1.0, top_k=None, top_p=None, frequency_penalty=0.0, generator=None):
    """Draws from exp(logits) (red-team round 49): the course's processors, then no softmax."""
    processors = (
        (frequency_penalty, lambda x: c07.apply_frequency_penalty(x, tokens, frequency_penalty)),
        (True, lambda x: c07.apply_temperature(x, temperature)),
        (top_k is not None, lambda x: c07.top_k_filter(x, top_k)),
        (top_p is not None, lambda x: c07.top_p_filter(x, top_p)),
    )
    for active, process in processors:
        logits = process(logits) if active else logits
    return torch.multinomial(logits.exp(), num_samples=1, generator=generator)[:, 0]


def seq2seq_loss_by_hand(logits, tgt_out, pad_id, label_smoothing=0.0):
    """Cross-entropy with smoothing from softmax().log(), by hand (red-team round 49)."""
    log_probs = logits.softmax(dim=-1).log()
    nll = -log_probs.gather(-1, tgt_out[..., None])[..., 0]
    smooth = -log_probs.mean(dim=-1)
    per_token = (1 - label_smoothing) * nll + label_smoothing * smooth
    real = tgt_out != pad_id
    return per_token[real].mean()


T = "top_p_test"
add(T, "skipped for a batch of one", lambda: harness.top_p_test(_single_skipped(c07.top_p_filter)), "one row of")
add(T, "", lambda: harness.top_p_test(c07.top_p_filter))
add(T, "softmax as exp() / sum", lambda: harness.top_p_test(top_p_exp), "logits spread over hundreds")
add(T, "drops the crossing token", top_p_with("no_crossing"), "cross")
add(
    T,
    "cumsum of logits, not probabilities",
    top_p_with("logit_cumsum"),
    "cumulative logits",
    "probabilities, not",
    "softmax",
)
add(T, "not sorted", top_p_with("unsorted"), "sort")
add(T, "mask left in sorted order", top_p_with("gather_back"), "sorted order", "vocabulary order", "scatter", "unsort")
add(T, "ignores min_tokens_to_keep", top_p_with("no_min"), "fewer than min_tokens_to_keep")

T = "frequency_penalty_test"
add(
    T,
    "counts the last 32 tokens",
    lambda: harness.frequency_penalty_test(_recent_only(c07.apply_frequency_penalty)),
    "however far back",
)
add(T, "", lambda: harness.frequency_penalty_test(c07.apply_frequency_penalty))
add(
    T,
    "presence, not count",
    lambda: harness.frequency_penalty_test(
        lambda logits, tokens, pen: logits - pen * torch.zeros_like(logits).scatter(-1, tokens, 1.0)
    ),
    "presence",
)
add(
    T,
    "adds the penalty",
    lambda: harness.frequency_penalty_test(
        lambda logits, tokens, pen: (
            logits + pen * torch.zeros_like(logits).scatter_add(-1, tokens, torch.ones_like(tokens, dtype=logits.dtype))
        )
    ),
    "sign",
    "subtract",
    "adds",
)
add(
    T,
    "counts over the whole batch",
    lambda: harness.frequency_penalty_test(
        lambda logits, tokens, pen: (
            logits - pen * torch.bincount(tokens.flatten(), minlength=logits.shape[-1]).to(logits.dtype)
        )
    ),
    "whole batch",
    "own row",
)
add(
    T,
    "in place",
    lambda: harness.frequency_penalty_test(
        lambda logits, tokens, pen: logits.scatter_add_(-1, tokens, -pen * torch.ones_like(tokens, dtype=logits.dtype))
    ),
    "in place",
)


def ngram_with(kind):
    def fn(log_probs, sequences, n):
        banned = log_probs if kind == "in_place" else log_probs.clone()
        size = {"n_plus": n + 1, "n_minus": max(n - 1, 1)}.get(kind, n)
        for row, seq in enumerate(sequences.tolist()):
            if kind == "row0":
                seq = sequences[0].tolist()
            prefix = seq[len(seq) - size + 1 :]
            stop = len(seq) - size + (0 if kind == "last_window_missed" else 1)
            for start in range(max(0, stop - 8) if kind == "last_8" else 0, stop):
                if seq[start : start + size - 1] == prefix:
                    banned[row, seq[start + size - 1]] = -1e9 if kind == "finite" else float("-inf")
        return banned

    return lambda: harness.ngram_ban_test(fn)


T = "ngram_ban_test"
add(T, "", lambda: harness.ngram_ban_test(c07.ban_repeated_ngrams))
add(T, "bans (n+1)-grams", ngram_with("n_plus"), "3-grams, not 2-grams")
add(T, "bans (n-1)-grams", ngram_with("n_minus"), "1-grams, not 2-grams")
add(T, "row 0's tokens for every row", ngram_with("row0"), "row 0's tokens")
add(T, "in place", ngram_with("in_place"), "in place")
add(T, "-1e9, not -inf", ngram_with("finite"), "must be -inf")
add(T, "the last window never compared", ngram_with("last_window_missed"), "last window")
add(T, "the last 8 windows alone searched", ngram_with("last_8"), "anywhere in the row")


def min_p_with(kind):
    def fn(logits, min_p, min_tokens_to_keep=1):
        probs = logits.softmax(-1)
        top = probs.amax(-1, keepdim=True)
        if kind == "absolute":
            remove = probs < min_p
        elif kind == "on_logits":
            remove = logits < min_p * logits.amax(-1, keepdim=True)
        elif kind == "batch_top":
            remove = probs < min_p * probs.max()
        elif kind == "no_min":
            return logits.masked_fill(probs < min_p * top, float("-inf"))
        elif kind == "first_k":  # the first k in vocabulary order, not the k likeliest
            remove = probs < min_p * top
            remove[:, :min_tokens_to_keep] = False
            return logits.masked_fill(remove, float("-inf"))
        elif kind == "keeps_below":  # the comparison reversed
            remove = probs > min_p * top
        elif kind == "at_most":  # a token at the threshold removed too
            remove = probs <= min_p * top
        keep = probs.topk(min(min_tokens_to_keep, logits.shape[-1]), dim=-1).indices
        return logits.masked_fill(remove.scatter(-1, keep, False), float("-inf"))

    return lambda: harness.min_p_test(fn)


T = "min_p_test"
add(T, "skipped on GPT-2's vocabulary", lambda: harness.min_p_test(_wide_skipped(c07.min_p_filter)), "50,257 logits")
add(T, "", lambda: harness.min_p_test(c07.min_p_filter))
add(T, "probabilities as exp(logits)", lambda: harness.min_p_test(min_p_exp), "logits spread over hundreds")


def min_p_floored(logits, min_p, min_tokens_to_keep=1):
    """The top probability floored at 0.1 (agreement sweep 19: right wherever a row's top token was likely)."""
    probs = logits.softmax(dim=-1)
    remove = probs < min_p * probs.amax(dim=-1, keepdim=True).clamp(min=0.1)
    kept = probs.topk(min(min_tokens_to_keep, logits.shape[-1]), dim=-1).indices
    return logits.masked_fill(remove.scatter(-1, kept, False), float("-inf"))


add(T, "top probability floored at 0.1", lambda: harness.min_p_test(min_p_floored), "kept", "removes", "tokens")
add(T, "threshold min_p itself", min_p_with("absolute"), "below min_p itself")
add(T, "threshold on logits", min_p_with("on_logits"), "applied to logits")
add(T, "the batch's top probability", min_p_with("batch_top"), "whole batch", "own top probability")
add(T, "ignores min_tokens_to_keep", min_p_with("no_min"), "min_tokens_to_keep")
add(T, "keeps the first k ids, not the k likeliest", min_p_with("first_k"), "first 1 token ids", "likeliest")
add(T, "comparison reversed", min_p_with("keeps_below"), "reversed")
add(T, "removes a token at the threshold (<=)", min_p_with("at_most"), "strictly below")


def repetition_with(kind):
    def fn(logits, tokens, penalty):
        seen = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, tokens, True)
        penalised = torch.where(logits < 0, logits * penalty, logits / penalty)
        if kind == "divide_all":
            return torch.where(seen, logits / penalty, logits)
        if kind == "per_occurrence":
            counts = torch.zeros_like(logits).scatter_add(-1, tokens, torch.ones_like(tokens, dtype=logits.dtype))
            return torch.where(logits < 0, logits * penalty**counts, logits / penalty**counts)
        if kind == "inverse":
            return torch.where(seen, torch.where(logits < 0, logits / penalty, logits * penalty), logits)
        if kind == "batch":
            anywhere = torch.zeros(logits.shape[-1], dtype=torch.bool).scatter(0, tokens.flatten(), True)
            return torch.where(anywhere, penalised, logits)
        if kind == "row0":
            return torch.where(seen[:1], penalised, logits)
        if kind == "everything":
            return penalised
        if kind == "subtract":
            return torch.where(seen, logits - penalty, logits)
        if kind == "in_place":
            logits[seen] = penalised[seen]
            return logits
        raise ValueError(kind)

    return lambda: harness.repetition_penalty_test(fn)


T = "repetition_penalty_test"
add(
    T,
    "counts the last 32 tokens",
    lambda: harness.repetition_penalty_test(_recent_only(c07.apply_repetition_penalty)),
    "however far back",
)
add(T, "", lambda: harness.repetition_penalty_test(c07.apply_repetition_penalty))
add(T, "divides negative logits too", repetition_with("divide_all"), "negative logit")
add(T, "once per occurrence", repetition_with("per_occurrence"), "once per occurrence", "once per distinct")
add(T, "inverse: seen tokens likelier", repetition_with("inverse"), "likelier")
add(T, "tokens of the whole batch", repetition_with("batch"), "anywhere in the batch", "own tokens")
add(T, "row 0's tokens for every row", repetition_with("row0"), "row 0's tokens")
add(T, "every token penalised", repetition_with("everything"), "never occurs in that row")
add(T, "subtracts (presence)", repetition_with("subtract"), "subtracts the penalty")
add(T, "in place", repetition_with("in_place"), "in place")


def sample_with(kind):
    def fn(logits, tokens, temperature=1.0, top_k=None, top_p=None, frequency_penalty=0.0, generator=None):
        if kind == "argmax":
            return logits.argmax(-1)
        if kind == "order":  # top-p before temperature
            if frequency_penalty:
                logits = c07.apply_frequency_penalty(logits, tokens, frequency_penalty)
            if top_k is not None:
                logits = c07.top_k_filter(logits, top_k)
            if top_p is not None:
                logits = c07.top_p_filter(logits, top_p)
            logits = c07.apply_temperature(logits, temperature)
        if kind == "nogen":
            return c07.sample_next_token(logits, tokens, temperature, top_k, top_p, frequency_penalty)
        if kind == "no_penalty":
            return c07.sample_next_token(logits, tokens, temperature, top_k, top_p, 0.0, generator)
        if kind == "logits_multinomial":  # multinomial of exp without the filters' -inf handled
            logits = c07.apply_temperature(logits, temperature)
            return torch.multinomial(logits.exp(), 1, generator=generator)[:, 0]
        return torch.multinomial(logits.softmax(-1), 1, generator=generator)[:, 0]

    return lambda: harness.sample_next_token_test(fn)


def sample_greedy_alone(logits, tokens, **options):  # greedy on a batch of one (red-team round 51)
    if logits.shape[0] == 1:
        return logits.argmax(dim=-1)
    return c07.sample_next_token(logits, tokens, **options)


T = "sample_next_token_test"
add(T, "", lambda: harness.sample_next_token_test(c07.sample_next_token))
add(T, "greedy on a batch of one", lambda: harness.sample_next_token_test(sample_greedy_alone), "a batch of one row")
add(T, "draws from exp(logits)", lambda: harness.sample_next_token_test(sample_exp), "logits spread over hundreds")
add(
    T,
    "a fixed seed when no generator is given",
    lambda: harness.sample_next_token_test(sample_fixed_default),
    "global generator",
)
add(T, "argmax instead of sampling", sample_with("argmax"), "argmax", "does not sample", "greedy")
add(T, "top-k/top-p before temperature", sample_with("order"), "order", "temperature")
add(T, "generator not passed on", sample_with("nogen"), "generator")
add(T, "frequency penalty ignored", sample_with("no_penalty"), "frequency_penalty", "penalty")
add(T, "ignores top_k and top_p", sample_with("logits_multinomial"), "top_k", "top-k", "top_p", "filter")


def sample_dividing_in_place(logits, tokens, temperature=1.0, top_k=None, top_p=None, frequency_penalty=0.0, **kw):
    if temperature > 0:  # the caller's logits divided (agreement sweep 17)
        logits.div_(temperature)
        temperature = 1.0
    return c07.sample_next_token(logits, tokens, temperature, top_k, top_p, frequency_penalty, **kw)


add(T, "temperature applied in place", lambda: harness.sample_next_token_test(sample_dividing_in_place), "in place")


def generate_with(kind):
    def fn(model, tokens, max_new_tokens, eos_token_id=c07.EOT, **sampling):
        finished = torch.zeros(tokens.shape[0], dtype=torch.bool)
        if kind == "prompt_ends":  # a prompt that ends with the id taken as finished (red-team round 49)
            finished = tokens[:, -1] == eos_token_id
        for _ in range(max_new_tokens):
            window = tokens if kind == "nocrop" else tokens[:, -model.cfg.n_ctx :]
            logits = model(window)[:, -1]
            if kind == "ban_eos_single" and tokens.shape[1] == 1:  # the id banned for a one-token prompt (sweep 19)
                logits = logits.clone()
                logits[:, eos_token_id] = float("-inf")
            # the penalty counted over the window the model sees (a mutation sweep: passed the judge then)
            if kind == "no_generator":  # the global generator instead (agreement sweep 17)
                sampling = {k: v for k, v in sampling.items() if k != "generator"}
            seen = window if kind == "window_penalty" else tokens[:, -64:] if kind == "penalty_64" else tokens
            nxt = c07.sample_next_token(logits, seen, **sampling)
            if kind == "argmax":  # never samples (red-team round 9: full marks where only greedy runs were checked)
                nxt = logits.argmax(dim=-1)
            if kind != "nopad":
                nxt = torch.where(finished, torch.full_like(nxt, eos_token_id), nxt)
            tokens = torch.cat([tokens, nxt[:, None]], 1)
            if kind == "precedence":  # Python reads it as (finished | nxt) == eos_token_id
                finished = finished | nxt == eos_token_id
            elif kind == "held_anywhere":  # the id anywhere in the row, its prompt's included
                finished = (tokens == eos_token_id).any(dim=1)
            else:
                finished |= nxt == eos_token_id
            if kind == "stop_first" and finished.any():
                break
            if finished.all() and kind != "nostop":
                break
        return tokens

    return lambda: harness.generate_test(fn)


T = "generate_test"
add(T, "", lambda: harness.generate_test(c07.generate))
add(T, "no crop to n_ctx", generate_with("nocrop"), "n_ctx")
add(T, "no padding after EOS", generate_with("nopad"), "eos", "pad")
add(T, "stops when the first row finishes", generate_with("stop_first"), "every row", "row 0 finished", "first row")
add(T, "never samples (argmax)", generate_with("argmax"), "never sampled", "argmax")
add(T, "the penalty counts the window only", generate_with("window_penalty"), "crop what the model is given")
add(T, "the penalty counts the last 64 tokens", generate_with("penalty_64"), "however far back")
add(T, "the generator not passed on", generate_with("no_generator"), "generators seeded alike")
add(T, "finished | next == eos, unbracketed", generate_with("precedence"), "kept generating after row 0")
add(T, "a prompt ending with EOS counts as finished", generate_with("prompt_ends"), "not by its prompt")
add(T, "EOS anywhere in the row counts as finished", generate_with("held_anywhere"), "not by its prompt")
add(T, "EOS banned for a one-token prompt", generate_with("ban_eos_single"), "one-token prompt")


def beam_with(kind):
    def fn(
        model,
        tokens,
        num_beams,
        max_new_tokens,
        no_repeat_ngram_size=0,
        eos_token_id=c07.EOT,
        length_penalty=1.0,
        early_stopping=False,
    ):
        if kind == "greedy":
            for _ in range(max_new_tokens):
                nxt = model(tokens)[:, -1].argmax(-1, keepdim=True)
                tokens = torch.cat([tokens, nxt], 1)
                if nxt.item() == eos_token_id:
                    break
            return tokens
        if kind == "no_ngram":
            return c07.beam_search(
                model, tokens, num_beams, max_new_tokens, 0, eos_token_id, length_penalty, early_stopping
            )
        if kind == "no_lp":  # length_penalty accepted and never used
            return c07.beam_search(
                model, tokens, num_beams, max_new_tokens, no_repeat_ngram_size, eos_token_id, 0.0, early_stopping
            )
        if kind == "es_true_ignored":  # early_stopping=True treated as the default
            stop = False if early_stopping is True else early_stopping
            return c07.beam_search(
                model, tokens, num_beams, max_new_tokens, no_repeat_ngram_size, eos_token_id, length_penalty, stop
            )
        if kind == "probs_product_unsummed":  # scores are the last step's log-prob only
            live = [(0.0, tokens[0])]
            for _ in range(max_new_tokens):
                batch = torch.stack([s for _, s in live])
                lp = model(batch)[:, -1].log_softmax(-1)
                top = lp.flatten().topk(min(num_beams, lp.numel()))
                d = lp.shape[-1]
                live = [
                    (v, torch.cat([batch[i // d], torch.tensor([i % d])]))
                    for v, i in zip(top.values.tolist(), top.indices.tolist())
                ]
            return max(live, key=lambda b: b[0])[1][None]
        raise ValueError(kind)

    return lambda: harness.beam_search_test(fn)


T = "beam_search_test"
add(T, "", lambda: harness.beam_search_test(c07.beam_search))
add(T, "length_penalty unused", beam_with("no_lp"), "length_penalty", "transformers'")
add(T, "early_stopping=True ignored", beam_with("es_true_ignored"), "early_stopping=True")


def select_with(kind):
    def fn(scores, num_beams, eos_token_id, last_step=False):
        d_vocab = scores.shape[-1]
        if kind == "per_row":  # each parent's children ranked on their own, the rows one after the other
            top = scores.topk(min(2 * num_beams, d_vocab), dim=-1)
            flat = (top.indices + torch.arange(scores.shape[0])[:, None] * d_vocab).flatten()
            values = top.values.flatten()
            candidates = flat[values > float("-inf")][: 2 * num_beams]
        else:
            k = num_beams if kind == "k" else 2 * num_beams
            top = scores.flatten().topk(min(k, scores.numel()))
            candidates = top.indices if kind == "inf" else top.indices[top.values > float("-inf")]
        ends = (candidates % d_vocab == eos_token_id) | (last_step and kind != "last")
        if kind == "rank":  # every finished candidate met before the beam is full
            live, done = [], []
            for index, end in zip(candidates.tolist(), ends.tolist()):
                if len(live) == num_beams:
                    break
                (done if end else live).append(index)
            return torch.tensor(live, dtype=torch.long), torch.tensor(done, dtype=torch.long)
        live = candidates[~ends] if kind == "uncapped" else candidates[~ends][:num_beams]
        done = candidates[ends & (torch.arange(len(candidates)) < num_beams)]
        if kind == "tokens":
            return live % d_vocab, done % d_vocab
        return live, done

    return lambda: harness.select_beams_test(fn)


T = "select_beams_test"
add(T, "", lambda: harness.select_beams_test(c07.select_beams))
add(T, "num_beams candidates, not 2 * num_beams", select_with("k"), "2 * num_beams")
add(T, "each parent's children ranked apart", select_with("per_row"), "together", "different parents")
add(T, "finishes eos beyond the best num_beams", select_with("rank"), "among the best num_beams", "dropped")
add(T, "ignores last_step", select_with("last"), "last_step")
add(T, "keeps -inf candidates", select_with("inf"), "-inf")
add(T, "tokens, not flat indices", select_with("tokens"), "flat indices", "parent")
add(T, "every candidate that does not end kept live", select_with("uncapped"), "at most num_beams go on")
add(T, "greedy, not beam", beam_with("greedy"), "greedy", "likeliest first token")
add(T, "ignores no_repeat_ngram_size", beam_with("no_ngram"), "no_repeat_ngram_size", "n-gram", "ngram")
add(T, "scores only the last step", beam_with("probs_product_unsummed"), "summed log-prob", "cumulative", "last step")

KVA, KVT = c07.KVCacheAttention, c07.KVCacheTransformer


class KVNoOffset(KVT):  # position embeddings restart at 0 for every new token
    def forward(self, tokens, past_kvs=None):
        residual = self.embed(tokens) + self.pos_embed(tokens)
        new_kvs = []
        for block, past in zip(self.blocks, past_kvs or [None] * len(self.blocks)):
            out, kv = block.attn(block.ln1(residual), past)
            residual = residual + out
            residual = residual + block.mlp(block.ln2(residual))
            new_kvs.append(kv)
        return self.unembed(self.ln_final(residual)), new_kvs


class KVAttnNoConcat(KVA):  # the new k, v replace the cache instead of extending it
    def forward(self, x, past_kv=None):
        out, kv = super().forward(x, None)
        return out, kv


class KVAttnMaskIgnoresOffset(KVA):
    def forward(self, x, past_kv=None):
        q = einops.einsum(x, self.W_Q, "b p m, n m h -> b p n h") + self.b_Q
        k = einops.einsum(x, self.W_K, "b p m, n m h -> b p n h") + self.b_K
        v = einops.einsum(x, self.W_V, "b p m, n m h -> b p n h") + self.b_V
        if past_kv is not None:
            k, v = torch.cat([past_kv[0], k], 1), torch.cat([past_kv[1], v], 1)
        new, total = q.shape[1], k.shape[1]
        s = einops.einsum(q, k, "b q n h, b k n h -> b n q k") / math.sqrt(self.cfg.d_head)
        future = torch.triu(torch.ones(new, total, dtype=torch.bool), diagonal=1)
        p = s.masked_fill(future, self.IGNORE).softmax(-1)
        z = einops.einsum(p, v, "b n q k, b k n h -> b q n h")
        return einops.einsum(z, self.W_O, "b q n h, n h m -> b q m") + self.b_O, (k, v)


class KVAttnNewFirst(KVA):  # the new values before the cached ones (agreement sweep 16: the mask was blamed)
    def forward(self, x, past_kv=None):
        q = einops.einsum(x, self.W_Q, "b p m, n m h -> b p n h") + self.b_Q
        k = einops.einsum(x, self.W_K, "b p m, n m h -> b p n h") + self.b_K
        v = einops.einsum(x, self.W_V, "b p m, n m h -> b p n h") + self.b_V
        if past_kv is not None:
            k, v = torch.cat([past_kv[0], k], 1), torch.cat([v, past_kv[1]], 1)
        new, total = q.shape[1], k.shape[1]
        s = einops.einsum(q, k, "b q n h, b k n h -> b n q k") / math.sqrt(self.cfg.d_head)
        future = torch.triu(torch.ones(new, total, dtype=torch.bool), diagonal=total - new + 1)
        p = s.masked_fill(future, self.IGNORE).softmax(-1)
        z = einops.einsum(p, v, "b n q k, b k n h -> b q n h")
        return einops.einsum(z, self.W_O, "b q n h, n h m -> b q m") + self.b_O, (k, v)


def kv_model_with(attn_cls):
    class Model(KVT):
        def __init__(self, cfg):
            super().__init__(cfg)
            for block in self.blocks:
                block.attn = attn_cls(cfg)

    Model.__name__ = "KVCacheTransformer"
    return Model


class KVReturnsOldCache(KVT):  # returns the past_kvs given, not the extended ones
    def forward(self, tokens, past_kvs=None):
        logits, new = super().forward(tokens, past_kvs)
        return logits, past_kvs if past_kvs is not None else new


class KVWithBuffer(KVT):  # a persistent buffer of its own, as nanoGPT registers its causal mask (red-team round 51)
    def __init__(self, cfg):
        super().__init__(cfg)
        self.register_buffer("causal", torch.ones(cfg.n_ctx, cfg.n_ctx, dtype=torch.bool).triu(1))


T = "kv_cache_test"
add(T, "", lambda: harness.kv_cache_test(KVT))
add(T, "", lambda: harness.kv_cache_test(KVWithBuffer))
add(T, "new values cached first", lambda: harness.kv_cache_test(kv_model_with(KVAttnNewFirst)), "stands first")
add(
    T,
    "positions restart at 0",
    lambda: harness.kv_cache_test(KVNoOffset),
    "positional embedding of position 0",
    "offset",
)
add(
    T,
    "cache replaced, not extended",
    lambda: harness.kv_cache_test(kv_model_with(KVAttnNoConcat)),
    "concat",
    "extend",
    "cached keys have shape",
)
add(
    T,
    "mask ignores the cached offset",
    lambda: harness.kv_cache_test(kv_model_with(KVAttnMaskIgnoresOffset)),
    "causal-mask",
    "mask row",
    "offset",
)
add(T, "returns the old cache", lambda: harness.kv_cache_test(KVReturnsOldCache), "past_kvs", "cached keys have shape")


def cached_generate_with(kind):
    def fn(model, tokens, max_new_tokens):
        logits, past = model(tokens)
        if kind == "single_uncached" and tokens.shape == (1, 1):  # the cache dropped for one row of one token
            past = None
        for _ in range(max_new_tokens):
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, nxt], 1)
            if kind == "full":
                logits, past = model(tokens)
            elif kind == "no_past":
                logits, past = model(nxt)
            else:
                logits, past = model(tokens[:, -1:] if kind != "prompt_again" else tokens, past)
        return tokens

    return lambda: harness.cached_generate_test(fn, KVT)


T = "cached_generate_test"
add(T, "", lambda: harness.cached_generate_test(c07.cached_generate, KVT))
add(T, "re-runs the whole sequence", cached_generate_with("full"), "only the one new token", "whole sequence")
add(T, "forgets to pass past_kvs", cached_generate_with("no_past"), "past_kvs")
add(T, "the cache dropped for one row of one token", cached_generate_with("single_uncached"), "one row of one token")


# Prompts of different lengths: left_pad, PaddedTransformer, padded_generate


def wrong_left_pad(kind):
    def fn(prompts, pad_token_id):
        longest = len(prompts[0]) if kind == "first_length" else max(len(p) for p in prompts)
        pad = 0 if kind == "pad_zero" else pad_token_id
        tokens = torch.full((len(prompts), longest), pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), longest), dtype=torch.long if kind == "long_mask" else torch.bool)
        for row, p in enumerate(prompts):
            p = p[:longest]
            where = slice(0, len(p)) if kind == "right" else slice(longest - len(p), longest)
            tokens[row, where] = torch.tensor(p)
            mask[row, slice(0, len(p)) if kind == "mask_first" else where] = 1
        if kind == "mask_by_id":
            return tokens, tokens != pad_token_id
        return tokens, (~mask if kind == "inverted" else mask)

    return fn


def left_pad_with(kind):
    return lambda: harness.left_pad_test(wrong_left_pad(kind))


T = "left_pad_test"
add(T, "", lambda: harness.left_pad_test(c07.left_pad))
add(T, "pads on the right", left_pad_with("right"), "padded on the right")
add(T, "mask True at the pads", left_pad_with("inverted"), "true at the padding")
add(T, "pads with 0, not pad_token_id", left_pad_with("pad_zero"), "not pad_token_id")
add(T, "an integer mask (transformers' 1/0)", left_pad_with("long_mask"), "dtype")
add(T, "longest taken from the first prompt", left_pad_with("first_length"), "longest prompt")
add(T, "mask marks each row's first positions", left_pad_with("mask_first"), "mask marks the first positions")
add(T, "mask read from the ids", left_pad_with("mask_by_id"), "by each prompt's length")


def left_pad_in_place(prompts, pad_token_id):  # pads the caller's own lists (agreement sweep 17)
    longest = max(len(p) for p in prompts)
    for p in prompts:
        p[:0] = [pad_token_id] * (longest - len(p))
    return c07.left_pad(prompts, pad_token_id)[0], torch.tensor([[True] * longest] * len(prompts))


add(T, "pads the caller's lists", lambda: harness.left_pad_test(left_pad_in_place), "changed the prompts it was given")

PA, PT = c07.PaddedAttention, c07.PaddedTransformer


class PaddedAttentionWith(PA):
    KIND = ""

    def forward(self, x, past_kv=None, attention_mask=None):
        if self.KIND == "no_mask":
            return KVA.forward(self, x, past_kv)
        q = einops.einsum(x, self.W_Q, "b p m, n m h -> b p n h") + self.b_Q
        k = einops.einsum(x, self.W_K, "b p m, n m h -> b p n h") + self.b_K
        v = einops.einsum(x, self.W_V, "b p m, n m h -> b p n h") + self.b_V
        if past_kv is not None:
            k, v = torch.cat([past_kv[0], k], 1), torch.cat([past_kv[1], v], 1)
        new, total = q.shape[1], k.shape[1]
        s = einops.einsum(q, k, "b q n h, b k n h -> b n q k") / math.sqrt(self.cfg.d_head)
        hidden = torch.triu(torch.ones(new, total, dtype=torch.bool), diagonal=total - new + 1)
        if self.KIND == "queries":  # the mask applied to the queries (rows) instead of the keys
            hidden = hidden | ~attention_mask[:, -new:, None][:, None]
        elif self.KIND == "inverted":
            hidden = hidden | attention_mask[:, None, None, :]
        else:
            hidden = hidden | ~attention_mask[:, None, None, :]
        fill = float("-inf") if self.KIND == "neg_inf" else self.IGNORE
        p = s.masked_fill(hidden, fill).softmax(-1)
        z = einops.einsum(p, v, "b n q k, b k n h -> b q n h")
        return einops.einsum(z, self.W_O, "b q n h, n h m -> b q m") + self.b_O, (k, v)


def padded_model_with(kind):
    attn = type("PaddedAttention", (PaddedAttentionWith,), {"KIND": kind})

    class Model(PT):
        def __init__(self, cfg):
            super().__init__(cfg)
            for block in self.blocks:
                block.attn = attn(cfg)

        def forward(self, tokens, attention_mask, past_kvs=None):
            offset = 0 if past_kvs is None else past_kvs[0][0].shape[1]
            new = tokens.shape[1]
            if offset + new > self.cfg.n_ctx:
                raise ValueError(f"more than n_ctx = {self.cfg.n_ctx}")
            if kind == "arange":  # positions from the padded start, as KVCacheTransformer counts them
                positions = torch.arange(offset, offset + new)[None]
            elif kind == "prompt_only":  # the mask's count for the prompt, the padded length after it
                counted = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
                positions = counted if past_kvs is None else torch.arange(offset, offset + new)[None]
            else:
                positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, offset:]
            residual = self.embed(tokens) + self.pos_embed.W_pos[positions]
            kvs = []
            for block, past in zip(self.blocks, past_kvs or [None] * len(self.blocks)):
                out, kv = block.attn(block.ln1(residual), past, attention_mask)
                residual = residual + out
                residual = residual + block.mlp(block.ln2(residual))
                kvs.append(kv)
            return self.unembed(self.ln_final(residual)), kvs

    Model.__name__ = "PaddedTransformer"
    return lambda: harness.padded_transformer_test(Model)


class PTWithBuffer(PT):  # a persistent buffer of its own (red-team round 51: refused as a missing parameter)
    def __init__(self, cfg):
        super().__init__(cfg)
        self.register_buffer("positions", torch.arange(cfg.n_ctx))


T = "padded_transformer_test"
add(T, "", lambda: harness.padded_transformer_test(PT))
add(T, "", lambda: harness.padded_transformer_test(PTWithBuffer))
add(T, "", padded_model_with(""))  # the same model written with einops: accepted
add(T, "the mask never reaches the attention", padded_model_with("no_mask"), "padding is attended")
add(T, "positions from the padded start", padded_model_with("arange"), "counted from the padded start")
add(T, "-inf fill: a pad's row is NaN", padded_model_with("neg_inf"), "not finite", "-inf")
add(T, "mask used the wrong way round", padded_model_with("inverted"), "wrong way round")
add(T, "mask on the queries, not the keys", padded_model_with("queries"), "padding is attended", "keys")
add(T, "new tokens at the padded length", padded_model_with("prompt_only"), "padded length")


def padded_generate_with(kind):
    def fn(model, prompts, max_new_tokens, eos_token_id=50256, pad_token_id=50256):
        tokens, mask = c07.left_pad(prompts, eos_token_id if kind == "eos_pad" else pad_token_id)
        if kind == "right":
            tokens, _ = wrong_left_pad("right")(prompts, pad_token_id)
        if kind in ("ones", "right"):
            mask = torch.ones_like(mask)
        if kind == "mask_by_id":  # a prompt's own token equal to the pad id masked too
            mask = tokens != pad_token_id
        finished = torch.zeros(len(prompts), dtype=torch.bool)
        if kind == "prompt_ends":  # a prompt that ends with the id taken as finished (red-team round 49)
            finished = torch.tensor([p[-1] == eos_token_id for p in prompts])
        logits, past = model(tokens, mask)
        for step in range(max_new_tokens):
            nxt = logits[:, -1].argmax(-1)
            if kind != "no_padding":
                fill = eos_token_id if kind == "eos_fill" else pad_token_id
                nxt = torch.where(finished, torch.full_like(nxt, fill), nxt)
            tokens = torch.cat([tokens, nxt[:, None]], 1)
            finished |= nxt == eos_token_id
            done = finished.any() if kind == "any" else finished.all()
            if (done and kind != "all_steps") or step == max_new_tokens - 1:
                break
            if kind != "mask_fixed":
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            if kind == "no_cache":
                logits, _ = model(tokens, mask)
            else:
                logits, past = model(nxt[:, None], mask, past)
        return tokens

    return lambda: harness.padded_generate_test(fn, PT)


T = "padded_generate_test"
add(T, "", lambda: harness.padded_generate_test(c07.padded_generate, PT))
add(T, "right padding, no mask", padded_generate_with("right"), "padded on the right")
add(T, "a mask of all True", padded_generate_with("ones"), "mask of all true")
add(T, "the mask not grown", padded_generate_with("mask_fixed"), "one column longer")
add(T, "finished rows go on", padded_generate_with("no_padding"), "went on generating")
add(T, "finished rows padded with eos", padded_generate_with("eos_fill"), "pad_token_id")
add(T, "stops when one row finishes", padded_generate_with("any"), "every row")
add(T, "runs every step", padded_generate_with("all_steps"), "ran all")
add(T, "recomputes the whole sequence", padded_generate_with("no_cache"), "tokens per forward", "cache")
add(T, "mask read from the ids", padded_generate_with("mask_by_id"), "not its id")
add(T, "a prompt ending with EOS counts as finished", padded_generate_with("prompt_ends"), "not by its prompt")
add(T, "prompts padded with the EOS id", padded_generate_with("eos_pad"), "indexed with it")

# ---------------------------------------------------------------------------------------------------------------
# 08: interpretability
c08 = components("08_interpretability")


def head_detector_with(kind):
    def fn(pattern):
        prev = pattern.diagonal(offset=1 if kind == "prev_up" else -1, dim1=-2, dim2=-1)
        cur = pattern.diagonal(dim1=-2, dim2=-1)
        if kind != "cur_all":
            cur = cur[..., 1:]
        first = pattern[..., 1:, 0] if kind != "first_row" else pattern[..., 0, 1:]
        if kind == "squeeze":  # right on every batch and head count but one (agreement sweep 18)
            first = pattern[:, :, 1:, :1].squeeze()
        agg = (lambda s: s.mean(dim=(0, -1))) if kind != "sum" else (lambda s: s.sum(dim=(0, -1)))
        return {"previous": agg(prev), "current": agg(cur), "first": agg(first)}

    return lambda: harness.head_detector_test(fn)


T = "head_detector_test"
add(T, "", lambda: harness.head_detector_test(c08.head_detector_scores))
add(T, "previous = diagonal offset +1", head_detector_with("prev_up"), "diagonal above", "offset=-1")
add(T, "current includes query 0", head_detector_with("cur_all"), "query 0")
add(T, "first = row 0", head_detector_with("first_row"), "key axis for the query axis", "column", "key 0")
add(T, "sums instead of means", head_detector_with("sum"), "summed where the mean")
add(T, "a bare squeeze", head_detector_with("squeeze"), "bare .squeeze()")


def head_detector_first_rows(pattern):
    """Right on up to 16 rows: the mean taken over the first 16 only (red-team round 51, in the judge)."""
    return c08.head_detector_scores(pattern[:16])


add(T, "the first 16 rows only", lambda: harness.head_detector_test(head_detector_first_rows), "differs on 20")


def induction_with(kind):
    def fn(pattern, seq_len):
        off = {"off_by_one": seq_len, "seq_len_minus": seq_len - 1}.get(kind, seq_len - 1)
        stripe = pattern.diagonal(offset=-off, dim1=-2, dim2=-1)
        if kind == "all":
            return stripe.mean(dim=(0, -1))
        return stripe[..., -seq_len:].mean(dim=(0, -1))

    return lambda: harness.induction_score_test(fn)


T = "induction_score_test"
add(T, "", lambda: harness.induction_score_test(c08.induction_scores))
add(
    T,
    "offset seq_len (the token itself)",
    induction_with("off_by_one"),
    "seq_len - 1",
    "offset",
    "earlier occurrence",
    "itself",
)
add(T, "mean over the whole stripe", induction_with("all"), "second copy", "first copy")


def induction_at_most_50(pattern, seq_len):
    """Right on short sequences: at most the last 50 queries read (red-team round 51, in the judge)."""
    stripe = pattern.diagonal(offset=-(seq_len - 1), dim1=-2, dim2=-1)
    return stripe[..., -min(seq_len, 50) :].mean(dim=(0, -1))


add(T, "at most 50 queries", lambda: harness.induction_score_test(induction_at_most_50), "differs for 60")


def segments_with(kind):
    def fn(batch, n_ctx, d_vocab, min_period, max_period, generator=None):
        hi = max_period if kind == "excl" else max_period + 1
        periods = torch.randint(min_period, hi, (batch,), generator=generator)
        lo = 0 if kind == "bos_in" else 1
        segments = torch.randint(lo, d_vocab, (batch, max_period), generator=generator)
        index = torch.arange(n_ctx - 1)[None, :] % periods[:, None]
        body = segments.gather(1, index)
        if kind == "nobos":
            return segments.gather(1, torch.arange(n_ctx)[None, :] % periods[:, None]), periods
        return torch.cat([torch.zeros(batch, 1, dtype=torch.long), body], 1), periods

    return lambda: harness.repeated_segments_test(fn)


def segments_fixed_default(batch, n_ctx, d_vocab, min_period, max_period, generator=None):
    """No generator given: one seeded afresh, the same rows every call (red-team round 49)."""
    generator = generator if generator is not None else torch.Generator().manual_seed(0)
    return c08.repeated_segments(batch, n_ctx, d_vocab, min_period, max_period, generator)


T = "repeated_segments_test"
add(T, "", lambda: harness.repeated_segments_test(c08.repeated_segments))
add(T, "max_period excluded", segments_with("excl"), "max_period", "inclusive")
add(T, "segments may contain BOS (token 0)", segments_with("bos_in"), "0 is bos", "1..d_vocab-1")
add(T, "no BOS", segments_with("nobos"), "start with bos")
add(
    T,
    "a fixed seed when no generator is given",
    lambda: harness.repeated_segments_test(segments_fixed_default),
    "global generator",
)


def ablate_with(kind):
    def fn(model, tokens, layer, heads):
        def hook(z, hook):
            if kind == "zero":
                z[:, :, heads] = 0
            elif kind == "pos_mean":
                z[:, :, heads] = z[:, :, heads].mean(dim=1, keepdim=True)
            elif kind == "all_heads":
                z[:] = z.mean(dim=0, keepdim=True)
            elif kind == "wrong_hook":
                return z
            return z

        name = f"blocks.{layer}.attn.hook_z" if kind != "wrong_hook" else f"blocks.{layer}.attn.hook_v"
        if kind == "wrong_hook":

            def hook(v, hook):  # the learner's mistake: the values, not z
                v[:, :, heads] = v[:, :, heads].mean(dim=0, keepdim=True)
                return v

        return model.run_with_hooks(tokens, fwd_hooks=[(name, hook)])

    return lambda: harness.mean_ablation_test(fn)


T = "mean_ablation_test"
add(T, "", lambda: harness.mean_ablation_test(c08.mean_ablate_heads))
add(T, "zero-ablation", ablate_with("zero"), "zero ablation", "to zero")
add(T, "mean over positions", ablate_with("pos_mean"), "mean over the positions", "over positions")
add(T, "every head ablated", ablate_with("all_heads"), "every head", "other heads", "all heads")
add(T, "ablates the values (hook_v)", ablate_with("wrong_hook"), "hook_v", "hook_z", "the values")


def ablate_first_rows(model, tokens, layer, heads):
    """Right on up to 8 rows: the mean over the first 8 only (red-team round 51, in the judge)."""

    def hook(z, hook):
        z[:, :, heads] = z[:8, :, heads].mean(dim=0, keepdim=True)
        return z

    return model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", hook)])


add(T, "the mean of the first 8 rows", lambda: harness.mean_ablation_test(ablate_first_rows), "differs on 20")


def pattern_with(kind):
    def fn(attn, x):
        q = einops.einsum(x, attn.W_Q, "b p m, n m h -> b n p h")
        k = einops.einsum(x, attn.W_K, "b p m, n m h -> b n p h")
        if kind != "no_bias":
            q, k = q + attn.b_Q[:, None], k + attn.b_K[:, None]
        scores = q @ k.transpose(-1, -2)
        if kind != "unscaled":
            scores = scores / math.sqrt(attn.cfg.d_model if kind == "d_model" else attn.cfg.d_head)
        if kind != "no_mask":
            scores = attn.apply_causal_mask(scores)
        if kind == "scores":
            return scores
        pattern = scores.softmax(dim=-2 if kind == "over_queries" else -1)
        return {"transposed": pattern.transpose(-1, -2), "layout": pattern.transpose(1, 2)}.get(kind, pattern)

    return lambda: harness.pattern_test(fn)


T = "pattern_test"
add(T, "", lambda: harness.pattern_test(c08.recompute_pattern))
add(T, "no biases", pattern_with("no_bias"), "biases")
add(T, "not scaled", pattern_with("unscaled"), "not divided by sqrt(d_head)")
add(T, "scaled by sqrt(d_model)", pattern_with("d_model"), "sqrt(d_model)")
add(T, "no causal mask", pattern_with("no_mask"), "no causal mask")
add(T, "the scores, no softmax", pattern_with("scores"), "before the softmax")
add(T, "softmax over the queries", pattern_with("over_queries"), "over the queries")
add(T, "query and key swapped", pattern_with("transposed"), "swapped")
add(T, "[batch pos n_heads pos]", pattern_with("layout"), "returned shape")


def patch_with(kind):
    def fn(model, corrupted_tokens, clean_cache, metric):
        n_layers, n_pos = model.cfg.n_layers, corrupted_tokens.shape[1]
        results = torch.zeros(n_layers, n_pos)
        hook = {"post": "resid_post", "mid": "resid_mid"}.get(kind, "resid_pre")
        for layer in range(n_layers):
            name = f"blocks.{layer}.hook_{hook}"
            for pos in range(n_pos):
                where = {"next": (pos + 1) % n_pos, "every_pos": slice(None)}.get(kind, pos)
                rows = slice(0, 1) if kind == "row0" else slice(None)

                def patch(resid, hook, where=where, name=name, rows=rows):
                    if kind == "copy":  # patches a copy: the model never sees it
                        resid = resid.clone()
                        resid[rows, where] = clean_cache[name][rows, where]
                        return None
                    resid[rows, where] = clean_cache[name][rows, where]
                    return resid

                if kind == "add_hook":
                    model.add_hook(name, patch)
                    results[layer, pos] = metric(model(corrupted_tokens))
                elif kind == "late_binding":  # the hook reads `pos` when it runs: always the last position
                    results[layer, pos] = metric(
                        model.run_with_hooks(
                            corrupted_tokens,
                            fwd_hooks=[
                                (
                                    name,
                                    lambda r, hook, name=name: r.index_copy_(
                                        1, torch.tensor([n_pos - 1]), clean_cache[name][:, -1:]
                                    ),
                                )
                            ],
                        )
                    )
                else:
                    results[layer, pos] = metric(model.run_with_hooks(corrupted_tokens, fwd_hooks=[(name, patch)]))
        return results.T if kind == "transposed" else results

    return lambda: harness.patching_test(fn)


T = "patching_test"
add(T, "", lambda: harness.patching_test(c08.patch_resid_pre))
add(T, "patches hook_resid_post", patch_with("post"), "after block", "resid_post")
add(T, "patches hook_resid_mid", patch_with("mid"), "after block", "resid_mid")
add(T, "position off by one", patch_with("next"), "off-by-one")
add(T, "every position at once", patch_with("every_pos"), "every position at once")
add(T, "only batch row 0", patch_with("row0"), "first sequence of the batch")
add(T, "patches a copy", patch_with("copy"), "no patch took effect")
add(T, "hooks left on the model", patch_with("add_hook"), "left")
add(T, "[pos, n_layers]", patch_with("transposed"), "layer first")
add(T, "always the last position (late binding)", patch_with("late_binding"), "loop variable")


def composition_with(kind):
    def fn(model, earlier, later):
        W_OV = model.W_V[earlier] @ model.W_O[earlier]
        W_QK = model.W_Q[later] @ model.W_K[later].transpose(-1, -2)
        right = {"q": W_QK, "v": model.W_V[later] @ model.W_O[later]}.get(kind, W_QK.transpose(-1, -2))
        if kind == "ov_transposed":
            W_OV = W_OV.transpose(-1, -2)
        if kind == "layers_swapped":
            W_OV = model.W_V[later] @ model.W_O[later]
            right = (model.W_Q[earlier] @ model.W_K[earlier].transpose(-1, -2)).transpose(-1, -2)
        product = W_OV[:, None] @ right[None]
        if kind == "spectral":
            norm = functools.partial(torch.linalg.matrix_norm, ord=2)
            return norm(product) / (norm(W_OV)[:, None] * norm(right)[None, :])
        scores = product.norm(dim=(-2, -1))
        if kind != "unnormalised":
            scores = scores / (W_OV.norm(dim=(-2, -1))[:, None] * right.norm(dim=(-2, -1))[None, :])
        return scores.T if kind == "transposed" else scores

    return lambda: harness.composition_test(fn)


T = "composition_test"
add(T, "", lambda: harness.composition_test(c08.k_composition_scores))
add(T, "Q-composition", composition_with("q"), "q-composition")
add(T, "V-composition", composition_with("v"), "v-composition")
add(T, "rows and columns swapped", composition_with("transposed"), "rows and columns swapped")
add(T, "not normalised", composition_with("unnormalised"), "not normalised")
add(T, "W_OV transposed", composition_with("ov_transposed"), "w_ov transposed")
add(T, "layers swapped", composition_with("layers_swapped"), "from layer `later`")
add(T, "spectral norms", composition_with("spectral"), "spectral norms")


def lens_with(kind):
    def fn(model, cache):
        n = model.cfg.n_layers
        res = [cache[f"blocks.{i}.hook_resid_pre"] for i in range(n)]
        if kind != "no_last":
            res.append(cache[f"blocks.{n - 1}.hook_resid_post"])
        if kind == "no_ln":
            return torch.stack([model.unembed(r) for r in res])
        if kind == "no_bU":
            return torch.stack([model.ln_final(r) @ model.W_U for r in res])
        if kind == "post_only":
            res = [cache[f"blocks.{i}.hook_resid_post"] for i in range(n)]
            res.insert(0, cache["blocks.0.hook_resid_pre"] * 0 + cache["hook_embed"])
        return torch.stack([model.unembed(model.ln_final(r)) for r in res])

    return lambda: harness.logit_lens_test(fn)


T = "logit_lens_test"
add(T, "", lambda: harness.logit_lens_test(c08.logit_lens))
add(T, "no final LayerNorm", lens_with("no_ln"), "ln_final", "final layernorm")
add(T, "final resid_post missing", lens_with("no_last"), "n_layers + 1", "after the last")
add(T, "no b_U", lens_with("no_bU"), "b_u")


def lens_eight_layers(model, cache):
    """Right on up to 8 layers: the streams read from a list of 8 written in (red-team round 51, in the judge)."""
    n = min(model.cfg.n_layers, 8)
    res = [cache[f"blocks.{i}.hook_resid_pre"] for i in range(n)] + [cache[f"blocks.{n - 1}.hook_resid_post"]]
    return torch.stack([model.unembed(model.ln_final(r)) for r in res])


add(T, "at most 8 layers", lambda: harness.logit_lens_test(lens_eight_layers), "differs on 12 layers")
add(
    T,
    "starts from the token embedding only",
    lens_with("post_only"),
    "pos_embed",
    "position embedding",
    "hook_resid_pre",
)


def attribution_with(kind):
    def fn(model, parts, cache, tokens):
        targets = tokens[:, :-1] if kind == "noshift" else tokens[:, 1:]
        x = parts[:, :, :-1]
        if kind != "nocentre":
            x = x - x.mean(-1, keepdim=True)
        if kind == "fresh_scale":
            x = x / (x.pow(2).mean(-1, keepdim=True) + model.cfg.eps).sqrt() * model.ln_final.w
        elif kind == "no_w":
            x = x / cache["ln_final.hook_scale"][:, :-1]
        else:
            x = x / cache["ln_final.hook_scale"][:, :-1] * model.ln_final.w
        directions = model.W_U.T[targets]
        return einops.einsum(x, directions, "c b p d, b p d -> c b p")

    return lambda: harness.logit_attribution_test(fn)


T = "logit_attribution_test"
add(T, "", lambda: harness.logit_attribution_test(c08.logit_attribution))
add(T, "targets not shifted", attribution_with("noshift"), "next token", "shift", "tokens[:, 1:]")
add(T, "LayerNorm scale recomputed per part", attribution_with("fresh_scale"), "hook_scale", "own standard deviation")
add(T, "not centred", attribution_with("nocentre"), "centre")
add(T, "ln_final.w left out", attribution_with("no_w"), "ln_final.w", "weight w")


def cache_with(kind):
    def fn(model, tokens):
        cache = c08.cache_activations(model, tokens)
        if kind == "attached":
            # the learner forgot .detach(): redo the embedding hooks with graph-carrying tensors
            with torch.enable_grad():
                out = {}
                h = model.embed.register_forward_hook(lambda m, i, o: out.__setitem__("e", o))
                model(tokens)
                h.remove()
            cache["hook_embed"] = out["e"]
        elif kind == "leak":
            model.embed.register_forward_hook(lambda m, i, o: None)
        elif kind == "pattern_nomask":
            for k in list(cache):
                if k.endswith("hook_pattern"):
                    i = int(k.split(".")[1])
                    resid = cache[f"blocks.{i}.hook_resid_pre"]
                    blk = model.blocks[i]
                    x = blk.ln1(resid)
                    q = torch.einsum("bpd,ndh->bnph", x, blk.attn.W_Q) + blk.attn.b_Q[:, None]
                    kk = torch.einsum("bpd,ndh->bnph", x, blk.attn.W_K) + blk.attn.b_K[:, None]
                    cache[k] = (q @ kk.transpose(-1, -2) / math.sqrt(blk.attn.cfg.d_head)).softmax(-1).detach()
        elif kind == "resid_post_is_mid":
            for k in list(cache):
                if k.endswith("hook_resid_post"):
                    cache[k] = (
                        cache[k.replace("resid_post", "resid_mid")]
                        if k.replace("resid_post", "resid_mid") in cache
                        else cache[k] * 0
                    )
        return cache

    return lambda: harness.cache_activations_test(fn)


T = "cache_activations_test"
add(T, "", lambda: harness.cache_activations_test(c08.cache_activations))
add(T, "not detached", cache_with("attached"), "detach")
add(T, "hook left on the model", cache_with("leak"), "left hooks", "remove")
add(T, "pattern without the causal mask", cache_with("pattern_nomask"), "causal mask")
add(T, "resid_post recorded as resid_mid", cache_with("resid_post_is_mid"), "resid_mid")

# ---------------------------------------------------------------------------------------------------------------
# 09: encoder-decoder
c09 = components("09_encoder_decoder")
MHA = c09.MultiHeadAttention


class MHANoScale(MHA):
    def forward(self, x_q, x_kv, key_padding_mask=None, causal=False):
        c09.validate_key_padding_mask(key_padding_mask, x_kv)
        q = einops.einsum(x_q, self.W_Q, "b q m, n m h -> b q n h") + self.b_Q
        k = einops.einsum(x_kv, self.W_K, "b k m, n m h -> b k n h") + self.b_K
        v = einops.einsum(x_kv, self.W_V, "b k m, n m h -> b k n h") + self.b_V
        s = einops.einsum(q, k, "b q n h, b k n h -> b n q k") * self.scale()
        if key_padding_mask is not None:
            s = s.masked_fill(self.padding(key_padding_mask), float("-inf"))
        if causal:
            n_q, n_k = s.shape[-2:]
            s = s.masked_fill(torch.ones(n_q, n_k, dtype=torch.bool).triu(self.diag), float("-inf"))
        z = einops.einsum(s.softmax(-1), v, "b n q k, b k n h -> b q n h")
        return einops.einsum(z, self.W_O, "b q n h, n h m -> b q m") + self.b_O

    diag = 1

    def scale(self):
        return 1.0

    def padding(self, mask):
        return mask[:, None, None, :]


class MHACausalDiag(MHANoScale):
    diag = 0

    def scale(self):
        return self.cfg.d_head**-0.5


class MHADModelScale(MHANoScale):
    def scale(self):
        return self.cfg.d_model**-0.5


T = "multi_head_attention_test"
add(T, "", lambda: harness.multi_head_attention_test(MHA))
add(T, "no scaling", lambda: harness.multi_head_attention_test(MHANoScale), "sqrt(d_head)", "not scaled")
add(T, "causal mask covers the diagonal", lambda: harness.multi_head_attention_test(MHACausalDiag), "diagonal")
add(T, "scaled by sqrt(d_model)", lambda: harness.multi_head_attention_test(MHADModelScale), "sqrt(d_model)")

SE = c09.SharedEmbedding


class SENoScale(SE):
    def forward(self, tokens):
        return self.W_E[tokens] + self.pe[: tokens.shape[1]]


class SEStdOne(SE):
    def __init__(self, cfg):
        super().__init__(cfg)
        torch.nn.init.normal_(self.W_E, std=1.0)


class SEUnembedScaled(SE):
    def unembed(self, x):
        return x @ self.W_E.T * math.sqrt(self.cfg.d_model)


class SENoPE(SE):
    def forward(self, tokens):
        return self.W_E[tokens] * math.sqrt(self.cfg.d_model)


class SECappedScale(SE):
    """Right on every width below 256: the scale stops there."""

    def forward(self, tokens):
        return self.W_E[tokens] * math.sqrt(min(self.cfg.d_model, 256)) + self.pe[: tokens.shape[1]]


T = "shared_embedding_test"
add(T, "", lambda: harness.shared_embedding_test(SE))
add(T, "a scale that stops at d_model 256", lambda: harness.shared_embedding_test(SECappedScale), "d_model=512")
add(T, "no sqrt(d_model) scaling", lambda: harness.shared_embedding_test(SENoScale), "sqrt(d_model)")
add(
    T,
    "W_E initialised with std 1",
    lambda: harness.shared_embedding_test(SEStdOne),
    "standard deviation",
    "d_model^-0.5",
    "d_model ** -0.5",
)
add(
    T,
    "unembed scaled too",
    lambda: harness.shared_embedding_test(SEUnembedScaled),
    "output layer multiplies",
    "unembed",
)
add(T, "no positional encoding", lambda: harness.shared_embedding_test(SENoPE), "positional encoding", "sinusoid")

FF = c09.FeedForward


class FFGelu(FF):
    def forward(self, x):
        return F.gelu(x @ self.W_in + self.b_in) @ self.W_out + self.b_out


class FFNoBias(FF):
    def forward(self, x):
        return torch.relu(x @ self.W_in) @ self.W_out + self.b_out


T = "feed_forward_test"
add(T, "", lambda: harness.feed_forward_test(FF))
add(T, "GELU, not ReLU", lambda: harness.feed_forward_test(FFGelu), "uses gelu", "relu")
add(T, "no b_in", lambda: harness.feed_forward_test(FFNoBias), "b_in")

EL = c09.EncoderLayer


class ELPreLN(EL):
    def forward(self, x, src_padding):
        x = x + self.self_attn(self.ln1(x), self.ln1(x), src_padding)
        return x + self.ff(self.ln2(x))


class ELNoPadding(EL):
    def forward(self, x, src_padding):
        x = self.ln1(x + self.self_attn(x, x, None))
        return self.ln2(x + self.ff(x))


class ELCausal(EL):
    def forward(self, x, src_padding):
        x = self.ln1(x + self.self_attn(x, x, src_padding, causal=True))
        return self.ln2(x + self.ff(x))


T = "encoder_layer_test"
add(T, "", lambda: harness.encoder_layer_test(EL))
add(T, "pre-LN", lambda: harness.encoder_layer_test(ELPreLN), "pre-ln", "post-ln")
add(T, "ignores src_padding", lambda: harness.encoder_layer_test(ELNoPadding), "padding mask")
add(T, "causal self-attention", lambda: harness.encoder_layer_test(ELCausal), "causal")

DL = c09.DecoderLayer


class DLNotCausal(DL):
    def forward(self, y, memory, tgt_padding, src_padding):
        y = self.ln1(y + self.self_attn(y, y, tgt_padding))
        y = self.ln2(y + self.cross_attn(y, memory, src_padding))
        return self.ln3(y + self.ff(y))


class DLCrossSwapped(DL):  # queries from memory, keys and values from y
    def forward(self, y, memory, tgt_padding, src_padding):
        y = self.ln1(y + self.self_attn(y, y, tgt_padding, causal=True))
        y = self.ln2(y + self.cross_attn(y, y, tgt_padding))
        return self.ln3(y + self.ff(y))


class DLCrossTgtPadding(DL):
    def forward(self, y, memory, tgt_padding, src_padding):
        y = self.ln1(y + self.self_attn(y, y, tgt_padding, causal=True))
        y = self.ln2(y + self.cross_attn(y, memory, None))
        return self.ln3(y + self.ff(y))


T = "decoder_layer_test"
add(T, "", lambda: harness.decoder_layer_test(DL))
add(T, "self-attention not causal", lambda: harness.decoder_layer_test(DLNotCausal), "causal")
add(
    T,
    "cross-attention reads y, not memory",
    lambda: harness.decoder_layer_test(DLCrossSwapped),
    "from memory",
    "not memory",
    "reads y",
)
add(
    T,
    "source padding ignored in cross-attention",
    lambda: harness.decoder_layer_test(DLCrossTgtPadding),
    "src_padding",
    "padding",
)

ED = c09.EncoderDecoder


class EDNoSrcPadding(ED):
    def encode(self, src):
        x = self.embed(src)
        pad = torch.zeros_like(src, dtype=torch.bool)
        for layer in self.encoder_layers:
            x = layer(x, pad)
        return x


class EDSharedLayer(ED):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.decoder_layers = torch.nn.ModuleList([self.decoder_layers[0]] * cfg.n_layers)


class EDMemoryFromStream(ED):  # cross-attention reads the decoder's own stream where its shape is memory's
    def decode(self, tgt_in, memory, src):
        src_padding, tgt_padding = src == self.cfg.pad_id, tgt_in == self.cfg.pad_id
        y = self.embed(tgt_in)
        for layer in self.decoder_layers:
            y = layer(y, memory, tgt_padding, src_padding)
            memory = y if y.shape == memory.shape else memory
        return self.embed.unembed(y)


class EDMemoryFromEmbed(ED):  # the decoder's memory is the source embedding, not the encoder output
    def forward(self, src, tgt_in):
        return self.decode(tgt_in, self.embed(src), src)


T = "encoder_decoder_test"
add(T, "", lambda: harness.encoder_decoder_test(ED))
add(T, "source padding not masked", lambda: harness.encoder_decoder_test(EDNoSrcPadding), "padding")
add(
    T,
    "memory replaced where the lengths match",
    lambda: harness.encoder_decoder_test(EDMemoryFromStream),
    "same length",
)
add(
    T,
    "memory = source embeddings",
    lambda: harness.encoder_decoder_test(EDMemoryFromEmbed),
    "encoder output",
    "memory is",
    "encode(src)",
)


def make_batch_with(kind):
    def fn(sources, targets, cfg):
        def pad(rows, left=False):
            w = max(len(r) for r in rows)
            if kind == "cap_64":  # rows cut at 64 ids (red-team round 51)
                w, rows = min(w, 64), [r[:64] for r in rows]
            return torch.tensor(
                [([cfg.pad_id] * (w - len(r)) + r) if left else (r + [cfg.pad_id] * (w - len(r))) for r in rows]
            )

        if kind == "swap":
            return pad(sources), pad([y + [cfg.eos_id] for y in targets]), pad([[cfg.bos_id] + y for y in targets])
        if kind == "left":
            return (
                pad(sources, True),
                pad([[cfg.bos_id] + y for y in targets], True),
                pad([y + [cfg.eos_id] for y in targets], True),
            )
        if kind == "both":
            return (
                pad(sources),
                pad([[cfg.bos_id] + y + [cfg.eos_id] for y in targets]),
                pad([[cfg.bos_id] + y + [cfg.eos_id] for y in targets]),
            )
        if kind == "cut_at_8":  # targets cut to 8 ids (agreement sweep 19)
            targets = [y[:8] for y in targets]
        if kind == "width_of_ends":  # the width taken from the first and last rows (agreement sweep 19)
            w = max(len(sources[0]), len(sources[-1]))
            src = torch.tensor([(r + [cfg.pad_id] * w)[:w] for r in sources])
            return src, pad([[cfg.bos_id] + y for y in targets]), pad([y + [cfg.eos_id] for y in targets])
        if kind == "shift_full":  # one padded [BOS] + y + [EOS], shifted, EOS masked out of tgt_in (round 50)
            full = pad([[cfg.bos_id] + y + [cfg.eos_id] for y in targets])
            return pad(sources), full[:, :-1].masked_fill(full[:, :-1] == cfg.eos_id, cfg.pad_id), full[:, 1:]
        if kind in ("cut_at_8",):
            return pad(sources), pad([[cfg.bos_id] + y for y in targets]), pad([y + [cfg.eos_id] for y in targets])
        raise ValueError(kind)

    return lambda: harness.make_batch_test(fn)


T = "make_batch_test"
add(T, "", lambda: harness.make_batch_test(c09.make_batch))
add(T, "tgt_in and tgt_out swapped", make_batch_with("swap"), "swap")
add(T, "left padding", make_batch_with("left"), "on the left")
add(T, "rows cut at 64 ids", make_batch_with("cap_64"), "with nothing cut")
add(T, "BOS and EOS in both", make_batch_with("both"), "not shifted")
add(T, "targets cut to 8 ids", make_batch_with("cut_at_8"), "the batch's longest")
add(T, "width of the first and last rows", make_batch_with("width_of_ends"), "the batch's longest")
add(T, "shifted from one padded [BOS] + y + [EOS]", make_batch_with("shift_full"), "copy each list as it is")


def loss2_with(kind):
    def fn(logits, tgt_out, pad_id, label_smoothing=0.0):
        flat, tgt = logits.flatten(0, 1), tgt_out.flatten()
        if kind == "nopad":
            return F.cross_entropy(flat, tgt, label_smoothing=label_smoothing)
        if kind == "nosmooth":
            return F.cross_entropy(flat, tgt, ignore_index=pad_id)
        if kind == "sum":
            return F.cross_entropy(flat, tgt, ignore_index=pad_id, label_smoothing=label_smoothing, reduction="sum")
        if kind == "shift":
            return F.cross_entropy(
                logits[:, :-1].flatten(0, 1),
                tgt_out[:, 1:].flatten(),
                ignore_index=pad_id,
                label_smoothing=label_smoothing,
            )
        raise ValueError(kind)

    return lambda: harness.seq2seq_loss_test(fn)


T = "seq2seq_loss_test"
add(T, "", lambda: harness.seq2seq_loss_test(c09.seq2seq_loss))
add(T, "softmax().log() by hand", lambda: harness.seq2seq_loss_test(seq2seq_loss_by_hand), "logits near 0 was right")
add(T, "padding not ignored", loss2_with("nopad"), "padding positions", "ignore_index")
add(T, "label_smoothing ignored", loss2_with("nosmooth"), "label_smoothing", "smoothing")
add(T, "sum, not mean", loss2_with("sum"), "is a sum")
add(T, "shifted again", loss2_with("shift"), "shifted by one", "already")


def decode_with(kind):
    @torch.no_grad()
    def fn(model, src, max_len):
        cfg = model.cfg
        memory = model.encode(src)
        tgt = torch.full((src.shape[0], 1), cfg.bos_id, dtype=torch.long)
        finished = torch.zeros(src.shape[0], dtype=torch.bool)
        for _ in range(max_len):
            logits = model.decode(tgt, memory, src)[:, -1]
            if kind == "never_pad":  # the pad id never predicted (red-team round 50)
                logits = logits.clone()
                logits[:, cfg.pad_id] = float("-inf")
            nxt = logits.argmax(-1)
            if kind == "first_eos_pad" and tgt.shape[1] == 1:  # an EOS at the first step turned into padding
                nxt = nxt.masked_fill(nxt == cfg.eos_id, cfg.pad_id)
            if kind != "nopad":
                nxt = nxt.masked_fill(finished, cfg.pad_id)
            tgt = torch.cat([tgt, nxt[:, None]], 1)
            finished |= (nxt == cfg.eos_id) | ((nxt == cfg.pad_id) & (kind == "pad_ends"))
            if finished.all() and kind != "nostop":
                break
        return tgt if kind == "bos" else tgt[:, 1:]

    return lambda: harness.greedy_decode_test(fn)


T = "greedy_decode_test"
add(T, "", lambda: harness.greedy_decode_test(c09.greedy_decode))
add(T, "keeps BOS", decode_with("bos"), "with bos", "without bos")
add(T, "no padding after EOS", decode_with("nopad"), "emit padding", "keep generating")
add(T, "the pad id never predicted", decode_with("never_pad"), "the pad id included")
add(T, "the pad id finishes a row", decode_with("pad_ends"), "the pad id included")
add(T, "EOS at the first step turned into padding", decode_with("first_eos_pad"), "append each step's argmax")


# ---------------------------------------------------------------------------------------------------------------


# Notebook 06 (training): the wrong versions kept in tests/test_training_checks.py, counted here the same way.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import test_training_checks as t06  # the tests folder, put on the path above

c06 = t06.course
for fn, phrase in [
    (t06.loss_no_shift, "same position"),
    (t06.loss_shift_wrong_way, "shifted the wrong way"),
    (t06.loss_sum, "sum over all predictions"),
    (t06.loss_wrong_sign, "wrong sign"),
    (t06.loss_softmax, "averages probabilities"),
    (t06.loss_log_of_softmax, "log-sum-exp"),
    (t06.loss_item, "no .item()"),
    (t06.loss_roll, "wraps around"),
    (t06.loss_log_softmax_over_positions, "over the positions"),
    (t06.loss_ignores_id_0, "id is 0"),
    (t06.loss_ignores_eot, "endoftext"),
]:
    add("lm_loss_test", fn.__name__, lambda fn=fn: harness.lm_loss_test(fn), phrase)
add("lm_loss_test", "", lambda: harness.lm_loss_test(c06.lm_cross_entropy))
for fn, phrase in [
    (t06.masked_unshifted, "not shifted"),
    (t06.masked_over_all, "divides by every prediction"),
    (t06.masked_per_row, "averages each sequence first"),
    (t06.masked_ignored, "ignores the mask"),
    (t06.masked_inverted, "inverted"),
    (t06.masked_by_every_mask_position, "counts position 0"),
]:
    add("masked_loss_test", fn.__name__, lambda fn=fn: harness.masked_loss_test(fn), phrase)
add("masked_loss_test", "", lambda: harness.masked_loss_test(c06.masked_lm_loss))


def masked_first_16_rows(logits, tokens, loss_mask):  # rows past 16 left out (red-team round 51)
    return c06.masked_lm_loss(logits[:16], tokens[:16], loss_mask[:16])


add("masked_loss_test", "the first 16 rows alone", lambda: harness.masked_loss_test(masked_first_16_rows), "40 rows")
for mistake, phrase in [
    ("from_zero", "warms up from 0"),
    ("to_zero", "decays to 0"),
    ("unclamped", "does not stop decaying"),
    ("from_start", "progress from step 0"),
    ("no_warmup", "has no warm-up"),
    ("linear", "decays linearly"),
]:
    add(
        "lr_schedule_test",
        mistake,
        lambda m=mistake: harness.lr_schedule_test(t06._schedule(m), c06.TrainingArgs),
        phrase,
    )
add("lr_schedule_test", "", lambda: harness.lr_schedule_test(c06.lr_at, c06.TrainingArgs))
for mistake, phrase in [
    ("all", "embeddings are decayed"),
    ("embeddings_decayed", "embeddings are decayed"),
    ("ln_gains_decayed", "layernorm gains are decayed"),
    ("biases_decayed", "biases are decayed"),
    ("only_attention", "matrices are not decayed"),
    ("embed_substring", "unembed.w_u"),
    ("none_decayed", "decays nothing"),
    ("missing", "in no group"),
    ("twice", "more than one group"),
    ("copies", "not one of the model's parameters"),
    ("no_decay_key", "has no 'weight_decay' entry"),
]:
    add("weight_decay_groups_test", mistake, lambda m=mistake: harness.weight_decay_groups_test(t06._groups(m)), phrase)
add("weight_decay_groups_test", "", lambda: harness.weight_decay_groups_test(c06.weight_decay_groups))


def groups_by_name(model, weight_decay):
    """Biases by name left out of decay, the attention's [n_heads, d_head] ones included (sweep 19: refused then)."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        by_name = name.rsplit(".", 1)[-1].startswith("b_") or name.endswith(("W_E", "W_pos"))
        (no_decay if param.ndim < 2 or by_name else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


add("weight_decay_groups_test", "", lambda: harness.weight_decay_groups_test(groups_by_name))


def groups_first_four_blocks(model, weight_decay):  # blocks from the fourth on left out of decay (red-team round 51)
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        late = name.startswith("blocks.") and int(name.split(".")[1]) >= 4
        (decay if param.ndim >= 2 and not name.endswith(("W_E", "W_pos")) and not late else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


add(
    "weight_decay_groups_test",
    "blocks past the fourth left out",
    lambda: harness.weight_decay_groups_test(groups_first_four_blocks),
    "Matrices are not decayed",
)
for fn, phrase in [
    (t06.no_zero_grad, "previous step's gradients"),
    (t06.no_clipping, "not clipped"),
    (t06.clip_values, "clip_grad_value_"),
    (t06.no_schedule, "schedule was not applied"),
    (t06.lr_after_step, "rate of the previous step"),
    (t06.zero_grad_before_step, "not between backward and step"),
    (t06.trains_on_validation, "validation windows"),
    (t06.same_batch_every_step, "new random batch"),
    (t06.windows_cut_to_even_length, "the model takes whole windows"),
    (t06.no_step, "never called optimizer.step"),
    (t06.unshifted_loss, "not those of this step's loss"),
    (t06.new_optimizer_every_step, "create the optimizer once"),
]:
    add("train_test", fn.__name__, lambda fn=fn: harness.train_test(t06.make_train(fn), c06.TrainingArgs), phrase)
add("train_test", "", lambda: harness.train_test(c06.train, c06.TrainingArgs))
for mistake, phrase in [
    ("same_seed", "same 8 problems at every step"),
    ("unmasked", "not those of this step's loss"),
    ("new_optimizer", "different optimizers"),
    ("no_schedule", "schedule was not applied"),
    ("no_clip", "not clipped"),
]:
    add(
        "train_addition_test",
        mistake,
        lambda m=mistake: harness.train_addition_test(t06._train_addition(m), c06.TrainingArgs),
        phrase,
    )
add("train_addition_test", "", lambda: harness.train_addition_test(c06.train_addition, c06.TrainingArgs))

# reversal_floor_test: the floor as a function of (seq_len, d_vocab), and the mistakes of counting
add("reversal_floor_test", "", lambda: harness.reversal_floor_test(c06.reversal_loss_floor))
for label, floor, phrase in [
    ("first token counted", lambda n, v: (n // 2) / (n - 1) * math.log(v), "no loss is taken on it"),
    ("over seq_len positions", lambda n, v: (n // 2 - 1) / n * math.log(v), "seq_len - 1 predictions"),
    ("in bits", lambda n, v: (n // 2 - 1) / (n - 1) * math.log2(v), "in bits"),
    ("a total, not a mean", lambda n, v: (n // 2 - 1) * math.log(v), "total over the sequence"),
    ("right for 16 and 100 only", lambda n, v: 7 / 15 * math.log(100), "seq_len=8, d_vocab=10"),
]:
    add("reversal_floor_test", label, lambda f=floor: harness.reversal_floor_test(f), phrase)


def _course_names() -> None:
    """Give every wrong class its course class's name, as a learner's would have: a name like `LNNoBias` must not
    put the mistake's name into the message for free."""
    course_classes = {obj for module in (c05, c07, c09) for obj in vars(module).values() if isinstance(obj, type)}
    for obj in list(globals().values()):
        if isinstance(obj, type) and obj not in course_classes and issubclass(obj, torch.nn.Module):
            base = next((b for b in obj.__mro__ if b in course_classes), None)
            if base is not None:
                obj.__name__ = obj.__qualname__ = base.__name__


_course_names()


def run_case(c: Case) -> tuple[str, str]:
    """('pass' | 'named' | 'unnamed' | 'error', message) for one entry."""
    torch.manual_seed(0)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            c.run()
    except AssertionError as err:
        message = str(err)
        head = message[:MESSAGE_HEAD].lower()
        if c.correct:
            return "refused", message
        return ("named" if any(p in head for p in c.phrases) else "unnamed"), message
    except Exception as err:  # noqa: BLE001 -- a bench entry that cannot run is reported, not fatal
        return "error", f"{type(err).__name__}: {err}"
    return "pass", ""
