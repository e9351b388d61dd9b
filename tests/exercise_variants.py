"""Run a solution notebook once, then try variants of its exercises against their graded tests in forked copies.

Used by the test that every exercise argument is exercised (tests/test_exercise_arguments.py) and by the mutation
benchmark (bench/mutation_score.py). A variant is new code for an exercise cell, a change to the namespace after the
cell has run (a wrapper in place of the learner's function), or both; the graded test cell that follows the exercise
then runs in the copy. The outcome: "killed" (an AssertionError: a check failed, with its message's first line),
"crashed" (any other exception, or a time-out), or "survived" (the test passed).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def exercises(notebook: dict) -> list[dict]:
    """The exercise cells (graded-answer cells with a solution region) and the graded test cells that follow each
    (`tests`: their indices; `test_name`: the first's grade id): the tests check every exercise since the
    previous test."""
    cells = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    found, waiting, current = [], [], None
    for index, cell in enumerate(cells):
        grade = cell.get("metadata", {}).get("nbgrader", {})
        source = "".join(cell["source"])
        if grade.get("solution") and "### BEGIN SOLUTION" in source:
            waiting.append((index, grade.get("grade_id", f"cell{index}"), source))
            current = None
        elif grade.get("grade") and waiting:
            current = [index]
            for cell_index, name, code in waiting:
                found.append(
                    {"cell": cell_index, "name": name, "source": code, "tests": current, "test_name": grade["grade_id"]}
                )
            waiting = []
        elif grade.get("grade") and current is not None:
            current.append(index)  # a further test of the same exercises
        elif grade.get("solution"):
            current = None
    return found


class NotebookState:
    """Solution notebook `name` run once, top to bottom, in this process (fast mode, as nbval runs it)."""

    def __init__(self, name: str):
        os.environ.setdefault("COURSE_FAST", "1")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("MPLBACKEND", "Agg")
        import torch
        from IPython.core.interactiveshell import InteractiveShell

        torch.set_num_threads(1)  # the copies are forked: one thread each, no pool to inherit
        self.name = name
        notebook = json.loads((ROOT / "solutions" / f"{name}.ipynb").read_text(encoding="utf-8"))
        self.cells = [c for c in notebook["cells"] if c["cell_type"] == "code"]
        self.exercises = exercises(notebook)
        self.shell = InteractiveShell.instance()
        os.chdir(ROOT / "solutions")
        started = time.monotonic()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            for cell in self.cells:
                result = self.shell.run_cell("".join(cell["source"]), store_history=False, silent=True)
                if not result.success:
                    raise result.error_in_exec or result.error_before_exec
        self.setup_s = time.monotonic() - started

    @property
    def namespace(self) -> dict:
        return self.shell.user_ns

    def _run(self, exercise: dict, code: str | None, patch: Callable[[dict], None] | None) -> None:
        ns = self.namespace
        if code is not None:
            exec(compile(code, f"<variant of {exercise['name']}>", "exec"), ns)  # noqa: S102 - the point
            for between in self.cells[exercise["cell"] + 1 : exercise["tests"][0]]:  # later parts of the exercise
                if between.get("metadata", {}).get("nbgrader", {}).get("solution"):
                    exec(compile("".join(between["source"]), "<cell>", "exec"), ns)  # noqa: S102
        if patch is not None:
            patch(ns)
        for index in exercise["tests"]:
            test = "".join(self.cells[index]["source"])
            exec(compile(test, f"<test cell {index}>", "exec"), ns)  # noqa: S102

    def try_variant(
        self,
        exercise: dict,
        code: str | None = None,
        patch: Callable[[dict], None] | None = None,
        timeout: float = 30.0,
        report: str | None = None,
    ) -> dict:
        """Fork this state; in the copy run `code` in place of the exercise cell, then `patch(namespace)`, then the
        exercise's graded tests. Returns {"outcome", "message"}, and "report": the namespace's entry `report`
        afterwards (JSON-able) when one is named."""
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            outcome = {"outcome": "survived", "message": ""}
            try:

                def stop(*_):
                    raise TimeoutError

                signal.signal(signal.SIGALRM, stop)
                signal.setitimer(signal.ITIMER_REAL, timeout)
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    self._run(exercise, code, patch)
                signal.setitimer(signal.ITIMER_REAL, 0)
            except AssertionError as err:
                outcome = {"outcome": "killed", "message": str(err).strip().split("\n")[0][:300]}
            except TimeoutError:
                outcome = {"outcome": "crashed", "message": f"timed out after {timeout:g} s"}
            except BaseException as err:  # noqa: BLE001 - anything else the variant raised is its outcome
                outcome = {"outcome": "crashed", "message": f"{type(err).__name__}: {str(err)[:200]}"}
            if report:
                try:
                    outcome["report"] = json.loads(json.dumps(self.namespace.get(report, {}), default=str))
                except (TypeError, ValueError):
                    outcome["report"] = {}
            os.write(write, json.dumps(outcome).encode())
            os._exit(0)
        os.close(write)
        chunks = []
        while chunk := os.read(read, 1 << 16):
            chunks.append(chunk)
        os.close(read)
        _, status = os.waitpid(pid, 0)
        if not chunks:
            return {"outcome": "crashed", "message": f"the copy died (wait status {status})"}
        return json.loads(b"".join(chunks))
