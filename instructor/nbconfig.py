"""nbgrader settings and the course's own nbgrader preprocessors.

- `GuardedExecute`: nbgrader's `Execute` with a time budget for the whole notebook on top of the per-cell timeout,
  and a kernel that dies (out of memory, a crash) ending the run instead of failing the notebook: the cells that
  ran keep their outputs, the others get an error, so a submission is scored for what ran. Code cells after the
  last graded cell are not run: cells run in order, so none of them can change a score, and the notebooks' closing
  demonstrations (09's runs after its last test, 06's addition model) were a fifth of a submission's time.
- `HarmlessStderr`: nbgrader takes any stderr output in a graded test cell as a failure. The course's checks
  raise an exception when they fail and print only to stdout, so stderr there is a warning (a
  DeprecationWarning, a tqdm bar) and must not cost points: it is moved to stdout. An exception still fails.
- `HideHiddenTests`: feedback shows neither the hidden test code nor its traceback.
"""

from __future__ import annotations

import ast
import builtins
import re
from time import monotonic

from nbformat.notebooknode import NotebookNode
from nbgrader import utils
from nbgrader.preprocessors import NbGraderPreprocessor
from nbgrader.preprocessors.execute import Execute
from traitlets import Integer

from instructor.course import GIVEN


def error_output(ename: str, evalue: str) -> NotebookNode:
    return NotebookNode(output_type="error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


NOT_RUN = "(Not run when grading: no graded test needs this cell of the course.)\n"
_BUILTINS = frozenset(dir(builtins)) - {"__builtins__"}
# A cell that reads one of these may read any name: every cell before it runs.
_DYNAMIC = frozenset(
    {
        "exec",
        "eval",
        "globals",
        "locals",
        "vars",
        "__import__",
        "get_ipython",
        "sys",
        "inspect",
        "builtins",
        "importlib",
    }
)


def cells_to_run(cells: list) -> set[int]:
    """The code cells nbgrader runs: none after the last graded cell (cells run in order, so none can change a
    score); before it, every graded cell, every cell of the learner's, and each of the course's own cells (marked
    `GIVEN` by the normaliser) that may bind or change a name read by a cell that runs after it, or by the body of
    a function or class any running cell defines (it may be called later). The rest are the course's
    demonstrations (a training run, a comparison, a plot), which decide nothing.

    Conservative by design: a cell may change what it binds, what any call in it is given or is called on
    (`train(model, args)` and `model.eval()` change `model`) and a module whose settings it sets
    (`torch.set_default_dtype`); a seed only changes which numbers are drawn next. A cell with a magic, one the
    parser cannot take, or one that reads names dynamically (`globals()`, `exec`, `sys`) runs, and so does every
    cell before it.
    """
    from instructor.plan import binds_and_uses

    code = [i for i, cell in enumerate(cells) if cell.cell_type == "code"]
    last = max((i for i in code if utils.is_grade(cells[i])), default=-1)
    trees = {}
    for i in code:
        if i <= last:
            try:  # plain Python only: a magic (`%time f(x)`) holds code as a string, whose names are not seen
                trees[i] = ast.parse(cells[i].source)
            except (SyntaxError, RecursionError, MemoryError, ValueError):
                trees[i] = None
    modules = frozenset(
        (alias.asname or alias.name).split(".")[0]
        for tree in trees.values()
        if tree is not None
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    )
    info = {}  # cell -> (ours, what it may change, its top-level reads, its functions' and classes' reads)
    for i, tree in trees.items():
        if tree is not None:
            ours = cells[i].metadata.get(GIVEN) is True and not utils.is_grade(cells[i])
            info[i] = (ours, binds_and_uses(tree, modules)[0] | _changes(tree, modules), *_reads(tree), _dynamic(tree))
    runs: set[int] = set()
    while True:  # the least set that needs nothing more: each round only adds cells (their bodies' reads)
        needed = set().union(*(info[i][3] for i in runs if i in info))
        now, everything = set(), False
        for i in sorted(trees, reverse=True):
            if i not in info:
                now.add(i)
                everything = True
                continue
            ours, changes, top, inner, dynamic = info[i]
            if not ours or everything or changes & needed or SETTINGS in changes:
                now.add(i)
                needed |= top | inner
                everything = everything or dynamic
        if now == runs:
            return runs
        runs = now


def _dynamic(tree: ast.Module) -> bool:
    """Whether a cell may read names by other means than naming them (`globals()`, `import sys`)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in _DYNAMIC:
            return True
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] in _DYNAMIC for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in _DYNAMIC:
            return True
    return False


def _dotted(node: ast.AST) -> str | None:
    """`torch.backends` -> "torch" (a plain module path), None for anything else (`torch.Generator()`)."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _reads(tree: ast.Module) -> tuple[set[str], set[str]]:
    """Global names a cell reads before it binds them itself (`fig, ax = plt.subplots()` then `ax.plot(...)` does
    not read an earlier cell's `ax`), and those its functions and classes read (when they are called, which may be
    in any later cell). Builtins are left out."""
    from instructor.plan import global_uses

    bound: set[str] = set()
    top: set[str] = set()
    inner: set[str] = set()
    for stmt in tree.body:
        reads = global_uses(ast.Module(body=[stmt], type_ignores=[])) - bound
        definition = isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        (inner if definition else top).update(reads)
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in stmt.names}
        elif definition:
            bound.add(stmt.name)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            bound |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name) and _whole(t, n)}
    return top - _BUILTINS, inner - _BUILTINS


def _whole(target: ast.AST, name: ast.Name) -> bool:
    """Whether `target` rebinds `name` as a whole (`a`, `a, (b, *c)`), not an item or attribute of it (`a[0]`)."""
    if target is name:
        return True
    if isinstance(target, (ast.Tuple, ast.List)):
        return any(_whole(t, name) for t in target.elts)
    return isinstance(target, ast.Starred) and _whole(target.value, name)


SETTINGS = "<a module's settings>"  # changed: seen by code everywhere (the checks' too), so the cell always runs


def _changes(tree: ast.Module, modules: frozenset[str]) -> set[str]:
    """Names a cell's top-level code may change besides those it binds: what any call there is given or is called
    on; `SETTINGS` if it sets a module's settings or attributes."""
    from instructor.plan import _root_name

    out = set()
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            decorators = {_root_name(d) for d in getattr(node, "decorator_list", [])}
            out |= decorators - modules - {None}  # `@torch.no_grad()` changes no module
            continue  # their bodies run when called, in a cell that calls them
        if isinstance(node, ast.Call):
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                if _root_name(arg) not in modules:  # `dtype=torch.float32`, `torch.tensor(x)` change no module
                    out.add(_root_name(arg) or "")
            root = _root_name(node.func)
            if isinstance(node.func, ast.Attribute) and root:
                attr = node.func.attr
                if root not in modules:
                    out.add(root)
                elif attr.startswith(("set_", "use_")) and root == _dotted(node.func.value):
                    out.add(SETTINGS)  # `torch.set_default_dtype`; a seed only changes which numbers come next
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(not isinstance(t, ast.Name) and _root_name(t) in modules for t in targets):
                out.add(SETTINGS)  # `torch.backends.cudnn.deterministic = True`, `plt.rcParams[k] = v`
        stack.extend(ast.iter_child_nodes(node))
    out.discard("")
    return out


class GuardedExecute(Execute):
    notebook_timeout = Integer(
        300, help="Seconds for the whole notebook; cells still to run after that are not run (and fail)."
    ).tag(config=True)

    def preprocess(self, nb, resources=None, km=None):
        self._deadline = monotonic() + self.notebook_timeout
        self._cell_timeout = self.timeout
        self._stopped = None
        self._runs = cells_to_run(nb.cells)
        try:
            return super().preprocess(nb, resources, km)
        finally:
            self.timeout = self._cell_timeout

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type != "code":
            return cell, resources
        if index not in self._runs:
            cell.outputs = (
                [NotebookNode(output_type="stream", name="stdout", text=NOT_RUN)] if cell.source.strip() else []
            )
            cell.execution_count = None
            return cell, resources
        remaining = self._deadline - monotonic()
        if self._stopped is None and remaining <= 0:
            self._stopped = ("NotebookTimeoutError", f"the notebook ran past its {self.notebook_timeout} s limit")
        if self._stopped is not None:
            cell.outputs = [error_output(*self._stopped)]
            return cell, resources
        self.timeout = max(1, int(min(self._cell_timeout or remaining, remaining)))
        try:
            return super().preprocess_cell(cell, resources, index)
        except Exception as err:  # noqa: BLE001 - DeadKernelError, or the kernel's messages lost in a busy machine
            from nbclient.exceptions import DeadKernelError

            if isinstance(err, DeadKernelError):
                self._stopped = ("DeadKernelError", "the kernel died (out of memory or crashed); later cells not run")
                failure = self._stopped
                self.log.warning("Stopping execution at cell %d: %s", index, failure[1])
            else:
                failure = (type(err).__name__, f"{err}".splitlines()[0] if str(err) else "execution failed")
                self.log.warning("Cell %d failed to execute: %s", index, failure[1])
            cell.outputs = [*cell.get("outputs", []), error_output(*failure)]
            return cell, self.resources
        finally:
            self.timeout = self._cell_timeout


class HarmlessStderr(NbGraderPreprocessor):
    """In graded test cells, stderr becomes stdout: only an exception fails a test."""

    def preprocess_cell(self, cell, resources, cell_index):
        if cell.cell_type == "code" and utils.is_grade(cell) and not utils.is_solution(cell):
            for output in cell.get("outputs", []):
                if output.get("output_type") == "stream" and output.get("name") == "stderr":
                    output["name"] = "stdout"
        return cell, resources


class HideHiddenTests(NbGraderPreprocessor):
    """Feedback without hidden tests: their code is cut out and a failure shows only the exception's message."""

    begin = "BEGIN HIDDEN TESTS"
    end = "END HIDDEN TESTS"

    def preprocess_cell(self, cell, resources, cell_index):
        if cell.cell_type != "code" or self.begin not in cell.source:
            return cell, resources
        cell.source = re.sub(
            rf"[^\n]*{self.begin}.*?{self.end}[^\n]*\n?", "# (hidden tests)\n", cell.source, flags=re.DOTALL
        )
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                output["traceback"] = [f"{output.get('ename', 'Error')}: {output.get('evalue', '')}"]
        return cell, resources


def configure(
    c, cell_timeout: int = 60, notebook_timeout: int = 300, kernel_name: str | None = None, ipc: bool = False
) -> None:
    """Apply the course's nbgrader settings to a traitlets config `c` (also used by nbgrader_config.py)."""
    from nbconvert.preprocessors import ClearMetadataPreprocessor, CSSHTMLHeaderPreprocessor
    from nbgrader.preprocessors import (
        AssignLatePenalties,
        CheckCellMetadata,
        GetGrades,
        IgnorePattern,
        LimitOutput,
        SaveAutoGrades,
    )

    c.Execute.timeout = cell_timeout
    c.Execute.interrupt_on_timeout = True
    c.Execute.error_on_timeout = {
        "ename": "CellTimeoutError",
        "evalue": f"the cell ran past its {cell_timeout} s limit and was interrupted",
        "traceback": [f"CellTimeoutError: the cell ran past its {cell_timeout} s limit and was interrupted"],
    }
    # On a busy machine a kernel's output can trail its reply by seconds: wait for it, and never fail a cell for
    # it (an error in the cell is still seen: nbgrader adds it from the reply's status).
    c.Execute.iopub_timeout = 30
    c.Execute.raise_on_iopub_timeout = False
    c.Execute.startup_timeout = 180
    c.GuardedExecute.notebook_timeout = notebook_timeout
    if kernel_name:  # the grader's warm kernels (instructor.kernel_launcher); else the notebook's own kernelspec
        c.Execute.kernel_name = kernel_name
    if ipc:  # sandboxed kernels have no network: nbgrader talks to them over Unix sockets (JUPYTER_RUNTIME_DIR)
        c.KernelManager.transport = "ipc"
    c.Autograde.autograde_preprocessors = [
        GuardedExecute,
        IgnorePattern,
        ClearMetadataPreprocessor,
        LimitOutput,
        HarmlessStderr,
        SaveAutoGrades,
        AssignLatePenalties,
        CheckCellMetadata,
    ]
    from instructor.offline_html import MathAsMathML

    c.GenerateFeedback.preprocessors = [GetGrades, HideHiddenTests, MathAsMathML, CSSHTMLHeaderPreprocessor]
    # Learners cannot add files next to their notebooks that the kernel would import (harness.py, torch.py):
    # only the notebooks are collected, and nothing else is copied in from the source folder.
    c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback"]
