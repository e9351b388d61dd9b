"""Every argument an exercise takes is exercised by its check: a version that ignores it is caught.

For each exercise of each solution notebook, the course's own answer is wrapped so that it ignores one of its
arguments, and the exercise's graded test cell runs against the wrapper (tests/exercise_variants.py):
- a function's parameter ignored: a tensor replaced by other values of its shape, a parameter with a default held
  at its default, any other value frozen at the first call's (a hard-coded value);
- two parameters of the same scalar type, swapped (`temperature` for `top_p`, `pad_id` for `eos_id`);
- a module's config field that it reads, frozen at the first config's value (a hard-coded `n_heads`), and each
  parameter of its `forward`, ignored as a function's is.
Arguments that are objects (a model, a cache, training arguments) are left as they are: what varies them is the
models and caches the check builds. Only what the learner writes counts: functions with a solution region, parameters and config fields named
inside it. A wrapper that passes the test is an argument that no input varies. It fails this test unless `UNVARIED` gives the
reason (an argument the exercise never reads for the answer, a value the check cannot vary, ...).

Each notebook runs in its own process (`python tests/test_exercise_arguments.py NOTEBOOK` prints the records).
Opt-in (`-m exhaustive`, about five minutes on 2 cores); `.ci/run` runs it after the default suite.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(p.stem for p in (ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))

# (exercise grade id, variant) -> why a wrapper that ignores this argument still passes, reviewed here.
UNVARIED: dict[tuple[str, str], str] = {
    ("pos_embed", "PosEmbed.forward: tokens frozen"): (
        "the positional embedding depends on the tokens' shape only, and the replacement keeps the shape"
    ),
    ("padded_transformer", "PaddedAttention: cfg.n_ctx frozen"): (
        "the attention never reads n_ctx; the cell's other class, PaddedTransformer, does (its context's edge is "
        "checked, and freezing n_ctx there is caught)"
    ),
    ("apply_causal_mask", "apply_causal_mask: ignore frozen"): (
        "the check accepts any masking value of -1e4 or below, -inf included (the exercise text allows either): "
        "`ignore` is a convenience, not part of the contract"
    ),
}


# ---------------------------------------------------------------------------------------------- the wrappers
def _replaced(value, first: dict, name: str, default):
    """What an exercise that ignores argument `name` sees in its place: a tensor's values changed (same shape and
    dtype: the answer no longer depends on them), a parameter's default when it has one (a default never changed),
    else the value of the first call (a hard-coded value)."""
    import torch

    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            noise = torch.randn(value.shape, generator=torch.Generator().manual_seed(0), dtype=value.dtype)
            return noise.to(value.device) * (value.std() if value.numel() > 1 else 1.0) + value.mean()
        if value.dtype == torch.bool:
            return ~value
        return (value + 1) % (int(value.max()) + 1)  # other ids of the same range: counts and orders change
    if not isinstance(value, int | float | bool | str | type(None)):
        first["objects"] = True  # a model, a cache, a list of pairs: what the check builds varies them
        return value
    if default is not inspect.Parameter.empty:
        return default
    first.setdefault(name, value)
    return first[name]


def _frozen_function(fn, name: str):
    signature = inspect.signature(fn)
    default = signature.parameters[name].default
    first: dict = {}

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        bound.arguments[name] = _replaced(bound.arguments[name], first, name, default)
        return fn(*bound.args, **bound.kwargs)

    wrapper.variant_state = first
    return wrapper


def _swapped_function(fn, a: str, b: str):
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        bound.arguments[a], bound.arguments[b] = bound.arguments[b], bound.arguments[a]
        return fn(*bound.args, **bound.kwargs)

    return wrapper


def _frozen_config_field(cls, field: str):
    first: dict = {}

    class Frozen(cls):
        def __init__(self, cfg, *args, **kwargs):
            if field not in first:
                first[field] = getattr(cfg, field)
            super().__init__(dataclasses.replace(cfg, **{field: first[field]}), *args, **kwargs)

    Frozen.__name__ = Frozen.__qualname__ = cls.__name__
    return Frozen


def _frozen_forward(cls, name: str):
    signature = inspect.signature(cls.forward)
    default = signature.parameters[name].default
    first: dict = {}

    class Frozen(cls):
        def forward(self, *args, **kwargs):
            bound = signature.bind(self, *args, **kwargs)
            bound.apply_defaults()
            bound.arguments[name] = _replaced(bound.arguments[name], first, name, default)
            return super().forward(*bound.args[1:], **bound.kwargs)

    Frozen.__name__ = Frozen.__qualname__ = cls.__name__
    Frozen.variant_state = first
    return Frozen


def _defined_names(source: str) -> list[str]:
    return [n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef | ast.ClassDef)]


def _solution_text(source: str, name: str | None = None) -> str:
    """The lines inside the solution regions of `source` (of definition `name` only, when given)."""
    if name is not None:
        for node in ast.parse(source).body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name == name:
                source = "\n".join(source.splitlines()[node.lineno - 1 : node.end_lineno])
    lines, inside = [], False
    for line in source.splitlines():
        if "### BEGIN SOLUTION" in line or "### END SOLUTION" in line:
            inside = "BEGIN" in line
        elif inside:
            lines.append(line)
    return "\n".join(lines)


def _config_fields_read(source: str) -> list[str]:
    """The config fields the learner's own code reads (`cfg.X` inside the solution regions); the scaffolding's
    reads (the given `__init__`) are the notebook's, not the learner's."""
    from harness import Config

    fields = {f.name for f in dataclasses.fields(Config)}
    return sorted(set(re.findall(r"cfg\.(\w+)", _solution_text(source))) & fields)


def variants(namespace: dict, exercise: dict) -> list[tuple[str, object]]:
    """(label, patch) pairs for one exercise: each patch replaces one defined name with an argument-ignoring
    wrapper."""
    import torch

    found = []
    for name in _defined_names(exercise["source"]):
        obj = namespace.get(name)
        learners = _solution_text(exercise["source"], name)
        if not learners.strip():
            continue  # given code: the learner writes none of it
        used = set(re.findall(r"\w+", learners))
        if inspect.isclass(obj) and issubclass(obj, torch.nn.Module):
            for field in _config_fields_read(exercise["source"]):
                found.append((f"{name}: cfg.{field} frozen", name, _frozen_config_field(obj, field)))
            for param in list(inspect.signature(obj.forward).parameters)[1:]:
                kind = inspect.signature(obj.forward).parameters[param].kind
                if kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD) or param not in used:
                    continue
                found.append((f"{name}.forward: {param} frozen", name, _frozen_forward(obj, param)))
        elif inspect.isfunction(obj):
            parameters = inspect.signature(obj).parameters
            plain = [
                p
                for p in parameters.values()
                if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD) and p.name in used
            ]
            for p in plain:
                found.append((f"{name}: {p.name} frozen", name, _frozen_function(obj, p.name)))
            scalars = [p for p in plain if p.annotation in (int, float, bool, "int", "float", "bool")]
            for i, a in enumerate(scalars):
                for b in scalars[i + 1 :]:
                    if a.annotation == b.annotation:
                        found.append(
                            (f"{name}: {a.name} and {b.name} swapped", name, _swapped_function(obj, a.name, b.name))
                        )
    return [(label, _patch(name, wrapper)) for label, name, wrapper in found]


def _patch(name, wrapper):
    def patch(namespace):
        namespace[name] = wrapper
        namespace["__variant_state__"] = getattr(wrapper, "variant_state", {})

    return patch


def records(notebook: str) -> list[dict]:
    sys.path.insert(0, str(ROOT / "tests"))
    from exercise_variants import NotebookState

    state = NotebookState(notebook)
    out = []
    for exercise in state.exercises:
        for label, patch in variants(state.namespace, exercise):
            result = state.try_variant(exercise, patch=patch, timeout=60, report="__variant_state__")
            if result.pop("report", {}).get("objects"):
                continue  # the argument was an object, left as it was: nothing to learn
            out.append({"exercise": exercise["name"], "variant": label, **result})
    return out


# ---------------------------------------------------------------------------------------------- the test
@pytest.mark.exhaustive
@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_every_exercise_argument_is_exercised(notebook):
    run = subprocess.run(
        [sys.executable, __file__, notebook], capture_output=True, text=True, check=False, cwd=ROOT, timeout=900
    )
    assert run.returncode == 0, run.stderr[-3000:]
    results = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    unexplained = [
        f"{r['exercise']}: {r['variant']}"
        for r in results
        if r["outcome"] == "survived" and (r["exercise"], r["variant"]) not in UNVARIED
    ]
    assert not unexplained, "arguments that no input of the check varies:\n" + "\n".join(unexplained)
    stale = [key for key in UNVARIED if key[0] in {r["exercise"] for r in results}]
    stale = [
        key
        for key in stale
        if not any((r["exercise"], r["variant"]) == key and r["outcome"] == "survived" for r in results)
    ]
    assert not stale, f"listed as unvaried but now caught (remove them from UNVARIED): {stale}"


if __name__ == "__main__":
    for record in records(sys.argv[1]):
        print(json.dumps(record), flush=True)
