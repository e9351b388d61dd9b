"""Checks for the tools primer at the end of notebook 00: einops' `rearrange`, `einsum`, and shape annotations.

Each exercise is a small reshaping or contraction that the attention notebook needs later. The oracle is plain
PyTorch indexing and matrix products (`view`, `permute`, `@`); a wrong answer is compared with the usual mistakes
(axes grouped in the wrong order, the output's axes transposed, a contraction over the wrong axis).
"""

from __future__ import annotations

import torch
from torch import Tensor

from harness._assertions import as_tensor_output, call, fail

__all__ = ["head_scores_test", "merge_heads_test", "split_heads_test"]


def _inputs(seed: int, *shape: int) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _result(fn, name: str, *args) -> Tensor:
    if not callable(fn):
        fail(f"Expected the function itself, got {type(fn).__name__}.")
    given = [a.clone() if isinstance(a, Tensor) else a for a in args]
    out = as_tensor_output(call(fn, *given, what=f"{name}(...)"), name)
    for before, after in zip(args, given):
        if isinstance(before, Tensor) and not torch.equal(before, after):
            fail(f"{name} modified its input in place.")
    return out


def split_heads_test(split_heads) -> None:
    """Checks `split_heads(x [batch pos d_model], n_heads) -> [batch pos n_heads d_head]`, head 0 first, for
    several head counts of one d_model (the output must follow the `n_heads` argument)."""
    name = getattr(split_heads, "__name__", "split_heads")
    batch, pos, d_model = 2, 5, 12
    x = _inputs(0, batch, pos, d_model)
    right = []
    for n_heads in (3, 4, 2):
        d_head = d_model // n_heads
        out = _result(split_heads, name, x, n_heads)
        expected = x.view(batch, pos, n_heads, d_head)
        if tuple(out.shape) != tuple(expected.shape):
            hint = ""
            if right:  # evidence first: the same code was right for another head count
                hint = (
                    f" With n_heads = {right[0]} the output was right: the shape does not follow the `n_heads` "
                    "argument."
                )
            elif tuple(out.shape) == (batch, pos, d_head, n_heads):
                hint = " The last two axes are swapped: the output pattern ends in `n_heads d_head`."
            elif tuple(out.shape) == (batch, n_heads, pos, d_head):
                hint = " The heads came before the positions: keep `batch pos` first, as the annotation says."
            fail(
                f"{name}(x, n_heads={n_heads}) returned shape {list(out.shape)}, expected {list(expected.shape)}.{hint}"
            )
        if torch.equal(out, x.view(batch, pos, d_head, n_heads).transpose(-1, -2)):
            fail(
                f"{name} grouped the axes as (d_head n_heads): features 0, 1, 2 went to heads 0, 1, 2. GPT-2 stores "
                "head 0's d_head features first, then head 1's: the pattern is `(n_heads d_head)`."
            )
        if not torch.equal(out, expected):
            fail(
                f"{name}(x, n_heads={n_heads}) has the right shape but puts features in the wrong places: head h "
                "holds features h*d_head ... (h+1)*d_head - 1."
            )
        right.append(n_heads)
    print(f"{name} passed: d_model splits into n_heads blocks of d_head, head 0 first, for n_heads = 3, 4 and 2.")


def merge_heads_test(merge_heads) -> None:
    """Checks `merge_heads(z [batch pos n_heads d_head]) -> [batch pos n_heads*d_head]`, the inverse of split_heads."""
    name = getattr(merge_heads, "__name__", "merge_heads")
    z = _inputs(1, 2, 5, 3, 4)
    out = _result(merge_heads, name, z)
    expected = z.reshape(2, 5, 12)
    if tuple(out.shape) != (2, 5, 12):
        fail(f"{name} returned shape {list(out.shape)}, expected [2, 5, 12]: merge the last two axes into one.")
    if torch.equal(out, expected):
        print(f"{name} passed: the heads are concatenated back, head 0 first.")
        return
    if torch.equal(out, z.transpose(-1, -2).reshape(2, 5, 12)):
        fail(f"{name} merged the axes as (d_head n_heads): the pattern is `(n_heads d_head)`, head 0's features first.")
    fail(f"{name} has the right shape but not the right values: each position's vector is head 0, then head 1, ...")


def head_scores_test(head_scores) -> None:
    """Checks `head_scores(q, k) -> [batch n_heads pos_q pos_k]` for q, k of shape [batch pos n_heads d_head]:
    the dot product of every query with every key, head by head (no scaling, no mask)."""
    name = getattr(head_scores, "__name__", "head_scores")
    batch, pos_q, pos_k, n_heads, d_head = 2, 3, 5, 4, 6
    q, k = _inputs(2, batch, pos_q, n_heads, d_head), _inputs(3, batch, pos_k, n_heads, d_head)
    out = _result(head_scores, name, q, k)
    expected = q.permute(0, 2, 1, 3) @ k.permute(0, 2, 3, 1)  # [batch n_heads pos_q pos_k]
    want = tuple(expected.shape)
    if tuple(out.shape) != want:
        hint = ""
        if tuple(out.shape) == (batch, n_heads, pos_k, pos_q):
            hint = " Queries and keys are swapped in the output: the pattern ends in `pos_q pos_k` (rows are queries)."
        elif tuple(out.shape) == (batch, pos_q, pos_k, n_heads):
            hint = " The heads axis is last: put `n_heads` right after `batch`."
        elif len(out.shape) == 3:
            hint = " An axis was summed away: only d_head is contracted; every axis in the output pattern survives."
        fail(f"{name} returned shape {list(out.shape)}, expected {list(want)} (q has 3 positions, k has 5).{hint}")
    if torch.allclose(out, expected, atol=1e-5):
        print(f"{name} passed: every query dotted with every key, per head, with different query and key lengths.")
        return
    if torch.allclose(out, expected / d_head**0.5, atol=1e-5):
        fail(f"{name} divides by sqrt(d_head): that scaling belongs to attention, not to this exercise.")
    fail(f"{name} has the right shape but wrong values: sum q[b, i, h, :] * k[b, j, h, :] over d_head only.")
