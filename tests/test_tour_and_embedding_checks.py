"""The checks of notebooks 00 (param_count_test) and 02 (sinusoidal_test): the course's own solutions pass, and
realistic wrong implementations fail with a message that names the mistake."""

from __future__ import annotations

import dataclasses
import math
import random
import warnings

import numpy as np
import pytest
import torch

from harness import Config, components, param_count_test, sinusoidal_test
from harness.tour_checks import TEST_CONFIGS, _true_param_count, true_param_count


@pytest.fixture(scope="module")
def count_params():
    return components("00_tour").count_params


@pytest.fixture(scope="module")
def sinusoidal():
    return components("02_embeddings").sinusoidal_positional_encoding


def run_clean(check, fn, capsys):
    """Run a passing check: it returns None, prints one line to stdout, nothing to stderr, and warns nothing."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = check(fn)
    out, err = capsys.readouterr()
    assert result is None
    assert err == ""
    assert [str(w.message) for w in caught] == []
    assert out.count("\n") == 1 and "passed" in out
    return out


# ----------------------------------------------------------------------------------------------------------------
# param_count_test


def test_param_count_passes_course_solution(count_params, capsys):
    _true_param_count.cache_clear()  # so that building the TransformerLens models happens inside this test
    run_clean(param_count_test, count_params, capsys)


def test_param_count_accepts_numpy_integers(count_params, capsys):
    run_clean(param_count_test, lambda cfg: np.int64(count_params(cfg)), capsys)


def test_course_count_params_matches_random_configs(count_params):
    rng = random.Random(0)
    for _ in range(5):
        cfg = Config(
            d_model=rng.randint(2, 40),
            d_head=rng.randint(1, 12),
            n_heads=rng.randint(1, 6),
            d_mlp=rng.randint(1, 90),
            n_layers=rng.randint(1, 4),
            n_ctx=rng.randint(1, 50),
            d_vocab=rng.randint(2, 300),
        )
        assert count_params(cfg) == true_param_count(cfg), cfg


def test_true_count_of_gpt2_small_and_offline_reference():
    # 124,439,808 is GPT-2 small's published count (W_E tied to W_U, no b_U); TransformerLens adds W_U and b_U.
    small = Config()
    assert true_param_count(small) == 124_439_808 + small.d_model * small.d_vocab + small.d_vocab
    from harness import load_reference_gpt2

    reference = load_reference_gpt2("offline")
    assert true_param_count(Config.from_reference(reference)) == sum(p.numel() for p in reference.parameters())


def test_test_configs_are_odd():
    odd = TEST_CONFIGS[1:]
    assert TEST_CONFIGS[0] == Config()
    assert any(c.n_heads * c.d_head != c.d_model for c in odd)
    assert any(c.d_mlp != 4 * c.d_model for c in odd)
    assert all(c.d_vocab < 1000 for c in odd)


# Wrong implementations, as a learner might write them.


def forgets_unembed_bias(cfg):
    per_layer = 4 * cfg.d_model + 4 * cfg.n_heads * cfg.d_model * cfg.d_head + 3 * cfg.n_heads * cfg.d_head
    per_layer += cfg.d_model + 2 * cfg.d_model * cfg.d_mlp + cfg.d_mlp + cfg.d_model
    return 2 * cfg.d_vocab * cfg.d_model + cfg.n_ctx * cfg.d_model + cfg.n_layers * per_layer + 2 * cfg.d_model


def tied_unembedding(cfg):
    # GPT-2's famous "124M": W_U shares W_E's storage, and there is no b_U.
    attn = 4 * cfg.n_heads * cfg.d_model * cfg.d_head + 3 * cfg.n_heads * cfg.d_head + cfg.d_model
    mlp = 2 * cfg.d_model * cfg.d_mlp + cfg.d_mlp + cfg.d_model
    block = 4 * cfg.d_model + attn + mlp
    return cfg.d_vocab * cfg.d_model + cfg.n_ctx * cfg.d_model + cfg.n_layers * block + 2 * cfg.d_model


def forgets_layernorms(cfg):
    attn = 4 * cfg.n_heads * cfg.d_model * cfg.d_head + 3 * cfg.n_heads * cfg.d_head + cfg.d_model
    mlp = 2 * cfg.d_model * cfg.d_mlp + cfg.d_mlp + cfg.d_model
    embed = cfg.d_vocab * cfg.d_model + cfg.n_ctx * cfg.d_model
    return embed + cfg.n_layers * (attn + mlp) + cfg.d_model * cfg.d_vocab + cfg.d_vocab


def layernorm_weights_only(cfg):
    ln = cfg.d_model  # forgot LayerNorm's bias
    attn = 4 * cfg.n_heads * cfg.d_model * cfg.d_head + 3 * cfg.n_heads * cfg.d_head + cfg.d_model
    mlp = 2 * cfg.d_model * cfg.d_mlp + cfg.d_mlp + cfg.d_model
    embed = cfg.d_vocab * cfg.d_model + cfg.n_ctx * cfg.d_model
    return embed + cfg.n_layers * (2 * ln + attn + mlp) + ln + cfg.d_model * cfg.d_vocab + cfg.d_vocab


def assumes_4x_mlp(cfg):
    d_mlp = 4 * cfg.d_model
    attn = 4 * cfg.n_heads * cfg.d_model * cfg.d_head + 3 * cfg.n_heads * cfg.d_head + cfg.d_model
    mlp = 2 * cfg.d_model * d_mlp + d_mlp + cfg.d_model
    embed = cfg.d_vocab * cfg.d_model + cfg.n_ctx * cfg.d_model
    return embed + cfg.n_layers * (4 * cfg.d_model + attn + mlp) + 2 * cfg.d_model + (cfg.d_model + 1) * cfg.d_vocab


def square_attention(cfg):
    attn = 4 * cfg.d_model * cfg.d_model + 4 * cfg.d_model  # as if W_Q were one [d_model, d_model] matrix
    mlp = 2 * cfg.d_model * cfg.d_mlp + cfg.d_mlp + cfg.d_model
    embed = cfg.d_vocab * cfg.d_model + cfg.n_ctx * cfg.d_model
    return embed + cfg.n_layers * (4 * cfg.d_model + attn + mlp) + 2 * cfg.d_model + (cfg.d_model + 1) * cfg.d_vocab


def forgets_positions(cfg):
    return forgets_unembed_bias(cfg) + cfg.d_vocab - cfg.n_ctx * cfg.d_model


def forgets_output_bias(cfg):
    return forgets_unembed_bias(cfg) + cfg.d_vocab - cfg.n_layers * cfg.d_model


def one_block(cfg):
    return forgets_unembed_bias(dataclasses.replace(cfg, n_layers=1)) + cfg.d_vocab


def no_biases(cfg):
    attn = 4 * cfg.n_heads * cfg.d_model * cfg.d_head
    mlp = 2 * cfg.d_model * cfg.d_mlp
    embed = cfg.d_vocab * cfg.d_model + cfg.n_ctx * cfg.d_model
    return embed + cfg.n_layers * (4 * cfg.d_model + attn + mlp) + 2 * cfg.d_model + cfg.d_model * cfg.d_vocab


def counts_embedding_twice(cfg):
    return forgets_unembed_bias(cfg) + cfg.d_vocab + cfg.d_vocab * cfg.d_model


def fixed_number(cfg):
    return 163_087_441


def float_division(cfg):
    return forgets_unembed_bias(cfg) * 2 / 2 + cfg.d_vocab


def tensor_count(cfg):
    return torch.tensor(forgets_unembed_bias(cfg) + cfg.d_vocab)


def forgets_return(cfg):
    total = forgets_unembed_bias(cfg) + cfg.d_vocab
    print(total)


def crashes(cfg):
    return cfg.d_ff * 2


@pytest.mark.parametrize(
    "wrong, message",
    [
        (forgets_unembed_bias, r"short by exactly d_vocab \(b_U"),
        (tied_unembedding, r"short by exactly d_vocab\*d_model \(W_E or W_U.*\+ d_vocab \(b_U.*count both"),
        (forgets_layernorms, r"2\*n_layers\*2\*d_model \(ln1.w\+ln2.w, ln1.b\+ln2.b.* \+ 2\*d_model \(ln_final"),
        (layernorm_weights_only, r"n_layers\*2\*d_model \(ln1.w\+ln2.w or ln1.b\+ln2.b.*\+ d_model \(ln_final.w or"),
        (assumes_4x_mlp, r"d_mlp = 4\*d_model: use cfg.d_mlp"),
        (square_attention, r"d_head = d_model // n_heads"),
        (forgets_positions, r"n_ctx\*d_model \(W_pos"),
        (forgets_output_bias, r"n_layers\*d_model \(b_O or b_out"),
        (one_block, r"single block"),
        (no_biases, r"without the biases b_Q, b_K, b_V, b_O, b_in, b_out and b_U"),
        (counts_embedding_twice, r"too many.*d_vocab\*d_model \(W_E or W_U: .*\) too many"),
        (fixed_number, r"returned 163,087,441 for every config"),
        (float_division, r"returned builtins.float .*must return a Python int"),
        (tensor_count, r"torch.Tensor .*\.item\(\)"),
        (forgets_return, r"returned builtins.NoneType None; .*forget `return`"),
        (crashes, r"raised AttributeError"),
    ],
)
def test_param_count_rejects_wrong(wrong, message, capsys):
    with pytest.raises(AssertionError, match=message):
        param_count_test(wrong)
    assert capsys.readouterr().err == ""


def test_param_count_rejects_non_function():
    with pytest.raises(AssertionError, match="Pass the function itself"):
        param_count_test(163_087_441)


# ----------------------------------------------------------------------------------------------------------------
# sinusoidal_test


def test_sinusoidal_passes_course_solution(sinusoidal, capsys):
    run_clean(sinusoidal_test, sinusoidal, capsys)


def test_sinusoidal_accepts_other_correct_forms(capsys):
    def with_exp_log(n_ctx, d_model):  # the form of the Annotated Transformer, in float32
        position = torch.arange(n_ctx).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(n_ctx, d_model)
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        return pe

    def via_float64(n_ctx, d_model):
        pos = torch.arange(n_ctx, dtype=torch.float64)[:, None]
        angle = pos / 10000 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
        return torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(1).float()

    run_clean(sinusoidal_test, with_exp_log, capsys)
    run_clean(sinusoidal_test, via_float64, capsys)


def _angles(n_ctx, d_model, base=10000.0, two_i=None, start=0):
    two_i = torch.arange(0, d_model, 2).float() if two_i is None else two_i
    return torch.arange(start, start + n_ctx).float()[:, None] / base ** (two_i / d_model)


def swapped(n_ctx, d_model):
    angles = _angles(n_ctx, d_model)
    return torch.stack([angles.cos(), angles.sin()], dim=-1).flatten(1)


def concatenated(n_ctx, d_model):
    angles = _angles(n_ctx, d_model)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


def exponent_i(n_ctx, d_model):
    angles = _angles(n_ctx, d_model, two_i=torch.arange(d_model // 2).float())
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)


def per_dimension_frequency(n_ctx, d_model):
    angles = torch.arange(n_ctx).float()[:, None] / 10000 ** (torch.arange(d_model).float() / d_model)
    pe = angles.sin()
    pe[:, 1::2] = angles[:, 1::2].cos()
    return pe


def base_1000(n_ctx, d_model):
    angles = _angles(n_ctx, d_model, base=1000.0)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)


def positions_from_1(n_ctx, d_model):
    angles = _angles(n_ctx, d_model, start=1)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)


def multiplied(n_ctx, d_model):
    angles = torch.arange(n_ctx).float()[:, None] * 10000 ** (torch.arange(0, d_model, 2).float() / d_model)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)


def float64(n_ctx, d_model):
    pos = torch.arange(n_ctx, dtype=torch.float64)[:, None]
    angles = pos / 10000 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)


def numpy_array(n_ctx, d_model):
    pos = np.arange(n_ctx)[:, None]
    angles = pos / 10000 ** (np.arange(0, d_model, 2) / d_model)
    return np.stack([np.sin(angles), np.cos(angles)], axis=-1).reshape(n_ctx, d_model)


def transposed(n_ctx, d_model):
    angles = _angles(n_ctx, d_model)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1).T.contiguous()


def with_batch(n_ctx, d_model):
    angles = _angles(n_ctx, d_model)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)[None]


def sin_only(n_ctx, d_model):
    return _angles(n_ctx, d_model).sin().repeat_interleave(2, dim=-1)


@pytest.mark.parametrize(
    "wrong, message",
    [
        (swapped, r"sin and cos are swapped"),
        (concatenated, r"concatenated \(\[sin \.\.\. sin \| cos \.\.\. cos\]\) rather than interleaved"),
        (exponent_i, r"exponent is i/d_model where the formula has 2i/d_model"),
        (per_dimension_frequency, r"each dimension j has its own frequency"),
        (base_1000, r"base 1000 rather than 10000"),
        (positions_from_1, r"positions start at 1"),
        (multiplied, r"multiplied by 10000\^\(2i/d_model\) instead of divided"),
        (float64, r"dtype torch.float64, expected torch.float32.*Avoid float64"),
        (numpy_array, r"NumPy array"),
        (transposed, r"shape \[8, 12\], expected \[12, 8\].*wrong order"),
        (with_batch, r"3 dimensions where 2 are due"),
        (
            sin_only,
            r"does not match PE\[pos, 2i\].*Row 0 \(position 0\) should read 0, 1, 0, 1, \.\.\. and reads 0\.000, 0\.000",
        ),
    ],
)
def test_sinusoidal_rejects_wrong(wrong, message, capsys):
    with pytest.raises(AssertionError, match=message):
        sinusoidal_test(wrong)
    assert capsys.readouterr().err == ""
