"""What a wrong answer's evidence shows, found by controlled changes of the input (metamorphic probes).

When no known mistake matches, a check still says what it observed, in the exercise's own terms: which rows or
positions the learner's output ignores (changing them changed nothing, where the course's output changes), which
ones it reads that it should not, and whether the value is the expected one scaled by a size of the input. These
are observations, never a guessed cause.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor


def _ranges(values: list[int]) -> str:
    parts, start = [], None
    for i, value in enumerate(values):
        start = value if start is None else start
        if i + 1 == len(values) or values[i + 1] != value + 1:
            parts.append(f"{start}" if start == value else f"{start}-{value}")
            start = None
    return ", ".join(parts)


def sensitivity(
    learner: Callable[[Tensor], float],
    reference: Callable[[Tensor], float],
    x: Tensor,
    groups: Sequence[tuple[str, str, list[tuple]]],
    seed: int = 0,
) -> str:
    """Change one slice of `x` at a time (random values of its scale) and compare what moves.

    `groups`: (singular, plural, [index, ...]) per kind of slice, e.g. ("row", "rows", [(0,), (1,)]) or
    ("position", "positions", [(slice(None), 0), ...]); the label of each index is its last integer.
    Returns sentences (or "") about the slices the learner's value ignores and those it reads but should not."""
    generator = torch.Generator().manual_seed(seed)
    base_l, base_r = learner(x), reference(x)
    notes = []
    for singular, plural, indices in groups:
        ignored, extra = [], []
        for index in indices:
            changed = x.clone()
            noise = torch.randn(changed[index].shape, generator=generator, dtype=x.dtype) * (x.std() + 1.0)
            changed[index] = changed[index] + noise
            moved_l = abs(learner(changed) - base_l) > 1e-6 * (1 + abs(base_l))
            moved_r = abs(reference(changed) - base_r) > 1e-6 * (1 + abs(base_r))
            label = [i for i in index if isinstance(i, int)][-1]
            if moved_r and not moved_l:
                ignored.append(label)
            elif moved_l and not moved_r:
                extra.append(label)
        if ignored:
            word = singular if len(ignored) == 1 else plural
            notes.append(f"changing the input at {word} {_ranges(ignored)} did not change your value (it changes the "
                         "expected one)")  # fmt: skip
        if extra:
            word = singular if len(extra) == 1 else plural
            notes.append(f"changing the input at {word} {_ranges(extra)} changed your value (the expected one does "
                         "not depend on it)")  # fmt: skip
    return "; ".join(notes)


def rows_and_positions(batch: int, pos: int) -> list[tuple[str, str, list[tuple]]]:
    """The slices `sensitivity` changes for a [batch, pos, ...] input: each row, then each position."""
    return [
        ("row", "rows", [(b,) for b in range(batch)]),
        ("position", "positions", [(slice(None), p) for p in range(pos)]),
    ]


def scale_note(value: float, expected: float, sizes: dict[str, int]) -> str:
    """'' or a sentence saying that `value` is `expected` multiplied or divided by one of the input's sizes (or a
    ratio of two), e.g. 'it is the expected value divided by d_vocab = 13'."""
    if expected == 0 or value == 0:
        return ""
    ratio = value / expected
    candidates = dict(sizes)
    names = list(sizes)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if sizes[a] != sizes[b] and sizes[b]:
                candidates[f"{a}/{b}"] = sizes[a] / sizes[b]
                candidates[f"{b}/{a}"] = sizes[b] / sizes[a] if sizes[a] else 0
    for name, factor in candidates.items():
        if factor in (0, 1):
            continue
        if abs(ratio - factor) < 1e-4 * factor:
            return f"it is the expected value multiplied by {name} = {factor:.4g}"
        if abs(ratio - 1 / factor) < 1e-4 / factor:
            return f"it is the expected value divided by {name} = {factor:.4g}"
    return ""


def unused_parameters(module: torch.nn.Module, run: Callable[[], Tensor], seed: int = 0) -> list[str]:
    """The parameters of `module` whose values do not reach `run()`'s output: each changed in turn (then put back),
    with the output compared. In a layer the reference uses every parameter, so each one found is evidence."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        base = run().clone()
        unused = []
        for name, param in module.named_parameters():
            saved = param.detach().clone()
            param.add_(
                torch.randn(param.shape, generator=generator) * (saved.std() if saved.numel() > 1 else 1.0) + 0.5
            )
            try:
                same = torch.allclose(run(), base, atol=1e-7, rtol=0)
            finally:
                param.copy_(saved)
            if same:
                unused.append(name)
    return unused


def unused_note(module: torch.nn.Module, run: Callable[[], Tensor]) -> str:
    """' Changing X did not change your output (...)' or ''."""
    try:
        unused = unused_parameters(module, run)
    except Exception:  # noqa: BLE001 - the learner's forward failing on changed weights: no further evidence
        return ""
    if not unused:
        return ""
    shown = ", ".join(unused[:4]) + (f" and {len(unused) - 4} more" if len(unused) > 4 else "")
    return (
        f" Changing {shown} did not change your output: {'it is' if len(unused) == 1 else 'they are'} not used, "
        "where the reference uses every parameter."
    )
