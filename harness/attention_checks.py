"""The check of notebook 03's first step, the causal mask on its own, on crafted scores whose answer is known."""

from __future__ import annotations

import torch

from harness._assertions import as_tensor_output, call, defaults_as_given, fail

__all__ = [
    "attention_pattern_test",
    "attention_scores_test",
    "causal_mask_test",
    "project_heads_test",
    "weighted_values_test",
]


def causal_mask_test(apply_causal_mask) -> None:
    """Checks `apply_causal_mask(attn_scores [batch n_heads query_pos key_pos]) -> scores`: every score of a key later
    than its query replaced by a large negative number (or -inf), everything else unchanged."""
    name = getattr(apply_causal_mask, "__name__", "apply_causal_mask")
    defaults_as_given(apply_causal_mask, "03_attention", "apply_causal_mask", name)
    if not callable(apply_causal_mask):
        fail(f"Expected the function itself, got {type(apply_causal_mask).__name__}.")
    for shape in ((2, 3, 5, 5), (1, 1, 1, 1), (1, 2, 7, 7)):
        scores = torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))
        given = scores.clone()
        out = as_tensor_output(call(apply_causal_mask, given, what=f"{name}(attn_scores)"), name)
        if not torch.equal(given, scores):
            fail(f"{name} modified the scores in place: use masked_fill (a new tensor), not masked_fill_.")
        if tuple(out.shape) != shape:
            fail(f"{name} returned shape {list(out.shape)} for scores of shape {list(shape)}: keep the shape.")
        n = shape[-1]
        future = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)
        kept_ok = torch.equal(out[..., ~future], scores[..., ~future])
        masked = out[..., future]
        masked_ok = bool((masked <= -1e4).all())
        if kept_ok and masked_ok:
            continue
        past = torch.tril(torch.ones(n, n, dtype=torch.bool), diagonal=-1)
        diagonal = torch.eye(n, dtype=torch.bool)
        if n > 1 and (out[..., diagonal] <= -1e4).all() and masked_ok:
            fail(
                f"{name} also masks the diagonal: a position may attend to itself (position 0 would otherwise have "
                "no key at all). Use torch.triu(..., diagonal=1)."
            )
        if n > 1 and (out[..., past] <= -1e4).all() and not (masked <= -1e4).any():
            fail(f"{name} masks the past instead of the future: the keys after the query (j > i) must be hidden.")
        if n > 1 and torch.equal(out[..., future], torch.zeros_like(masked)):
            fail(
                f"{name} sets the masked scores to 0, an ordinary score (exp(0) = 1 after the softmax): use a large "
                "negative number such as -1e5 (self.IGNORE), so that their weight becomes 0."
            )
        if n > 1 and not masked_ok and torch.isfinite(masked).all() and (masked < 0).all():
            fail(
                f"{name} uses a masking value ({masked.max().item():g}) that is not negative enough: a masked key "
                "must get weight 0 after the softmax; -1e5 does."
            )
        if not kept_ok:
            fail(f"{name} changed scores on or below the diagonal, which must pass through unchanged.")
        fail(f"{name} left some scores of later keys (above the diagonal) unmasked.")
    print(f"{name} passed: keys after their query are masked, the diagonal and the past are unchanged.")


# ---------------------------------------------------------------------------------------------------------------
# The steps of attention, one check each: scores, pattern, weighted sum of values, output projection.


def _rand(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return tuple(a.shape) == tuple(b.shape) and bool(torch.allclose(a, b, atol=1e-5, rtol=1e-4))


def _run_step(fn, name: str, *args) -> torch.Tensor:
    if not callable(fn):
        fail(f"Expected the function itself, got {type(fn).__name__}.")
    given = [a.clone() for a in args]
    out = as_tensor_output(call(fn, *given, what=f"{name}(...)"), name)
    for before, after in zip(args, given):
        if not torch.equal(before, after):
            fail(f"{name} modified an input in place: compute into a new tensor.")
    # again with inputs that require gradients: the same output, and one the gradients flow back through (a
    # `.detach()` gave right values and passed here while the grader's judge refused it: agreement sweep 18)
    leaves = [a.clone().requires_grad_(a.is_floating_point()) for a in args]
    with torch.enable_grad():
        again = as_tensor_output(call(fn, *leaves, what=f"{name}(...)"), name)
    if any(leaf.requires_grad for leaf in leaves) and again.is_floating_point() and not again.requires_grad:
        fail(
            f"{name}'s output carries no gradient back to its inputs: a .detach(), .data, torch.no_grad() or a value "
            "made outside torch cuts the graph, and training could not pass through it."
        )
    alike = tuple(again.shape) == tuple(out.shape) and torch.allclose(again.detach(), out, 1e-4, 1e-5, equal_nan=True)
    if not alike:
        fail(f"{name} returned other values when its inputs require gradients: compute the same either way.")
    return out


def _named_variant(name: str, out: torch.Tensor, expected: torch.Tensor, variants: dict, what: str) -> None:
    if _close(out, expected):
        return
    for label, variant in variants.items():
        if _close(out, variant):
            fail(f"{name} {label}.")
    if tuple(out.shape) != tuple(expected.shape):
        fail(f"{name} returned shape {list(out.shape)}, expected {what} = {list(expected.shape)}.")
    worst = (out - expected).abs().max().item()
    fail(f"{name} has the right shape but wrong values (largest difference {worst:.3g}).")


def attention_scores_test(attention_scores) -> None:
    """Checks `attention_scores(q, k) -> [batch n_heads pos_q pos_k]`: q . k / sqrt(d_head) for every pair, per head."""
    name = getattr(attention_scores, "__name__", "attention_scores")
    batch, pos, n_heads, d_head = 2, 5, 3, 16
    q, k = _rand(0, batch, pos, n_heads, d_head), _rand(1, batch, pos, n_heads, d_head)
    out = _run_step(attention_scores, name, q, k)
    raw = torch.einsum("bqhd,bkhd->bhqk", q, k)
    expected = raw / d_head**0.5
    _named_variant(
        name,
        out,
        expected,
        {
            "did not divide by sqrt(d_head): without it the scores grow with the head size and the softmax saturates": raw,
            "divided by d_head, not by its square root": raw / d_head,
            "multiplied by sqrt(d_head) where dividing is due": raw * d_head**0.5,
            "put the key axis before the query axis: the output is [batch n_heads pos_q pos_k], one row per query": expected.transpose(
                -1, -2
            ),
            "left the heads after the positions: the output is [batch n_heads pos_q pos_k]": expected.permute(
                0, 2, 1, 3
            ),
        },
        "[batch n_heads pos_q pos_k]",
    )
    print(f"{name} passed: q . k / sqrt(d_head) for every (query, key) pair of every head.")


def attention_pattern_test(attention_pattern) -> None:
    """Checks `attention_pattern(attn_scores) -> pattern`: the causal mask, then a softmax over the keys."""
    name = getattr(attention_pattern, "__name__", "attention_pattern")
    scores = 3 * _rand(2, 2, 3, 6, 6)
    out = _run_step(attention_pattern, name, scores)
    future = torch.ones(6, 6, dtype=torch.bool).triu(1)
    masked = scores.masked_fill(future, -1e5)
    expected = masked.softmax(-1)
    _named_variant(
        name,
        out,
        expected,
        {
            "took the softmax over the queries (dim -2): each query's row, over the keys (dim -1), must sum to 1": masked.softmax(
                -2
            ),
            "applied no causal mask: queries attend to later keys": scores.softmax(-1),
            "masked after the softmax: the rows no longer sum to 1 (mask the scores, then take the softmax)": scores.softmax(
                -1
            ).masked_fill(future, 0.0),
            "took the softmax over the heads (dim 1)": masked.softmax(1),
        },
        "[batch n_heads pos_q pos_k] (the shape of the scores)",
    )
    # Scores of hundreds, as a trained model's can be: exp overflows in float32 past about 88, so an exp over its sum
    # (inf / inf) or a softmax renormalised after a mask (0 / 0) gives NaN where the masked softmax does not
    big = 300 * _rand(5, 1, 2, 6, 6)
    out = _run_step(attention_pattern, name, big)
    if not torch.isfinite(out).all():
        fail(
            f"{name} on scores of hundreds returned NaN or inf: exp overflows in float32 past about 88, and "
            "probabilities renormalised after a mask give 0/0. Mask the scores first, then take torch.softmax, which "
            "subtracts each row's largest score before exp."
        )
    want = big.masked_fill(future, -1e5).softmax(-1)
    if (out - want).abs().max().item() > 1e-4:
        fail(f"{name} on scores of hundreds differs from the masked softmax by up to {(out - want).abs().max():.3g}.")
    # other lengths, one position included (a row of one key is all 1): code written for the one length above shows
    for pos in (1, 2, 9):
        scores = 3 * _rand(1, 2, pos, pos)
        out = _run_step(attention_pattern, name, scores)
        want = scores.masked_fill(torch.ones(pos, pos, dtype=torch.bool).triu(1), -1e5).softmax(-1)
        if tuple(out.shape) != tuple(want.shape) or not torch.allclose(out, want, atol=1e-5):
            got = (
                list(out.shape)
                if tuple(out.shape) != tuple(want.shape)
                else f"values off by up to {(out - want).abs().max():.3g}"
            )
            fail(
                f"{name} on scores of {pos} position(s) returned {got} where the masked softmax over the keys is due "
                f"(shape {list(want.shape)}{', every entry 1' if pos == 1 else ''}): it was right on 6 positions."
            )
    print(f"{name} passed: masked, then a softmax over the keys; every row sums to 1, nothing above the diagonal.")


def weighted_values_test(weighted_values) -> None:
    """Checks `weighted_values(pattern, v) -> z [batch pos_q n_heads d_head]`: each query's pattern-weighted sum of
    the values."""
    name = getattr(weighted_values, "__name__", "weighted_values")
    batch, pos, n_heads, d_head = 2, 5, 3, 4
    future = torch.ones(pos, pos, dtype=torch.bool).triu(1)
    pattern = (2 * _rand(3, batch, n_heads, pos, pos)).masked_fill(future, -1e5).softmax(-1)
    v = _rand(4, batch, pos, n_heads, d_head)
    out = _run_step(weighted_values, name, pattern, v)
    expected = torch.einsum("bhqk,bkhd->bqhd", pattern, v)
    _named_variant(
        name,
        out,
        expected,
        {
            "summed over the queries instead of the keys (the pattern's last axis is the key: contract v's position with it)": torch.einsum(
                "bhqk,bqhd->bkhd", pattern, v
            ),
            "left the heads before the positions: z is [batch pos_q n_heads d_head], like q, k and v": expected.permute(
                0, 2, 1, 3
            ),
            "averaged the values uniformly, ignoring the pattern": v.cumsum(1)
            / torch.arange(1, pos + 1)[None, :, None, None],
        },
        "[batch pos_q n_heads d_head]",
    )
    print(f"{name} passed: z[query] is the pattern-weighted sum of the values over the keys, per head.")


def project_heads_test(project_heads) -> None:
    """Checks `project_heads(z, W_O, b_O) -> [batch pos d_model]`: every head's z through its W_O, summed, plus b_O."""
    name = getattr(project_heads, "__name__", "project_heads")
    batch, pos, n_heads, d_head, d_model = 2, 5, 3, 4, 6
    z, W_O, b_O = _rand(5, batch, pos, n_heads, d_head), _rand(6, n_heads, d_head, d_model), _rand(7, d_model)
    out = _run_step(project_heads, name, z, W_O, b_O)
    per_head = torch.einsum("bphd,hdm->bphm", z, W_O)
    expected = per_head.sum(2) + b_O
    _named_variant(
        name,
        out,
        expected,
        {
            "averaged the heads: each head writes its own contribution to the residual stream, so they are summed": per_head.mean(
                2
            )
            + b_O,
            f"added b_O once per head ({n_heads} times): it is one bias for the whole layer, added after the sum": per_head.sum(
                2
            )
            + n_heads * b_O,
            "left out the bias b_O": per_head.sum(2),
        },
        "[batch pos d_model]",
    )
    print(f"{name} passed: sum over heads of z[h] @ W_O[h], plus b_O once.")
