"""Checks for notebooks 04 and 05: GPT-2's GELU, weight conversion from Hugging Face, the language-model loss and
greedy generation (the modules of notebooks 03 to 05 are checked by harness.checks).

Each check takes the learner's function, runs it on small inputs built here, compares the result with an independent
computation (transformers' own forward, `torch.nn.functional.cross_entropy`, a next-token rule known in closed form),
and raises AssertionError naming the likely mistake. On success it prints one line and returns None.
"""

from __future__ import annotations

import math
import types
from collections.abc import Mapping
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness._assertions import (
    GELU_OPS,
    LOSS_OPS,
    as_tensor_output,
    assert_unchanged,
    call,
    check_tensor,
    fail,
    mismatch_summary,
    refuse_operators,
)
from harness.config import Config

__all__ = ["cross_entropy_test", "gelu_new_test", "greedy_generate_test", "hf_conversion_test"]


# --------------------------------------------------------------------------------------------------------------------
# gelu_new_test
# --------------------------------------------------------------------------------------------------------------------


def gelu_new_test(gelu_new) -> None:
    """Checks `gelu_new(x)`: GPT-2's tanh approximation of GELU, elementwise, on a grid and on random values."""
    name = getattr(gelu_new, "__name__", "gelu_new")
    if not callable(gelu_new):
        fail(f"Expected the function itself, got {type(gelu_new).__name__}.")
    grid = torch.linspace(-6.0, 6.0, 1203).reshape(3, 1, 401)
    noise = 3.0 * torch.randn(3, 2, 401, generator=torch.Generator().manual_seed(0))
    x = torch.cat([grid, noise], dim=1)  # [3 3 401]: any shape must work, the function is elementwise
    x_in = x.clone()
    out = as_tensor_output(call(gelu_new, x_in, what=f"{name}(x)"), name)
    assert_unchanged(x, x_in, name)
    check_tensor(out, tuple(x.shape), name)
    x64 = x.double()
    expected = F.gelu(x64, approximate="tanh")
    summary = mismatch_summary(out, expected, atol=1e-6, rtol=1e-5)
    if summary is None:
        refuse_operators(  # right values: then, were they made by the operator the exercise is about?
            gelu_new,
            x.clone(),
            patterns=GELU_OPS,
            what=f"{name}(x)",
            rule="the exercise is GPT-2's GELU from tensor operations (tanh, pow), without F.gelu or torch's own GELU",
        )
        leaf = x.clone().requires_grad_(True)  # and its gradient: training backpropagates through it
        with torch.enable_grad():
            value = as_tensor_output(call(gelu_new, leaf, what=f"{name}(x)"), name)
            if not value.requires_grad:
                fail(
                    f"{name}'s output carries no gradient back to x: a .detach(), .data, torch.no_grad() or a value made "
                    "outside torch cuts the graph, and the MLP could not be trained through it."
                )
            (grad,) = torch.autograd.grad(value.sum(), leaf)
            due = torch.autograd.grad(F.gelu(x64.requires_grad_(True), approximate="tanh").sum(), x64)[0]
        summary = mismatch_summary(grad, due, atol=1e-5, rtol=1e-4)
        if summary is not None:
            fail(f"{name}'s gradient differs from that of GPT-2's GELU, though its values are right: {summary}.")
        print(f"{name} passed: matches GPT-2's tanh GELU on {x.numel()} values, and its gradient.")
        return

    def near(candidate: Tensor) -> bool:
        return mismatch_summary(out, candidate, atol=1e-6, rtol=1e-5) is None

    hint = " The formula: 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))."
    if near(F.gelu(x64)):
        hint = (
            " That is the exact GELU, x * Phi(x) with the error function; GPT-2 uses its tanh approximation, "
            "0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))."
        )
    elif near(torch.relu(x64)):
        hint = " That is ReLU; GPT-2 uses GELU, in its tanh approximation."
    elif near(2 * expected):
        hint = " It is twice the right value: the formula starts with a factor 0.5."
    elif near(x64 * torch.sigmoid(1.702 * x64)):
        hint = " That is the sigmoid approximation x * sigmoid(1.702 x); GPT-2 uses the tanh one."
    fail(f"{name} differs from GPT-2's GELU: {summary}.{hint}")


# --------------------------------------------------------------------------------------------------------------------
# hf_conversion_test
# --------------------------------------------------------------------------------------------------------------------

# n_heads != d_head and d_mlp != 4 * d_model, so a split into heads or a transpose that is wrong changes a shape or,
# where shapes cannot tell (the square c_proj of attention, the order of Q/K/V), the values.
_HF_SMALL = {"vocab_size": 101, "n_positions": 16, "n_embd": 24, "n_layer": 2, "n_head": 3, "n_inner": 40}


def _small_hf_gpt2(seed: int = 0):
    """A small `GPT2LMHeadModel` with random weights everywhere, biases and LayerNorm parameters included."""
    from transformers import GPT2Config, GPT2LMHeadModel

    hf_cfg = GPT2Config(
        **_HF_SMALL,
        activation_function="gelu_new",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        layer_norm_epsilon=1e-5,
        bos_token_id=None,
        eos_token_id=None,
        tie_word_embeddings=True,
    )
    model = GPT2LMHeadModel(hf_cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            if ".ln_" in name:  # LayerNorm: weights around 1, biases around 0, neither trivial
                param.copy_((1.0 if name.endswith("weight") else 0.0) + 0.2 * noise)
            else:
                param.copy_(0.2 * noise)
    return model.eval()


def _expected_course_weights(hf_model, cfg: Config) -> dict[str, Tensor]:
    """The course's names and layouts, from TransformerLens's own GPT-2 conversion (plus GPT-2's absent b_U)."""
    from transformer_lens.pretrained.weight_conversions.gpt2 import convert_gpt2_weights

    tl_cfg = types.SimpleNamespace(
        n_ctx=cfg.n_ctx, n_layers=cfg.n_layers, d_model=cfg.d_model, n_heads=cfg.n_heads, d_head=cfg.d_head
    )
    expected = {k: v.detach().clone() for k, v in convert_gpt2_weights(hf_model, tl_cfg).items()}
    expected["unembed.b_U"] = torch.zeros(cfg.d_vocab)
    return expected


def _hf_name(key: str) -> str:
    """The Hugging Face tensor a course key comes from, for messages."""
    parts = key.split(".")
    if key.startswith("blocks."):
        layer, rest = parts[1], ".".join(parts[2:])
        source = {
            "ln1.w": "ln_1.weight",
            "ln1.b": "ln_1.bias",
            "ln2.w": "ln_2.weight",
            "ln2.b": "ln_2.bias",
            "attn.W_Q": "attn.c_attn.weight (first d_model columns)",
            "attn.W_K": "attn.c_attn.weight (middle d_model columns)",
            "attn.W_V": "attn.c_attn.weight (last d_model columns)",
            "attn.b_Q": "attn.c_attn.bias (first d_model entries)",
            "attn.b_K": "attn.c_attn.bias (middle d_model entries)",
            "attn.b_V": "attn.c_attn.bias (last d_model entries)",
            "attn.W_O": "attn.c_proj.weight",
            "attn.b_O": "attn.c_proj.bias",
            "mlp.W_in": "mlp.c_fc.weight",
            "mlp.b_in": "mlp.c_fc.bias",
            "mlp.W_out": "mlp.c_proj.weight",
            "mlp.b_out": "mlp.c_proj.bias",
        }.get(rest, rest)
        return f"transformer.h.{layer}.{source}"
    return {
        "embed.W_E": "transformer.wte.weight",
        "pos_embed.W_pos": "transformer.wpe.weight",
        "ln_final.w": "transformer.ln_f.weight",
        "ln_final.b": "transformer.ln_f.bias",
        "unembed.W_U": "lm_head.weight (tied to transformer.wte.weight)",
        "unembed.b_U": "nothing (GPT-2 has no unembedding bias)",
    }.get(key, key)


def _key_hints(missing: list[str], unexpected: list[str]) -> str:
    if any(k.startswith(("transformer.", "lm_head")) for k in unexpected):
        return (
            " Some keys still have Hugging Face names: every key must be renamed to the course's "
            "(transformer.wte.weight -> embed.W_E, transformer.h.0.ln_1.weight -> blocks.0.ln1.w, ...)."
        )
    hints = []
    if any(k.split(".")[-2:] in (["attn", "bias"], ["attn", "masked_bias"]) for k in unexpected):
        hints.append(
            "Leave out attention mask buffers (attn.bias, attn.masked_bias): the course's Attention makes its own mask."
        )
    if "unembed.b_U" in missing:
        hints.append(
            "GPT-2's lm_head has no bias but the course's Unembed has b_U: set it to torch.zeros(cfg.d_vocab)."
        )
    missing_layers = {int(k.split(".")[1]) for k in missing if k.startswith("blocks.")}
    if missing_layers and not any(k.startswith("blocks.") for k in unexpected):
        hints.append(
            f"Layers {sorted(missing_layers)} are missing: loop over range(cfg.n_layers) "
            f"(this test model has {_HF_SMALL['n_layer']})."
        )
    if any(k.endswith(("attn.W_QKV", "attn.W_qkv", "attn.c_attn")) for k in unexpected):
        hints.append("Split the fused c_attn into separate W_Q, W_K and W_V (and b_Q, b_K, b_V).")
    return (" " + " ".join(hints)) if hints else ""


def _shape_hint(key: str, got: tuple[int, ...], want: tuple[int, ...], cfg: Config) -> str:
    if len(got) == 2 and got == want[::-1]:
        if key == "unembed.W_U":
            return (
                " It is transposed: lm_head.weight is an nn.Linear weight, stored [d_vocab, d_model]; "
                "the course's W_U is [d_model, d_vocab], so take its .T."
            )
        return (
            " It is transposed: GPT-2's Conv1D layers already store weights as [d_in, d_out], the course's "
            "layout, so use them as they are (unlike nn.Linear, which stores [d_out, d_in])."
        )
    if len(got) == len(want) and sorted(got) == sorted(want):
        return " The sizes are right but in the wrong order: check the output pattern of your rearrange."
    if key.split(".")[-1] in ("W_Q", "W_K", "W_V") and got == (cfg.d_model, 3 * cfg.d_model):
        return " That is all of c_attn: split its columns into Q, K and V (d_model each), then each into heads."
    if key.split(".")[-1] in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V") and len(got) != len(want):
        return " Split the n_heads * d_head dimension into separate n_heads and d_head dimensions."
    return ""


def _value_hint(key: str, got: Tensor, expected: dict[str, Tensor], hf: dict[str, Tensor], cfg: Config) -> str:
    """Names the likely mistake when a converted tensor has the right shape but the wrong values."""

    def same(a: Tensor, b: Tensor) -> bool:
        return a.shape == b.shape and torch.allclose(a.to(torch.float32), b.to(torch.float32), atol=1e-6, rtol=0)

    leaf = key.split(".")[-1]
    prefix = key[: -len(leaf)]
    n, h, m = cfg.n_heads, cfg.d_head, cfg.d_model
    if leaf in ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V"):
        kind = leaf[0]
        for other in "QKV":
            other_key = f"{prefix}{kind}_{other}"
            if other_key != key and same(got, expected[other_key]):
                return (
                    f" It holds the values of {kind}_{other} instead: c_attn's output columns are the queries, then "
                    "the keys, then the values (d_model each), in that order."
                )
        layer = key.split(".")[1]
        fused = hf[f"transformer.h.{layer}.attn.c_attn.{'weight' if kind == 'W' else 'bias'}"]
        part = fused.split(m, dim=-1)["QKV".index(leaf[-1])]
        if kind == "W":
            alt_heads = part.reshape(m, h, n).permute(2, 0, 1)
        else:
            alt_heads = part.reshape(h, n).T
        if same(got, alt_heads):
            return (
                " Its heads are split wrongly: the d_model columns of each of Q, K, V are n_heads blocks of d_head "
                "columns, head 0's first, so use '(n_heads d_head)', not '(d_head n_heads)'."
            )
        if kind == "W" and same(got, part.reshape(n, m, h)):
            return (
                " It is c_attn's block reshaped to [n_heads, d_model, d_head] without moving the axes: reshape "
                "keeps the memory order, so the rows (d_model) get split across heads. Split the columns into heads "
                "and move the head axis first: einops.rearrange(W, 'm (n h) -> n m h', n=n_heads), or "
                ".reshape(d_model, n_heads, d_head).permute(1, 0, 2)."
            )
        if kind == "W" and same(got, part.T.reshape(m, n, h).transpose(0, 1)):
            return (
                " It comes from c_attn.weight transposed: Conv1D already stores weights as [d_in, d_out] "
                "(here [d_model, 3 * d_model]), so split its columns, without transposing."
            )
    if leaf == "W_O":
        layer = key.split(".")[1]
        proj = hf[f"transformer.h.{layer}.attn.c_proj.weight"]
        if same(got, proj.T.reshape(n, h, m)):
            return (
                " It comes from c_proj.weight transposed: Conv1D already stores weights as [d_in, d_out] "
                "(here [n_heads * d_head, d_model]), so do not transpose it."
            )
        if same(got, proj.reshape(h, n, m).transpose(0, 1)):
            return " Its heads are split wrongly: c_proj's rows are n_heads blocks of d_head rows, so use '(n_heads d_head)'."
    if leaf in ("W_in", "W_out", "W_U") and got.ndim == 2:
        source = {"W_in": "mlp.c_fc.weight", "W_out": "mlp.c_proj.weight", "W_U": "lm_head.weight"}[leaf]
        layer = key.split(".")[1] if leaf != "W_U" else ""
        weight = hf[f"transformer.h.{layer}.{source}" if layer else source]
        if got.numel() == weight.numel() and same(got, weight.T.reshape(got.shape)) and leaf != "W_U":
            return (
                f" It is {source} transposed (then reshaped): Conv1D already stores weights as [d_in, d_out], the "
                "course's layout, so use it as it is."
            )
        if leaf == "W_U" and got.numel() == weight.numel() and same(got, weight.reshape(got.shape)):
            return (
                " It is lm_head.weight reshaped, not transposed: lm_head is an nn.Linear, stored [d_vocab, d_model]; "
                "W_U is its transpose, lm_head.weight.T ([d_model, d_vocab])."
            )
    if got.ndim == 2 and got.shape[0] == got.shape[1] and same(got, expected[key].T):
        return " It is transposed: Conv1D already stores weights as [d_in, d_out]; use them as they are."
    for other_key, other in expected.items():
        if other_key != key and same(got, other):
            return f" It holds the values that belong to {other_key} (from {_hf_name(other_key)})."
    return ""


def hf_conversion_test(convert) -> None:
    """Checks `convert(hf_state_dict, cfg) -> dict`, which renames and reshapes a Hugging Face GPT-2 state dict
    into the course's `DemoTransformer` names and layouts, on a small random `GPT2LMHeadModel`."""
    from harness.course import components

    DemoTransformer = components("05_full_gpt2").DemoTransformer
    name = getattr(convert, "__name__", "convert")
    if not callable(convert):
        fail(f"Expected the conversion function itself, got {type(convert).__name__}.")

    hf_model = _small_hf_gpt2()
    cfg = Config(
        d_model=hf_model.config.n_embd,
        layer_norm_eps=hf_model.config.layer_norm_epsilon,
        d_vocab=hf_model.config.vocab_size,
        init_range=0.02,
        n_ctx=hf_model.config.n_positions,
        d_head=hf_model.config.n_embd // hf_model.config.n_head,
        d_mlp=hf_model.config.n_inner,
        n_heads=hf_model.config.n_head,
        n_layers=hf_model.config.n_layer,
    )
    hf_state = {k: v.detach().clone() for k, v in hf_model.state_dict().items()}
    untouched = {k: v.clone() for k, v in hf_state.items()}
    expected = _expected_course_weights(hf_model, cfg)
    model = DemoTransformer(cfg).eval()
    wanted = model.state_dict()

    converted = call(convert, hf_state, cfg, what=f"{name}(hf_state_dict, cfg)")
    if converted is None:
        fail(f"{name} returned None: did you forget `return`?")
    if not isinstance(converted, Mapping):
        fail(
            f"{name} returned a {type(converted).__name__}; return a dict from the course's parameter names to tensors."
        )
    removed = sorted(set(untouched) - set(hf_state))
    if removed or set(hf_state) - set(untouched):
        fail(
            f"{name} changed the keys of the state dict it was given (e.g. removed {removed[:3]}): a `pop` or `del` "
            "empties the caller's dict, so a second conversion fails. Read from it without changing it."
        )
    for key, before in untouched.items():
        assert_unchanged(before, hf_state[key], f"{name} (on {key})")

    missing = sorted(set(wanted) - set(converted))
    unexpected = sorted(set(converted) - set(wanted))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing keys ({len(missing)}): {missing[:8]}{' ...' if len(missing) > 8 else ''}")
        if unexpected:
            parts.append(
                f"unexpected keys ({len(unexpected)}): {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}"
            )
        fail(
            f"The converted state dict does not fit DemoTransformer: {'; '.join(parts)}."
            f"{_key_hints(missing, unexpected)}"
        )

    for key, want in wanted.items():
        got = converted[key]
        if not isinstance(got, Tensor):
            fail(f"converted[{key!r}] is a {type(got).__name__}, not a torch.Tensor.")
        if tuple(got.shape) != tuple(want.shape):
            fail(
                f"converted[{key!r}] (from {_hf_name(key)}) has shape {list(got.shape)}, but DemoTransformer's "
                f"{key} is {list(want.shape)} (this test model: n_heads={cfg.n_heads}, d_head={cfg.d_head}, "
                f"d_model={cfg.d_model}, d_mlp={cfg.d_mlp}).{_shape_hint(key, tuple(got.shape), tuple(want.shape), cfg)}"
            )
        if got.dtype != torch.float32:
            fail(f"converted[{key!r}] has dtype {got.dtype}; keep the weights in torch.float32.")

    try:
        model.load_state_dict(dict(converted), strict=True)
    except Exception as err:
        raise AssertionError(f"DemoTransformer.load_state_dict(converted, strict=True) failed: {err}") from err

    tokens = torch.randint(0, cfg.d_vocab, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        hf_logits = hf_model(tokens).logits
        logits = as_tensor_output(model(tokens), "DemoTransformer")
    check_tensor(logits, (2, 11, cfg.d_vocab), "DemoTransformer (with your converted weights)")
    summary = mismatch_summary(logits, hf_logits, atol=1e-4, rtol=1e-4)
    if summary is None:
        again = call(convert, {k: v.clone() for k, v in untouched.items()}, cfg, what=f"{name} (called again)")
        if (
            not isinstance(again, Mapping)
            or set(again) != set(converted)
            or any(not torch.equal(again[k], converted[k]) for k in converted)
        ):
            fail(f"{name} gave a different result when called a second time on the same input: it must not keep state.")
        # A model with a shorter context than the checkpoint's: W_pos keeps its first cfg.n_ctx rows.
        short = replace(cfg, n_ctx=cfg.n_ctx - 3)
        cropped = call(convert, hf_state, short, what=f"{name}(hf_state_dict, cfg with n_ctx={short.n_ctx})")
        w_pos = cropped.get("pos_embed.W_pos") if isinstance(cropped, Mapping) else None
        if not isinstance(w_pos, Tensor) or tuple(w_pos.shape) != (short.n_ctx, cfg.d_model):
            fail(
                f"{name} with cfg.n_ctx = {short.n_ctx} (the checkpoint has {cfg.n_ctx} positions) gave pos_embed.W_pos "
                f"of shape {list(getattr(w_pos, 'shape', []))}, expected [{short.n_ctx}, {cfg.d_model}]: keep the "
                "first cfg.n_ctx rows of transformer.wpe.weight, so that a model with a shorter context loads it."
            )
        diff = (logits - hf_logits).abs().max().item()
        print(
            f"{name} passed: DemoTransformer with the converted weights matches transformers' logits (max |diff| {diff:.1e})."
        )
        return

    for key in wanted:
        got = converted[key].detach()
        if not torch.allclose(got, expected[key], atol=1e-6, rtol=0):
            # The tensor and the likely cause first, then the evidence (the logits) that shows it matters.
            fail(
                f"converted[{key!r}] (from {_hf_name(key)}) is the first wrong tensor."
                f"{_value_hint(key, got, expected, hf_state, cfg)} (The logits of DemoTransformer with your weights "
                f"differ from transformers': {summary}.)"
            )
    fail(
        f"Every converted tensor looks right, yet the logits differ from transformers' ({summary}). "
        "Is the course's DemoTransformer intact (components('05_full_gpt2'))?"
    )


# --------------------------------------------------------------------------------------------------------------------
# cross_entropy_test
# --------------------------------------------------------------------------------------------------------------------


def _reference_ce(logits: Tensor, tokens: Tensor) -> Tensor:
    """Next-token cross-entropy, mean over every (sequence, position) that has a next token."""
    d_vocab = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, d_vocab).double(), tokens[:, 1:].reshape(-1))


def _ce_diagnosis(value: float, logits: Tensor, tokens: Tensor) -> str:
    """Compares a wrong loss with the losses that common mistakes give."""
    batch, pos, d_vocab = logits.shape
    logits = logits.double()
    right = _reference_ce(logits, tokens).item()
    log_probs = logits.log_softmax(-1)
    candidates = [
        (-right, "It has the wrong sign: the loss is the *negative* mean log-probability of the correct next tokens."),
        (
            F.cross_entropy(logits.reshape(-1, d_vocab), tokens.reshape(-1)).item(),
            (
                "It scores each position's logits against the token at the same position. The logits at position "
                "i predict token i+1: compare logits[:, :-1] with tokens[:, 1:]."
            ),
        ),
        (
            F.cross_entropy(logits[:, 1:].reshape(-1, d_vocab), tokens[:, :-1].reshape(-1)).item(),
            (
                "It is shifted the wrong way: the logits at position i predict token i+1, so pair logits[:, :-1] "
                "with tokens[:, 1:] (not logits[:, 1:] with tokens[:, :-1])."
            ),
        ),
        (right * batch * (pos - 1), "It is the sum over all positions: take the mean instead."),
        (right * (pos - 1), "It sums over positions (and averages over the batch): take the mean over both."),
        (right * batch, "It sums over the batch: take the mean over every (sequence, position) pair."),
        (
            -logits[:, :-1].gather(-1, tokens[:, 1:, None]).mean().item(),
            "It uses the raw logits as log-probabilities: apply log_softmax over the vocabulary first.",
        ),
        (
            -log_probs[:, :-1].gather(-1, tokens[:, 1:, None]).exp().mean().item(),
            "It averages probabilities, not log-probabilities: take the log of the probability of each correct token.",
        ),
        (
            -log_probs[:, :-1].mean().item(),
            "It averages the log-probabilities of the whole vocabulary: pick out (gather) only the correct next token's.",
        ),
        (right / math.log(2), "It is in bits (log2): use the natural logarithm, as torch.log and F.cross_entropy do."),
        (
            -log_probs.gather(-1, tokens.roll(-1, dims=1)[..., None]).mean().item(),
            (
                "It pairs the last position's logits with the first token (torch.roll wraps around): the last "
                "position has no next token, so drop it: logits[:, :-1] with tokens[:, 1:]."
            ),
        ),
        (
            right * (pos - 1) / pos,
            (
                f"It divides the summed loss by batch * pos ({batch * pos}): only batch * (pos - 1) = "
                f"{batch * (pos - 1)} positions have a next token, so take the mean over those."
            ),
        ),
        (
            -logits[:, :-1].log_softmax(1).gather(-1, tokens[:, 1:, None]).mean().item(),
            (
                "It takes log_softmax over the positions (dim=1): normalise over the vocabulary, the last dimension "
                "(dim=-1)."
            ),
        ),
    ]
    for candidate, hint in candidates:
        if math.isfinite(candidate) and abs(value - candidate) <= 1e-4 + 1e-4 * abs(candidate):
            return " " + hint
    return ""


def _ce_inputs(seed: int, scale: float) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    batch, pos, d_vocab = 3, 7, 13
    logits = scale * torch.randn(batch, pos, d_vocab, generator=gen)
    tokens = torch.randint(0, d_vocab, (batch, pos), generator=gen)
    return logits, tokens


def _loss_evidence(loss_fn, logits: Tensor, tokens: Tensor, value: float, expected: float) -> str:
    """What changing one row's or one position's logits does to the learner's loss and to the expected one; and
    whether the value is the expected one scaled by a size."""
    from harness._evidence import rows_and_positions, scale_note, sensitivity

    batch, pos, d_vocab = logits.shape

    def learner(x):
        with torch.no_grad():
            return float(loss_fn(x.clone(), tokens.clone()))

    def reference(x):
        return _reference_ce(x, tokens).item()

    try:
        notes = sensitivity(learner, reference, logits, rows_and_positions(batch, pos))
        other = (tokens + 1) % d_vocab
        with torch.no_grad():
            if float(loss_fn(logits.clone(), other)) == value:
                notes = "; ".join(n for n in (notes, "other target tokens did not change your value") if n)
    except Exception:  # noqa: BLE001 - the learner's function failing on other inputs: no further evidence
        notes = ""
    scale = scale_note(value, expected, {"d_vocab": d_vocab, "batch": batch, "pos": pos, "pos - 1": pos - 1})
    found = "; ".join(n for n in (notes, scale) if n)
    return f" Changing the inputs shows: {found}." if found else ""


def cross_entropy_test(cross_entropy_loss) -> None:
    """Checks `cross_entropy_loss(logits, tokens) -> scalar`: the mean next-token cross-entropy of a batch."""
    name = getattr(cross_entropy_loss, "__name__", "cross_entropy_loss")
    if not callable(cross_entropy_loss):
        fail(f"Expected the loss function itself, got {type(cross_entropy_loss).__name__}.")

    # Large logits: softmax underflows to exactly 0 in float32 for the correct token of some positions
    # (it sits 200 below the largest logit), and exp() alone would overflow; only a log-sum-exp survives.
    big_logits, big_tokens = _ce_inputs(seed=3, scale=1.0)
    big_logits[:, :, 0] += 100.0
    big_logits[0, :-1].scatter_(-1, big_tokens[0, 1:, None], -100.0)

    for what, (logits, tokens) in (
        ("random logits", _ce_inputs(seed=0, scale=2.0)),
        ("logits of large magnitude (up to about 100)", (big_logits, big_tokens)),
    ):
        batch, pos, d_vocab = logits.shape
        leaf = logits.clone().requires_grad_(True)
        tokens_in = tokens.clone()
        with torch.enable_grad():  # the notebook may have turned gradients off
            out = call(cross_entropy_loss, leaf, tokens_in, what=f"{name}(logits, tokens)")
        if isinstance(out, float | int):
            fail(
                f"{name} returned a Python {type(out).__name__}: return the tensor itself (no .item()), so it can be backpropagated."
            )
        out = as_tensor_output(out, name)
        assert_unchanged(logits, leaf.detach(), name)
        assert_unchanged(tokens, tokens_in, name)
        if out.ndim != 0:
            hint = ""
            if out.numel() > 1:
                hint = " It seems to keep one loss per sequence or position: average them all into one number."
            elif out.numel() == 1:
                hint = " Return a 0-dimensional tensor (e.g. the result of .mean()), not one of shape [1]."
            fail(f"{name} returned a tensor of shape {list(out.shape)}; the loss is a scalar (shape []).{hint}")
        if out.dtype != torch.float32:
            fail(f"{name} returned dtype {out.dtype}; with float32 logits the loss should be float32.")
        if not out.requires_grad:
            fail(
                f"{name} returned a tensor that does not depend on the logits' gradient: no .item(), .detach(), "
                "torch.no_grad() or NumPy inside the loss, or training could not backpropagate through it."
            )
        expected = _reference_ce(logits, tokens).item()
        value = out.item()
        if not math.isfinite(value):
            fail(
                f"On {what}, {name} returned {value} (expected {expected:.4f}). softmax underflows to 0 (and exp "
                "overflows) for large logits, so log(softmax(x)) gives -inf or nan: use torch.log_softmax, which "
                "subtracts the largest logit first (the log-sum-exp trick)."
            )
        if abs(value - expected) > 1e-4 + 1e-4 * abs(expected):
            hint = _ce_diagnosis(value, logits, tokens)
            if not hint and what.startswith("logits of large"):
                hint = (
                    " It is right on small logits but not on large ones: log(softmax(x) + eps) or clamping hides the "
                    "underflow without fixing it; use torch.log_softmax (the log-sum-exp trick)."
                )
            evidence = (
                f"On {what} (batch {batch}, {pos} positions, {d_vocab} tokens), {name} returned {value:.6f}, "
                f"expected {expected:.6f}: the mean of -log p(tokens[:, i+1] | logits[:, i]) over all "
                f"{batch * (pos - 1)} predictions."
            )
            if hint:  # the likely cause first, then the evidence
                fail(f"{name}:{hint} ({evidence})")
            observed = _loss_evidence(cross_entropy_loss, logits, tokens, value, expected)
            if observed:  # what the controlled changes show, before the definition
                fail(
                    f"On {what}, {name} returned {value:.6f}, expected {expected:.6f}.{observed} The expected value "
                    f"is the mean of -log p(tokens[:, i+1] | logits[:, i]) over all {batch * (pos - 1)} predictions."
                )
            fail(evidence)
        with torch.enable_grad():
            out.backward()
        if leaf.grad is None or not torch.isfinite(leaf.grad).all():
            fail(f"Backpropagating through {name} on {what} gave no or non-finite gradients: use log_softmax.")
    logits, tokens = _ce_inputs(seed=0, scale=2.0)  # right values: then, were they made by a loss of torch's?
    refuse_operators(
        cross_entropy_loss,
        logits,
        tokens,
        patterns=LOSS_OPS,
        what=f"{name}(logits, tokens)",
        rule="the exercise is the loss from log_softmax and each target's log-probability, without F.cross_entropy, "
        "F.nll_loss or another of torch's losses",
    )
    print(f"{name} passed: matches F.cross_entropy on next-token targets, also for large logits.")


# --------------------------------------------------------------------------------------------------------------------
# greedy_generate_test
# --------------------------------------------------------------------------------------------------------------------

_GEN_VOCAB = 17


def _next_token_rule(prefix: list[int]) -> int:
    """The token a test model's logits favour after `prefix`: depends on all of it and on its length."""
    return (7 * sum(prefix) + 3 * len(prefix) + 1) % _GEN_VOCAB


class _EndOfTextLM(nn.Module):
    """GPT-2's vocabulary, and <|endoftext|> the likeliest next token at every position."""

    EOT = 50256

    def __init__(self):
        super().__init__()
        self.cfg = Config(d_vocab=self.EOT + 1, n_ctx=64, d_model=8, d_head=4, n_heads=2, d_mlp=16, n_layers=1)

    def forward(self, tokens: Tensor) -> Tensor:
        logits = torch.zeros(*tokens.shape, self.cfg.d_vocab)
        logits[..., self.EOT] = 1.0
        return logits


class _RuleLM(nn.Module):
    """A deterministic stand-in for a language model: logits [batch pos d_vocab] whose argmax at position p is
    `_next_token_rule(tokens[:p+1])`, with a small margin, so sampling would rarely pick it."""

    def __init__(self, n_ctx: int = 64):
        super().__init__()
        self.cfg = Config(d_vocab=_GEN_VOCAB, n_ctx=n_ctx, d_model=8, d_head=4, n_heads=2, d_mlp=16, n_layers=1)
        self.base = nn.Parameter(
            torch.rand(_GEN_VOCAB, generator=torch.Generator().manual_seed(0)), requires_grad=False
        )
        self.calls: list[tuple[int, ...]] = []

    def forward(self, tokens: Tensor) -> Tensor:
        if tokens.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"the model takes integer token ids, got dtype {tokens.dtype}")
        if tokens.ndim != 2:
            raise ValueError(f"the model takes tokens of shape [batch, pos], got {list(tokens.shape)}")
        self.calls.append(tuple(tokens.shape))
        batch, pos = tokens.shape
        if pos > self.cfg.n_ctx:
            raise ValueError(f"{pos} positions, more than the model's n_ctx = {self.cfg.n_ctx}")
        logits = self.base.expand(batch, pos, _GEN_VOCAB).clone()
        for b in range(batch):
            row = tokens[b].tolist()
            for p in range(pos):
                logits[b, p, _next_token_rule(row[: p + 1])] = self.base.max() + 0.3
        return logits


def _greedy_variants(prompt: list[int], n_new: int) -> dict[str, list[int]]:
    right, first, last_only = list(prompt), list(prompt), list(prompt)
    for _ in range(n_new):
        right.append(_next_token_rule(right))
        first.append(_next_token_rule(first[:1]))
        last_only.append(_next_token_rule(last_only[-1:]))
    return {
        "right": right,
        "first": first,
        "last_only": last_only,
        "not_appended": list(prompt) + [_next_token_rule(prompt)] * n_new,
    }


def greedy_generate_test(greedy_generate) -> None:
    """Checks `greedy_generate(model, tokens, n_new) -> tokens`: append the argmax next token n_new times."""
    name = getattr(greedy_generate, "__name__", "greedy_generate")
    if not callable(greedy_generate):
        fail(f"Expected the generation function itself, got {type(greedy_generate).__name__}.")
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, _GEN_VOCAB, (2, 5), generator=gen)
    n_new = 6
    batch, pos = tokens.shape
    want = {
        kind: torch.tensor([_greedy_variants(row, n_new)[kind] for row in tokens.tolist()])
        for kind in ("right", "first", "last_only", "not_appended")
    }

    outs = []
    for attempt in range(2):
        model = _RuleLM().eval()
        tokens_in = tokens.clone()
        out = call(greedy_generate, model, tokens_in, n_new, what=f"{name}(model, tokens, n_new={n_new})")
        out = as_tensor_output(out, name)
        assert_unchanged(tokens, tokens_in, name)
        if tuple(out.shape) == (batch, n_new):
            fail(
                f"{name} returned shape {list(out.shape)}: only the new tokens. Return the prompt followed by them, [batch, pos + n_new]."
            )
        if tuple(out.shape) != (batch, pos + n_new):
            fail(
                f"{name} returned shape {list(out.shape)} for a prompt of shape {[batch, pos]} and n_new={n_new}; "
                f"expected {[batch, pos + n_new]}: the prompt followed by n_new tokens, one per step. If a dimension "
                "is off, check which dimension argmax reduces: the vocabulary (dim=-1) of the last position's logits."
            )
        if out.dtype != torch.int64:
            fail(f"{name} returned dtype {out.dtype}; token ids are torch.int64 (torch.long), as argmax returns them.")
        if not torch.equal(out[:, :pos], tokens):
            fail(f"{name} changed the prompt: the first {pos} tokens of its output must be the input tokens unchanged.")
        outs.append(out)
        calls = model.calls
    if not torch.equal(outs[0], outs[1]):
        fail(
            f"{name} gave different outputs on two runs with the same model and prompt: greedy generation is "
            "deterministic, it takes the argmax of the logits (no sampling, no torch.multinomial)."
        )
    out = outs[0]
    if torch.equal(out, want["right"]):
        short = as_tensor_output(
            call(greedy_generate, _RuleLM().eval(), tokens.clone(), 2, what=f"{name}(model, tokens, n_new=2)"), name
        )
        expected = torch.tensor([_greedy_variants(row, 2)["right"] for row in tokens.tolist()])
        if tuple(short.shape) != tuple(expected.shape) or not torch.equal(short, expected):
            fail(
                f"{name}(model, tokens, n_new=2) differs from the first 2 of the {n_new} greedy tokens that "
                f"n_new={n_new} gave (shape {list(short.shape)}, expected {list(expected.shape)}): the number of "
                "new tokens must follow the n_new argument."
            )
        # A model whose argmax is always GPT-2's <|endoftext|>: greedy_generate has no end-of-text rule.
        eot = as_tensor_output(
            call(greedy_generate, _EndOfTextLM().eval(), tokens[:1].clone(), 3, what=f"{name}(model, tokens, n_new=3)"),
            name,
        )
        if tuple(eot.shape) != (1, pos + 3) or not (eot[0, pos:] == _EndOfTextLM.EOT).all():
            fail(
                f"{name} on a model whose likeliest token is always <|endoftext|> ({_EndOfTextLM.EOT}) returned "
                f"shape {list(eot.shape)}, expected [1, {pos + 3}] ending in three {_EndOfTextLM.EOT}s: append "
                "exactly n_new tokens, whatever they are (stopping at <|endoftext|> comes in notebook 07)."
            )
        # The context filled exactly: 2 prompt tokens and 3 new ones on a model of 4 positions, whose last forward
        # sees all 4 (a window one short passed while no forward reached the context: agreement sweep 17)
        edge = as_tensor_output(
            call(greedy_generate, _RuleLM(n_ctx=4).eval(), tokens[:, :2].clone(), 3, what=f"{name}(model, tokens, 3)"),
            name,
        )
        expected = torch.tensor([_greedy_variants(row, 3)["right"] for row in tokens[:, :2].tolist()])
        if tuple(edge.shape) != tuple(expected.shape) or not torch.equal(edge, expected):
            fail(
                f"{name} on a model of n_ctx = 4, a 2-token prompt and 3 new tokens returned {edge.tolist()}, expected "
                f"{expected.tolist()}: the last forward sees the whole sequence, all 4 positions the model takes."
            )
        print(f"{name} passed: {n_new} and 2 greedy tokens appended correctly for a batch of {batch} prompts.")
        return

    step = int((out != want["right"]).any(dim=0).nonzero()[0])
    hint = ""
    if torch.equal(out, want["first"]):
        hint = " Each new token is the argmax at the *first* position: take the logits of the last position, logits[:, -1]."
    elif torch.equal(out, want["not_appended"]):
        hint = (
            " Every new token is the same prediction from the prompt: append each new token to the sequence and "
            "run the model on the extended sequence at the next step."
        )
    elif torch.equal(out, want["last_only"]):
        hint = (
            " The model sees only the newest token at each step: feed it the whole sequence so far (this model has "
            "no key-value cache)."
        )
    elif calls and any(shape[1] != pos + i for i, shape in enumerate(calls[:n_new])):
        hint = f" The model was called on sequences of lengths {[s[1] for s in calls]}; expected {list(range(pos, pos + n_new))}."
    elif (
        batch > 1
        and (out[:, step] == out[0, step]).all()
        and not (want["right"][:, step] == want["right"][0, step]).all()
    ):
        hint = (
            " Every row got row 0's token: each row's next token is the argmax of its own logits, "
            "logits[:, -1].argmax(dim=-1, keepdim=True) (one per row)."
        )
    else:
        # Is the wrong token at least the argmax of the model's logits for the tokens that precede it in the output?
        with torch.no_grad():
            argmax = _RuleLM()(out[:, :step])[:, -1].argmax(dim=-1)
        if not torch.equal(argmax, out[:, step]):
            hint = (
                f" The token appended at position {step} is not the most likely next token of the sequence before "
                f"it (the argmax of the last position's logits is {argmax.tolist()}): greedy decoding appends "
                "logits[:, -1].argmax(dim=-1), the argmax over the vocabulary, with no sampling."
            )
    where = (
        f"the first wrong one is new token {step - pos} (position {step}), got {out[:, step].tolist()}, expected "
        f"{want['right'][:, step].tolist()} (one per prompt)"
    )
    if hint:  # the likely cause first, then the evidence
        fail(f"{name} returned the wrong tokens:{hint} ({where.capitalize()}.)")
    fail(f"{name} returned the wrong tokens: {where}.")
