"""Notebook 09's checks: the solutions pass; realistic wrong versions fail with a message that names the mistake.

Each wrong version is the solution notebook's own code with one realistic change, so it differs by exactly one
mistake. The solution's code is read from solutions/09_encoder_decoder.ipynb (its `component` cells, in order).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import harness

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "solutions" / "09_encoder_decoder.ipynb"
EXERCISES = {
    "MultiHeadAttention": "class MultiHeadAttention",
    "SharedEmbedding": "class SharedEmbedding",
    "FeedForward": "class FeedForward",
    "EncoderLayer": "class EncoderLayer",
    "DecoderLayer": "class DecoderLayer",
    "EncoderDecoder": "class EncoderDecoder",
    "make_batch": "def make_batch",
    "seq2seq_loss": "def seq2seq_loss",
    "greedy_decode": "def greedy_decode",
}


def _component_cells() -> list[str]:
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    return [
        "".join(c["source"])
        for c in cells
        if c["cell_type"] == "code" and "component" in c.get("metadata", {}).get("tags", [])
    ]


CELLS = _component_cells()


def build(**changes) -> dict:
    """The solution's definitions, with `old -> new` replaced in the named exercises' cells."""
    namespace: dict = {}
    for source in CELLS:
        for key, head in EXERCISES.items():
            if head in source and key in changes:
                pairs = changes[key]
                for old, new in [pairs] if isinstance(pairs, tuple) else pairs:
                    assert old in source, f"{old!r} not in {key}"
                    source = source.replace(old, new)
        exec(compile(source, "<solution 09>", "exec"), namespace)  # noqa: S102 -- the course's own solution code
    return namespace


RIGHT = build()
CHECKS = {
    "MultiHeadAttention": "multi_head_attention_test",
    "SharedEmbedding": "shared_embedding_test",
    "FeedForward": "feed_forward_test",
    "EncoderLayer": "encoder_layer_test",
    "DecoderLayer": "decoder_layer_test",
    "EncoderDecoder": "encoder_decoder_test",
    "make_batch": "make_batch_test",
    "seq2seq_loss": "seq2seq_loss_test",
    "greedy_decode": "greedy_decode_test",
}


def test_every_exercise_was_found():
    for key, head in EXERCISES.items():
        assert any(head in cell for cell in CELLS), key


@pytest.mark.parametrize("name", list(CHECKS))
def test_solutions_pass(name, capsys):
    getattr(harness, CHECKS[name])(RIGHT[name])
    assert "passed" in capsys.readouterr().out


def test_solution_matches_nn_transformer_within_1e_5():
    """The notebook's claim, measured independently of the check: the solution's logits vs nn.Transformer's."""
    from harness.encoder_decoder_checks import _oracle_logits, _torch_transformer

    cfg = harness.EncoderDecoderConfig(d_model=32, n_heads=4, d_head=8, d_ff=64, n_layers=3, d_vocab=20, n_ctx=40)
    torch.manual_seed(0)
    model = RIGHT["EncoderDecoder"](cfg).eval()
    src = torch.randint(3, 20, (4, 9)).masked_fill(torch.arange(9) >= torch.tensor([[9], [4], [7], [1]]), 0)
    tgt_in = torch.randint(3, 20, (4, 6)).masked_fill(torch.arange(6) >= torch.tensor([[6], [2], [5], [3]]), 0)
    tgt_in[:, 0] = cfg.bos_id
    with torch.no_grad():
        ours = model(src, tgt_in)
        _, theirs = _oracle_logits(_torch_transformer(model, cfg, "EncoderDecoder"), model.embed.W_E, src, tgt_in, cfg)
    assert (ours - theirs).abs().max().item() < 1e-5


ATTN_SCORES = 'scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))'
ATTN_SCALE = "/ math.sqrt(self.cfg.d_head)"
INIT = "nn.init.normal_(self.W_E, mean=0.0, std=cfg.d_model**-0.5)"
EMBED = "return self.W_E[tokens] * math.sqrt(self.cfg.d_model) + self.pe[:pos]"
RELU = "hidden = torch.relu(x @ self.W_in + self.b_in)"
ENC_ATTN = "x = self.ln1(x + self.self_attn(x, x, src_padding))"
ENC_FF = "return self.ln2(x + self.ff(x))"
DEC_SELF = "y = self.ln1(y + self.self_attn(y, y, tgt_padding, causal=True))"
DEC_CROSS = "y = self.ln2(y + self.cross_attn(y, memory, src_padding))"
DEC_FF = "return self.ln3(y + self.ff(y))"
PRE_LN_ENC = [
    (ENC_ATTN, "x = x + self.self_attn(self.ln1(x), self.ln1(x), src_padding)"),
    (ENC_FF, "return x + self.ff(self.ln2(x))"),
]
PRE_LN_DEC = [
    (DEC_SELF, "y = y + self.self_attn(self.ln1(y), self.ln1(y), tgt_padding, causal=True)"),
    (DEC_CROSS, "y = y + self.cross_attn(self.ln2(y), memory, src_padding)"),
    (DEC_FF, "return y + self.ff(self.ln3(y))"),
]
TGT_IN = "tgt_in = pad([[cfg.bos_id] + y for y in targets])"
TGT_OUT = "tgt_out = pad([y + [cfg.eos_id] for y in targets])"
LOSS = "        ignore_index=pad_id,\n"
NEXT = "next_token = next_token.masked_fill(finished, cfg.pad_id)  # finished rows emit padding"
DECODE_STEP = "next_token = model.decode(tgt, memory, src)[:, -1].argmax(dim=-1)  # [batch]"

WRONG = [
    # 1. attention
    (
        "MultiHeadAttention",
        {"MultiHeadAttention": (ATTN_SCORES, ATTN_SCORES.replace("(key_", "(~key_"))},
        "wrong polarity",
    ),
    (
        "MultiHeadAttention",
        {"MultiHeadAttention": (ATTN_SCORES, "scores + key_padding_mask[:, None, None, :]")},
        "added to the scores",
    ),
    ("MultiHeadAttention", {"MultiHeadAttention": (ATTN_SCORES, "scores")}, "no effect"),
    (
        "MultiHeadAttention",
        {"MultiHeadAttention": (ATTN_SCORES, ATTN_SCORES.replace("[:, None, None, :]", "[:, None, :, None]"))},
        "hides whole query rows",
    ),
    ("MultiHeadAttention", {"MultiHeadAttention": (ATTN_SCALE, "")}, "not scaled"),
    ("MultiHeadAttention", {"MultiHeadAttention": (ATTN_SCALE, "/ math.sqrt(self.cfg.d_model)")}, "sqrt(d_model)"),
    (
        "MultiHeadAttention",
        {"MultiHeadAttention": ("        if causal:  #", "        if False:  #")},
        "causal mask is missing",
    ),
    (
        "MultiHeadAttention",
        {"MultiHeadAttention": ("device=scores.device), diagonal=1)", "device=scores.device), diagonal=0)")},
        "also hides the diagonal",
    ),
    (
        "MultiHeadAttention",
        {
            "MultiHeadAttention": [
                ('einops.einsum(x_kv, self.W_K, "b k m', 'einops.einsum(x_q, self.W_K, "b k m'),
                ('einops.einsum(x_kv, self.W_V, "b k m', 'einops.einsum(x_q, self.W_V, "b k m'),
            ]
        },
        "come from x_q",
    ),
    (
        "MultiHeadAttention",
        {"MultiHeadAttention": ("pattern = scores.softmax(dim=-1)", "pattern = scores.softmax(dim=-2)")},
        "over the queries",
    ),
    (
        "MultiHeadAttention",
        {"MultiHeadAttention": ("        validate_key_padding_mask(key_padding_mask, x_kv)\n", "")},
        "keep the call to validate_key_padding_mask",
    ),
    # 2. embedding
    ("SharedEmbedding", {"SharedEmbedding": (INIT, "nn.init.normal_(self.W_E)")}, "standard deviation 1"),
    ("SharedEmbedding", {"SharedEmbedding": (INIT, "nn.init.normal_(self.W_E, std=0.02)")}, "0.02 (GPT-2's)"),
    (
        "SharedEmbedding",
        {"SharedEmbedding": (EMBED, "return self.W_E[tokens] + self.pe[:pos]")},
        "embedding is not scaled",
    ),
    (
        "SharedEmbedding",
        {"SharedEmbedding": (EMBED, "return self.W_E[tokens] / math.sqrt(self.cfg.d_model) + self.pe[:pos]")},
        "divided by sqrt(d_model)",
    ),
    (
        "SharedEmbedding",
        {"SharedEmbedding": (EMBED, "return (self.W_E[tokens] + self.pe[:pos]) * math.sqrt(self.cfg.d_model)")},
        "scaled too",
    ),
    (
        "SharedEmbedding",
        {"SharedEmbedding": (EMBED, "return self.W_E[tokens] * math.sqrt(self.cfg.d_model)")},
        "positional encoding is missing",
    ),
    (
        "SharedEmbedding",
        {"SharedEmbedding": ("return x @ self.W_E.T", "return x @ self.W_E.T * math.sqrt(self.cfg.d_model)")},
        "output layer multiplies by sqrt(d_model)",
    ),
    (
        "SharedEmbedding",
        {
            "SharedEmbedding": (
                'self.register_buffer("pe", sinusoidal_positional_encoding(cfg.n_ctx, cfg.d_model), persistent=False)',
                "self.pe = nn.Parameter(sinusoidal_positional_encoding(cfg.n_ctx, cfg.d_model))",
            )
        },
        "besides W_E",
    ),
    # 3. feed-forward and layers
    ("FeedForward", {"FeedForward": (RELU, "hidden = F.gelu(x @ self.W_in + self.b_in)")}, "GELU"),
    ("FeedForward", {"FeedForward": (RELU, "hidden = x @ self.W_in + self.b_in")}, "activation is missing"),
    ("EncoderLayer", {"EncoderLayer": PRE_LN_ENC}, "pre-LN"),
    (
        "EncoderLayer",
        {
            "EncoderLayer": [
                (ENC_ATTN, "x = self.ln1(self.self_attn(x, x, src_padding))"),
                (ENC_FF, "return self.ln2(self.ff(x))"),
            ]
        },
        "residual connection is missing",
    ),
    ("EncoderLayer", {"FeedForward": (RELU, "hidden = F.gelu(x @ self.W_in + self.b_in)")}, "GELU"),
    (
        "EncoderLayer",
        {"EncoderLayer": (ENC_ATTN, "x = self.ln1(x + self.self_attn(x, x))")},
        "source padding mask is not passed",
    ),
    (
        "EncoderLayer",
        {"EncoderLayer": (ENC_ATTN, "x = self.ln1(x + self.self_attn(x, x, src_padding, causal=True))")},
        "encoder's self-attention is causal",
    ),
    (
        "DecoderLayer",
        {"DecoderLayer": (DEC_CROSS, DEC_CROSS.replace("(y, memory,", "(y, y,"))},
        "keys and values from the decoder",
    ),
    ("DecoderLayer", {"DecoderLayer": (DEC_SELF, DEC_SELF.replace(", causal=True", ""))}, "is not causal"),
    (
        "DecoderLayer",
        {"DecoderLayer": (DEC_CROSS, DEC_CROSS.replace("src_padding)", "src_padding, causal=True)"))},
        "cross-attention is causal",
    ),
    (
        "DecoderLayer",
        {"DecoderLayer": (DEC_CROSS, DEC_CROSS.replace(", src_padding)", ")"))},
        "not passed to the cross-attention",
    ),
    (
        "DecoderLayer",
        {
            "DecoderLayer": [
                (DEC_SELF, DEC_SELF.replace("tgt_padding", "src_padding")),
                (DEC_CROSS, DEC_CROSS.replace("src_padding", "tgt_padding")),
            ]
        },
        "masks are swapped",
    ),
    ("DecoderLayer", {"DecoderLayer": PRE_LN_DEC}, "pre-LN"),
    # 4. the model, the batch, the loss
    (
        "EncoderDecoder",
        {"EncoderDecoder": ("            x = layer(x, src_padding)", "            x = layer(x, None)")},
        "Appending padding to the source",
    ),
    ("EncoderDecoder", {"DecoderLayer": (DEC_SELF, DEC_SELF.replace(", causal=True", ""))}, "sees the future"),
    (
        "EncoderDecoder",
        {
            "EncoderDecoder": [
                (
                    "        self.embed = SharedEmbedding(cfg)",
                    (
                        "        self.W_U = nn.Parameter(torch.randn(cfg.d_model, cfg.d_vocab))\n"
                        "        self.embed = SharedEmbedding(cfg)"
                    ),
                ),
                ("return self.embed.unembed(y)", "return y @ self.W_U"),
            ]
        },
        "vocabulary-sized weights",
    ),
    (
        "EncoderDecoder",
        {
            "EncoderDecoder": (
                "y = layer(y, memory, tgt_padding, src_padding)",
                "y = layer(y, torch.zeros_like(memory), tgt_padding, src_padding)",
            )
        },
        "does not read the source",
    ),
    ("make_batch", {"make_batch": (TGT_IN, "tgt_in = pad([y + [cfg.eos_id] for y in targets])")}, "not shifted"),
    (
        "make_batch",
        {
            "make_batch": [
                (TGT_IN, "tgt_in = pad([y + [cfg.eos_id] for y in targets])"),
                (TGT_OUT, "tgt_out = pad([[cfg.bos_id] + y for y in targets])"),
            ]
        },
        "swaps",
    ),
    ("make_batch", {"make_batch": (TGT_OUT, "tgt_out = pad([y for y in targets])")}, "does not end with EOS"),
    (
        "make_batch",
        {
            "make_batch": (
                "return torch.tensor([row + [cfg.pad_id] * (width - len(row)) for row in rows]",
                "return torch.tensor([[cfg.pad_id] * (width - len(row)) + row for row in rows]",
            )
        },
        "pads on the left",
    ),
    (
        "make_batch",
        {
            "make_batch": [
                (TGT_IN, "full = pad([[cfg.bos_id] + y + [cfg.eos_id] for y in targets])\n    tgt_in = full[:, :-1]"),
                (TGT_OUT, "tgt_out = full[:, 1:]"),
            ]
        },
        "and then slices",
    ),
    # found by tests/test_exercise_arguments.py: one configuration let a size be hard-coded
    (
        "MultiHeadAttention",
        {"MultiHeadAttention": ("/ math.sqrt(self.cfg.d_head)", "/ math.sqrt(4)")},
        "d_head=6",
    ),
    (
        "SharedEmbedding",
        {"SharedEmbedding": ("self.W_E[tokens] * math.sqrt(self.cfg.d_model)", "self.W_E[tokens] * math.sqrt(64)")},
        "d_model=36",
    ),
    ("seq2seq_loss", {"seq2seq_loss": (LOSS, "")}, "counts the padding"),
    ("seq2seq_loss", {"seq2seq_loss": (LOSS, "        ignore_index=0,\n")}, "not pad_id=5: use the pad_id argument"),
    (
        "seq2seq_loss",
        {"seq2seq_loss": ("        label_smoothing=label_smoothing,\n", "")},
        "label smoothing is ignored",
    ),
    (
        "seq2seq_loss",
        {
            "seq2seq_loss": [
                (
                    'einops.rearrange(logits, "b t v -> (b t) v")',
                    'einops.rearrange(logits[:, :-1], "b t v -> (b t) v")',
                ),
                ('einops.rearrange(tgt_out, "b t -> (b t)")', 'einops.rearrange(tgt_out[:, 1:], "b t -> (b t)")'),
            ]
        },
        "shifted by one",
    ),
    (
        "seq2seq_loss",
        {"seq2seq_loss": ("    return F.cross_entropy(", "    return logits.shape[1] * F.cross_entropy(")},
        "returned",
    ),
    # 5. greedy decoding
    ("greedy_decode", {"greedy_decode": (NEXT, "pass")}, "Rows that finished keep generating"),
    # found by bench/mutation_score.py: EOS and padding at the ends of the vocabulary hid these
    (
        "greedy_decode",
        {"greedy_decode": ("        if finished.all():\n            break\n", "")},
        "after every row had emitted EOS",
    ),
    (
        "greedy_decode",
        {"greedy_decode": ("finished |= next_token == cfg.eos_id", "finished |= next_token <= cfg.eos_id")},
        "stopped after",
    ),
    (
        "greedy_decode",
        {
            "greedy_decode": (
                DECODE_STEP,
                "next_token = model.decode(tgt, model.encode(src), src)[:, -1].argmax(dim=-1)",
            )
        },
        "called model.encode",
    ),
    (
        "greedy_decode",
        {"greedy_decode": (DECODE_STEP, DECODE_STEP.replace("[:, -1]", "[:, 0]"))},
        "earlier position than the decoder's last",
    ),
    (
        "greedy_decode",
        {"greedy_decode": (DECODE_STEP, DECODE_STEP.replace("decode(tgt,", "decode(tgt[:, -1:],"))},
        "wrong prefix",
    ),
    (
        "greedy_decode",
        {"greedy_decode": ("return tgt[:, 1:]  # without BOS", "return tgt")},
        "starts every row with BOS",
    ),
]


@pytest.mark.parametrize("name, changes, phrase", WRONG, ids=[f"{w[0]}-{w[2][:28]}" for w in WRONG])
def test_wrong_versions_are_named(name, changes, phrase):
    namespace = build(**changes)
    with pytest.raises(AssertionError) as err:
        getattr(harness, CHECKS[name])(namespace[name])
    assert phrase in str(err.value), str(err.value)


def test_unfinished_exercise_is_named():
    namespace = build(MultiHeadAttention=(ATTN_SCALE, ATTN_SCALE + "\n        raise NotImplementedError()"))
    with pytest.raises(AssertionError) as err:
        harness.multi_head_attention_test(namespace["MultiHeadAttention"])
    assert "is not written yet" in str(err.value), str(err.value)


def test_a_decoder_self_attention_without_the_target_padding_is_told_by_where_it_differs():
    """Found by a held-out review: it differs only at the padded target positions, and the message says so."""
    namespace = build(DecoderLayer=(DEC_SELF, DEC_SELF.replace("tgt_padding", "None")))
    with pytest.raises(AssertionError) as err:
        harness.decoder_layer_test(namespace["DecoderLayer"])
    assert "only at padded target positions" in str(err.value), str(err.value)


def test_an_encoder_layer_that_never_uses_a_layernorm_says_which():
    """Found by a held-out review: ln1 for both sublayers; the message reports the parameters that change nothing."""
    namespace = build(EncoderLayer=(ENC_FF, ENC_FF.replace("self.ln2", "self.ln1")))
    with pytest.raises(AssertionError) as err:
        harness.encoder_layer_test(namespace["EncoderLayer"])
    assert "Changing ln2.w, ln2.b did not change your output" in str(err.value), str(err.value)
