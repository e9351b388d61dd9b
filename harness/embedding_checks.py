"""Checks for notebook 02 (embeddings): the sinusoidal positional encoding of "Attention Is All You Need"."""

from __future__ import annotations

import torch
from torch import Tensor

from harness._assertions import as_tensor_output, call, check_tensor, fail, mismatch_summary

__all__ = ["sinusoidal_test"]

# (n_ctx, d_model): small ones first, where a mistake is easy to read off, then GPT-2 small's size. d_model is even
# (the formula pairs dimensions); d_model / 2 is odd in some, which catches code that assumes a power of two.
TEST_SIZES = ((12, 8), (9, 6), (1, 4), (40, 10), (64, 32), (1024, 768))
# float32 angles reach n_ctx radians with a relative error near 1e-7, so large positions need some slack; any
# actual mistake is off by O(1).
ATOL = 1e-3


def _encoding(
    n_ctx: int, d_model: int, base: float = 10000.0, pair: bool = True, exponent_scale: float = 2.0, first_pos: int = 0
) -> Tensor:
    """PE[pos, 2i] = sin(pos / base^(2i/d_model)), PE[pos, 2i+1] = cos(pos / base^(2i/d_model)), in float64.

    The keyword arguments reproduce mistakes: `pair=False` gives dimension j its own frequency base^(j/d_model)
    (rather than sharing one with its partner), `exponent_scale=1` makes the exponent i/d_model.
    """
    pos = torch.arange(first_pos, first_pos + n_ctx, dtype=torch.float64)[:, None]
    dim = torch.arange(d_model, dtype=torch.float64)
    i = torch.div(dim, 2, rounding_mode="floor")
    exponent = exponent_scale * i / d_model if pair else dim / d_model
    angle = pos / base**exponent
    return torch.where(dim % 2 == 0, torch.sin(angle), torch.cos(angle))


def _halves(pe: Tensor, cos_first: bool = False) -> Tensor:
    """The same sines and cosines concatenated ([all sines | all cosines]) rather than interleaved."""
    sin, cos = pe[:, 0::2], pe[:, 1::2]
    return torch.cat([cos, sin] if cos_first else [sin, cos], dim=-1)


def _likely_mistakes(n_ctx: int, d_model: int):
    """(wrong encoding, what went wrong) for mistakes that are easy to make."""
    pe = _encoding(n_ctx, d_model)
    swapped = torch.empty_like(pe)
    swapped[:, 0::2], swapped[:, 1::2] = pe[:, 1::2], pe[:, 0::2]
    yield swapped, "sin and cos are swapped: sin goes in the even dimensions (0, 2, 4, ...), cos in the odd ones."
    yield (
        _halves(pe),
        (
            "the sines and cosines are concatenated ([sin ... sin | cos ... cos]) rather than interleaved: dimension 2i "
            "holds sin and dimension 2i+1 holds cos of the same angle (e.g. torch.stack([sin, cos], dim=-1) then "
            "flatten the last two dimensions, or assign pe[:, 0::2] and pe[:, 1::2])."
        ),
    )
    yield (
        _halves(pe, cos_first=True),
        (
            "the cosines and sines are concatenated ([cos ... | sin ...]) rather than interleaved: dimension 2i holds "
            "sin and dimension 2i+1 holds cos of the same angle."
        ),
    )
    yield (
        _encoding(n_ctx, d_model, exponent_scale=1.0),
        (
            "the exponent is i/d_model where the formula has 2i/d_model (i counts the pairs of dimensions: 0 .. "
            "d_model/2 - 1), so the frequencies fall too slowly. torch.arange(0, d_model, 2) gives 2i directly."
        ),
    )
    yield (
        _encoding(n_ctx, d_model, pair=False),
        (
            "each dimension j has its own frequency 10000^(j/d_model): dimensions 2i and 2i+1 must share one, "
            "10000^(2i/d_model), so that they are the sin and cos of the same angle."
        ),
    )
    yield (
        _encoding(n_ctx, d_model, first_pos=1),
        "positions start at 1: they start at 0 (the first row is sin(0)=0 and cos(0)=1 alternating).",
    )
    pos = torch.arange(n_ctx, dtype=torch.float64)[:, None]
    dim = torch.arange(d_model, dtype=torch.float64)
    angle = pos * 10000.0 ** (2 * torch.div(dim, 2, rounding_mode="floor") / d_model)
    yield (
        torch.where(dim % 2 == 0, angle.sin(), angle.cos()),
        (
            "the position is multiplied by 10000^(2i/d_model) instead of divided by it (the wavelengths must grow, "
            "from 2*pi to 10000*2*pi, along the dimensions)."
        ),
    )
    for base in (1000.0, 100000.0, 100.0, 10.0):
        yield (
            _encoding(n_ctx, d_model, base=base),
            f"it matches the formula with base {base:g} rather than 10000 (note 1e4 = 10_000 = 10000).",
        )


def sinusoidal_test(sinusoidal_positional_encoding) -> None:
    """Check `sinusoidal_positional_encoding(n_ctx, d_model) -> Float[Tensor, "n_ctx d_model"]` on several sizes."""
    if not callable(sinusoidal_positional_encoding):
        fail(f"Pass the function itself, not {type(sinusoidal_positional_encoding).__name__}.")
    for n_ctx, d_model in TEST_SIZES:
        what = f"sinusoidal_positional_encoding(n_ctx={n_ctx}, d_model={d_model})"
        out = as_tensor_output(call(sinusoidal_positional_encoding, n_ctx, d_model, what=what), what)
        check_tensor(out, (n_ctx, d_model), what, dtype=torch.float32, device="cpu")
        expected = _encoding(n_ctx, d_model)
        summary = mismatch_summary(out, expected, atol=ATOL, rtol=0.0)
        if summary is None:
            continue
        got = out.detach().to(torch.float64)
        for wrong, why in _likely_mistakes(n_ctx, d_model):
            if mismatch_summary(got, wrong, atol=ATOL, rtol=0.0) is None:
                fail(f"{what} is wrong: {why}")
        row = ", ".join(f"{v:.3f}" for v in got[0, :6].tolist())
        fail(
            f"{what} does not match PE[pos, 2i] = sin(pos / 10000^(2i/d_model)), PE[pos, 2i+1] = cos(pos / "
            f"10000^(2i/d_model)): {summary}. Row 0 (position 0) should read 0, 1, 0, 1, ... and reads {row}, ... "
            "Check the frequencies (one per pair of dimensions), the angles pos * frequency, and the interleaving."
        )
    print(f"sinusoidal_test passed: the encoding matches the formula for {len(TEST_SIZES)} sizes (n_ctx, d_model).")
