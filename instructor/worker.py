"""One nbgrader grading process with its own course directory and gradebook (started by `instructor.grade`).

nbgrader grades one submission at a time, so `instructor.grade` runs several of these side by side, each on a
copy of the course's gradebook, and merges their grades at the end. Requests and replies are JSON lines on
stdin/stdout; everything else the process prints goes to stderr (the worker's log).

    {"op": "autograde", "student": ..., "notebook": ..., "path": normalised submission}
    {"op": "finalize", "student": ..., "notebook": ..., "overrides": {test_grade_id: {"score", "comment"}},
     "comments": {solution_grade_id: text}, "flagged": bool, "feedback": bool}
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import traceback
from html import escape as html_escape
from pathlib import Path

from instructor.bounded import ChildFailed, bounded
from instructor.course import encodable
from instructor.offline_html import runs_nothing


def _protocol_stream():
    """A private copy of stdout for replies; fd 1 then points at stderr so stray prints cannot corrupt them."""
    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(fd, "w", buffering=1)


STOP_ERRORS = ("NotebookTimeoutError", "DeadKernelError", "CellTimeoutError")

# A feedback page is made in a child killed after this long: what a learner writes is parsed for it (markdown,
# HTML, TeX), and each parser has had an input that made it super-linear (a regular expression over 64,000 nested
# `<script`, 15 minutes; bleach over 28,000 nested `<div>`, 88 s). Whatever the next one is, one page waits this
# long, never the worker's other notebooks. Pages take 1 to 2 s.
FEEDBACK_SECONDS = 60.0


def _no_page(notebook: str, note: str) -> str:
    """The page left where a feedback page could not be made: says so, runs and loads nothing."""
    return runs_nothing(
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>Feedback</title></head><body>'
        f"<h1>{notebook}</h1><p>{html_escape(note)}. The grades are in the gradebook and the grader's CSVs.</p>"
        "</body></html>\n"
    )


# What a submission can make the grader store of its outputs (characters): per cell and per notebook. The
# autograded notebook, its feedback page and this process's memory stay bounded whatever a cell prints.
CELL_OUTPUT_CHARS = 100_000
NOTEBOOK_OUTPUT_CHARS = 2_000_000
# What a feedback page may weigh: the course's come to under 0.5 MB. Whatever a page's parts are bounded by, the
# page itself is (markup that renders larger than it was written grew a 2 MB notebook into a 48 MB page: round 26)
MAX_PAGE_BYTES = 8 << 20


def _size(output) -> int:
    """Everything of `output` that would be saved: its data, its metadata, an error's name (a learner's kernel
    chooses all of it: 25 MB of metadata on one-character outputs made a 500 MB notebook, red-team round 15)."""
    return len(json.dumps(output, default=str))


_IMAGE_SIZE = ("width", "height")


def _plain(output):
    """`output` with only the metadata a page may use, as numbers (nbconvert writes an image's width unquoted into
    its tag: `100% class=navbar-fixed-top` pinned a learner's picture over the page's header, round 15), and an
    error's name within 200 characters."""
    if output.get("output_type") == "error":
        output["ename"] = str(output.get("ename", ""))[:200]
    if "metadata" in output:
        kept = {}
        for key, value in (output.get("metadata") or {}).items():
            if isinstance(value, dict) and key.startswith("image/"):
                sizes = {k: int(v) for k, v in value.items() if k in _IMAGE_SIZE and type(v) in (int, float)}
                if sizes:
                    kept[key] = sizes
        output["metadata"] = kept
    return output


def _essential(kind: tuple, seen: set) -> bool:
    """An output never dropped, only shortened: an error, a cell's value, its first stderr (nbgrader's score
    depends on them). `kind`: (output_type, name)."""
    return kind[0] in ("error", "execute_result") or (kind == ("stream", "stderr") and kind not in seen)


def _cut_note(dropped: int) -> str:
    return (
        f"\n[the grader cut this cell's output here: {dropped:,} more characters "
        f"(limits: {CELL_OUTPUT_CHARS:,} per cell, {NOTEBOOK_OUTPUT_CHARS:,} per notebook)]\n"
    )


def _cut_text(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[the grader cut this output here: {len(text) - limit:,} more characters]\n"


def _shrink(output, limit: int):
    """The output within `limit` characters, keeping its kind (an error stays an error, stderr stays stderr: the
    grade depends on them)."""
    kind = output.get("output_type")
    if kind == "stream":
        output["text"] = _cut_text(output.get("text") or "", limit)
    elif kind == "error":
        output["evalue"] = _cut_text(str(output.get("evalue", "")), min(limit, 2000))
        lines, kept, used = output.get("traceback") or [], [], 0
        for line in lines:
            if used + len(line) > limit:
                kept.append(f"[the grader cut this traceback here: {len(lines) - len(kept)} more lines]")
                break
            kept.append(line)
            used += len(line)
        output["traceback"] = kept
    else:
        data = output.get("data") or {}
        for key, value in list(data.items()):
            if key == "text/plain" and isinstance(value, str):
                data[key] = _cut_text(value, limit)
            elif _size({"data": {key: value}}) > limit:
                del data[key]  # an image or HTML too large to keep: its text form, if any, stays
        if not data:
            data["text/plain"] = "[the grader dropped an output too large to keep]"
    return output


def bound_outputs() -> None:
    """Patch nbclient (in this process, which only ever runs nbgrader) so that each executed cell keeps at most
    CELL_OUTPUT_CHARS of output and each notebook NOTEBOOK_OUTPUT_CHARS; what is cut is said where it is cut.
    Errors, stderr and a cell's value are never dropped, only shortened: nbgrader's score depends on them."""
    from nbclient.client import NotebookClient
    from nbformat.v4 import new_output

    original = NotebookClient.output
    if getattr(original, "_bounded", False):
        return

    def output(self, outs, msg, display_id, cell_index):
        out = original(self, outs, msg, display_id, cell_index)
        if out is None:
            return out
        _plain(out)
        used = getattr(self, "_tfs_used", None)
        if used is None:
            used = self._tfs_used = {"total": 0}
        cell = used.setdefault(cell_index, {"chars": 0, "note": None, "kinds": set()})
        size = _size(out)
        left = min(CELL_OUTPUT_CHARS - cell["chars"], NOTEBOOK_OUTPUT_CHARS - used["total"])
        kind = (out.get("output_type"), out.get("name"))
        essential = _essential(kind, cell["kinds"])
        if size <= left:
            cell["chars"] += size
            used["total"] += size
        elif essential or left > 200:
            _shrink(out, max(left, 2000 if essential else 0))
            cell["chars"] += _size(out)
            used["total"] += _size(out)
        else:
            if outs and outs[-1] is out:
                outs.pop()
            if cell["note"] is None:
                cell["note"] = new_output("stream", name="stdout", text="")
                cell["dropped"] = 0
                outs.append(cell["note"])
            cell["dropped"] += size
            cell["note"]["text"] = _cut_note(cell["dropped"])
            out = None
        cell["kinds"].add(kind)
        return out

    output._bounded = True
    NotebookClient.output = output


def bound_notebook(nb) -> None:
    """The executed notebook within CELL_OUTPUT_CHARS a cell and NOTEBOOK_OUTPUT_CHARS in all, measured on what will
    be saved, however it got there: `bound_outputs` sees each output as it arrives, but an `update_display_data`
    writes its data into every earlier output with its display id (400 one-character outputs and one 1 MB update
    made a 400 MB notebook and feedback page, red-team round 15), and a widget's state goes into the notebook's
    metadata (24 comms of 16 MB: it is not kept, `store_widget_state` off, and dropped here). Errors, a cell's value
    and its first stderr are shortened, never dropped; other outputs past the bounds are, with a note that says so."""
    from nbformat.v4 import new_output

    metadata = nb.get("metadata", {})
    metadata.pop("widgets", None)
    total = 0
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        used, kept, dropped, kinds = 0, [], 0, set()
        for out in cell.get("outputs", []):
            _plain(out)
            size = _size(out)
            left = min(CELL_OUTPUT_CHARS - used, NOTEBOOK_OUTPUT_CHARS - total)
            kind = (out.get("output_type"), out.get("name"))
            essential = _essential(kind, kinds)
            kinds.add(kind)
            if size > left:
                if not essential:
                    dropped += size
                    continue
                _shrink(out, max(left, 2000))
                size = _size(out)
            kept.append(out)
            used += size
            total += size
        if dropped:
            kept.append(new_output("stream", name="stdout", text=_cut_note(dropped)))
        cell["outputs"] = kept


class Worker:
    def __init__(
        self,
        root: Path,
        cell_timeout: int,
        notebook_timeout: int,
        kernel_name: str | None = None,
        ipc: str | None = None,
    ):
        from nbgrader.apps import NbGraderAPI

        from instructor.course import nbgrader_config

        self.root = Path(root)
        config = nbgrader_config(cell_timeout, notebook_timeout, self.root, kernel_name)
        if ipc:  # sandboxed kernels have no network: Unix sockets under this prefix, in a folder the sandbox shares
            config.KernelManager.transport = "ipc"
            config.KernelManager.ip = ipc
        self.api = NbGraderAPI(config=config)
        self.db_url = f"sqlite:///{self.root / 'gradebook.db'}"
        try:  # what every feedback page's child would load and compile for itself, once here (`warm_feedback`)
            from instructor.offline_html import warm_feedback

            warm_feedback(self.api)
        except Exception:  # noqa: BLE001, S110 - a page's child then does it itself, as before
            pass

    def _paths(self, student: str, notebook: str, folder: str) -> Path:
        return self.root / folder / student / notebook

    def autograde(self, student: str, notebook: str, path: str) -> dict:
        from nbgrader.api import Gradebook

        submitted = self._paths(student, notebook, "submitted")
        for folder in ("submitted", "autograded", "feedback"):
            shutil.rmtree(self._paths(student, notebook, folder), ignore_errors=True)
        submitted.mkdir(parents=True)
        shutil.copyfile(path, submitted / f"{notebook}.ipynb")
        result = self.api.autograde(notebook, student, force=True, create=True)
        reply = {"success": bool(result.get("success")), "log": (result.get("log") or "")[-4000:]}
        if result.get("error"):
            reply["error"] = str(result["error"])[-2000:]
        autograded = self._paths(student, notebook, "autograded") / f"{notebook}.ipynb"
        errors, stopped = {}, []
        if autograded.exists():
            nb = encodable(json.loads(autograded.read_text(encoding="utf-8")))
            for cell in nb["cells"]:
                grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
                for output in cell.get("outputs", []):
                    if output.get("output_type") != "error":
                        continue
                    message = f"{output.get('ename')}: {output.get('evalue', '')}"[:500]
                    if grade_id:
                        errors[grade_id] = message
                    if output.get("ename") in STOP_ERRORS and message not in stopped:
                        stopped.append(message)
        reply["stopped"] = stopped
        reply["autograded"] = autograded.exists()
        grades = {}
        with Gradebook(self.db_url) as gb:
            try:
                sub = gb.find_submission_notebook(notebook, notebook, student)
            except Exception:  # noqa: BLE001 - no submission row: no grades
                sub = None
            if sub is not None:
                for grade in sub.grades:
                    if grade.cell.cell_type == "code" and not grade.cell.name.startswith("_"):
                        grades[grade.cell.name] = {"auto_score": grade.auto_score, "max_score": grade.max_score}
        reply["grades"] = grades
        reply["errors"] = errors
        return reply

    def finalize(
        self, student: str, notebook: str, overrides: dict, comments: dict, flagged: bool, feedback: bool
    ) -> dict:
        from nbgrader.api import Gradebook, MissingEntry

        with Gradebook(self.db_url) as gb:
            gb.update_or_create_student(student)
            gb.update_or_create_submission(notebook, student)
            sub = gb.find_submission_notebook(notebook, notebook, student)
            sub.flagged = bool(flagged)
            for grade_id, override in overrides.items():
                try:
                    grade = gb.find_grade(grade_id, notebook, notebook, student)
                except MissingEntry:
                    continue
                grade.manual_score = override.get("score")
                grade.needs_manual_grade = False
            for grade_id, text in comments.items():
                try:
                    comment = gb.find_comment(grade_id, notebook, notebook, student)
                except MissingEntry:
                    continue
                comment.manual_comment = text
            gb.db.commit()
            sub = gb.find_submission_notebook(notebook, notebook, student)
            grades = {
                g.cell.name: {
                    "auto_score": g.auto_score,
                    "manual_score": g.manual_score,
                    "score": g.score,
                    "max_score": g.max_score,
                }
                for g in sub.grades
            }
        reply = {"success": True, "grades": grades, "feedback": None}
        autograded = self._paths(student, notebook, "autograded") / f"{notebook}.ipynb"
        html = self._paths(student, notebook, "feedback") / f"{notebook}.html"
        if feedback and autograded.exists():
            reply.update(self.feedback(notebook, student, html))
        elif feedback:  # nbgrader's run failed: the learner still gets a page, which says so (red-team round 23)
            note = "the feedback page was not made: nbgrader could not grade this notebook (its rows say why)"
            html.parent.mkdir(parents=True, exist_ok=True)
            html.write_text(_no_page(notebook, note), encoding="utf-8")
            reply.update({"feedback": str(html), "feedback_note": note})
        return reply

    def feedback(self, notebook: str, student: str, html: Path) -> dict:
        """Make the feedback page at `html`, in at most FEEDBACK_SECONDS: {"feedback": its path}, with a
        "feedback_note" where a page saying why stands in for it: one that took too long, or that nbgrader could
        not make (a pasted image whose attachment was lost left no page and no word of it, red-team round 16)."""
        log = ""
        try:
            result = bounded(self._feedback_page, notebook, student, str(html), timeout=FEEDBACK_SECONDS)
            if result.get("success") and html.exists():
                return {"feedback": str(html)}
            log = result.get("log") or ""
            lines = [line for line in log.splitlines() if line.strip()]
            why = result.get("too_large") or "nbgrader's feedback failed" + (f" ({lines[-1][:200]})" if lines else "")
        except TimeoutError:
            why = f"rendering its markdown and outputs took more than {FEEDBACK_SECONDS:.0f} s"
        except ChildFailed as err:
            why = str(err)
        note = f"the feedback page was not made: {why}"
        html.parent.mkdir(parents=True, exist_ok=True)
        html.write_text(_no_page(notebook, note), encoding="utf-8")
        return {"feedback": str(html), "feedback_note": note, **({"feedback_error": log[-2000:]} if log else {})}

    def _feedback_page(self, notebook: str, student: str, html: str) -> dict:
        """nbgrader's feedback page, made safe to open (`runs_nothing`); in a child of `bounded`'s. A page over
        MAX_PAGE_BYTES is not kept (`feedback` leaves one that says why)."""
        result = self.api.generate_feedback(notebook, student, force=True)
        page = Path(html)
        if result.get("success") and page.exists():
            size = page.stat().st_size
            if size > MAX_PAGE_BYTES:
                page.unlink()
                return {"success": False, "too_large": f"it came to {size / 1e6:.1f} MB, more than a page may be"}
            page.write_text(runs_nothing(page.read_text(encoding="utf-8")), encoding="utf-8")
        return {"success": bool(result.get("success")), "log": str(result.get("log") or "")[-2000:]}

    def merge(self, db_path: str, records: list[dict]) -> dict:
        """Write final grades into another gradebook (the course's master one): one record per notebook."""
        from nbgrader.api import Gradebook, MissingEntry

        with Gradebook(f"sqlite:///{db_path}") as gb:
            for record in records:
                student, notebook = record["student"], record["notebook"]
                gb.update_or_create_student(student)
                gb.update_or_create_submission(notebook, student)
                sub = gb.find_submission_notebook(notebook, notebook, student)
                sub.flagged = bool(record.get("flagged"))
                for grade_id, grade in record["grades"].items():
                    try:
                        row = gb.find_grade(grade_id, notebook, notebook, student)
                    except MissingEntry:
                        continue
                    row.auto_score = grade.get("auto_score")
                    row.manual_score = grade.get("manual_score")
                    row.needs_manual_grade = False
                for grade_id, text in record.get("comments", {}).items():
                    try:
                        gb.find_comment(grade_id, notebook, notebook, student).manual_comment = text
                    except MissingEntry:
                        continue
                gb.db.commit()
        return {"success": True}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m instructor.worker")
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--cell-timeout", type=int, default=60)
    parser.add_argument("--notebook-timeout", type=int, default=300)
    parser.add_argument("--memory-gb", type=float, default=0, help="data-segment limit inherited by the kernels")
    parser.add_argument("--kernel-name", help="kernelspec to run the notebooks with (default: the notebook's)")
    parser.add_argument(
        "--ipc", metavar="PREFIX", help="talk to kernels over Unix sockets PREFIX-N (sandboxed kernels)"
    )
    args = parser.parse_args(argv)
    out = _protocol_stream()
    if args.memory_gb > 0:
        limit = int(args.memory_gb * (1 << 30))
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    bound_outputs()
    worker = Worker(args.root, args.cell_timeout, args.notebook_timeout, args.kernel_name, args.ipc)
    out.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        try:
            op = request.pop("op")
            reply = getattr(worker, op)(**request)
        except Exception:  # noqa: BLE001 - reported to the grader, which carries on
            reply = {"success": False, "error": traceback.format_exc()[-3000:]}
        out.write(json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
