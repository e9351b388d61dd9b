"""Collect submissions and put each notebook into the canonical shape nbgrader expects.

Learners save notebooks with Jupyter, JupyterLab, VS Code or Colab; each writes different metadata (Colab's
`colab`/`accelerator`, per-cell `id`/`outputId`/`executionInfo`, widget state; VS Code's `vscode` and its own
kernelspec) and some lose or duplicate cell ids. Normalising rebuilds every notebook as nbformat 4.5 with the
course's kernelspec, valid unique cell ids, no outputs, and each cell's nbgrader metadata either copied from the
released notebook (matched by grade_id) or removed:

- a grade_id that appears several times: the last cell keeps it (as nbgrader would), the others are flagged;
- an unknown grade_id or malformed nbgrader metadata: removed, flagged;
- a graded test cell that was deleted, or lost its metadata: the course's test cell is put back after the cell
  it followed (so the exercise is still graded by the course's test), flagged.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import os
import re
import stat
from pathlib import Path

from instructor.course import GIVEN, cell_kind, cell_source, nbgrader_meta, same_text

_ID_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


class Unreadable(ValueError):
    """A file that is not a notebook nbformat can read, or not a regular file of its own."""


# A submission is data: only regular files are read, never through a link, and never more than this.
MAX_NOTEBOOK_BYTES = 20 << 20
MAX_ENTRIES = 5000  # files and folders looked at in one student's folder
# The course's notebooks have under 100 cells; nbgrader's run and the feedback page take a few ms a cell, so 300,000
# empty cells (15 MB) would have held a worker some 20 minutes a notebook (red-team round 13)
MAX_CELLS = 2_000
# A cell's tags and a markdown cell's pasted images, and each image's types: the course's cells have at most one tag.
# 3.6 million copies of one tag made the normalised notebook invalid (tags are unique in nbformat's schema), and
# nbformat's slow validator, run at every read and write of nbgrader's, held a worker 181 s (red-team round 23)
MAX_TAGS = 16
MAX_ATTACHMENTS = 32
MAX_IMAGE_TYPES = 4


def read_regular_file(path: Path, limit: int = MAX_NOTEBOOK_BYTES) -> bytes:
    """The bytes of `path` if it is a regular file (not a link, a FIFO, a device or a socket) of at most `limit`
    bytes; Unreadable otherwise. Opened without following a link and without blocking, then checked on the
    descriptor itself, so what is checked is what is read."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as err:
        why = "a symbolic link" if os.path.islink(path) else err.strerror
        raise Unreadable(f"{Path(path).name} was not read ({why})") from err
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Unreadable(f"{Path(path).name} was not read (not a regular file)")
        if info.st_nlink > 1:  # the same file under another name: the solutions, or another student's notebook
            raise Unreadable(f"{Path(path).name} was not read (a hard link: {info.st_nlink} names share it)")
        if info.st_size > limit:
            raise Unreadable(f"{Path(path).name} was not read ({info.st_size:,} bytes; the limit is {limit:,})")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise Unreadable(f"{Path(path).name} was not read (it grew past {limit:,} bytes)")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_submission(path: Path) -> dict:
    """The notebook at `path` as nbformat 4 JSON; Unreadable if it is not one, or is too large once converted.
    The grader calls it in a bounded child (`bounded.bounded`): parsing and converting are work a submission sizes."""
    raw = read_regular_file(path)
    try:
        nb = json.loads(raw.decode("utf-8-sig"))
        if not isinstance(nb, dict) or not isinstance(nb.get("cells", []), list):
            raise ValueError("no list of cells")  # noqa: TRY004 - reported as unreadable, never raised out
        converted = nb.get("nbformat") != 4
        if converted:  # an old format: let nbformat convert it
            import nbformat

            text = json.dumps(nbformat.reads(raw.decode("utf-8-sig"), as_version=4))
            # the conversion can make much more than it was given: a version 3 heading cell of level 10^6 became a
            # million '#' (300 cells of 22 kB made 300 MB, red-team round 45); the limits hold for what it made
            if len(text) > MAX_NOTEBOOK_BYTES:
                raise Unreadable(
                    f"{Path(path).name} was not read (it converts to {len(text):,} bytes of nbformat 4; the limit is "
                    f"{MAX_NOTEBOOK_BYTES:,})"
                )
            nb = json.loads(text)
    except Unreadable:
        raise
    except Exception as err:
        raise Unreadable(f"{Path(path).name} is not a readable notebook ({type(err).__name__}: {err})"[:300]) from err
    if len(nb.get("cells", [])) > MAX_CELLS:
        raise Unreadable(f"{Path(path).name} was not read ({len(nb['cells']):,} cells; the limit is {MAX_CELLS:,})")
    return nb


# The first line of a markdown cell the course did not write, once normalised: the feedback page frames the cell as
# the learner's and says so. A learner's own copy of it frames only the learner's cell.
LEARNERS_MARKDOWN = "<!-- written in this submission -->\n"


_TAG_RE = re.compile(r"[\w.:-]{1,100}", re.ASCII)  # a cell tag, an attachment's name
_MIME_RE = re.compile(r"image/[\w.+-]{1,50}", re.ASCII)
_B64 = re.compile(r"[A-Za-z0-9+/=\s]*")


def _attachments(value) -> dict:
    """A markdown cell's pasted images as nbformat keeps them ({name: {image MIME type: base64 text}}), and nothing
    else: dropped, they left `![](attachment:...)` that the feedback page could not render, and the learner had no
    page (red-team round 16)."""
    if not isinstance(value, dict):
        return {}

    def image(mime, data) -> bool:  # base64 text of an image type, nothing that could leave a `src` attribute
        return bool(
            isinstance(mime, str) and _MIME_RE.fullmatch(mime) and isinstance(data, str) and _B64.fullmatch(data)
        )

    kept = {
        name: dict([(mime, data) for mime, data in bundle.items() if image(mime, data)][:MAX_IMAGE_TYPES])
        for name, bundle in value.items()
        if isinstance(name, str) and _TAG_RE.fullmatch(name) and isinstance(bundle, dict)
    }
    return dict([(name, bundle) for name, bundle in kept.items() if bundle][:MAX_ATTACHMENTS])


def normalise(learner: dict, release: dict, name: str) -> tuple[dict, list[str]]:
    """(the canonical notebook, flags) for one submitted notebook; `release` is the course's learner version."""
    flags: list[str] = []
    release_meta = {}
    release_cells = release["cells"]
    for cell in release_cells:
        meta = nbgrader_meta(cell)
        if meta.get("grade_id"):
            release_meta[meta["grade_id"]] = cell
    test_by_text = {
        same_text(cell_source(c)): nbgrader_meta(c)["grade_id"] for c in release_cells if cell_kind(c) == "test"
    }

    cells = []
    for raw in learner.get("cells", []):
        kind = raw.get("cell_type")
        if kind not in ("code", "markdown", "raw"):
            continue
        meta = raw.get("metadata") if isinstance(raw.get("metadata"), dict) else {}
        cell = {"cell_type": kind, "metadata": {}, "source": cell_source(raw)}
        attachments = _attachments(raw.get("attachments")) if kind == "markdown" else {}
        if attachments:
            cell["attachments"] = attachments
        tags = meta.get("tags")
        if isinstance(tags, list) and all(isinstance(t, str) for t in tags):
            # one word each: the page writes a cell's tags into its class attribute, and a tag "x hidden" gave it
            # bootstrap's `hidden` (test cells hidden, a banner pinned over the header: red-team round 17)
            cell["metadata"]["tags"] = list(dict.fromkeys(t for t in tags if _TAG_RE.fullmatch(t)))[:MAX_TAGS]
        if isinstance(meta.get("nbgrader"), dict):
            cell["metadata"]["nbgrader"] = meta["nbgrader"]
        elif "nbgrader" in meta:
            flags.append("malformed nbgrader metadata removed")
        cell["_id"] = raw.get("id")
        cells.append(cell)

    # nbgrader metadata: the release's, by grade_id; duplicates keep the last; unknown ones go
    last = {}
    for index, cell in enumerate(cells):
        grade_id = cell["metadata"].get("nbgrader", {}).get("grade_id")
        if "nbgrader" in cell["metadata"] and not isinstance(grade_id, str):
            del cell["metadata"]["nbgrader"]
            if cell["cell_type"] == "code":
                flags.append(f"cell {index}: nbgrader metadata without a grade_id removed")
            continue
        if grade_id is None:
            continue
        if grade_id not in release_meta:
            del cell["metadata"]["nbgrader"]
            flags.append(f"cell {index}: unknown grade_id {grade_id!r} removed")
            continue
        if grade_id in last:
            flags.append(f"grade_id {grade_id!r} appears more than once; only the last cell keeps it")
        last[grade_id] = index
    for index, cell in enumerate(cells):
        grade_id = cell["metadata"].get("nbgrader", {}).get("grade_id")
        if grade_id is None:
            continue
        if last.get(grade_id) != index:
            del cell["metadata"]["nbgrader"]
            continue
        source_cell = release_meta[grade_id]
        cell["metadata"]["nbgrader"] = copy.deepcopy(source_cell["metadata"]["nbgrader"])
        for key in ("editable", "deletable"):
            if key in source_cell["metadata"]:
                cell["metadata"][key] = source_cell["metadata"][key]
        cell["cell_type"] = source_cell["cell_type"]

    # test cells that lost their metadata but kept their code get it back; deleted ones are restored
    present = {c["metadata"]["nbgrader"]["grade_id"] for c in cells if "nbgrader" in c["metadata"]}
    for index, cell in enumerate(cells):
        if cell["cell_type"] == "code" and "nbgrader" not in cell["metadata"]:
            grade_id = test_by_text.get(same_text(cell["source"]))
            if grade_id and grade_id not in present:
                source_cell = release_meta[grade_id]
                cell["metadata"]["nbgrader"] = copy.deepcopy(source_cell["metadata"]["nbgrader"])
                present.add(grade_id)
                flags.append(f"test cell {grade_id}: nbgrader metadata was missing; restored")
    for r_index, r_cell in enumerate(release_cells):
        if cell_kind(r_cell) != "test":
            continue
        grade_id = nbgrader_meta(r_cell)["grade_id"]
        if grade_id in present:
            continue
        # after the learner's cell matching the closest release cell above it
        insert_at = len(cells)
        for back in range(r_index - 1, -1, -1):
            key = nbgrader_meta(release_cells[back]).get("grade_id") or (
                "text",
                same_text(cell_source(release_cells[back])),
            )
            match = [
                i
                for i, c in enumerate(cells)
                if (c["metadata"].get("nbgrader", {}).get("grade_id") or ("text", same_text(c["source"]))) == key
            ]
            if match:
                insert_at = match[-1] + 1
                break
        restored = {"cell_type": "code", "metadata": copy.deepcopy(r_cell["metadata"]), "source": cell_source(r_cell)}
        restored["metadata"].pop("tags", None)
        cells.insert(insert_at, restored)
        present.add(grade_id)
        flags.append(f"test cell {grade_id} was missing; the course's test was put back")

    # the course's own code cells, left as released: nbgrader's run may leave out those no graded cell needs
    given = {same_text(cell_source(c)) for c in release_cells if cell_kind(c) == "given"}
    for cell in cells:
        if cell["cell_type"] == "code" and "nbgrader" not in cell["metadata"] and same_text(cell["source"]) in given:
            cell["metadata"][GIVEN] = True

    # markdown the course did not write (a learner's notes, a course cell edited) is shown framed as the learner's
    # on the feedback page (`offline_html.FeedbackExporter`): a learner's "Score: 2.0 / 2.0" headings and score table
    # read as the page's own (red-team round 14)
    course_text = {same_text(cell_source(c)) for c in release_cells if c.get("cell_type") in ("markdown", "raw")}
    for cell in cells:
        if cell["cell_type"] in ("markdown", "raw") and same_text(cell["source"]) not in course_text:
            cell["source"] = LEARNERS_MARKDOWN + cell["source"]

    # valid, unique cell ids; no outputs
    used = set()
    out_cells = []
    for index, cell in enumerate(cells):
        cell_id = cell.pop("_id", None)
        if not isinstance(cell_id, str) or not _ID_RE.match(cell_id) or cell_id in used:
            cell_id = hashlib.sha1(f"{name}:{index}:{cell['source']}".encode()).hexdigest()[:12]
            while cell_id in used:
                cell_id = hashlib.sha1(cell_id.encode()).hexdigest()[:12]
        used.add(cell_id)
        cell["id"] = cell_id
        if cell["cell_type"] == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
        out_cells.append(cell)
    nb = {
        "cells": out_cells,
        "metadata": {
            k: copy.deepcopy(v) for k, v in release.get("metadata", {}).items() if k in ("kernelspec", "language_info")
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    _valid(nb)
    return nb, flags


def _valid(nb: dict) -> None:
    """Raise unless `nb` is valid under nbformat's schema. Everything nbgrader does to a notebook reads or writes it,
    and nbformat validates each time: a valid one at the fast validator's pace, an invalid one with the slow one,
    item by item, and then nbgrader fails on it anyway. Checked here, in the normaliser's bounded child, so nbgrader
    only ever sees notebooks that are valid (what the learner wrote reaches them as sources, bounded tags and images)."""
    import nbformat

    try:
        nbformat.validate(copy.deepcopy(nb), version=4)
    except nbformat.ValidationError as err:
        raise ValueError(f"not a valid notebook once normalised: {str(err).splitlines()[0][:200]}") from None


def find_notebooks(student_dir: Path, names: list[str]) -> tuple[dict[str, Path], list[str]]:
    """The course notebooks in a student's folder (searched breadth first, the shallowest wins), and notes.

    Only regular files and real folders count: a link (to the solutions, to another student's notebook, to a
    device) is never followed, and neither is anything that is not a regular file; each is noted, so the grader
    flags it. At most MAX_ENTRIES entries are looked at."""
    found: dict[str, Path] = {}
    notes: list[str] = []
    root = Path(student_dir)
    queue, seen = [root], 0
    while queue:
        folder = queue.pop(0)
        try:  # at most the entries left to look at are listed (a folder of 200,000 files took 66 MB to sort whole)
            with os.scandir(folder) as listing:
                entries = sorted(itertools.islice(listing, MAX_ENTRIES + 1 - seen), key=lambda e: e.name)
        except OSError as err:
            notes.append(f"{folder.relative_to(root)} could not be listed ({err.strerror})")
            continue
        for entry in entries:
            seen += 1
            if seen > MAX_ENTRIES:
                notes.append(f"only the first {MAX_ENTRIES} files and folders were looked at")
                return found, notes
            path = Path(entry.path)
            where = path.relative_to(root)
            if entry.name.startswith(".") or entry.name == ".ipynb_checkpoints":
                continue
            if entry.is_symlink():
                notes.append(f"{where} ignored (a symbolic link: never followed, only a notebook's own file is graded)")
                continue
            if entry.is_dir(follow_symlinks=False):
                queue.append(path)
                continue
            stem = path.stem if path.suffix == ".ipynb" else None
            if not entry.is_file(follow_symlinks=False):
                if stem in names:
                    notes.append(f"{where} ignored (not a regular file)")
                continue
            if stem in names:
                if stem in found:
                    notes.append(f"{where} ignored (another {stem}.ipynb is nearer the top)")
                else:
                    found[stem] = path
            else:
                notes.append(f"{where} ignored (not one of the course's notebooks)")
    return found, notes
