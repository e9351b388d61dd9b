"""Small assertion helpers shared by every check: each failure is an AssertionError that speaks to the learner."""

from __future__ import annotations

import functools
import itertools
import math
from typing import NoReturn

import torch
from torch import Tensor


def fail(message: str) -> NoReturn:
    raise AssertionError(message)


def defaults_as_given(fn, notebook: str, target: str, name: str) -> None:
    """Fail unless `fn` gives each parameter that the notebook's signature of `target` gives a number or None by
    default the same default, where it gives a plain number: the notebook's own calls that leave the argument out
    rely on it, and a check that passes every argument never sees it. A parameter `fn` does not name or gives no
    default, and a default that is None where the notebook's is a number (a sentinel for it) or another object, are
    left to the rest of the check (the judge is stricter: docs/grading.md)."""
    import inspect
    import numbers

    from harness.course import components

    def plain(default) -> bool:
        return default is None or (isinstance(default, numbers.Real) and math.isfinite(float(default)))

    given = inspect.signature(getattr(components(notebook), target)).parameters
    try:
        theirs = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin or an object inspect cannot read: the calls judge it
        return
    for key, param in given.items():
        if param.default is inspect.Parameter.empty or not plain(param.default):
            continue
        if key not in theirs:  # a function without the parameter, or one that takes it as **kwargs: the calls judge
            continue
        got = theirs[key].default
        # a plain number is compared; a None standing for the notebook's number, an object (a tensor) or no default
        # at all is left to the calls below
        readable = type(got) in (int, float, bool) or (param.default is None and got is not inspect.Parameter.empty)
        if readable and not (got is None if param.default is None else got is not None and got == param.default):
            fail(
                f"{name}'s default for {key} is {got!r}, where the notebook's signature gives {param.default!r}: "
                f"the notebook's own calls that leave {key} out rely on it; keep the signature's defaults as given."
            )


def build(cls, cfg, what: str | None = None):
    """`cls(cfg)`, turning a wrong signature or an exception in `__init__` into a clear failure."""
    name = what or getattr(cls, "__name__", repr(cls))
    if not callable(cls):
        fail(f"Expected a class to test, got {type(cls).__name__} {cls!r}. Pass the class itself, e.g. LayerNorm.")
    try:
        module = cls(cfg)
    except TypeError as err:
        raise AssertionError(
            f"Could not build {name}(cfg): {err}. The class must take exactly one argument, the Config."
        ) from err
    except Exception as err:
        raise AssertionError(f"{name}(cfg) raised {type(err).__name__} in __init__: {err}") from err
    if not isinstance(module, torch.nn.Module):
        fail(f"{name}(cfg) returned a {type(module).__name__}, not a torch.nn.Module: subclass nn.Module.")
    return module


def call(fn, *args, what: str):
    """Run learner code, turning any exception into a failure that names it (the cause stays chained)."""
    try:
        return fn(*args)
    except AssertionError:
        raise
    except Exception as err:
        hint = ""
        if isinstance(err, IndexError) and "PosEmbed" in what:
            hint = " (index W_pos by position, 0..pos-1, not by the token ids)"
        elif isinstance(err, RuntimeError) and ("size" in str(err) or "shape" in str(err)):
            hint = " (a shape mismatch: check the shape of each tensor against the annotations)"
        raise AssertionError(f"{what} raised {type(err).__name__}: {err}{hint}") from err


# Operator families a notebook forbids in an exercise, as the grader's judge refuses them (its rules are wider:
# docs/grading.md); here the learner hears of it first. The profiler sees every name that reaches the dispatcher.
NORM_OPS = ("*layer_norm*", "*group_norm*", "*batch_norm*", "*instance_norm*", "*rms_norm*")
ATTENTION_OPS = ("*scaled_dot_product*", "*multi_head_attention*", "*flash_attention*", "*efficient_attention*")
GELU_OPS = ("*::gelu*",)
LOSS_OPS = ("*::*loss*", "*::kl_div*", "*::binary_cross_entropy*")


def refuse_operators(fn, *args, patterns: tuple[str, ...], what: str, rule: str):
    """`call(fn, *args)`, failing if an operator of `patterns` (fnmatch over the profiler's names, `aten::gelu`)
    ran: the output may be right, but the exercise is to compute it without that operator."""
    import fnmatch

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as record:
        out = call(fn, *args, what=what)
    ran = sorted({e.name for e in record.events() if any(fnmatch.fnmatch(e.name, p) for p in patterns)})
    if ran:
        fail(f"{what} ran {ran[0]}: {rule}")
    return out


def as_tensor_output(out, what: str) -> Tensor:
    """The output as a tensor: a tuple's first item is taken; lists, arrays and other types fail."""
    if isinstance(out, tuple) and out:
        out = out[0]
    if isinstance(out, Tensor):
        return out
    kind = type(out).__module__.split(".")[0] + "." + type(out).__name__
    if kind == "numpy.ndarray":
        fail(f"{what} returned a NumPy array: return a torch.Tensor (stay in torch, no .numpy()).")
    if isinstance(out, list):
        fail(f"{what} returned a list: return one torch.Tensor (e.g. torch.stack the pieces).")
    if out is None:
        fail(f"{what} returned None: did you forget `return`?")
    fail(f"{what} returned {kind}, expected a torch.Tensor.")


def check_tensor(out: Tensor, shape: tuple[int, ...], what: str, dtype=torch.float32, device=None) -> None:
    """Exact shape (no broadcasting), dtype, device and finiteness."""
    shape = tuple(shape)
    got = tuple(out.shape)
    if got != shape:
        hint = ""
        if len(got) == len(shape) - 1 and got == shape[1:]:
            hint = " It lacks the batch dimension: keep `batch` as the first dimension."
        elif len(got) == len(shape) and sorted(got) == sorted(shape):
            hint = " The sizes are right but in the wrong order: check your einsum/rearrange output pattern."
        elif len(got) != len(shape):
            hint = f" It has {len(got)} dimensions where {len(shape)} are due."
        fail(f"{what} output has shape {list(got)}, expected {list(shape)}.{hint}")
    if out.dtype != dtype:
        hint = (
            " Avoid float64 (NumPy, or torch.tensor on Python floats with dtype=float64)."
            if out.dtype == torch.float64
            else ""
        )
        fail(f"{what} output has dtype {out.dtype}, expected {dtype}.{hint}")
    if device is not None and out.device != torch.device(device):
        fail(
            f"{what} output is on {out.device}, but its input was on {device}: create new tensors on the input's device."
        )
    if out.is_floating_point() and not torch.isfinite(out).all():
        n_nan = int(out.isnan().sum())
        n_inf = int(out.isinf().sum())
        fail(
            f"{what} output has {n_nan} NaN and {n_inf} infinite values. Common causes: a row of attention scores "
            "that is masked entirely (then softmax divides 0 by 0), -inf where a large negative number is safer, "
            "or dividing by a standard deviation without epsilon."
        )


def _ranges(indices: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    parts, start = [], None
    for i, value in enumerate(indices):
        if start is None:
            start = value
        if i + 1 == len(indices) or indices[i + 1] != value + 1:
            parts.append(f"{start}" if start == value else f"{start}-{value}")
            start = None
    return ", ".join(parts)


def where_it_differs(bad: Tensor, names: tuple[str, ...] | None = None) -> str:
    """The axes along which the wrong entries are confined to some indices (evidence, not a cause): e.g.
    '; the differences are only at position 2 (of 0-3)'. '' when they are spread over every index of every axis."""
    found = []
    for axis, size in enumerate(bad.shape):
        if size < 2:
            continue
        touched = bad.transpose(0, axis).reshape(size, -1).any(dim=1).nonzero().flatten().tolist()
        if 0 < len(touched) < size:
            label = names[axis] if names and axis < len(names) else f"axis {axis}"
            found.append(f"{label} {_ranges(touched)} (of 0-{size - 1})")
    if not found:
        return ""
    return "; the differences are only at " + " and ".join(found[:2])


def mismatch_summary(
    actual: Tensor, expected: Tensor, atol: float, rtol: float, names: tuple[str, ...] | None = None
) -> str | None:
    """None when `actual` matches `expected` within |a - e| <= atol + rtol * |e|, else a description: how many entries
    differ, the largest difference, and the indices the differences are confined to (`names`: the axes' names)."""
    actual = actual.detach().to(torch.float64)
    expected = expected.detach().to(torch.float64)
    diff = (actual - expected).abs()
    bad = diff > atol + rtol * expected.abs()
    if not bad.any():
        return None
    flat = int(diff.argmax())
    index = [int(i) for i in torch.unravel_index(torch.tensor(flat), diff.shape)]
    share = bad.double().mean().item()
    return (
        f"{int(bad.sum())} of {bad.numel()} values ({share:.1%}) differ by more than atol={atol:g} + "
        f"rtol={rtol:g}*|expected|; the largest difference is {diff.max().item():.3g} at index {index} "
        f"(got {actual.flatten()[flat].item():.6g}, expected {expected.flatten()[flat].item():.6g})"
        f"{where_it_differs(bad, names) if bad.dim() > 1 else ''}"
    )


def assert_close(
    actual: Tensor,
    expected: Tensor,
    what: str,
    atol: float = 1e-5,
    rtol: float = 1e-4,
    hint: str = "",
    names: tuple[str, ...] | None = None,
) -> None:
    summary = mismatch_summary(actual, expected, atol, rtol, names)
    if summary is not None:
        fail(f"{what}: {summary}.{(' ' + hint) if hint else ''}")


def assert_unchanged(before: Tensor, after: Tensor, what: str) -> None:
    if before.shape != after.shape or not torch.equal(before, after):
        fail(
            f"{what} modified its input in place: compute into a new tensor (x = x - mean, not x -= mean or x.sub_())."
        )


# ---------------------------------------------------------------------------------------------------------------
# What the learner sees when a check fails: their cell, the message and (when their code raised) their own frames.

_HARNESS_DIR = __file__.rsplit("/", 1)[0]
_LIBRARY_MARKERS = ("site-packages", "dist-packages", "/lib/python3")


def _is_harness_frame(frame) -> bool:
    return frame.f_code.co_filename.startswith(_HARNESS_DIR)


def _is_learner_frame(frame) -> bool:
    filename = frame.f_code.co_filename
    return not _is_harness_frame(frame) and not any(marker in filename for marker in _LIBRARY_MARKERS)


def _chain(err: BaseException):
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or (None if err.__suppress_context__ else err.__context__)


def unfinished_exercise(err: BaseException) -> str | None:
    """`Attention.forward` when the chain holds a bare NotImplementedError raised by the learner's own code."""
    for link in _chain(err):
        if type(link) is not NotImplementedError or link.args not in ((), ("",)):
            continue
        tb, raiser = link.__traceback__, None
        while tb is not None:
            raiser = tb.tb_frame
            tb = tb.tb_next
        if raiser is not None and _is_learner_frame(raiser):
            return getattr(raiser.f_code, "co_qualname", raiser.f_code.co_name)
    return None


def _drop_harness_frames(err: BaseException) -> None:
    """Cut the harness's own frames from the front of each chained traceback, so learner frames lead."""
    for link in _chain(err):
        tb = link.__traceback__
        while tb is not None and _is_harness_frame(tb.tb_frame):
            tb = tb.tb_next
        link.__traceback__ = tb


class CheckFailed(AssertionError):
    """A failed check. In IPython and Jupyter it shows the learner's cell, the message and their own frames only."""

    def _render_traceback_(self) -> list[str]:
        # IPython calls this instead of its own formatting; it hides every frame but the last one marked
        # `__tracebackhide__`, which would leave one harness frame, so the frames are chosen here.
        from IPython import get_ipython

        shell = get_ipython()
        entries, tb = [], self.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            if not (_is_harness_frame(frame) or frame.f_locals.get("__tracebackhide__")):
                entries.append(tb)
            tb = tb.tb_next
        for outer, inner in itertools.pairwise(entries):
            outer.tb_next = inner
        if entries:
            entries[-1].tb_next = None
        self.__traceback__ = entries[0] if entries else None
        if shell is None:
            import traceback

            return traceback.format_exception(self)
        return shell.InteractiveTB.structured_traceback(type(self), self, self.__traceback__, tb_offset=0)


def learner_facing(check):
    """Wrap a public check: an unfinished exercise is named in one line, and harness frames are hidden.

    The failure is re-raised as `CheckFailed` (an AssertionError) with the learner's exception, if any, as its
    cause, stripped of the harness frames that called into it.
    """

    @functools.wraps(check)
    def wrapper(*args, **kwargs):
        __tracebackhide__ = True  # read by IPython and pytest
        try:
            return check(*args, **kwargs)
        except Exception as err:
            name = unfinished_exercise(err)
            if name is not None:
                message = f"`{name}` is not written yet: complete the exercise cell above, run it, then run this check."
                raise CheckFailed(message) from None
            if not isinstance(err, AssertionError) or isinstance(err, CheckFailed):
                raise
            _drop_harness_frames(err)
            failure = CheckFailed(*err.args)
            failure.__cause__ = err.__cause__
            failure.__suppress_context__ = True
            raise failure from err.__cause__

    return wrapper
