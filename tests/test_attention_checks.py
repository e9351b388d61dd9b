"""causal_mask_test (notebook 03's first step): right masks pass, the usual wrong ones are named."""

import pytest
import torch

from harness import causal_mask_test, components


def _future(scores, diagonal=1):
    n_q, n_k = scores.shape[-2:]
    return torch.triu(torch.ones(n_q, n_k, dtype=torch.bool), diagonal=diagonal)


def mask_with_inf(scores):  # -inf instead of -1e5: the same for a causal mask
    return scores.masked_fill(_future(scores), float("-inf"))


def mask_diagonal_too(scores):
    return scores.masked_fill(_future(scores, diagonal=0), -1e5)


def mask_the_past(scores):
    return scores.masked_fill(torch.tril(torch.ones(scores.shape[-2:], dtype=torch.bool), diagonal=-1), -1e5)


def mask_with_zero(scores):
    return scores.masked_fill(_future(scores), 0.0)


def mask_not_negative_enough(scores):
    return scores.masked_fill(_future(scores), -10.0)


def mask_in_place(scores):
    return scores.masked_fill_(_future(scores), -1e5)


def mask_nothing(scores):
    return scores * 1.0


def test_course_and_equivalent_masks_pass(capsys):
    causal_mask_test(components("03_attention").apply_causal_mask)
    causal_mask_test(mask_with_inf)
    assert capsys.readouterr().out.count("passed") == 2


@pytest.mark.parametrize(
    ("wrong", "phrase"),
    [
        (mask_diagonal_too, "also masks the diagonal"),
        (mask_the_past, "masks the past instead of the future"),
        (mask_with_zero, "sets the masked scores to 0"),
        (mask_not_negative_enough, "not negative enough"),
        (mask_in_place, "in place"),
        (mask_nothing, "left some scores of later keys"),
    ],
)
def test_wrong_masks_are_named(wrong, phrase):
    with pytest.raises(AssertionError) as err:
        causal_mask_test(wrong)
    assert phrase in str(err.value), str(err.value)
