"""The checks of harness/gpt2_checks.py pass the course's own implementations and fail realistic wrong ones."""

from __future__ import annotations

import einops
import pytest
import torch
import torch.nn.functional as F

from harness import components, cross_entropy_test, gelu_new_test, greedy_generate_test, hf_conversion_test


@pytest.fixture(scope="module")
def course():
    return components("05_full_gpt2")


def passes(check, fn, capsys) -> None:
    assert check(fn) is None
    out, err = capsys.readouterr()
    assert err == ""
    assert out.count("\n") == 1 and "passed" in out


# --------------------------------------------------------------------------------------------------------------------
# gelu_new_test
# --------------------------------------------------------------------------------------------------------------------


def test_gelu_passes_course(course, capsys):
    passes(gelu_new_test, course.gelu_new, capsys)


def gelu_exact(x):
    return F.gelu(x)


def gelu_wrong_constant(x):
    return 0.5 * x * (1.0 + torch.tanh((2.0 / torch.pi) * (x + 0.044715 * x.pow(3))))  # 2/pi, not sqrt(2/pi)


def gelu_square(x):
    return 0.5 * x * (1.0 + torch.tanh((2.0 / torch.pi) ** 0.5 * (x + 0.044715 * x.pow(2))))


def gelu_no_half(x):
    return x * (1.0 + torch.tanh((2.0 / torch.pi) ** 0.5 * (x + 0.044715 * x.pow(3))))


def gelu_in_place(x):
    return x.mul_(torch.sigmoid(1.702 * x.clone()))


def gelu_float64(x):
    return F.gelu(x.double(), approximate="tanh")


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (gelu_exact, "exact GELU"),
        (gelu_wrong_constant, "differ"),
        (gelu_square, "differ"),
        (gelu_no_half, "0.5"),
        (gelu_in_place, "in place"),
        (gelu_float64, "dtype"),
        (torch.relu, "ReLU"),
    ],
)
def test_gelu_fails_wrong(fn, message):
    with pytest.raises(AssertionError, match=message):
        gelu_new_test(fn)


# --------------------------------------------------------------------------------------------------------------------
# hf_conversion_test: each wrong version takes the course's conversion and makes one realistic mistake in it
# --------------------------------------------------------------------------------------------------------------------


def test_conversion_passes_course(course, capsys):
    passes(hf_conversion_test, course.convert_hf_gpt2_state_dict, capsys)


def _wrong_conversion(course, mistake):
    def convert(hf, cfg):
        sd = course.convert_hf_gpt2_state_dict(hf, cfg)
        mistake(sd, hf, cfg)
        return sd

    return convert


def _each_layer(fn):
    def mistake(sd, hf, cfg):
        for i in range(cfg.n_layers):
            fn(sd, hf, cfg, f"transformer.h.{i}.", f"blocks.{i}.")

    return mistake


@_each_layer
def qkv_as_kqv(sd, hf, cfg, h, b):  # the fused columns read in the wrong order
    sd[b + "attn.W_Q"], sd[b + "attn.W_K"] = sd[b + "attn.W_K"], sd[b + "attn.W_Q"]
    sd[b + "attn.b_Q"], sd[b + "attn.b_K"] = sd[b + "attn.b_K"], sd[b + "attn.b_Q"]


@_each_layer
def heads_split_d_head_first(sd, hf, cfg, h, b):
    for name, W in zip("QKV", hf[h + "attn.c_attn.weight"].split(cfg.d_model, dim=1)):
        sd[b + f"attn.W_{name}"] = einops.rearrange(W, "m (h n) -> n m h", n=cfg.n_heads)


@_each_layer
def c_proj_transposed_like_linear(sd, hf, cfg, h, b):
    sd[b + "attn.W_O"] = einops.rearrange(hf[h + "attn.c_proj.weight"].T, "(n h) m -> n h m", n=cfg.n_heads)


@_each_layer
def c_attn_transposed_like_linear(sd, hf, cfg, h, b):
    for name, W in zip("QKV", hf[h + "attn.c_attn.weight"].T.split(cfg.d_model, dim=0)):
        sd[b + f"attn.W_{name}"] = einops.rearrange(W, "m (n h) -> n m h", n=cfg.n_heads)


@_each_layer
def mlp_transposed_like_linear(sd, hf, cfg, h, b):
    sd[b + "mlp.W_in"] = hf[h + "mlp.c_fc.weight"].T
    sd[b + "mlp.W_out"] = hf[h + "mlp.c_proj.weight"].T


@_each_layer
def heads_by_view(sd, hf, cfg, h, b):  # view(d_model, d_head, n_heads): heads as the last dimension
    sd[b + "attn.W_Q"] = sd[b + "attn.W_Q"].permute(1, 2, 0).reshape(cfg.d_model, cfg.d_head, cfg.n_heads)


def unembed_not_transposed(sd, hf, cfg):
    sd["unembed.W_U"] = hf["lm_head.weight"]


def no_unembed_bias(sd, hf, cfg):
    del sd["unembed.b_U"]


def ln_swapped(sd, hf, cfg):
    sd["blocks.0.ln1.w"], sd["blocks.0.ln2.w"] = sd["blocks.0.ln2.w"], sd["blocks.0.ln1.w"]


def hf_names_kept(hf, cfg):
    return dict(hf)


def only_first_layer(hf, cfg):
    sd = components("05_full_gpt2").convert_hf_gpt2_state_dict(hf, cfg)
    return {k: v for k, v in sd.items() if not k.startswith("blocks.") or k.startswith("blocks.0.")}


def twelve_layers_hard_coded(hf, cfg):
    cfg = type(cfg)(**{**cfg.__dict__, "n_layers": 12})
    return components("05_full_gpt2").convert_hf_gpt2_state_dict(hf, cfg)


def in_place_transpose(hf, cfg):
    sd = components("05_full_gpt2").convert_hf_gpt2_state_dict(hf, cfg)
    hf["transformer.wte.weight"].mul_(1.0001)
    return sd


def no_return(hf, cfg):
    components("05_full_gpt2").convert_hf_gpt2_state_dict(hf, cfg)


@pytest.mark.parametrize(
    ("mistake", "message"),
    [
        (qkv_as_kqv, "values of W_K instead.*queries, then the keys"),
        (heads_split_d_head_first, "heads are split wrongly"),
        (c_proj_transposed_like_linear, "c_proj.weight transposed"),
        (c_attn_transposed_like_linear, "c_attn.weight transposed"),
        (mlp_transposed_like_linear, r"mlp.W_in.*shape \[40, 24\].*transposed"),
        (heads_by_view, r"shape \[24, 8, 3\].*wrong order"),
        (unembed_not_transposed, r"unembed.W_U.*nn.Linear weight"),
        (no_unembed_bias, r"missing keys.*unembed.b_U.*torch.zeros"),
        (ln_swapped, r"blocks.0.ln1.w.*belong to blocks.0.ln2.w"),
    ],
)
def test_conversion_fails_wrong_layouts(course, mistake, message):
    with pytest.raises(AssertionError, match=message):
        hf_conversion_test(_wrong_conversion(course, mistake))


@pytest.mark.parametrize(
    ("convert", "message"),
    [
        (hf_names_kept, "Hugging Face names"),
        (only_first_layer, r"Layers \[1\] are missing"),
        (twelve_layers_hard_coded, "raised KeyError"),
        (in_place_transpose, "in place"),
        (no_return, "forget `return`"),
    ],
)
def test_conversion_fails_wrong_functions(convert, message):
    with pytest.raises(AssertionError, match=message):
        hf_conversion_test(convert)


def test_conversion_that_empties_the_callers_dict_is_named(course):
    def convert_by_popping(hf, cfg):
        converted = course.convert_hf_gpt2_state_dict(hf, cfg)
        for key in list(hf):
            hf.pop(key)  # "nothing else needs it"
        return converted

    with pytest.raises(AssertionError, match="pop"):
        hf_conversion_test(convert_by_popping)


def test_conversion_that_keeps_state_between_calls_is_named(course):
    calls = []

    def convert_once(hf, cfg):
        calls.append(1)
        converted = course.convert_hf_gpt2_state_dict(hf, cfg)
        if len(calls) > 1:  # e.g. a module-level cache keyed by nothing, or a counter that shifts layers
            converted["ln_final.w"] = converted["ln_final.w"] * 2
        return converted

    with pytest.raises(AssertionError, match="second time"):
        hf_conversion_test(convert_once)


# --------------------------------------------------------------------------------------------------------------------
# cross_entropy_test
# --------------------------------------------------------------------------------------------------------------------


def test_cross_entropy_passes_course(course, capsys):
    passes(cross_entropy_test, course.cross_entropy_loss, capsys)


def ce_no_shift(logits, tokens):
    return -logits.log_softmax(-1).gather(-1, tokens[..., None]).mean()


def ce_shift_backwards(logits, tokens):
    return -logits[:, 1:].log_softmax(-1).gather(-1, tokens[:, :-1, None]).mean()


def ce_sum(logits, tokens):
    return -logits[:, :-1].log_softmax(-1).gather(-1, tokens[:, 1:, None]).sum()


def ce_sum_over_positions(logits, tokens):
    return -logits[:, :-1].log_softmax(-1).gather(-1, tokens[:, 1:, None])[..., 0].sum(-1).mean()


def ce_log_of_softmax(logits, tokens):
    return -logits[:, :-1].softmax(-1).log().gather(-1, tokens[:, 1:, None]).mean()


def ce_naive_exp(logits, tokens):
    probs = logits[:, :-1].exp() / logits[:, :-1].exp().sum(-1, keepdim=True)
    return -probs.gather(-1, tokens[:, 1:, None]).log().mean()


def ce_epsilon(logits, tokens):
    return -(logits[:, :-1].softmax(-1) + 1e-9).log().gather(-1, tokens[:, 1:, None]).mean()


def ce_wrong_sign(logits, tokens):
    return logits[:, :-1].log_softmax(-1).gather(-1, tokens[:, 1:, None]).mean()


def ce_raw_logits(logits, tokens):
    return -logits[:, :-1].gather(-1, tokens[:, 1:, None]).mean()


def ce_item(logits, tokens):
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten()).item()


def ce_detached(logits, tokens):
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten()).detach()


def ce_per_position(logits, tokens):
    return -logits[:, :-1].log_softmax(-1).gather(-1, tokens[:, 1:, None])[..., 0]


def ce_log2(logits, tokens):
    return -(logits[:, :-1].log_softmax(-1) / torch.log(torch.tensor(2.0))).gather(-1, tokens[:, 1:, None]).mean()


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (ce_no_shift, "same position.*logits\\[:, :-1\\]"),
        (ce_shift_backwards, "shifted the wrong way"),
        (ce_sum, "sum over all positions"),
        (ce_sum_over_positions, "sums over positions"),
        (ce_log_of_softmax, "inf.*log-sum-exp"),
        (ce_naive_exp, "nan.*log-sum-exp"),
        (ce_epsilon, "eps.*log_softmax"),
        (ce_wrong_sign, "wrong sign"),
        (ce_raw_logits, "raw logits"),
        (ce_item, "Python float"),
        (ce_detached, "gradient"),
        (ce_per_position, r"shape \[3, 6\].*one loss per"),
        (ce_log2, "natural logarithm"),
    ],
)
def test_cross_entropy_fails_wrong(fn, message):
    with pytest.raises(AssertionError, match=message):
        cross_entropy_test(fn)


# --------------------------------------------------------------------------------------------------------------------
# greedy_generate_test
# --------------------------------------------------------------------------------------------------------------------


def test_greedy_passes_course(course, capsys):
    passes(greedy_generate_test, course.greedy_generate, capsys)


def gen_first_position(model, tokens, n_new):
    for _ in range(n_new):
        tokens = torch.cat([tokens, model(tokens)[:, 0].argmax(-1, keepdim=True)], dim=1)
    return tokens


def gen_argmax_over_positions(model, tokens, n_new):
    for _ in range(n_new):
        tokens = torch.cat([tokens, model(tokens).argmax(dim=1)[:, -1:]], dim=1)
    return tokens


def gen_argmax_over_batch(model, tokens, n_new):
    for _ in range(n_new):
        tokens = torch.cat([tokens, model(tokens)[:, -1].argmax(dim=0)[None]], dim=1)
    return tokens


def gen_not_appended(model, tokens, n_new):
    out = tokens
    for _ in range(n_new):
        out = torch.cat([out, model(tokens)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return out


def gen_sampling(model, tokens, n_new):
    for _ in range(n_new):
        probs = model(tokens)[:, -1].softmax(-1)
        tokens = torch.cat([tokens, torch.multinomial(probs, 1)], dim=1)
    return tokens


def gen_last_token_only(model, tokens, n_new):
    out = tokens
    for _ in range(n_new):
        out = torch.cat([out, model(out[:, -1:])[:, -1].argmax(-1, keepdim=True)], dim=1)
    return out


def gen_only_new(model, tokens, n_new):
    new = []
    for _ in range(n_new):
        new.append(model(tokens)[:, -1].argmax(-1, keepdim=True))
        tokens = torch.cat([tokens, new[-1]], dim=1)
    return torch.cat(new, dim=1)


def gen_float_tokens(model, tokens, n_new):
    for _ in range(n_new):
        tokens = torch.cat([tokens, model(tokens)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return tokens.float()


def gen_in_place(model, tokens, n_new):
    out = greedy = components("05_full_gpt2").greedy_generate(model, tokens, n_new)
    tokens[:] = greedy[:, : tokens.shape[1]].flip(1)
    return out


def gen_stops_at_eot(model, tokens, n_new):  # 07's rule, a notebook early
    for _ in range(n_new):
        nxt = model(tokens)[:, -1].argmax(-1, keepdim=True)
        tokens = torch.cat([tokens, nxt], dim=1)
        if (nxt == 50256).all():
            break
    return tokens


def gen_six_tokens(model, tokens, n_new):  # the 6 of the check's first call, in place of the argument
    return components("05_full_gpt2").greedy_generate(model, tokens, 6)


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (gen_first_position, r"\*first\* position"),
        (gen_argmax_over_positions, "argmax over the vocabulary"),
        (gen_argmax_over_batch, "raised RuntimeError"),
        (gen_not_appended, "append each new token"),
        (gen_sampling, "no sampling"),
        (gen_last_token_only, "only the newest token"),
        (gen_only_new, "only the new tokens"),
        (gen_float_tokens, "dtype torch.float32"),
        (gen_in_place, "in place"),
        (gen_six_tokens, "follow the n_new argument"),
        (gen_stops_at_eot, "append exactly n_new tokens"),
    ],
)
def test_greedy_fails_wrong(fn, message):
    with pytest.raises(AssertionError, match=message):
        greedy_generate_test(fn)


# --------------------------------------------------------------------------------------------------------------------
# Mistakes found by bench/naming_rate.py: the cause leads the message
# --------------------------------------------------------------------------------------------------------------------


def _ce_roll(logits, tokens):
    return -logits.log_softmax(-1).gather(-1, tokens.roll(-1, dims=1)[..., None]).mean()


def _ce_divides_by_all(logits, tokens):
    return -logits[:, :-1].log_softmax(-1).gather(-1, tokens[:, 1:, None]).sum() / tokens.numel()


def _ce_softmax_over_positions(logits, tokens):
    return -logits[:, :-1].log_softmax(1).gather(-1, tokens[:, 1:, None]).mean()


def _ce_no_shift(logits, tokens):
    return F.cross_entropy(logits.flatten(0, 1), tokens.flatten())


@pytest.mark.parametrize(
    ("fn", "match"),
    [
        (_ce_roll, r"^_ce_roll: It pairs the last position's logits with the first token \(torch.roll wraps"),
        (_ce_divides_by_all, r"^_ce_divides_by_all: It divides the summed loss by batch \* pos"),
        (_ce_softmax_over_positions, r"^_ce_softmax_over_positions: It takes log_softmax over the positions"),
        (_ce_no_shift, r"^_ce_no_shift: It scores each position's logits against the token at the same position"),
    ],
)
def test_cross_entropy_names_the_cause_first(fn, match):
    with pytest.raises(AssertionError, match=match):
        cross_entropy_test(fn)


def _conversion_with(course, mistake):
    def convert(hf, cfg):
        sd = course.convert_hf_gpt2_state_dict(hf, cfg)
        for i in range(cfg.n_layers):
            h, b = f"transformer.h.{i}.", f"blocks.{i}."
            if mistake == "reshape":  # reshape to [n_heads, d_model, d_head] without moving the axes
                for name, W in zip("QKV", hf[h + "attn.c_attn.weight"].split(cfg.d_model, dim=1)):
                    sd[b + f"attn.W_{name}"] = W.reshape(cfg.n_heads, cfg.d_model, cfg.d_head)
            elif mistake == "c_fc":  # Conv1D taken for nn.Linear: transposed, then reshaped to fit
                sd[b + "mlp.W_in"] = hf[h + "mlp.c_fc.weight"].T.reshape(cfg.d_model, cfg.d_mlp)
        if mistake == "lm_head":
            sd["unembed.W_U"] = hf["lm_head.weight"].reshape(cfg.d_model, cfg.d_vocab)
        return sd

    return convert


@pytest.mark.parametrize(
    ("mistake", "match"),
    [
        ("reshape", r"^converted\['blocks.0.attn.W_Q'\] .* is the first wrong tensor. It is c_attn's block reshaped"),
        ("c_fc", r"^converted\['blocks.0.mlp.W_in'\] .* It is mlp.c_fc.weight transposed \(then reshaped\)"),
        ("lm_head", r"^converted\['unembed.W_U'\] .* It is lm_head.weight reshaped, not transposed"),
    ],
)
def test_conversion_names_the_wrong_tensor_and_layout_first(course, mistake, match):
    with pytest.raises(AssertionError, match=match):
        hf_conversion_test(_conversion_with(course, mistake))


@torch.no_grad()
def _greedy_first_row(model, tokens, n_new):
    for _ in range(n_new):
        token = model(tokens)[0, -1].argmax(-1)  # row 0's prediction for every row
        tokens = torch.cat([tokens, token.expand(tokens.shape[0], 1)], dim=1)
    return tokens


@torch.no_grad()
def _greedy_samples(model, tokens, n_new):
    gen = torch.Generator().manual_seed(0)
    for _ in range(n_new):
        probs = model(tokens)[:, -1].softmax(-1)
        tokens = torch.cat([tokens, torch.multinomial(probs, 1, generator=gen)], dim=1)
    return tokens


@pytest.mark.parametrize(
    ("fn", "match"),
    [
        (_greedy_first_row, r"^_greedy_first_row returned the wrong tokens: Every row got row 0's token"),
        (
            _greedy_samples,
            r"^_greedy_samples returned the wrong tokens: The token appended at position \d+ is not the most likely",
        ),
    ],
)
def test_greedy_names_the_cause_first(fn, match):
    with pytest.raises(AssertionError, match=match):
        greedy_generate_test(fn)


# --------------------------------------------------------------------------------------------------------------------
# Found by a held-out review: mistakes no known variant names are described by what controlled changes show
# --------------------------------------------------------------------------------------------------------------------


def test_a_loss_of_the_first_sequence_only_says_which_rows_it_ignores(course):
    def first_only(logits, tokens):
        return course.cross_entropy_loss(logits[:1], tokens[:1])

    with pytest.raises(AssertionError) as err:
        cross_entropy_test(first_only)
    assert "changing the input at rows 1-2 did not change your value" in str(err.value), str(err.value)


def test_a_loss_that_reads_no_target_says_so():
    def argmax_log_prob(logits, tokens):
        return -logits[:, :-1].log_softmax(-1).max(-1).values.mean()

    with pytest.raises(AssertionError) as err:
        cross_entropy_test(argmax_log_prob)
    assert "other target tokens did not change your value" in str(err.value), str(err.value)


def test_a_conversion_that_keeps_every_position_is_refused_for_a_shorter_context(course):
    def uncropped(hf, cfg):
        out = course.convert_hf_gpt2_state_dict(hf, cfg)
        return {**out, "pos_embed.W_pos": hf["transformer.wpe.weight"]}

    with pytest.raises(AssertionError) as err:
        hf_conversion_test(uncropped)
    assert "keep the first cfg.n_ctx rows" in str(err.value), str(err.value)
