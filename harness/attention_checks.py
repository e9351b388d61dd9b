"""The check of notebook 03's first step, the causal mask on its own, on crafted scores whose answer is known."""

from __future__ import annotations

import torch

from harness._assertions import as_tensor_output, call, fail

__all__ = ["causal_mask_test"]


def causal_mask_test(apply_causal_mask) -> None:
    """Checks `apply_causal_mask(attn_scores [batch n_heads query_pos key_pos]) -> scores`: every score of a key later
    than its query replaced by a large negative number (or -inf), everything else unchanged."""
    name = getattr(apply_causal_mask, "__name__", "apply_causal_mask")
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
