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
