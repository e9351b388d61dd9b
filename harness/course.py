"""The course's own implementations of earlier exercises, read from the instructor notebooks.

A later notebook builds on components from earlier ones (the block needs LayerNorm, Attention and MLP).
Rather than copying that code around, it lives once, in the cells of `solutions/*.ipynb` tagged
`component`, and is executed here on demand.
"""

from __future__ import annotations

import functools
import json
import linecache
import sys
import types
from pathlib import Path

COMPONENT_TAG = "component"
SOLUTIONS_DIR = Path(__file__).resolve().parent.parent / "solutions"


def notebook_names() -> list[str]:
    """The course's notebooks in order, e.g. `["00_tour", "01_layernorm", ...]`."""
    return sorted(path.stem for path in SOLUTIONS_DIR.glob("[0-9][0-9]_*.ipynb"))


def component_source(name: str) -> str:
    """The code of the `component` cells of one solution notebook, joined in order."""
    path = SOLUTIONS_DIR / f"{name}.ipynb"
    if not path.exists():
        raise FileNotFoundError(
            f"{path} not found: the course's components are read from the repository's solutions/ folder, "
            "so install the course from a clone of the repository (pip install -e .)."
        )
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    chunks = []
    for cell in cells:
        if cell["cell_type"] == "code" and COMPONENT_TAG in cell.get("metadata", {}).get("tags", []):
            source = cell["source"]
            chunks.append(source if isinstance(source, str) else "".join(source))
    return "\n\n".join(chunks)


@functools.cache
def components(upto: str) -> types.ModuleType:
    """Everything the course defines in notebooks up to and including `upto`, as one module.

    >>> prev = components("03_attention")
    >>> LayerNorm, Attention = prev.LayerNorm, prev.Attention
    """
    names = notebook_names()
    if upto not in names:
        raise ValueError(f"Unknown notebook {upto!r}; the course has {names}.")
    module = types.ModuleType(f"harness.course.{upto}")
    sys.modules[module.__name__] = module  # lets dataclasses and pickle resolve the module
    for name in names[: names.index(upto) + 1]:
        source = component_source(name)
        filename = f"<solutions/{name}.ipynb>"
        # Registering the source lets tracebacks and inspect.getsource show the real lines.
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        exec(compile(source, filename, "exec"), module.__dict__)  # noqa: S102 -- the course's own notebooks
    return module


# ---------------------------------------------------------------------------------------------------------------
# The learner's own earlier work, where it passes its checks.

_CHECKED_KINDS = {
    "LayerNorm": "float",
    "Attention": "float",
    "MLP": "float",
    "TransformerBlock": "float",
    "Embed": "int",
    "PosEmbed": "int",
    "Unembed": "float",
    "DemoTransformer": "int",
}


def _learner_namespace(upto: str, folder: Path) -> tuple[dict, list[str]]:
    """The `component` cells of the learner's own notebooks up to `upto` (as saved in `folder`), run in order in
    one namespace; returns it and the notebooks that could not be read or run."""
    names = notebook_names()
    namespace: dict = {"__name__": "harness.course.yours"}
    problems = []
    for name in names[: names.index(upto) + 1]:
        path = folder / f"{name}.ipynb"
        try:
            cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        except (OSError, ValueError, KeyError):
            problems.append(f"{name}.ipynb not found next to this notebook")
            continue
        for cell in cells:
            if cell.get("cell_type") != "code" or COMPONENT_TAG not in cell.get("metadata", {}).get("tags", []):
                continue
            source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
            try:
                exec(compile(source, f"<your {name}.ipynb>", "exec"), namespace)  # noqa: S102 -- the learner's own code
            except Exception as err:  # noqa: BLE001 -- an unfinished notebook: its names fall back to the course's
                problems.append(f"{name}.ipynb: {type(err).__name__}: {err}")
                break
    return namespace, problems


def yours_or_course(upto: str, *names: str, folder: Path | str | None = None) -> tuple:
    """The classes `names` as the learner wrote them in notebooks up to `upto`, each one only if it passes its
    check (`rand_float_test` / `rand_int_test` on a small config); otherwise the course's own. Prints one line
    saying which were used. In fast mode (COURSE_FAST=1: tests and grading) always the course's.

    >>> LayerNorm, Attention = yours_or_course("03_attention", "LayerNorm", "Attention")
    """
    import contextlib
    import io
    import os

    course = components(upto)
    chosen = {name: getattr(course, name) for name in names}
    if os.environ.get("COURSE_FAST", "0") == "1":
        print(f"Fast mode: using the course's {', '.join(names)}.")
        return tuple(chosen.values())
    from harness.checks import rand_float_test, rand_int_test
    from harness.config import Config

    small = Config(d_model=48, n_layers=2, n_heads=4, d_head=12, d_mlp=96, n_ctx=16, d_vocab=97)
    namespace, problems = _learner_namespace(upto, Path(folder) if folder is not None else Path.cwd())
    yours, theirs = [], []
    for name in names:
        candidate = namespace.get(name)
        if candidate is None or candidate is getattr(course, name, None):
            theirs.append(f"{name} (not found in your notebooks)")
            continue
        check = rand_int_test if _CHECKED_KINDS.get(name) == "int" else rand_float_test
        shape = [2, 5] if check is rand_int_test else [2, 5, small.d_model]
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                check(candidate, shape, small)
        except Exception as err:  # noqa: BLE001 -- a failing or unfinished class: the course's is used instead
            if "NotImplementedError" in str(err):
                theirs.append(f"{name} (yours is not written yet)")
            else:
                theirs.append(f"{name} (yours does not pass its check yet: {str(err).split('. ')[0][:120]})")
            continue
        chosen[name] = candidate
        yours.append(name)
    parts = []
    if yours:
        parts.append(f"your {', '.join(yours)}")
    if theirs:
        parts.append(f"the course's {'; '.join(theirs)}")
    note = f" [{problems[0]}]" if problems and theirs else ""
    print(f"Using {' and '.join(parts)}.{note}")
    return tuple(chosen.values())
