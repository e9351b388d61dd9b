"""The three general checks: the course's implementations pass, realistic wrong ones fail with the right message.

The correct implementations come from the solution notebooks (harness.components); the wrong ones below are the
mistakes learners make, written as small subclasses that override only the faulty step.
"""

import math

import einops
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import harness
from harness import Config, components, load_gpt2_test, load_reference_gpt2, rand_float_test, rand_int_test

course = components("05_full_gpt2")
SMALL = Config(d_model=64, d_head=16, n_heads=4, d_mlp=256, n_layers=2, n_ctx=32, d_vocab=500)


def passes(check, *args, capsys=None, **kwargs):
    result = check(*args, **kwargs)
    assert result is None
    if capsys is not None:
        captured = capsys.readouterr()
        assert captured.err == ""
        assert "passed" in captured.out


def fails(check, *args, match, **kwargs):
    with pytest.raises(AssertionError, match=match):
        check(*args, **kwargs)


# ---------------------------------------------------------------------------------------------------- LayerNorm
class LayerNormUnbiased(course.LayerNorm):
    def forward(self, x):
        x = x - x.mean(-1, keepdim=True)
        return x / (x.var(-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt() * self.w + self.b


class LayerNormEpsOutside(course.LayerNorm):
    def forward(self, x):
        x = x - x.mean(-1, keepdim=True)
        return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + self.cfg.layer_norm_eps) * self.w + self.b


class LayerNormNoAffine(course.LayerNorm):
    def forward(self, x):
        x = x - x.mean(-1, keepdim=True)
        return x / (x.pow(2).mean(-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt()


class LayerNormInPlace(course.LayerNorm):
    def forward(self, x):
        x -= x.mean(-1, keepdim=True)
        return x / (x.pow(2).mean(-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt() * self.w + self.b


class LayerNormNoEps(course.LayerNorm):
    def forward(self, x):
        x = x - x.mean(-1, keepdim=True)
        return x / x.pow(2).mean(-1, keepdim=True).sqrt() * self.w + self.b


class LayerNormTorchVar(course.LayerNorm):
    """torch.std defaults to the unbiased estimator: a classic."""

    def forward(self, x):
        return (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + self.cfg.layer_norm_eps) * self.w + self.b


class LayerNormFloat64(course.LayerNorm):
    def forward(self, x):
        return super().forward(x.double())


class LayerNormMisnamed(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.weight = nn.Parameter(torch.ones(cfg.d_model))
        self.bias = nn.Parameter(torch.zeros(cfg.d_model))

    def forward(self, x):
        return F.layer_norm(x, (self.cfg.d_model,), self.weight, self.bias, self.cfg.layer_norm_eps)


def test_layernorm_correct(capsys):
    passes(rand_float_test, course.LayerNorm, [2, 4, 768], capsys=capsys)


@pytest.mark.parametrize(
    "cls, match",
    [
        (LayerNormUnbiased, "unbiased variance"),
        (LayerNormEpsOutside, "epsilon added outside the square root"),
        (LayerNormNoAffine, "without the learned scale and shift"),
        (LayerNormInPlace, "modified its input in place"),
        (LayerNormNoEps, "without epsilon"),
        (LayerNormTorchVar, "does not match"),
        (LayerNormFloat64, "dtype torch.float64"),
        (LayerNormMisnamed, r"missing parameters \['b', 'w'\].*unexpected parameters \['bias', 'weight'\]"),
    ],
)
def test_layernorm_wrong(cls, match):
    fails(rand_float_test, cls, [2, 4, 768], match=match)


# ---------------------------------------------------------------------------------------------------- embeddings
class EmbedScaled(course.Embed):
    """Attention Is All You Need scales embeddings by sqrt(d_model); GPT-2 does not."""

    def forward(self, tokens):
        return self.W_E[tokens] * math.sqrt(self.cfg.d_model)


class EmbedNoBatch(course.Embed):
    def forward(self, tokens):
        return self.W_E[tokens[0]]


class EmbedNumpy(course.Embed):
    def forward(self, tokens):
        return self.W_E.detach().numpy()[tokens.numpy()]


class EmbedList(course.Embed):
    def forward(self, tokens):
        return [self.W_E[t] for t in tokens]


class EmbedOneHotNoClasses(course.Embed):
    def forward(self, tokens):
        return F.one_hot(tokens).float() @ self.W_E


@pytest.mark.parametrize(
    "cls, match",
    [
        (EmbedScaled, "does not match"),
        (EmbedNoBatch, "lacks the batch dimension"),
        (EmbedNumpy, "NumPy array"),
        (EmbedList, "returned a list"),
        (EmbedOneHotNoClasses, "raised RuntimeError"),
    ],
)
def test_embed_wrong(cls, match):
    fails(rand_int_test, cls, [2, 4], match=match)


def test_embed_correct(capsys):
    passes(rand_int_test, course.Embed, [2, 4], capsys=capsys)


class PosEmbedByToken(course.PosEmbed):
    def forward(self, tokens):
        return self.W_pos[tokens]


class PosEmbedNoBatch(course.PosEmbed):
    def forward(self, tokens):
        return self.W_pos[: tokens.shape[1]]


class PosEmbedWhole(course.PosEmbed):
    def forward(self, tokens):
        return einops.repeat(self.W_pos, "n d -> b n d", b=tokens.shape[0])


class PosEmbedFromOne(course.PosEmbed):
    def forward(self, tokens):
        batch, pos = tokens.shape
        return self.W_pos[1 : pos + 1].expand(batch, pos, -1)


@pytest.mark.parametrize(
    "cls, match",
    [
        (PosEmbedByToken, "not by the token ids"),
        (PosEmbedNoBatch, "lacks the batch dimension"),
        (PosEmbedWhole, r"shape \[2, 1024, 768\], expected \[2, 4, 768\]"),
        (PosEmbedFromOne, "positions start at 0"),
    ],
)
def test_pos_embed_wrong(cls, match):
    fails(rand_int_test, cls, [2, 4], match=match)


def test_pos_embed_correct(capsys):
    passes(rand_int_test, course.PosEmbed, [2, 4], capsys=capsys)


# ---------------------------------------------------------------------------------------------------- attention
def _attention(self, x, scale=None, diagonal=1, fill=None, softmax_dim=-1, b_O=True):
    q = einops.einsum(x, self.W_Q, "b p d, h d k -> b p h k") + self.b_Q
    k = einops.einsum(x, self.W_K, "b p d, h d k -> b p h k") + self.b_K
    v = einops.einsum(x, self.W_V, "b p d, h d k -> b p h k") + self.b_V
    scores = einops.einsum(q, k, "b q h k, b s h k -> b h q s")
    scores = scores / math.sqrt(self.cfg.d_head) if scale is None else scores * scale
    n = x.shape[1]
    mask = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=diagonal)
    scores = scores.masked_fill(mask, self.IGNORE if fill is None else fill)
    pattern = scores.softmax(softmax_dim)
    z = einops.einsum(v, pattern, "b s h k, b h q s -> b q h k")
    return einops.einsum(z, self.W_O, "b q h k, h k d -> b q d") + (self.b_O if b_O else 0)


class AttentionNoScale(course.Attention):
    def forward(self, x):
        return _attention(self, x, scale=1.0)


class AttentionScaleDModel(course.Attention):
    def forward(self, x):
        return _attention(self, x, scale=1 / math.sqrt(self.cfg.d_model))


class AttentionMaskDiagonal(course.Attention):
    def forward(self, x):
        return _attention(self, x, diagonal=0)

    def apply_causal_mask(self, scores):
        n = scores.shape[-1]
        return scores.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool)), self.IGNORE)


class AttentionMaskDiagonalInf(course.Attention):
    def forward(self, x):
        return _attention(self, x, diagonal=0, fill=float("-inf"))


class AttentionFillZero(course.Attention):
    def forward(self, x):
        return _attention(self, x, fill=0.0)

    def apply_causal_mask(self, scores):
        n = scores.shape[-1]
        return scores.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), 0.0)


class AttentionSoftmaxQuery(course.Attention):
    def forward(self, x):
        return _attention(self, x, softmax_dim=-2)


class AttentionNoBO(course.Attention):
    def forward(self, x):
        return _attention(self, x, b_O=False)


class AttentionHeadsFromDModel(course.Attention):
    """Splits heads assuming d_head = d_model // n_heads, as a fused implementation would."""

    def forward(self, x):
        d_head = self.cfg.d_model // self.cfg.n_heads
        q = einops.einsum(x, self.W_Q[..., :d_head], "b p d, h d k -> b p h k") + self.b_Q[..., :d_head]
        k = einops.einsum(x, self.W_K[..., :d_head], "b p d, h d k -> b p h k") + self.b_K[..., :d_head]
        v = einops.einsum(x, self.W_V[..., :d_head], "b p d, h d k -> b p h k") + self.b_V[..., :d_head]
        scores = self.apply_causal_mask(einops.einsum(q, k, "b q h k, b s h k -> b h q s") / math.sqrt(d_head))
        z = einops.einsum(v, scores.softmax(-1), "b s h k, b h q s -> b q h k")
        return einops.einsum(z, self.W_O[:, :d_head], "b q h k, h k d -> b q d") + self.b_O


class AttentionFlippedMask(course.Attention):
    def apply_causal_mask(self, scores):
        n = scores.shape[-1]
        return scores.masked_fill(torch.tril(torch.ones(n, n, dtype=torch.bool), -1), self.IGNORE)


def test_attention_correct(capsys):
    passes(rand_float_test, course.Attention, [2, 4, 768], capsys=capsys)


@pytest.mark.parametrize(
    "cls, match",
    [
        (AttentionNoScale, "without the 1/sqrt\\(d_head\\) scaling"),
        (AttentionScaleDModel, "1/sqrt\\(d_model\\) instead of 1/sqrt\\(d_head\\)"),
        (AttentionMaskDiagonal, "diagonal"),
        (AttentionMaskDiagonalInf, "NaN"),
        (AttentionFillZero, "set to 0|sets future scores to 0"),
        (AttentionSoftmaxQuery, "softmax over the query dimension"),
        (AttentionNoBO, "without the output bias b_O"),
        (AttentionHeadsFromDModel, "small config"),
        (AttentionFlippedMask, "flipped"),
    ],
)
def test_attention_wrong(cls, match):
    fails(rand_float_test, cls, [2, 4, 768], match=match)


# ---------------------------------------------------------------------------------------------------- MLP and block
class MLPExactGelu(course.MLP):
    def forward(self, x):
        return F.gelu(x @ self.W_in + self.b_in) @ self.W_out + self.b_out


class MLPRelu(course.MLP):
    def forward(self, x):
        return F.relu(x @ self.W_in + self.b_in) @ self.W_out + self.b_out


class MLPNoBOut(course.MLP):
    def forward(self, x):
        return F.gelu(x @ self.W_in + self.b_in, approximate="tanh") @ self.W_out


class MLPSigmoidGelu(course.MLP):
    def forward(self, x):
        pre = x @ self.W_in + self.b_in
        return (pre * torch.sigmoid(1.702 * pre)) @ self.W_out + self.b_out


def test_mlp_correct(capsys):
    passes(rand_float_test, course.MLP, [2, 4, 768], capsys=capsys)


@pytest.mark.parametrize(
    "cls, match",
    [
        (MLPExactGelu, "exact \\(erf\\) GELU"),
        (MLPRelu, "ReLU"),
        (MLPNoBOut, "without b_out"),
        (MLPSigmoidGelu, "sigmoid approximation of GELU"),
    ],
)
def test_mlp_wrong(cls, match):
    fails(rand_float_test, cls, [2, 4, 768], match=match)


class BlockPostLN(course.TransformerBlock):
    def forward(self, x):
        mid = self.ln1(x + self.attn(x))
        return self.ln2(mid + self.mlp(mid))


class BlockNoResidual(course.TransformerBlock):
    def forward(self, x):
        return self.mlp(self.ln2(self.attn(self.ln1(x))))


class BlockParallel(course.TransformerBlock):
    def forward(self, x):
        return x + self.attn(self.ln1(x)) + self.mlp(self.ln2(x))


class BlockSharedLN(course.TransformerBlock):
    def forward(self, x):
        mid = x + self.attn(self.ln1(x))
        return mid + self.mlp(self.ln1(mid))


def test_block_correct(capsys):
    passes(rand_float_test, course.TransformerBlock, [2, 4, 768], capsys=capsys)


@pytest.mark.parametrize(
    "cls, match",
    [
        (BlockPostLN, "post-LN"),
        (BlockNoResidual, "without the residual connections"),
        (BlockParallel, "MLP reads resid_pre"),
        (BlockSharedLN, "uses ln1 before the MLP"),
    ],
)
def test_block_wrong(cls, match):
    fails(rand_float_test, cls, [2, 4, 768], match=match)


# ---------------------------------------------------------------------------------------------------- unembed, model
class UnembedNoBias(course.Unembed):
    def forward(self, x):
        return x @ self.W_U


class UnembedTransposed(course.Unembed):
    def forward(self, x):
        return (x @ self.W_U).transpose(-1, -2)


class UnembedSoftmax(course.Unembed):
    """Returns probabilities where logits are due."""

    def forward(self, x):
        return (x @ self.W_U + self.b_U).softmax(-1)


def test_unembed_correct(capsys):
    passes(rand_float_test, course.Unembed, [2, 4, 768], capsys=capsys)


@pytest.mark.parametrize(
    "cls, match",
    [(UnembedNoBias, "without the bias b_U"), (UnembedTransposed, "shape"), (UnembedSoftmax, "does not match")],
)
def test_unembed_wrong(cls, match):
    fails(rand_float_test, cls, [2, 4, 768], match=match)


class ModelNoFinalLN(course.DemoTransformer):
    def forward(self, tokens):
        x = self.embed(tokens) + self.pos_embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.unembed(x)


class ModelNoPos(course.DemoTransformer):
    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.unembed(self.ln_final(x))


class ModelLastBlockOnly(course.DemoTransformer):
    def forward(self, tokens):
        x = self.embed(tokens) + self.pos_embed(tokens)
        return self.unembed(self.ln_final(self.blocks[-1](x)))


class ModelSharedBlock(course.DemoTransformer):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.blocks = nn.ModuleList([course.TransformerBlock(cfg)] * cfg.n_layers)


def test_model_correct(capsys):
    passes(rand_int_test, course.DemoTransformer, [2, 4], SMALL, capsys=capsys)


@pytest.mark.parametrize(
    "cls, match",
    [
        (ModelNoFinalLN, "without the final LayerNorm"),
        (ModelNoPos, "without positional embeddings"),
        (ModelLastBlockOnly, "only the last block"),
        (ModelSharedBlock, "are the same tensor"),
    ],
)
def test_model_wrong(cls, match):
    fails(rand_int_test, cls, [2, 4], SMALL, match=match)


# ---------------------------------------------------------------------------------------------------- bad input
class NoConfigArg(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(3))


class InitRaises(course.LayerNorm):
    def __init__(self, cfg):
        super().__init__(cfg)
        raise ValueError("oops")


class ForgotReturn(course.LayerNorm):
    def forward(self, x):
        super().forward(x)


class WrongDevice(course.LayerNorm):
    def forward(self, x):
        return super().forward(x).to("meta")


class TupleOutput(course.LayerNorm):
    def forward(self, x):
        return super().forward(x), "extra"


@pytest.mark.parametrize(
    "cls, match",
    [
        (NoConfigArg, "must take exactly one argument, the Config"),
        (InitRaises, "raised ValueError in __init__: oops"),
        (ForgotReturn, "returned None"),
        (WrongDevice, "is on meta"),
        (lambda cfg: torch.zeros(3), "not a torch.nn.Module"),
        ("LayerNorm", "Expected a class"),
    ],
)
def test_bad_learner_code(cls, match):
    fails(rand_float_test, cls, [2, 4, 768], match=match)


def test_tuple_output_uses_first_item(capsys):
    passes(rand_float_test, TupleOutput, [2, 4, 768], capsys=capsys)


def test_wrong_test_function():
    fails(rand_int_test, course.LayerNorm, [2, 4], match="use rand_float_test")
    fails(rand_float_test, course.Embed, [2, 4, 768], match="use rand_int_test")
    fails(rand_float_test, course.LayerNorm, [2, 4, 10], match="must be d_model=768")


# ---------------------------------------------------------------------------------------------------- load_gpt2_test
@pytest.fixture(scope="module")
def reference():
    return load_reference_gpt2("offline")


@pytest.fixture(scope="module")
def cache(reference):
    tokens = reference.to_tokens("It is a truth universally acknowledged, that a single man")
    _, cache = reference.run_with_cache(tokens)
    return tokens, cache


def _load_cases(reference, cache):
    tokens, cache = cache
    last = reference.cfg.n_layers - 1
    return {
        "LayerNorm": (reference.ln_final, cache["resid_post", last]),
        "Embed": (reference.embed, tokens),
        "PosEmbed": (reference.pos_embed, tokens),
        "Attention": (reference.blocks[0].attn, reference.blocks[0].ln1(cache["resid_pre", 0])),
        "MLP": (reference.blocks[0].mlp, reference.blocks[0].ln2(cache["resid_mid", 0])),
        "TransformerBlock": (reference.blocks[0], cache["resid_pre", 0]),
        "Unembed": (reference.unembed, reference.ln_final(cache["resid_post", last])),
        "DemoTransformer": (reference, tokens),
    }


@pytest.mark.parametrize(
    "name", ["LayerNorm", "Embed", "PosEmbed", "Attention", "MLP", "TransformerBlock", "Unembed", "DemoTransformer"]
)
def test_load_gpt2_correct(name, reference, cache, capsys):
    module, x = _load_cases(reference, cache)[name]
    passes(load_gpt2_test, getattr(course, name), module, x, capsys=capsys)


@pytest.mark.parametrize(
    "cls, name, match",
    [
        (LayerNormUnbiased, "LayerNorm", "unbiased variance|large epsilon|layer_norm_eps=0.5"),
        (LayerNormEpsOutside, "LayerNorm", "outside the square root"),
        (LayerNormMisnamed, "LayerNorm", "missing parameters"),
        (AttentionNoScale, "Attention", "1/sqrt\\(d_head\\)"),
        (AttentionMaskDiagonal, "Attention", "diagonal"),
        (MLPExactGelu, "MLP", "GELU"),
        (BlockPostLN, "TransformerBlock", "post-LN"),
        (ModelNoFinalLN, "DemoTransformer", "final LayerNorm"),
        (EmbedScaled, "Embed", "does not reproduce"),
    ],
)
def test_load_gpt2_wrong(cls, name, match, reference, cache):
    module, x = _load_cases(reference, cache)[name]
    fails(load_gpt2_test, cls, module, x, match=match)


def test_load_gpt2_reports_misshaped(reference, cache):
    class LayerNormWrongShape(course.LayerNorm):
        def __init__(self, cfg):
            super().__init__(cfg)
            self.b = nn.Parameter(torch.zeros(cfg.d_model + 1))

    module, x = _load_cases(reference, cache)["LayerNorm"]
    fails(load_gpt2_test, LayerNormWrongShape, module, x, match=r"wrong shape: b: yours \[\d+\], expected \[\d+\]")


# ------------------------------------------------- mistakes found by bench/naming_rate.py: each is named first
def _layer_norm_forward(self, x, *, dim=-1, uncentred_var=False, affine="wb", eps=None):
    eps = self.cfg.layer_norm_eps if eps is None else eps
    centred = x - x.mean(dim, keepdim=True)
    var = (x if uncentred_var else centred).pow(2).mean(dim, keepdim=True)
    normed = centred / (var + eps).sqrt()
    return {"wb": normed * self.w + self.b, "w": normed * self.w, "bw": normed * self.b + self.w}[affine]


def _named_like(base, forward, init=None):
    """A subclass named like the course's class: the learner's class is called LayerNorm too, so the message cannot
    get the mistake's name from the class name."""
    body = {"forward": forward}
    if init is not None:
        body["__init__"] = init
    return type(base.__name__, (base,), body)


def _attention_forward(self, x, *, swap_qk=False, mean_heads=False, v_from_q=False, z_over_queries=False):
    q = torch.einsum("bpd,ndh->bpnh", x, self.W_Q) + self.b_Q
    k = torch.einsum("bpd,ndh->bpnh", x, self.W_K) + self.b_K
    v = torch.einsum("bpd,ndh->bpnh", x, self.W_Q if v_from_q else self.W_V) + self.b_V
    if swap_qk:
        q, k = k, q
    scores = torch.einsum("bqnh,bknh->bnqk", q, k) / math.sqrt(self.cfg.d_head)
    pattern = self.apply_causal_mask(scores).softmax(-1)
    if z_over_queries:
        pattern = pattern.transpose(-1, -2)
    z = torch.einsum("bnqk,bknh->bqnh", pattern, v)
    per_head = torch.einsum("bqnh,nhd->bqnd", z, self.W_O)
    return (per_head.mean(2) if mean_heads else per_head.sum(2)) + self.b_O


def _model_forward(self, tokens, *, embed_scale=1.0, ln_every_block=False):
    residual = self.embed(tokens) * embed_scale + self.pos_embed(tokens)
    for block in self.blocks:
        residual = block(residual)
        if ln_every_block:
            residual = self.ln_final(residual)
    return self.unembed(residual if ln_every_block else self.ln_final(residual))


def _sinusoidal_pos(self, tokens):
    batch, pos = tokens.shape
    return components("02_embeddings").sinusoidal_positional_encoding(pos, self.cfg.d_model).expand(batch, -1, -1)


@pytest.mark.parametrize(
    ("check", "cls", "shape", "match"),
    [
        (
            rand_float_test,
            _named_like(course.LayerNorm, lambda s, x: _layer_norm_forward(s, x, affine="w")),
            3,
            r"^LayerNorm: It matches LayerNorm without the learned shift",
        ),
        (
            rand_float_test,
            _named_like(course.LayerNorm, lambda s, x: _layer_norm_forward(s, x, affine="bw")),
            3,
            r"^LayerNorm: It matches LayerNorm with w and b swapped",
        ),
        (
            rand_float_test,
            _named_like(course.LayerNorm, lambda s, x: _layer_norm_forward(s, x, dim=1)),
            3,
            r"^LayerNorm: It matches LayerNorm over the wrong dimension",
        ),
        (
            rand_float_test,
            _named_like(course.LayerNorm, lambda s, x: _layer_norm_forward(s, x, uncentred_var=True)),
            3,
            r"^LayerNorm: It matches LayerNorm with the variance of x itself",
        ),
        (
            rand_float_test,
            _named_like(course.LayerNorm, lambda s, x: _layer_norm_forward(s, x, eps=1e-5)),
            3,
            r"^LayerNorm: It matches LayerNorm with epsilon fixed at 1e-5: use cfg.layer_norm_eps",
        ),
        (
            rand_int_test,
            _named_like(course.Embed, lambda s, t: s.W_E[t] * math.sqrt(s.cfg.d_model)),
            2,
            r"^Embed: It matches W_E\[tokens\] scaled by sqrt\(d_model\)",
        ),
        (
            rand_int_test,
            _named_like(course.PosEmbed, _sinusoidal_pos),
            2,
            r"^PosEmbed: It matches the fixed sinusoidal encoding: GPT-2 learns",
        ),
        (
            rand_int_test,
            _named_like(course.PosEmbed, lambda s, t: s.W_pos[: t.shape[0]].expand(t.shape[0], -1, -1)),
            2,
            r"^PosEmbed output has shape \[2, 2, 64\] .* its length is the batch size",
        ),
        (
            rand_float_test,
            _named_like(course.Attention, lambda s, x: _attention_forward(s, x, swap_qk=True)),
            3,
            r"^Attention: It matches attention with queries and keys swapped",
        ),
        (
            rand_float_test,
            _named_like(course.Attention, lambda s, x: _attention_forward(s, x, mean_heads=True)),
            3,
            r"^Attention: It matches attention whose heads are averaged",
        ),
        (
            rand_float_test,
            _named_like(course.Attention, lambda s, x: _attention_forward(s, x, v_from_q=True)),
            3,
            r"^Attention: It matches attention with the values computed from W_Q",
        ),
        (
            rand_float_test,
            _named_like(course.Attention, lambda s, x: _attention_forward(s, x, z_over_queries=True)),
            3,
            r"^Attention: It matches attention whose pattern is applied transposed",
        ),
        (
            rand_float_test,
            _named_like(course.MLP, lambda s, x: course.gelu_new((x @ s.W_in + s.b_in) @ s.W_out + s.b_out)),
            3,
            r"^MLP: It matches the MLP with the activation after W_out",
        ),
        (
            rand_int_test,
            _named_like(
                course.DemoTransformer, lambda s, t: _model_forward(s, t, embed_scale=math.sqrt(s.cfg.d_model))
            ),
            2,
            r"^DemoTransformer: The token embeddings are scaled by sqrt\(d_model\)",
        ),
        (
            rand_int_test,
            _named_like(course.DemoTransformer, lambda s, t: _model_forward(s, t, ln_every_block=True)),
            2,
            r"^DemoTransformer: Block 1 received ln_final of block 0's output",
        ),
    ],
)
def test_bench_mistakes_are_named_first(check, cls, shape, match):
    size = [2, 5, SMALL.d_model][:shape] if shape == 3 else [2, 5]
    fails(check, cls, size, SMALL, match=match)


class BlockNoMlpResidualNamed(course.TransformerBlock):
    def forward(self, x):
        return self.mlp(self.ln2(x + self.attn(self.ln1(x))))


BlockNoMlpResidualNamed.__name__ = "TransformerBlock"


def test_load_gpt2_leads_with_the_cause(reference, cache):
    """load_gpt2_test names the mistake first, as rand_float_test does, using the block and model traces too."""
    given, x = _load_cases(reference, cache)["TransformerBlock"]
    fails(
        load_gpt2_test, BlockNoMlpResidualNamed, given, x, match=r"^TransformerBlock: The block returns the MLP output"
    )
    lnu = _named_like(course.LayerNorm, lambda s, x: _layer_norm_forward(s, x, affine="w"))
    given, x = _load_cases(reference, cache)["LayerNorm"]
    fails(load_gpt2_test, lnu, given, x, match=r"^LayerNorm: It matches LayerNorm without the learned shift")


# ---------------------------------------------------------------------------------------------------- random weights
def test_pooled_fill_has_the_asked_scale_and_no_repeats():
    from harness.checks import _PooledNormal

    def filled(seed):
        pooled = _PooledNormal(torch.Generator().manual_seed(seed))
        a, b = torch.empty(4000, 768), torch.empty(4000, 768)  # 3 million numbers each: the pooled path
        pooled.fill(a, 0.0, 0.5)
        pooled.fill(b, 1.0, 2.0)
        return a, b

    a, b = filled(0)
    assert abs(a.mean()) < 0.01 and abs(a.std() - 0.5) < 0.01
    assert abs(b.mean() - 1.0) < 0.02 and abs(b.std() - 2.0) < 0.02
    assert torch.equal(filled(0)[0], a) and not torch.equal(filled(1)[0], a)  # the seed decides, and only it
    assert len(torch.unique(a, dim=0)) == len(a)  # no row repeats another
    assert not torch.allclose((b - 1.0) / 2.0, a / 0.5)  # two weights are not one draw rescaled
    small = torch.empty(100, 100)
    _PooledNormal(torch.Generator().manual_seed(0)).fill(small, 0.0, 1.0)
    assert torch.equal(small, torch.empty(100, 100).normal_(0.0, 1.0, generator=torch.Generator().manual_seed(0)))


@pytest.mark.parametrize(
    "cls, match", [(ModelNoFinalLN, "without the final LayerNorm"), (ModelNoPos, "without positional")]
)
def test_model_wrong_at_gpt2_size(cls, match):
    """At GPT-2 small's size every large weight comes from the pooled fill: the mistakes are still named."""
    fails(rand_int_test, cls, [2, 4], match=match)


# A default changed in a function's signature: no call that passes the argument sees it, and the notebook's own calls
# that leave it out rely on it (red-team round 35). The judge compares the defaults (tests/test_judge.py keeps the
# same mistakes); so do the notebook's checks, which the learner runs first.
DEFAULT_MISTAKES = {
    "a generate that by default never stops at end of text": lambda ns: harness.generate_test(ns["generate"]),
    "a seq2seq loss that smooths its labels by default": lambda ns: harness.seq2seq_loss_test(ns["seq2seq_loss"]),
    "a causal mask that fills with -5e4 by default": lambda ns: harness.causal_mask_test(ns["apply_causal_mask"]),
    "a reversal floor whose default length is 32": lambda ns: harness.reversal_floor_test(ns["reversal_loss_floor"]),
    "a sampler that penalises repeats by default": lambda ns: harness.sample_next_token_test(ns["sample_next_token"]),
}


@pytest.mark.parametrize("mistake", sorted(DEFAULT_MISTAKES))
def test_a_changed_default_fails_its_check(mistake):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_judge import SWEPT_MISTAKES, course_with

    notebook, _, old, new, cause = SWEPT_MISTAKES[mistake]
    with pytest.raises(AssertionError) as err:
        DEFAULT_MISTAKES[mistake](course_with(notebook, old, new))
    assert cause.split(", where")[0] in str(err.value), str(err.value)
    DEFAULT_MISTAKES[mistake](course_with(notebook, None, None))  # the course's own passes
