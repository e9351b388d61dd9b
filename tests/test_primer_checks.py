"""The primer's checks (end of notebook 00): right answers pass, the usual einops mistakes are named."""

import einops
import pytest
import torch

from harness import head_scores_test, merge_heads_test, split_heads_test


def split_right(x, n_heads):
    return einops.rearrange(x, "b p (n h) -> b p n h", n=n_heads)


def split_with_view(x, n_heads):  # the same, written without einops
    return x.view(*x.shape[:-1], n_heads, x.shape[-1] // n_heads)


def split_grouped_wrong_way(x, n_heads):
    return einops.rearrange(x, "b p (h n) -> b p n h", n=n_heads)


def split_axes_swapped(x, n_heads):
    return einops.rearrange(x, "b p (n h) -> b p h n", n=n_heads)


def split_heads_before_positions(x, n_heads):
    return einops.rearrange(x, "b p (n h) -> b n p h", n=n_heads)


def split_hard_coded_heads(x, n_heads):  # the 3 of the first example, written in place of the argument
    return einops.rearrange(x, "b p (n h) -> b p n h", n=3)


def merge_right(z):
    return einops.rearrange(z, "b p n h -> b p (n h)")


def merge_grouped_wrong_way(z):
    return einops.rearrange(z, "b p n h -> b p (h n)")


def scores_right(q, k):
    return torch.einsum("bqnh,bknh->bnqk", q, k)


def scores_transposed(q, k):
    return einops.einsum(q, k, "b q n h, b k n h -> b n k q")


def scores_heads_last(q, k):
    return einops.einsum(q, k, "b q n h, b k n h -> b q k n")


def scores_summed_over_heads(q, k):
    return einops.einsum(q, k, "b q n h, b k n h -> b q k")


def scores_scaled(q, k):
    return scores_right(q, k) / q.shape[-1] ** 0.5


@pytest.mark.parametrize(
    ("check", "fn"),
    [
        (split_heads_test, split_right),
        (split_heads_test, split_with_view),
        (merge_heads_test, merge_right),
        (head_scores_test, scores_right),
    ],
)
def test_right_answers_pass(check, fn, capsys):
    check(fn)
    assert "passed" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("check", "fn", "phrase"),
    [
        (split_heads_test, split_grouped_wrong_way, "(d_head n_heads)"),
        (split_heads_test, split_axes_swapped, "last two axes are swapped"),
        (split_heads_test, split_heads_before_positions, "heads came before the positions"),
        (split_heads_test, split_hard_coded_heads, "does not follow the `n_heads` argument"),
        (merge_heads_test, merge_grouped_wrong_way, "(d_head n_heads)"),
        (head_scores_test, scores_transposed, "Queries and keys are swapped"),
        (head_scores_test, scores_heads_last, "heads axis is last"),
        (head_scores_test, scores_summed_over_heads, "summed away"),
        (head_scores_test, scores_scaled, "sqrt(d_head)"),
    ],
)
def test_wrong_answers_are_named(check, fn, phrase):
    with pytest.raises(AssertionError) as err:
        check(fn)
    assert phrase in str(err.value), str(err.value)
