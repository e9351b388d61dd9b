"""The course as nbgrader sees it: one nbgrader assignment per notebook, built from `solutions/`.

nbgrader's course directory (`source/<assignment>/<notebook>.ipynb`, `release/`, `submitted/`, `autograded/`,
`feedback/` and the SQLite gradebook) is created on demand: for generating the learner notebooks in a temporary
directory, and for grading in the output folder of `python -m instructor.grade`. Nothing of it is committed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS_DIR = REPO_ROOT / "solutions"
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"

# nbgrader runs `alembic` (the gradebook's migration tool) as a command: make the environment's own one findable.
_bin = os.path.dirname(sys.executable)
if _bin not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = _bin + os.pathsep + os.environ.get("PATH", "")


def notebook_names(solutions_dir: Path = SOLUTIONS_DIR) -> list[str]:
    """The course's notebooks in order, e.g. `["00_tour", "01_layernorm", ...]`."""
    return sorted(path.stem for path in Path(solutions_dir).glob("[0-9][0-9]_*.ipynb"))


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def dumps_notebook(nb: dict) -> str:
    """nbformat's on-disk layout (sorted keys, indent 1, trailing newline): stable bytes for stable input."""
    return json.dumps(nb, sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def cell_source(cell: dict) -> str:
    source = cell.get("source", "")
    if isinstance(source, str):
        return source
    if isinstance(source, list):
        return "".join(s for s in source if isinstance(s, str))
    return ""


def nbgrader_meta(cell: dict) -> dict:
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return meta if isinstance(meta, dict) else {}


# Cell metadata the grader's normaliser sets on the course's own code cells, left as released: nbgrader's run may
# leave out those no graded cell needs (`dataflow.cells_to_run`)
GIVEN = "course_given"


def encodable(value):
    """`value` (JSON: str, list, dict...) with every string made writable as UTF-8: a lone surrogate, which JSON
    carries as `\\udcff`, is written `\\udcff` in text. A learner's exception message holding one reached the
    gradebook and the CSVs, whose strict encoders raised, and the batch ended without them (red-team round 17).
    Everything the grader reads from a process that ran learner code goes through this."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
        return value
    if isinstance(value, list):
        return [encodable(item) for item in value]
    if isinstance(value, dict):
        return {encodable(key): encodable(item) for key, item in value.items()}
    return value


def same_text(source: str) -> str:
    """A cell's text as compared with the course's: line ends and trailing spaces do not count."""
    return "\n".join(line.rstrip() for line in source.strip().splitlines())


def cell_kind(cell: dict) -> str:
    """ "markdown" (or raw), "solution" (an exercise), "test" (a graded test cell) or "given" (other code)."""
    if cell.get("cell_type") != "code":
        return "markdown"
    meta = nbgrader_meta(cell)
    if meta.get("solution"):
        return "solution"
    if meta.get("grade"):
        return "test"
    return "given"


@dataclass
class SourceCell:
    index: int
    kind: str
    source: str
    grade_id: str | None = None
    points: float = 0.0
    exercise: str | None = None  # for a test cell: the grade_id of the nearest solution cell above it


@dataclass
class SourceNotebook:
    name: str
    cells: list[SourceCell] = field(default_factory=list)

    @property
    def tests(self) -> list[SourceCell]:
        return [c for c in self.cells if c.kind == "test"]

    @property
    def solutions(self) -> list[SourceCell]:
        return [c for c in self.cells if c.kind == "solution"]

    @property
    def max_score(self) -> float:
        return sum(c.points for c in self.tests)


def read_source_notebook(name: str, solutions_dir: Path = SOLUTIONS_DIR) -> SourceNotebook:
    nb = read_json(Path(solutions_dir) / f"{name}.ipynb")
    out = SourceNotebook(name)
    exercise = None
    for index, cell in enumerate(nb["cells"]):
        kind = cell_kind(cell)
        meta = nbgrader_meta(cell)
        entry = SourceCell(index, kind, cell_source(cell), meta.get("grade_id"), float(meta.get("points", 0) or 0))
        if kind == "solution":
            exercise = entry.grade_id
        elif kind == "test":
            entry.exercise = exercise
        out.cells.append(entry)
    return out


def solutions_digest(names: list[str], solutions_dir: Path = SOLUTIONS_DIR) -> str:
    digest = hashlib.sha256()
    for name in names:
        digest.update(name.encode())
        digest.update((Path(solutions_dir) / f"{name}.ipynb").read_bytes())
    return digest.hexdigest()[:16]


def nbgrader_config(
    cell_timeout: int = 60, notebook_timeout: int = 300, root: Path | None = None, kernel_name: str | None = None
):
    """The traitlets config nbgrader runs with, here and in the course directory's `nbgrader_config.py`."""
    from traitlets.config import Config

    from instructor import nbconfig

    c = Config()
    nbconfig.configure(c, cell_timeout=cell_timeout, notebook_timeout=notebook_timeout, kernel_name=kernel_name)
    if root is not None:
        c.CourseDirectory.root = str(root)
    return c


COURSE_CONFIG_TEMPLATE = '''"""nbgrader configuration of this course directory (written by `python -m instructor.grade`)."""

from instructor import nbconfig

c = get_config()  # noqa: F821
nbconfig.configure(c, cell_timeout={cell_timeout}, notebook_timeout={notebook_timeout})
'''


def build_course(
    root: Path,
    names: list[str],
    solutions_dir: Path = SOLUTIONS_DIR,
    cell_timeout: int = 60,
    notebook_timeout: int = 300,
) -> None:
    """An nbgrader course directory with one assignment per notebook, generated (release + gradebook)."""
    from nbgrader.apps import NbGraderAPI

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for name in names:
        folder = root / "source" / name
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(solutions_dir) / f"{name}.ipynb", folder / f"{name}.ipynb")
    (root / "nbgrader_config.py").write_text(
        COURSE_CONFIG_TEMPLATE.format(cell_timeout=cell_timeout, notebook_timeout=notebook_timeout)
    )
    api = NbGraderAPI(config=nbgrader_config(cell_timeout, notebook_timeout, root))
    for name in names:
        result = api.generate_assignment(name, force=True, create=True)
        if not result["success"]:
            raise RuntimeError(
                f"nbgrader generate_assignment {name} failed:\n{result.get('log', '')}\n{result.get('error', '')}"
            )
