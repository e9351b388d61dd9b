"""causal_mask_test (notebook 03's first step): right masks pass, the usual wrong ones are named."""

import pytest
import torch

from harness import (
    attention_pattern_test,
    attention_scores_test,
    causal_mask_test,
    components,
    project_heads_test,
    weighted_values_test,
)


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


# ---------------------------------------------------------------------------------------------------------------
# The steps of attention: scores, pattern, weighted values, output projection.

course03 = components("03_attention")


@pytest.mark.parametrize(
    ("check", "solution"),
    [
        (attention_scores_test, "attention_scores"),
        (attention_pattern_test, "attention_pattern"),
        (weighted_values_test, "weighted_values"),
        (project_heads_test, "project_heads"),
    ],
)
def test_course_steps_pass(check, solution, capsys):
    check(getattr(course03, solution))
    assert "passed" in capsys.readouterr().out


def _scores(scale="sqrt", order="bhqk"):
    def attention_scores(q, k):
        raw = torch.einsum(f"bqhd,bkhd->{order}", q, k)
        return {"sqrt": raw / q.shape[-1] ** 0.5, "none": raw, "full": raw / q.shape[-1]}[scale]

    return attention_scores


def _pattern(kind):
    def attention_pattern(scores):
        future = torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1)
        if kind == "dim_queries":
            return scores.masked_fill(future, -1e5).softmax(-2)
        if kind == "no_mask":
            return scores.softmax(-1)
        if kind == "mask_after":
            return scores.softmax(-1).masked_fill(future, 0.0)
        return scores.masked_fill(future, -1e5).softmax(1)

    return attention_pattern


def _values(kind):
    def weighted_values(pattern, v):
        if kind == "over_queries":
            return torch.einsum("bhqk,bqhd->bkhd", pattern, v)
        return torch.einsum("bhqk,bkhd->bhqd", pattern, v)

    return weighted_values


def _project(kind):
    def project_heads(z, W_O, b_O):
        per_head = torch.einsum("bphd,hdm->bphm", z, W_O)
        if kind == "mean":
            return per_head.mean(2) + b_O
        if kind == "bias_per_head":
            return (per_head + b_O).sum(2)
        return per_head.sum(2)

    return project_heads


@pytest.mark.parametrize(
    ("check", "wrong", "phrase"),
    [
        (attention_scores_test, _scores(scale="none"), "did not divide by sqrt(d_head)"),
        (attention_scores_test, _scores(scale="full"), "divided by d_head, not by its square root"),
        (attention_scores_test, _scores(order="bhkq"), "key axis before the query axis"),
        (attention_scores_test, _scores(order="bqhk"), "left the heads after the positions"),
        (attention_pattern_test, _pattern("dim_queries"), "softmax over the queries"),
        (attention_pattern_test, _pattern("no_mask"), "no causal mask"),
        (attention_pattern_test, _pattern("mask_after"), "masked after the softmax"),
        (attention_pattern_test, _pattern("dim_heads"), "softmax over the heads"),
        (weighted_values_test, _values("over_queries"), "summed over the queries instead of the keys"),
        (weighted_values_test, _values("heads_first"), "left the heads before the positions"),
        (project_heads_test, _project("mean"), "averaged the heads"),
        (project_heads_test, _project("bias_per_head"), "added b_O once per head"),
        (project_heads_test, _project("no_bias"), "left out the bias b_O"),
    ],
)
def test_wrong_steps_are_named(check, wrong, phrase):
    with pytest.raises(AssertionError) as err:
        check(wrong)
    assert phrase in str(err.value), str(err.value)
