"""Composite modules (the block, the full model): when the output is wrong and no whole-module variant matches, the
check traces the learner's own submodules and names the first place that departs from GPT-2 (wiring, order, or a
sublayer that computes differently on the input it received)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from harness import Config, rand_float_test, rand_int_test
from harness.course import components

course = components("05_full_gpt2")
LayerNorm, Attention, MLP = course.LayerNorm, course.Attention, course.MLP
Embed, PosEmbed, Unembed = course.Embed, course.PosEmbed, course.Unembed
SMALL = Config(d_model=48, n_layers=2, n_heads=4, d_head=12, d_mlp=96, n_ctx=16, d_vocab=97)


class ExactGeluMLP(MLP):
    def forward(self, x):
        return F.gelu(x @ self.W_in + self.b_in) @ self.W_out + self.b_out


class UnscaledAttention(Attention):
    def forward(self, x):
        q = torch.einsum("bpm,nmh->bpnh", x, self.W_Q) + self.b_Q
        k = torch.einsum("bpm,nmh->bpnh", x, self.W_K) + self.b_K
        v = torch.einsum("bpm,nmh->bpnh", x, self.W_V) + self.b_V
        pattern = self.apply_causal_mask(torch.einsum("bqnh,bknh->bnqk", q, k)).softmax(-1)
        z = torch.einsum("bnqk,bknh->bqnh", pattern, v)
        return torch.einsum("bqnh,nhm->bqm", z, self.W_O) + self.b_O


def block(wiring="right", attn_cls=Attention, mlp_cls=MLP):
    class TransformerBlock(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.cfg = cfg
            self.ln1, self.attn, self.ln2, self.mlp = LayerNorm(cfg), attn_cls(cfg), LayerNorm(cfg), mlp_cls(cfg)

        def forward(self, x):
            if wiring == "no_mlp_residual":
                return self.mlp(self.ln2(x + self.attn(self.ln1(x))))
            if wiring == "swapped_ln":
                mid = x + self.attn(self.ln2(x))
                return mid + self.mlp(self.ln1(mid))
            if wiring == "mlp_first":
                mid = x + self.mlp(self.ln1(x))
                return mid + self.attn(self.ln2(mid))
            if wiring == "attn_skips_ln":
                mid = x + self.attn(x)
                return mid + self.mlp(self.ln2(mid))
            if wiring == "post_ln":
                mid = self.ln1(x + self.attn(x))
                return self.ln2(mid + self.mlp(mid))
            mid = x + self.attn(self.ln1(x))
            return mid + self.mlp(self.ln2(mid))

    return TransformerBlock


def model(block_cls, kind="right"):
    class DemoTransformer(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.cfg = cfg
            self.embed, self.pos_embed = Embed(cfg), PosEmbed(cfg)
            self.blocks = nn.ModuleList([block_cls(cfg) for _ in range(cfg.n_layers)])
            self.ln_final, self.unembed = LayerNorm(cfg), Unembed(cfg)

        def forward(self, tokens):
            residual = self.embed(tokens) + self.pos_embed(tokens)
            for b in reversed(self.blocks) if kind == "reverse" else self.blocks:
                residual = b(residual)
            logits = self.unembed(self.ln_final(residual))
            return logits.softmax(-1) if kind == "softmax" else logits

    return DemoTransformer


@pytest.mark.parametrize(
    ("cls", "phrase"),
    [
        (block("no_mlp_residual"), "residual connection around the MLP is missing"),
        (block("swapped_ln"), "ln2 before ln1: they are swapped"),
        (block("mlp_first"), "runs the MLP before attention"),
        (block("attn_skips_ln"), "never called self.ln1: GPT-2 normalises"),
        (block(mlp_cls=ExactGeluMLP), "exact (erf) GELU"),
        (block(attn_cls=UnscaledAttention), "without the 1/sqrt(d_head) scaling"),
    ],
)
def test_wrong_blocks_are_named_first(cls, phrase):
    with pytest.raises(AssertionError) as err:
        rand_float_test(cls, [2, 5, 48], cfg=SMALL)
    message = str(err.value)
    assert phrase in message, message
    assert message.index(phrase) < message.index("does not match the reference"), "the cause must lead"


@pytest.mark.parametrize(
    ("cls", "phrase"),
    [
        (model(block(), "reverse"), "blocks run in reverse order"),
        (model(block(), "softmax"), "returns probabilities"),
        (model(block(attn_cls=UnscaledAttention)), "Block 0 differs"),
        (model(block(attn_cls=UnscaledAttention)), "without the 1/sqrt(d_head) scaling"),
        (model(block(mlp_cls=ExactGeluMLP)), "exact (erf) GELU"),
        (model(block("post_ln")), "post-LN block"),
    ],
)
def test_wrong_models_are_named_first(cls, phrase):
    with pytest.raises(AssertionError) as err:
        rand_int_test(cls, [2, 5], cfg=SMALL)
    assert phrase in str(err.value), str(err.value)


def test_right_composites_pass():
    rand_float_test(block(), [2, 5, 48], cfg=SMALL)
    rand_int_test(model(block()), [2, 5], cfg=SMALL)
