"""nbgrader settings and the course's own nbgrader preprocessors.

- `GuardedExecute`: nbgrader's `Execute` with a time budget for the whole notebook on top of the per-cell timeout,
  and a kernel that dies (out of memory, a crash) ending the run instead of failing the notebook: the cells that
  ran keep their outputs, the others get an error, so a submission is scored for what ran. The course's own
  demonstrations that no graded cell needs are not run (`dataflow.cells_to_run`): they were most of a submission's time.
- `HarmlessStderr`: nbgrader takes any stderr output in a graded test cell as a failure. The course's checks
  raise an exception when they fail and print only to stdout, so stderr there is a warning (a
  DeprecationWarning, a tqdm bar) and must not cost points: it is moved to stdout. An exception still fails.
- `HideHiddenTests`: feedback shows neither the hidden test code nor its traceback.
"""

from __future__ import annotations

import re
from time import monotonic

from nbformat.notebooknode import NotebookNode
from nbgrader import utils
from nbgrader.preprocessors import NbGraderPreprocessor
from nbgrader.preprocessors.execute import Execute
from traitlets import Integer

from instructor.dataflow import cells_to_run


def error_output(ename: str, evalue: str) -> NotebookNode:
    return NotebookNode(output_type="error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


NOT_RUN = "(Not run when grading: no graded test needs this cell of the course.)\n"


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
            nb, resources = super().preprocess(nb, resources, km)
        finally:
            self.timeout = self._cell_timeout
        from instructor.worker import bound_notebook

        bound_notebook(nb)  # what is saved, however it got into the notebook
        return nb, resources

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


def configure(c, cell_timeout: int = 60, notebook_timeout: int = 300, kernel_name: str | None = None) -> None:
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
    c.Execute.store_widget_state = False  # a widget's state, of any size, in the notebook: never needed for a grade
    c.Execute.raise_on_iopub_timeout = False
    c.Execute.startup_timeout = 180
    c.GuardedExecute.notebook_timeout = notebook_timeout
    if kernel_name:  # the grader's warm kernels (instructor.kernel_launcher); else the notebook's own kernelspec
        c.Execute.kernel_name = kernel_name
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
    from instructor.offline_html import FeedbackExporter, MathAsMathML

    c.GenerateFeedback.preprocessors = [GetGrades, HideHiddenTests, MathAsMathML, CSSHTMLHeaderPreprocessor]
    # what a learner wrote stays in its cell (instructor.offline_html)
    c.GenerateFeedback.exporter_class = FeedbackExporter
    c.HTMLExporter.sanitize_html = True
    c.HTMLExporter.exclude_anchor_links = True  # learner_html would leave their ¶ showing
    # Learners cannot add files next to their notebooks that the kernel would import (harness.py, torch.py):
    # only the notebooks are collected, and nothing else is copied in from the source folder.
    c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback"]
