"""Grade a batch of submissions: nbgrader autograding, the judge outside the sandbox, feedback and a CSV.

    python -m instructor.grade SUBMISSIONS_DIR --out OUT_DIR [--jobs 2] [--cell-timeout 60] [--notebook-timeout 300]

SUBMISSIONS_DIR holds one folder per student with any of the course's notebooks, named as released
(`01_layernorm.ipynb`, ...). OUT_DIR receives:

- `grades.csv`: one row per student, notebook and graded test (exercise, grade_id, score, max_score, the
  nbgrader score, the judge's verdict (a test it has no probe for fails), flags, the reason for a failure);
- `summary.csv`: one row per student and notebook (score, max_score, status, flags);
- `feedback/<student>/<notebook>.html`: nbgrader's feedback (no hidden tests), with the grader's comments;
- `course/`: the nbgrader course directory (gradebook.db, submitted/, autograded/, feedback/, and judge/ with each
  job's plan, its probe child's log and the judge's verdicts with their seed), usable with nbgrader's own tools
  (`cd OUT_DIR/course; nbgrader ...`);
- `logs/`: the nbgrader workers' and the template's logs.

Learner code runs only in a bubblewrap sandbox (`instructor.sandbox`): the warm template runs inside it and forks
every kernel and every probe child there, each under a uid and cgroups of its own, with no network, no view of the
solutions, the outputs or the submissions, and nothing that outlives the run. This process and the nbgrader
workers stay outside: they hold the gradebook and write the CSVs once the sandbox and everything in it are gone.
Without bwrap (or root) the grader refuses to run unless given `--no-sandbox`, which flags every row
`unsandboxed`. Nothing a submission does stops the batch: each failure is recorded on its rows (colliding student
folders are graded as `name-2`, flagged), and a last line says how many rows are flagged.

A test's points are given only if nbgrader's run of the notebook passes it AND the judge passes it
(`instructor.judge`): this process draws fresh inputs and random weights for the course's own component, keeps the
expected outputs, and hands a probe child (`instructor.template`), which holds no answer of the notebook being
graded and no check, only the inputs and weights (safetensors files in a folder of the job's own); once the child
is gone it reads the outputs the child wrote (safetensors only) and compares them itself, so nothing in the sandbox
can change how that comparison is made. Every graded test has probes (`judge.PROBES`; docs/grading.md says how
each is probed); one without a verdict scores 0. nbgrader's run gives the learner's feedback; a test it passed and
the judge failed is flagged. Notebooks are graded in parallel (`--jobs` nbgrader processes, each with its own copy
of the gradebook, merged at the end). nbgrader runs each notebook in a fresh kernel forked from a warm template
that has imported torch/TransformerLens/harness and loaded the reference model (`--cold-kernels` starts them from
scratch instead). A cell that runs past `--cell-timeout` is interrupted and fails; a notebook past
`--notebook-timeout` stops there and is scored for what ran; memory is limited per kernel (`--memory-gb`).
The notebooks run in their fast mode (COURSE_FAST=1) unless the environment sets COURSE_FAST.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import os
import re
import secrets
import select
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path

from instructor import judge
from instructor.bounded import ChildFailed, bounded
from instructor.collect import Unreadable, _valid, find_notebooks, normalise, read_submission
from instructor.course import (
    REPO_ROOT,
    SOLUTIONS_DIR,
    build_course,
    dumps_notebook,
    encodable,
    notebook_names,
    read_json,
    read_source_notebook,
    solutions_digest,
)
from instructor.plan import build_plan
from instructor.sandbox import INSIDE_CGROUP, MemoryCgroup, bwrap_command, find_bwrap, python_path, works

CACHE_DIR = REPO_ROOT / "grading" / "cache"
KERNEL_NAME = "tfs-warm-python3"
# The template's interpreter is isolated (-I: no user site, no PYTHONPATH, not the working directory) and is
# handed the grader's own sys.path, so it imports exactly what the grader imports, whatever the environment.
TEMPLATE_BOOT = (
    "import json, runpy, sys; sys.path[:] = json.loads(sys.argv.pop(1)); "
    "runpy.run_module('instructor.template', run_name='__main__', alter_sys=True)"
)
# A template that dies or is not ready this long after it started, this many times in a row, will not start:
# the batch stops and says why instead of restarting it forever.
TEMPLATE_START_SECONDS = 300
TEMPLATE_START_ATTEMPTS = 3


# What one notebook can put in the CSVs: its flags, each cut, and only the first few.
FLAG_CHARS, MAX_FLAGS = 400, 12


# A text cell starting with one of these is a formula to a spreadsheet opening the CSV; learner code chooses the
# text of its errors, which reach the flags and reasons.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _visible(text: str) -> str:
    """`text` with every control, format, separator and unassigned character but the plain space written as its
    escape (`\\x1b`, `\\u202e`, `\\u2028`): a learner's exception text reached the CSVs with terminal escapes that
    redraw the line as "agreed" in `cat` (red-team round 36), and with line separators at which editors and
    `splitlines` break a row, showing forged rows (round 38); bidirectional overrides reorder what an editor shows."""
    import unicodedata

    return "".join(
        (f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")
        if ch != " " and unicodedata.category(ch)[0] in "CZ"
        else ch
        for ch in text
    )


def _cell(value):
    """A CSV cell as data: control characters escaped, and text a spreadsheet would take for a formula quoted with a
    leading apostrophe."""
    if not isinstance(value, str):
        return value
    value = _visible(value)
    return "'" + value if value.startswith(_FORMULA_START) else value


def _data_row(row: dict) -> dict:
    return {key: _cell(value) for key, value in row.items()}


def _joined_flags(flags: list[str]) -> str:
    shown = [f if len(f) <= FLAG_CHARS else f[:FLAG_CHARS] + " [cut]" for f in flags[:MAX_FLAGS]]
    if len(flags) > MAX_FLAGS:
        shown.append(f"and {len(flags) - MAX_FLAGS} more flags, not shown")
    return " | ".join(shown)


class TemplateFailed(Exception):
    """The template could not be started: nothing can be graded."""


# Seconds each notebook's autograding took in bench/bench_grading.py (fast mode, 2 cores, two at once): the order
# in which a batch starts them, longest first. A notebook not listed counts as a short one.
# 07 before 06 measured slower on 2026-11-26 (63.6 and 61.6 s against 60.1 s); 07 second, once its probes had grown,
# faster on 2026-11-27 (56.9 and 56.8 s against 61.4 and 61.2 s with 07 fifth)
NOTEBOOK_SECONDS = {
    "06_training": 40.0,
    "07_sampling_and_kv_cache": 30.0,
    "09_encoder_decoder": 20.0,
    "08_interpretability": 14.0,
    "00_tour": 8.0,
    "05_full_gpt2": 5.0,
}


def as_code(text: str) -> str:
    """`text` as one Markdown code span, shown as it is: a verdict can quote the learner's own exception text, and
    nbgrader renders comments as Markdown into the feedback page (a `<script>` and a `javascript:` link were live)."""
    return "`" + " ".join(str(text).split()).replace("`", "'") + "`"


# A probe job that takes longer than this, and than four times nbgrader's run of the notebook, is flagged.
SLOW_PROBES = 60.0
# nbgrader's run of a notebook longer than this is flagged: the course's slowest takes about 18 s on 2 cores, and
# whatever else holds a worker (a notebook the grader's own analysis of it took 171 s to read, red-team round 18)
# is the instructor's to see, whichever way it found
SLOW_NOTEBOOK = 120.0

# What this process does with a submission's content (normalising it, planning its probes) runs in a child of its
# own for at most this long: nothing in a notebook holds the batch (a cell of 499 `%time` lines made IPython's
# transformer quadratic here, and held every student's grading for two minutes: red-team round 11)
PREPARE_TIMEOUT = 60.0
# ... and all of one student's notebooks together, for each of those two steps: they run one after another before
# any grading starts, so a notebook that takes its whole minute to plan held every student's grading that long (two
# such notebooks held a batch 123 s: red-team round 20); a student's ten honest notebooks take about 5 s
STUDENT_PREPARE_SECONDS = 60.0


def _why(err: BaseException) -> str:
    return str(err) if isinstance(err, ChildFailed) else f"{type(err).__name__}: {err}"


def _normalised(path: str, release: dict, name: str) -> tuple[str, list[str]] | dict:
    """The submission at `path` read, converted and normalised (in a bounded child: all of it is work the file
    sizes), or {"unreadable": why}."""
    try:
        learner = read_submission(Path(path))
    except Unreadable as err:
        return {"unreadable": str(err)}
    nb, flags = normalise(learner, release, name)
    return dumps_notebook(nb), flags


@dataclass
class Item:
    student: str
    notebook: str
    path: Path  # the normalised submission
    flags: list[str] = field(default_factory=list)
    autograde: dict | None = None
    probed: dict | None = None  # the probe job's end, as the template reported it
    worker: int | None = None
    final: dict | None = None
    started: float = 0.0
    finalize_started: float = 0.0
    rows: list[dict] = field(default_factory=list)
    overrides: dict = field(default_factory=dict)
    comments: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    attempts: int = 0
    check_attempts: int = 0
    status: str = "graded"
    probes: judge.Prepared | None = None  # the judge's request for the running probe job; expected outputs in it
    judged: dict | None = None  # grade_id -> the judge's verdict, once the probe job has ended
    test_flags: dict = field(default_factory=dict)  # grade_id -> its own flags (also in `flags`, the notebook's)

    def row_flags(self, grade_id: str) -> list[str]:
        """The flags a test's row shows: the notebook's, but another test's own left to that test's row."""
        others = {f for g, own in self.test_flags.items() if g != grade_id for f in own}
        return [f for f in self.flags if f not in others]

    def zero_rows(self, solutions: Path, reason: str) -> None:
        """One row per graded test of its notebook, 0 points, with `reason`: a notebook that was not graded."""
        for test in read_source_notebook(self.notebook, solutions).tests:
            self.rows.append(
                {
                    "student": self.student,
                    "notebook": self.notebook,
                    "exercise": test.exercise or "",
                    "grade_id": test.grade_id,
                    "score": 0.0,
                    "max_score": test.points,
                    "nbgrader_score": "",
                    "judge": "",
                    "reason": reason,
                }
            )


class Proc:
    """A child process speaking JSON lines on stdin/stdout."""

    def __init__(self, args: list[str], log: Path, env: dict, name: str, cgroups: list[MemoryCgroup] = ()):
        self.name = name
        self.log = open(log, "ab")  # noqa: SIM115 - closed in close()
        procs = [str(group.path / "cgroup.procs") for group in cgroups]

        def join_cgroup():  # before exec: the sandbox and everything in it are in the run's cgroups
            for path in procs:
                with open(path, "w") as f:
                    f.write("0")

        self.popen = subprocess.Popen(
            args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=env,
            start_new_session=True,
            cwd=str(log.parent),
            close_fds=True,  # the sandbox gets its two pipes and its log, nothing else of the grader's
            preexec_fn=join_cgroup if procs else None,  # noqa: PLW1509 - only writes one file
        )
        os.set_blocking(self.popen.stdout.fileno(), False)
        self.buffer = b""
        self.started = time.monotonic()
        self.ready = False
        self.busy: object = None
        self.deadline = float("inf")

    def send(self, request: dict, timeout: float, what: object) -> None:
        self.popen.stdin.write((json.dumps(request) + "\n").encode())
        self.popen.stdin.flush()
        self.busy = what
        self.deadline = time.monotonic() + timeout

    def read_lines(self) -> list[dict]:
        try:
            data = os.read(self.popen.stdout.fileno(), 1 << 20)
        except BlockingIOError:
            return []
        if not data:
            return [{"__eof__": True}]
        self.buffer += data
        lines = []
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            if line.strip():
                lines.append(encodable(json.loads(line)))
        return lines

    def kill(self) -> None:
        try:
            import psutil

            children = psutil.Process(self.popen.pid).children(recursive=True)
        except Exception:  # noqa: BLE001
            children = []
        for proc in [*children]:
            try:
                proc.kill()
            except Exception:  # noqa: BLE001, S110 - already gone
                pass
        try:
            os.killpg(self.popen.pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
        self.popen.kill()
        self.popen.wait()

    def close(self) -> None:
        try:
            self.popen.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        try:
            self.popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()
        self.log.close()


def prepare_course(
    course: Path,
    names: list[str],
    cell_timeout: int,
    notebook_timeout: int,
    solutions_dir: Path = SOLUTIONS_DIR,
    log=print,
) -> None:
    """The nbgrader course directory (assignments generated, gradebook created), from a cache when it can."""
    digest = solutions_digest(names, solutions_dir)
    marker = course / ".solutions-digest"
    if marker.exists() and marker.read_text().strip() == digest and (course / "gradebook.db").exists():
        return
    if (course / "gradebook.db").exists():
        old = course.with_name(f"course.{marker.read_text().strip() if marker.exists() else 'old'}.{int(time.time())}")
        log(f"the solutions changed since {course} was made: it is moved to {old}")
        course.rename(old)
    cached = CACHE_DIR / digest
    if not (cached / ".solutions-digest").exists():
        log("setting up the nbgrader course (generate_assignment for each notebook) ...")
        tmp = CACHE_DIR / f"{digest}.tmp{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        build_course(tmp, names, solutions_dir, cell_timeout, notebook_timeout)
        (tmp / ".solutions-digest").write_text(digest)
        shutil.rmtree(cached, ignore_errors=True)
        tmp.rename(cached)
    _prune_cache(keep=digest)
    course.mkdir(parents=True, exist_ok=True)
    for entry in ("source", "release"):
        shutil.copytree(cached / entry, course / entry, dirs_exist_ok=True)
    for entry in ("gradebook.db", "nbgrader_config.py"):
        shutil.copyfile(cached / entry, course / entry)
    text = (course / "nbgrader_config.py").read_text()
    text = re.sub(
        r"cell_timeout=\d+, notebook_timeout=\d+",
        f"cell_timeout={cell_timeout}, notebook_timeout={notebook_timeout}",
        text,
    )
    (course / "nbgrader_config.py").write_text(text)
    marker.write_text(digest)


def _prune_cache(keep: str, n: int = 3) -> None:
    """Keep the course set-ups of the `n` most recent versions of the solutions."""
    entries = sorted(
        (p for p in CACHE_DIR.glob("*") if p.is_dir() and "." not in p.name), key=lambda p: p.stat().st_mtime
    )
    for old in entries[:-n]:
        if old.name != keep:
            shutil.rmtree(old, ignore_errors=True)


def course_files_state() -> dict[str, tuple]:
    """(size, mtime, inode) of the files grading trusts: a learner's kernel could write to them (run the grader
    where they are read-only); this at least notices it."""
    state = {}
    for pattern in ("harness/**/*", "solutions/*.ipynb", "instructor/*.py"):
        for path in REPO_ROOT.glob(pattern):
            if path.is_file() and "__pycache__" not in path.parts:
                st = path.stat()
                state[str(path)] = (st.st_size, st.st_mtime_ns, st.st_ino)
    return state


def _student_id(folder: str) -> str:
    """The folder's name in letters, digits and `_.@-`, never starting with `-`, `@` or `.`: the CSVs quote a cell
    a spreadsheet would read as a formula (`-1-1`), which would make the id there differ from the gradebook's, and a
    command line (nbgrader's own) reads an id starting `-` as an option."""
    ident = re.sub(r"[^A-Za-z0-9_.@-]", "_", folder).lstrip(".-@").rstrip(".") or "student"
    if len(ident) > MAX_ID:
        # a file name holds 255 bytes: the id with a clash's suffix, and the names nbgrader and the grader make from
        # it, must fit (two 255-character folders that map to one id stopped the batch with no CSVs, red-team round
        # 18); the folder's digest keeps two long names apart
        digest = hashlib.sha256(folder.encode("utf-8", "surrogateescape")).hexdigest()[:10]
        ident = f"{ident[: MAX_ID - 11].rstrip('.')}-{digest}"
    return ident


MAX_ID = 64  # characters of a student id


def student_ids(names: list[str]) -> dict[str, tuple[str, str | None]]:
    """Each folder name's student id, and the name it clashed with (None where it did not). A name that is already an
    id, and the only one of that id in any case, keeps it, whatever the other folders are called; every other name
    takes its id where it is free, else the first suffix `-2`, `-3`... that no folder holds or was given (a folder
    `-blank` took `blank`'s id, red-team round 45; `Alice`, sorted first, kept `alice`'s id and pushed `alice-2` to
    `alice-2-2`, round 46). Case is not told apart (some file systems and people do not): names that differ only by
    case both take a suffix, flagged, so that neither takes the other's id by how it sorts."""
    base = {name: _student_id(name) for name in names}
    as_is = Counter(name.lower() for name in names if base[name] == name)
    taken: dict[str, str] = {}
    out: dict[str, tuple[str, str | None]] = {}
    for name in sorted(names):
        if base[name] == name and as_is[name.lower()] == 1:
            taken[name.lower()] = name
            out[name] = (name, None)
    for name in sorted((n for n in names if n not in out), key=lambda n: (base[n] != n, n)):
        shared = base[name] == name  # another folder holds this id in another case
        clash = taken.get(base[name].lower())
        if shared:
            clash = next(n for n in names if n != name and n.lower() == name.lower())
        student, n = base[name], 1
        while (shared and n == 1) or student.lower() in taken:
            n += 1
            student = f"{base[name]}-{n}"
        taken[student.lower()] = name
        out[name] = (student, clash)
    return out


class Grader:
    def __init__(self, args):
        self.args = args
        self.out = Path(args.out).resolve()
        self.course = self.out / "course"
        self.names = notebook_names(args.solutions)
        if args.notebooks:
            unknown = set(args.notebooks) - set(self.names)
            if unknown:
                raise SystemExit(f"unknown notebooks: {sorted(unknown)}; the course has {self.names}")
        self.t0 = time.monotonic()
        self.kernel_socket: str | None = None
        self.server_restarts = 0
        self.files_state = course_files_state()
        self.socket_dir: str | None = None
        self.kernels_dir = self.course / ".kernels"
        self.items: list[Item] = []
        self.skipped: list[dict] = []
        self.done = 0
        self.sandbox = not args.no_sandbox
        self.bwrap: str | None = None
        self.cgroup: MemoryCgroup | None = None
        self.extra_cgroups: list[MemoryCgroup] = []  # pids and cpu, where the machine has them
        self.shared_mount = False
        self.worker_dirs: list[str] = []  # each nbgrader process's kernels' sockets (`_worker_folders`)
        self.worker_mounts: list[str] = []
        self.memory_note = ""
        self.worker_starts = 0
        self.template_failures = 0  # starts in a row that never became ready
        self.worker_failures = 0
        self.not_graded = ""  # why the batch stopped before grading everything
        # As one job of a distributed batch (instructor.grade_one): one student's folder, graded under the id the
        # coordinator gave it, with the judge's inputs the coordinator drew; the judge's outputs are handed back
        # raw, since the expected ones never leave the coordinator, so nothing is scored here.
        self.job_student: str | None = getattr(args, "job_student", None)
        self.judge_inputs: Path | None = getattr(args, "judge_inputs", None)
        self.job_outputs: dict[str, Path] = {}  # notebook -> the judge's raw outputs, copied out of the sandbox

    def check_sandbox(self) -> None:
        """Refuse to grade without the sandbox, unless told --no-sandbox."""
        if not self.sandbox:
            self.say("WARNING: --no-sandbox: learner code runs unconfined; every row is flagged 'unsandboxed'")
            return
        if self.args.cold_kernels:
            raise SystemExit("--cold-kernels starts kernels outside the sandbox: add --no-sandbox to grade that way")
        self.bwrap = find_bwrap()
        why = None
        if self.bwrap is None:
            why = "bubblewrap (bwrap) is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
        elif os.geteuid() != 0:
            why = "the sandbox gives each learner process a uid and a memory cgroup of its own, which needs root"
        else:
            problem = works(self.bwrap)
            if problem:
                why = f"bwrap cannot make a sandbox here: {problem}"
        if why:
            raise SystemExit(
                f"refusing to grade: {why}. Learner code must run in the sandbox; to grade without it (every row "
                "is then flagged 'unsandboxed'), pass --no-sandbox."
            )
        for controller in ("pids", "cpu"):
            group, problem = MemoryCgroup.create(controller)
            if group is None:
                self.say(f"WARNING: {problem}: no per-student {controller} limit")
            else:
                self.extra_cgroups.append(group)
        self.cgroup, problem = MemoryCgroup.create()
        if self.cgroup is None:
            self.memory_note = (
                f"no memory cgroup ({problem}): memory is limited by RLIMIT_DATA, which does not count shared mmaps"
            )
            self.say(f"WARNING: {self.memory_note}")

    def say(self, text: str) -> None:
        if not self.args.quiet:
            print(f"[{time.monotonic() - self.t0:6.1f}s] {text}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ collection
    def collect(self) -> None:
        submissions = Path(self.args.submissions)
        if not submissions.is_dir():
            raise SystemExit(f"{submissions} is not a folder")
        # nbformat's validator, loaded here once: each notebook is normalised and validated in a forked child, which
        # otherwise loaded it afresh, 1.4 s a notebook before any grading began (measured: 19 s for ten)
        _valid({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
        wanted = self.args.notebooks or self.names
        entries = [] if self.job_student else sorted(submissions.iterdir())
        entries = [e for e in entries if not e.name.startswith(".") and (e.is_symlink() or e.is_dir())]
        ids = student_ids([entry.name for entry in entries])
        students = []
        for entry in entries:
            if entry.is_symlink():  # never followed: it could lead to the solutions or to another student's work
                self.skipped.append(
                    {
                        "student": ids[entry.name][0],
                        "notebook": "",
                        "status": "not read",
                        "reason": f"{entry.name} is a symbolic link, not a student's own folder: not followed",
                    }
                )
            elif entry.is_dir():
                students.append((entry, *ids[entry.name]))
        if self.job_student:
            students = [(submissions, self.job_student, None)]
        for folder, student, clash in students:
            try:  # whatever goes wrong with one student's folder, the batch goes on (`_collect_student`)
                self._collect_student(folder, student, clash, wanted)
            except Exception as err:  # noqa: BLE001
                why = f"the folder could not be collected: {type(err).__name__}: {err}"
                self.skipped.append({"student": student, "notebook": "", "status": "not read", "reason": why[:300]})
        self.say(
            f"{len(self.items)} notebooks from {len(students)} students to grade"
            + (f", {len(self.skipped)} unreadable" if self.skipped else "")
        )

    def _collect_student(self, folder: Path, student: str, clash: str | None, wanted: list[str]) -> None:
        """One student's notebooks read, normalised and stored for grading under `student`."""
        try:
            found, notes = find_notebooks(folder, self.names)
        except Exception as err:  # noqa: BLE001 - one unreadable folder never stops the batch
            found, notes = {}, [f"the folder could not be read: {type(err).__name__}: {err}"[:300]]
        if clash is not None:
            notes = [
                *notes,
                f"student folder {folder.name!r} and {clash!r} map to the same id: graded as {student!r}",
            ]
        if not found:
            self.skipped.append(
                {
                    "student": student,
                    "notebook": "",
                    "status": "no notebooks",
                    "reason": "; ".join(notes[:5]) or "the folder holds no course notebook",
                }
            )
        spent = 0.0  # seconds normalising this student's notebooks took (STUDENT_PREPARE_SECONDS)
        for name in wanted:
            if name not in found:
                continue
            flags = list(notes) if name == min(found) else [n for n in notes if "map to the same id" in n]
            if student != (self.job_student or folder.name) and not any("map to the same id" in f for f in flags):
                flags.append(f"student folder {folder.name!r} graded as {student!r}")
            release = read_json(self.course / "release" / name / f"{name}.ipynb")
            left = STUDENT_PREPARE_SECONDS - spent
            if left <= 0:
                why = f"not read: this student's notebooks took the {STUDENT_PREPARE_SECONDS:.0f} s that normalising"
                self.skipped.append({"student": student, "notebook": name, "reason": f"{why} a student's may take"})
                continue
            started = time.monotonic()
            try:
                # read in the child too: parsing and converting an old format are work the submission sizes (an
                # nbformat 3 notebook of 2.5 million tags held the grader's own process 86 s, red-team round 45)
                normalised = bounded(_normalised, str(found[name]), release, name, timeout=min(PREPARE_TIMEOUT, left))
                if isinstance(normalised, dict):
                    raise Unreadable(normalised["unreadable"])
                text, norm_flags = normalised
            except Unreadable as err:
                self.skipped.append({"student": student, "notebook": name, "reason": str(err)})
                continue
            except Exception as err:  # noqa: BLE001 - one broken file never stops the batch
                self.skipped.append(
                    {
                        "student": student,
                        "notebook": name,
                        "reason": f"could not be normalised: {_why(err)}"[:300],
                    }
                )
                continue
            finally:
                spent += time.monotonic() - started
            path = self.course / "submitted" / student / name / f"{name}.ipynb"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            self.items.append(Item(student, name, path, flags + norm_flags))

    def write_plans(self) -> None:
        spent: dict[str, float] = {}  # seconds planning each student's notebooks took (STUDENT_PREPARE_SECONDS)
        for item in self.items:
            folder = self.course / "judge" / item.student
            folder.mkdir(parents=True, exist_ok=True)
            source = read_json(Path(self.args.solutions) / f"{item.notebook}.ipynb")
            left = STUDENT_PREPARE_SECONDS - spent.get(item.student, 0.0)
            started = time.monotonic()
            try:
                if left <= 0:
                    raise TimeoutError(
                        f"this student's notebooks took the {STUDENT_PREPARE_SECONDS:.0f} s planning allows"
                    )
                timeout = min(PREPARE_TIMEOUT, left)
                plan = bounded(build_plan, source, read_json(item.path), item.notebook, timeout=timeout)
                text = json.dumps(plan, indent=1)
            except Exception as err:  # noqa: BLE001 - RecursionError on a deep expression, a time-out: this notebook
                message = f"the judge could not plan this notebook ({_why(err)[:200]})"
                item.flags.append(message)
                item.probed = {"wall": 0.0, "failed": message}
                item.judged = judge.no_result(item.notebook, message)
                continue
            finally:
                spent[item.student] = spent.get(item.student, 0.0) + time.monotonic() - started
            item.flags += plan["notes"]
            (folder / f"{item.notebook}.plan.json").write_text(text)

    # ------------------------------------------------------------------ processes
    def env(self) -> dict:
        env = dict(os.environ)
        env.setdefault("HF_HUB_OFFLINE", "1")
        # the notebooks' fast mode (shorter training demos); grading needs the tests, not the full demos
        env.setdefault("COURSE_FAST", "1")
        env["TOKENIZERS_PARALLELISM"] = "false"
        # the nbgrader workers import what this process imports, from whatever folder they run in
        env["PYTHONPATH"] = os.pathsep.join(python_path())
        env["MPLBACKEND"] = "Agg"
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        if self.args.jobs > 1:  # one core per process: more processes, not more threads
            for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
                env[var] = "1"
        return env

    def runtime_dir(self) -> str:
        """Where (sandboxed) the kernels' Unix sockets are: shared with the sandbox. Root's and closed to
        kernels (0711): each worker has a folder in it that the template hands to the kernel it starts, made
        afresh, 0700, for that kernel's uid alone, so no kernel sees or writes where another one talks."""
        if not self.socket_dir:  # short: socket paths are limited to 108 bytes
            self.socket_dir = tempfile.mkdtemp(prefix="tfs-grade-")
            os.chmod(self.socket_dir, 0o755)
            if self.sandbox:
                # A tmpfs: what a child writes here is memory charged to its own cgroup (its limit bounds it),
                # not the grader's disk; the template removes it when the child ends.
                run = subprocess.run(
                    [
                        "mount",
                        "-t",
                        "tmpfs",
                        "-o",
                        "mode=0755,size=50%,nr_inodes=1000000",
                        "tfs-grade",
                        self.socket_dir,
                    ],
                    capture_output=True,
                    text=True,
                    check=False,
                )
                self.shared_mount = run.returncode == 0
                if not self.shared_mount:
                    self.say(f"WARNING: no tmpfs for the kernels' sockets ({run.stderr.strip()}): they use the disk")
        path = os.path.join(self.socket_dir, "rt")
        if not os.path.isdir(path):
            os.mkdir(path)
            os.chmod(path, 0o711)
            if self.sandbox:
                self._worker_folders(path)
        return path

    def _worker_folders(self, rt: str) -> None:
        """A small tmpfs of its own for each nbgrader process's kernels' sockets, mounted before the sandbox starts
        (a mount made later would not reach it): a kernel can write only in its own folder there, so what it fills
        is that process's alone, and nothing of the grader's or of another student's kernel shares its inodes (a
        kernel that filled the shared tmpfs with a million empty files stopped the whole batch, red-team round 10).
        Children cannot write anywhere else on the shared tmpfs."""
        for index in range(max(1, self.args.jobs)):
            folder = os.path.join(rt, f"w{index}")
            os.mkdir(folder)
            os.chmod(folder, 0o711)
            if self.shared_mount:
                options = "mode=0711,size=16m,nr_inodes=4096"
                run = subprocess.run(
                    ["mount", "-t", "tmpfs", "-o", options, f"tfs-w{index}", folder],
                    capture_output=True,
                    text=True,
                    check=False,
                )
                if run.returncode == 0:
                    self.worker_mounts.append(folder)
                else:
                    self.say(
                        f"WARNING: no tmpfs of its own for nbgrader process {index}'s kernels' sockets "
                        f"({run.stderr.strip()}): they share the kernels' tmpfs"
                    )
            self.worker_dirs.append(folder)

    def _private_runtime(self) -> Path:
        path = self.course / ".runtime"
        path.mkdir(mode=0o700, exist_ok=True)
        return path

    def start_worker(self, index: int) -> Proc:
        self.worker_starts += 1
        root = self.course / ".workers" / f"w{index}"
        if not (root / "gradebook.db").exists():
            root.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.course / "gradebook.db", root / "gradebook.db")
            for entry in ("source", "release"):
                if not (root / entry).exists():
                    (root / entry).symlink_to(self.course / entry)
        args = [
            sys.executable,
            "-m",
            "instructor.worker",
            "--root",
            str(root),
            "--cell-timeout",
            str(self.args.cell_timeout),
            "--notebook-timeout",
            str(self.args.notebook_timeout),
            "--memory-gb",
            str(self.args.memory_gb),
        ]
        env = self.env()
        if self.kernel_socket:
            args += ["--kernel-name", KERNEL_NAME]
            env["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(self.kernels_dir), env.get("JUPYTER_PATH")]))
            env["TFS_KERNEL_SOCKET"] = self.kernel_socket
            env["TFS_KERNEL_MEMORY"] = str(int(self.args.memory_gb * (1 << 30)))
        if self.sandbox:
            self.runtime_dir()
            sockets = os.path.join(self.worker_dirs[index % len(self.worker_dirs)], str(self.worker_starts))
            os.makedirs(sockets, mode=0o700, exist_ok=True)
            args += ["--ipc", os.path.join(sockets, "k")]
            # connection files stay with the grader (root only): the template hands each kernel its own copy
            env["JUPYTER_RUNTIME_DIR"] = str(self._private_runtime())
            env["TFS_SANDBOXED"] = "1"
        (self.out / "logs").mkdir(parents=True, exist_ok=True)
        return Proc(args, self.out / "logs" / f"worker{index}.log", env, f"worker{index}")

    def start_server(self) -> Proc:
        """The warm template: the judge's probe jobs, and (unless --cold-kernels) the kernels nbgrader runs notebooks in."""
        (self.out / "logs").mkdir(parents=True, exist_ok=True)
        args = [sys.executable, "-I", "-c", TEMPLATE_BOOT, json.dumps(python_path()), "--serve"]
        self.kernel_socket = None
        self.runtime_dir()
        if not self.args.cold_kernels:
            self.kernel_socket = os.path.join(self.socket_dir, "kernels")
            args += ["--kernel-socket", self.kernel_socket]
            spec = self.kernels_dir / "kernels" / KERNEL_NAME
            spec.mkdir(parents=True, exist_ok=True)
            launcher = Path(__file__).resolve().parent / "kernel_launcher.py"
            (spec / "kernel.json").write_text(
                json.dumps(
                    {
                        "argv": [sys.executable, "-I", "-S", str(launcher), "-f", "{connection_file}"],
                        "display_name": "Python 3 (grader, warm)",
                        "language": "python",
                        "interrupt_mode": "signal",
                    },
                    indent=1,
                )
            )
        env = self.env()
        env["OMP_NUM_THREADS"] = "1"
        if self.sandbox:
            self.runtime_dir()
            args += ["--sandboxed", *(arg for folder in self.worker_dirs for arg in ("--scratch", folder))]
            args += ["--cgroup", INSIDE_CGROUP] if self.cgroup else []
            for group in self.extra_cgroups:
                args += [f"--cgroup-{group.controller}", f"{INSIDE_CGROUP}-{group.controller}"]
            args = bwrap_command(
                self.bwrap,
                args,
                rw=[self.socket_dir],
                cgroup=self.cgroup,
                cgroups=self.extra_cgroups,
                private_ro={str(Path(self.args.solutions).resolve()): "solutions"},
            )
        groups = [g for g in [self.cgroup, *self.extra_cgroups] if g is not None]
        return Proc(args, self.out / "logs" / "template.log", env, "template", groups)

    # ------------------------------------------------------------------ the run
    def run(self) -> int:
        distributed = getattr(self.args, "engine", "local") == "ray"
        if not distributed:  # on Ray each job checks the sandbox of the machine it runs on, and refuses without it
            self.check_sandbox()
        self.out.mkdir(parents=True, exist_ok=True)
        prepare_course(
            self.course,
            self.names,
            self.args.cell_timeout,
            self.args.notebook_timeout,
            Path(self.args.solutions),
            log=self.say,
        )
        self.collect()
        if not distributed:
            self.write_plans()
        try:
            if self.items and distributed:
                from instructor.engine import run_ray

                (self.out / "logs").mkdir(parents=True, exist_ok=True)
                run_ray(self)  # inside: a failure there still ends with CSVs (round 25: one student's id ended it)
            elif self.items:
                self.grade_all()
        except TemplateFailed as err:
            self.not_graded = str(err)
        except Exception as err:  # noqa: BLE001 - the batch still ends with its CSVs: what was graded, and the rest
            traceback.print_exc()
            self.not_graded = f"the grader failed: {type(err).__name__}: {err}"[:500]
        finally:
            self.end_sandbox()
        if not self.sandbox:
            for item in self.items:
                item.flags.insert(0, "unsandboxed")
        if self.not_graded:
            self._record_not_graded()
        self.report()
        if self.not_graded:
            print(f"GRADING STOPPED: {self.not_graded}", file=sys.stderr, flush=True)
            return 2
        return 0

    def _record_not_graded(self) -> None:
        """Every notebook the batch did not finish gets its rows, scored 0, with the reason: none goes missing."""
        reason = f"not graded: {self.not_graded}".splitlines()[0][:500]
        for item in self.items:
            if item.rows:
                continue
            item.status = "not graded"
            item.flags.append("not graded: the grader stopped (see the last line of its output)")
            item.zero_rows(Path(self.args.solutions), reason)

    def end_sandbox(self) -> None:
        """Every learner process is gone before any output is written: the template's PID namespace ended with
        it, and whatever is left in the run's memory cgroup is killed."""
        if self.cgroup is not None:
            self.cgroup.remove()
        if self.socket_dir:
            for folder in self.worker_mounts:
                subprocess.run(["umount", "-l", folder], capture_output=True, check=False)
            if self.shared_mount:
                subprocess.run(["umount", "-l", self.socket_dir], capture_output=True, check=False)
            shutil.rmtree(self.socket_dir, ignore_errors=True)
        for group in self.extra_cgroups:
            group.remove()

    def grade_all(self) -> None:
        jobs = max(1, self.args.jobs)
        n_workers = min(jobs, len(self.items))
        server = self.start_server()
        workers = [self.start_worker(i) for i in range(n_workers)]
        self._workers = workers
        selector = selectors.DefaultSelector()
        for proc in [*workers, server]:
            selector.register(proc.popen.stdout, selectors.EVENT_READ, proc)
        to_grade = deque(sorted(self.items, key=lambda it: (-self._weight(it.notebook), it.student)))
        to_check = deque(
            sorted(
                (it for it in self.items if it.probed is None), key=lambda it: (-self._weight(it.notebook), it.student)
            )
        )
        running_checks: dict[str, Item] = {}
        finalize_queue: dict[int, deque] = {i: deque() for i in range(n_workers)}
        self._finalize_queue = finalize_queue
        self.remaining = len(self.items)
        check_id = 0
        grading_budget = self.args.notebook_timeout + 120
        self.say(f"grading with {n_workers} nbgrader processes and the judge")
        while self.remaining:
            # dispatch: finalize first (quick), then autograde / probe jobs within `jobs` busy slots
            for index, proc in enumerate(workers):
                if proc.ready and proc.busy is None and finalize_queue[index]:
                    item = finalize_queue[index].popleft()
                    item.finalize_started = time.monotonic()
                    proc.send(self._finalize_request(item), 300, ("finalize", item))
            busy = sum(1 for p in workers if p.busy and p.busy[0] == "autograde") + len(running_checks)
            for proc in workers:
                if busy >= jobs or not to_grade:
                    break
                if proc.ready and proc.busy is None:
                    item = to_grade.popleft()
                    item.started = time.monotonic()
                    item.worker = workers.index(proc)
                    proc.send(
                        {"op": "autograde", "student": item.student, "notebook": item.notebook, "path": str(item.path)},
                        grading_budget,
                        ("autograde", item),
                    )
                    busy += 1
            while server.ready and to_check and (busy < jobs or not to_grade and len(running_checks) < jobs):
                item = to_check.popleft()
                check_id += 1
                key = str(check_id)
                running_checks[key] = item
                folder = self.course / "judge" / item.student
                self._prepare_probes(item, key)
                try:
                    server.send(
                        {
                            "id": key,
                            "plan": read_json(folder / f"{item.notebook}.plan.json"),
                            "cell_timeout": self.args.cell_timeout,
                            "notebook_timeout": self.args.notebook_timeout,
                            "memory_bytes": int(self.args.memory_gb * (1 << 30)),
                            "probes": str(item.probes.folder) if item.probes else None,
                        },
                        float("inf"),
                        None,
                    )
                except OSError:  # the template ended between two reads (a pipe closed): handled as its death
                    try:
                        selector.unregister(server.popen.stdout)
                    except (KeyError, ValueError):
                        pass
                    server = self._server_died(server, running_checks, to_check, selector)
                    break
                server.busy = None
                busy += 1
            # wait for replies
            for key, _ in selector.select(timeout=0.2):
                proc = key.data
                for reply in proc.read_lines():
                    if reply.get("__eof__"):
                        selector.unregister(proc.popen.stdout)
                        if proc is server:
                            server = self._server_died(server, running_checks, to_check, selector)
                        else:
                            self._worker_died(workers, proc, finalize_queue, to_grade, selector, "exited")
                        break
                    if reply.get("ready"):
                        proc.ready = True
                        if proc is server:
                            self.say(f"the sandbox's template is ready ({time.monotonic() - proc.started:.1f} s)")
                        continue
                    if proc is server:
                        if reply.get("id") not in running_checks:
                            continue
                        item = running_checks.pop(reply["id"])
                        item.probed = self._read_probed(item, reply)
                        self.remaining -= self._maybe_finish(item, finalize_queue)
                        continue
                    op, item = proc.busy
                    proc.busy = None
                    proc.deadline = float("inf")
                    if op == "autograde":
                        item.autograde = reply
                        item.timings["nbgrader"] = time.monotonic() - item.started
                        state = course_files_state()
                        if state != self.files_state:
                            changed = sorted(
                                k
                                for k in state.keys() | self.files_state.keys()
                                if state.get(k) != self.files_state.get(k)
                            )
                            message = f"the course's files changed while this notebook ran: {', '.join(changed[:5])}"
                            item.flags.append(message)
                            self.say(f"WARNING: {item.student}/{item.notebook}: {message}")
                            self.files_state = state
                        self.remaining -= self._maybe_finish(item, finalize_queue)
                    else:
                        item.final = reply
                        item.timings["finalize"] = time.monotonic() - item.finalize_started
                        self.remaining -= 1
                        self._progress(item)
            now = time.monotonic()
            if not server.ready and now - server.started > TEMPLATE_START_SECONDS:
                self.say(f"the template was not ready {TEMPLATE_START_SECONDS} s after it started")
                selector.unregister(server.popen.stdout)
                server = self._server_died(server, running_checks, to_check, selector)
            for proc in workers:
                if proc.busy and now > proc.deadline:
                    self._worker_died(workers, proc, finalize_queue, to_grade, selector, "stopped (time limit)")
        if self.job_student:
            self._keep_autograded(workers)
        else:
            self.merge(workers)
        for proc in workers:
            proc.close()
        server.close()
        shutil.rmtree(self.course / ".workers", ignore_errors=True)  # everything worth keeping was copied out
        shutil.rmtree(self.kernels_dir, ignore_errors=True)

    def _keep_autograded(self, workers: list[Proc]) -> None:
        """A job's autograded notebooks, out of its workers' folders: the coordinator's feedback is made from them."""
        for item in self.items:
            for index in range(len(workers)):
                src = self.course / ".workers" / f"w{index}" / "autograded" / item.student / item.notebook
                if src.exists():
                    shutil.copytree(src, self.course / "autograded" / item.student / item.notebook, dirs_exist_ok=True)

    @staticmethod
    def _weight(name: str) -> float:
        """The longest notebooks start first, so that no core idles at the end of a batch."""
        return NOTEBOOK_SECONDS.get(name, 2.0)

    def _server_died(self, server, running_checks, to_check, selector) -> Proc:
        """Restart the template and re-queue its checks. Sandboxed, learner code cannot reach it (it runs under
        other uids); unsandboxed a kernel can kill it, and a check that was running twice when it died fails."""
        server.kill()
        self.server_restarts += 1
        self.template_failures = 0 if server.ready else self.template_failures + 1
        if self.template_failures >= TEMPLATE_START_ATTEMPTS:
            for proc in self._workers:
                proc.kill()
            raise TemplateFailed(self._template_failure())
        self.say(f"the template stopped (see {self.out / 'logs' / 'template.log'}); restarting it")
        if self.server_restarts > 3:
            time.sleep(min(10, self.server_restarts))  # a broken installation: slow down, but finish the batch
        for item in running_checks.values():
            item.check_attempts += 1
            if item.check_attempts >= 2:
                item.probed = {"wall": 0.0}
                item.flags.append("the template was stopped twice while this notebook's probes ran")
                self.remaining -= self._maybe_finish(item, self._finalize_queue)
            else:
                to_check.appendleft(item)
        running_checks.clear()
        new = self.start_server()
        selector.register(new.popen.stdout, selectors.EVENT_READ, new)
        return new

    def _template_failure(self) -> str:
        """One message: what failed, the log's last lines, and what to do."""
        log = self.out / "logs" / "template.log"
        try:
            lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()][-6:]
        except OSError:
            lines = []
        where = "in the sandbox (bubblewrap)" if self.sandbox else "(unsandboxed)"
        return (
            f"the template (python -m instructor.template --serve) could not start {where}: it stopped or "
            f"was not ready within {TEMPLATE_START_SECONDS} s, {TEMPLATE_START_ATTEMPTS} times in a row. "
            f"Its log ({log}) ends with: " + (" / ".join(lines)[-1200:] or "(nothing)") + ". "
            f"What to do: run `{sys.executable} -c 'import torch, transformer_lens, harness, instructor'` with the "
            "interpreter you grade with (the sandbox sees only that interpreter's installation and the course's "
            "harness/ and instructor/); if that works, grade once with --no-sandbox to tell a sandbox problem from "
            "an installation one, and see docs/grading.md."
        )

    def _worker_died(self, workers, proc, finalize_queue, to_grade, selector, why):
        index = workers.index(proc)
        busy = proc.busy
        proc.kill()
        self.worker_failures = 0 if proc.ready else self.worker_failures + 1
        if self.worker_failures >= TEMPLATE_START_ATTEMPTS * len(workers):
            for other in workers:
                other.kill()
            log = self.out / "logs" / f"worker{index}.log"
            try:
                tail = " / ".join(line for line in log.read_text(errors="replace").splitlines() if line.strip())
            except OSError:
                tail = ""
            raise TemplateFailed(
                f"the nbgrader workers (python -m instructor.worker) could not start, {self.worker_failures} times "
                f"in a row. Their log ({log}) ends with: {tail[-800:] or '(nothing)'}. What to do: check that "
                f"`{sys.executable} -m instructor.worker --help` runs from any folder; see docs/grading.md."
            )
        try:
            selector.unregister(proc.popen.stdout)
        except (KeyError, ValueError):
            pass
        new = self.start_worker(index)
        workers[index] = new
        selector.register(new.popen.stdout, selectors.EVENT_READ, new)
        if busy:
            op, item = busy
            if op == "autograde":
                item.autograde = {
                    "success": False,
                    "grades": {},
                    "errors": {},
                    "stopped": [],
                    "error": f"the nbgrader run {why} after {time.monotonic() - item.started:.0f} s",
                }
                self.remaining -= self._maybe_finish(item, finalize_queue)
            else:
                item.attempts += 1
                if item.attempts < 3:
                    finalize_queue[index].appendleft(item)
                else:
                    item.flags.append(f"feedback and gradebook update failed ({why})")
                    item.final = {"success": False}
                    self.remaining -= 1
                    self._progress(item)

    def _prepare_probes(self, item: Item, key: str) -> None:
        """The judge's fresh probes for this job, in a folder of its own that the sandbox sees (the runtime
        folder, bound at the same path); the expected outputs stay in `item.probes`, in this process."""
        item.probes, item.judged = None, None
        if item.notebook not in judge.PROBES:
            return
        try:
            root = os.path.join(os.path.dirname(self.runtime_dir()), "probes")
            if not os.path.isdir(root):
                os.mkdir(root)
                os.chmod(root, 0o711)  # a child can reach its own job's folder by name, not list the others
        except OSError as err:  # this job's failure, never the batch's
            message = f"the judge could not make its probes' folder: {type(err).__name__}: {err}"[:300]
            item.flags.append(message)
            item.judged = judge.no_result(item.notebook, message)
            return
        folder = Path(root) / f"{key}-{secrets.token_hex(8)}"
        if self.judge_inputs is not None:
            given = self.judge_inputs / item.notebook
            if not (given / judge.REQUEST).is_file():
                item.judged = judge.no_result(item.notebook, "the coordinator sent no probes for this notebook")
                return
            # the coordinator's request, copied as prepare() writes one: the child reads it as root, then drops root
            try:
                folder.mkdir(mode=0o711)
                for path in given.iterdir():
                    shutil.copyfile(path, folder / path.name)
                    os.chmod(folder / path.name, 0o600)
            except OSError as err:  # this job's failure, never the batch's
                message = f"the judge could not copy the coordinator's probes: {type(err).__name__}: {err}"[:300]
                item.flags.append(message)
                item.judged = judge.no_result(item.notebook, message)
                return
            item.probes = judge.Prepared(folder, item.notebook, 0, {})
            return
        started = time.monotonic()
        try:
            item.probes = judge.prepare(item.notebook, folder)
            item.timings["judge's inputs"] = time.monotonic() - started
        except Exception as err:  # noqa: BLE001 - a broken judge fails its tests (flagged), never the batch
            message = f"the judge could not prepare its probes: {type(err).__name__}: {err}"[:300]
            item.flags.append(message)
            item.judged = judge.no_result(item.notebook, message)

    def _judge(self, item: Item) -> None:
        """The judge's verdicts: the probe child has exited and the template has reaped everything it started,
        so nothing in the sandbox can still write the outputs being read."""
        if item.probes is None:
            return
        prepared, item.probes = item.probes, None
        if self.judge_inputs is not None:
            self._keep_judge_outputs(item, prepared.folder)
            return
        prepared.fed = self.sandbox  # a sandboxed probe child is always fed: no record of its feeder is a lost one
        started = time.monotonic()
        try:
            item.judged = judge.verdicts(prepared)
            item.timings["verdicts"] = time.monotonic() - started
        except Exception as err:  # noqa: BLE001
            message = f"the judge failed: {type(err).__name__}: {err}"[:300]
            item.flags.append(message)
            item.judged = judge.no_result(item.notebook, message)
        record = {"seed": prepared.seed, "verdicts": item.judged}
        (self.course / "judge" / item.student / f"{item.notebook}.judge.json").write_text(json.dumps(record, indent=1))

    def _keep_judge_outputs(self, item: Item, folder: Path) -> None:
        """The judge's raw outputs, for the coordinator to compare: read as the judge reads them (regular files of
        their own, bounded), never followed through a link the child left."""
        dest = self.out / "probes" / item.notebook / judge.OUT_DIR
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        try:
            files = [
                (name, limit)
                for index in range(judge.MAX_PHASES)
                for name, limit in zip(judge.phase_files(index), (judge.MAX_OUTPUT_BYTES, 1 << 20), strict=True)
            ] + [(judge.SERVED, 1 << 20)]  # the feeder's counts, which the runner alone writes
            for name, limit in files:
                try:
                    data = judge.read_regular_file(folder / judge.OUT_DIR / name, limit)
                except ValueError as err:
                    item.flags.append(f"the judge's outputs were refused: {name} {err}"[:300])
                    continue
                if data is not None:
                    (dest / name).write_bytes(data)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        self.job_outputs[item.notebook] = dest

    def _read_probed(self, item: Item, reply: dict) -> dict:
        """The probe job's end, as the template reported it, and the judge's verdicts on its outputs."""
        if reply.get("probes_beside_oracles") and item.probes is not None:
            item.flags.append(
                "the judge's probes ran in a child of the main template, beside the oracles (the probe template "
                "could not start: see logs/template.log); the record alone refused them"
            )
        self._judge(item)
        folder = self.course / "judge" / item.student
        (folder / f"{item.notebook}.log").write_text(
            reply.get("log") or "", encoding="utf-8", errors="backslashreplace"
        )
        status = reply.get("status")
        if status == "killed":
            item.flags.append("the judge's probes were stopped at the notebook's time limit")
        elif status == "lost":
            item.flags.append(f"the judge's probes were lost: {reply.get('log', '')[:200]}")
        elif reply.get("returncode"):
            item.flags.append(f"the judge's probe child failed (exit {reply.get('returncode')}); see its log")
        item.timings["probes"] = reply.get("wall") or 0.0
        return {"wall": reply.get("wall")}

    def _maybe_finish(self, item: Item, finalize_queue) -> int:
        if item.autograde is None or item.probed is None:
            return 0
        probes, nbgrader = item.timings.get("probes", 0.0), item.timings.get("nbgrader", 0.0)
        if probes > SLOW_PROBES and probes > 4 * nbgrader:
            # the judge's child runs the definitions of every cell once a phase: what took long only there (a
            # `time.sleep` under `if not os.path.isdir("/proc")` held a probe slot 251 s, red-team round 14)
            # is the instructor's to see, with the job's log that says where the time went
            item.flags.append(
                f"the judge's probes took {probes:.0f} s, where nbgrader's run of the whole notebook took "
                f"{nbgrader:.0f} s (see course/judge/{item.student}/{item.notebook}.log)"
            )
        if nbgrader > SLOW_NOTEBOOK:
            item.flags.append(
                f"nbgrader's run of this notebook took {nbgrader:.0f} s (the course's own notebooks take well under "
                f"{SLOW_NOTEBOOK:.0f} s)"
            )
        if self.job_student:  # scored by the coordinator, which alone holds the judge's expected outputs
            return 1
        self._score(item)
        if item.worker is None:
            return 1
        finalize_queue[item.worker].append(item)
        return 0

    def _score(self, item: Item) -> None:
        source = read_source_notebook(item.notebook, Path(self.args.solutions))
        grades = item.autograde.get("grades", {})
        errors = item.autograde.get("errors", {})
        item.overrides, item.comments = {}, {}
        flags = item.flags
        if not item.autograde.get("success"):
            flags.append((item.autograde.get("error") or "the nbgrader run failed").strip().splitlines()[-1][:300])
        flags += item.autograde.get("stopped", [])
        judged = item.judged
        if judged is None:  # the probe job never reported (the template stopped twice, or it was never planned)
            judged = judge.no_result(item.notebook, "no output returned (the judge's probes did not finish)")
        for test in source.tests:
            grade = grades.get(test.grade_id, {})
            auto = grade.get("auto_score")
            # within [0, points] whatever nbgrader read from a cell's value (a partial-credit number the notebook chose)
            nb_score = float(auto) if auto is not None else 0.0
            nb_score = min(max(nb_score, 0.0), test.points) if math.isfinite(nb_score) else 0.0
            # Points need the judge's verdict: a test it has no probe for scores 0, never nbgrader's score alone
            # (`tests/test_judge.py` keeps every graded test probed). nbgrader's run, in the learner's own
            # process, is the learner's feedback; it can take points away, never give them.
            verdict = judged.get(test.grade_id) or {"passed": False, "message": "judge: no probe for this test"}
            judge_passed = bool(verdict["passed"])
            score = nb_score if judge_passed else 0.0
            reason = ""
            if nb_score < test.points:
                reason = errors.get(test.grade_id) or ("not graded by nbgrader" if auto is None else "failed")
            elif not judge_passed:
                reason = verdict["message"]
                # the checks in the learner's process passed what the course's own code, compared outside, does not
                # reproduce: code that behaves only while a check watches, a check tampered with, a forbidden call
                flag = (
                    f"{test.grade_id}: nbgrader's run passed it but the judge outside the sandbox failed it: "
                    f"{verdict['message']}"[:FLAG_CHARS]
                )
                flags.append(flag)
                item.test_flags.setdefault(test.grade_id, []).append(flag)
                if test.exercise:
                    item.comments[test.exercise] = (
                        f"The grader ran {test.grade_id}'s code on fresh inputs and compared the result with the "
                        f"course's; it differs, so it scores 0: {as_code(verdict['message'])}"
                    )
            item.overrides[test.grade_id] = {"score": score if auto is None or score != nb_score else None}
            item.rows.append(
                {
                    "student": item.student,
                    "notebook": item.notebook,
                    "exercise": test.exercise or "",
                    "grade_id": test.grade_id,
                    "score": score,
                    "max_score": test.points,
                    "nbgrader_score": nb_score,
                    "judge": "passed" if judge_passed else "failed",
                    "reason": reason[:500],
                }
            )

    def _finalize_request(self, item: Item) -> dict:
        return {
            "op": "finalize",
            "student": item.student,
            "notebook": item.notebook,
            "overrides": item.overrides,
            "comments": item.comments,
            "flagged": bool(item.flags),
            "feedback": not self.args.no_feedback,
        }

    def _progress(self, item: Item) -> None:
        self.done += 1
        score = sum(r["score"] for r in item.rows)
        total = sum(r["max_score"] for r in item.rows)
        took = time.monotonic() - item.started
        extra = f"  [{len(item.flags)} flag{'s' if len(item.flags) != 1 else ''}]" if item.flags else ""
        timings = ", ".join(f"{k} {v:.1f} s" for k, v in item.timings.items())
        self.say(
            f"{self.done}/{len(self.items)} {item.student}/{item.notebook}: {score:g}/{total:g} "
            f"({timings}; {took:.1f} s since it started){extra}"
        )
        feedback = (item.final or {}).get("feedback")
        if (item.final or {}).get("feedback_note"):
            item.flags.append(item.final["feedback_note"])
        if feedback:
            dest = self.out / "feedback" / item.student / f"{item.notebook}.html"
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(feedback, dest)
            master = self.course / "feedback" / item.student / item.notebook
            master.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(feedback, master / f"{item.notebook}.html")
        worker_root = self.course / ".workers" / f"w{item.worker}"
        autograded = worker_root / "autograded" / item.student / item.notebook
        if autograded.exists():
            shutil.copytree(autograded, self.course / "autograded" / item.student / item.notebook, dirs_exist_ok=True)

    def merge(self, workers: list[Proc]) -> None:
        """All grades into the course's gradebook (OUT_DIR/course/gradebook.db), by one of the nbgrader workers."""
        records = []
        for item in self.items:
            grades = (item.final or {}).get("grades") or {}
            for row in item.rows:
                grades.setdefault(row["grade_id"], {"auto_score": row["nbgrader_score"], "manual_score": row["score"]})
            records.append(
                {
                    "student": item.student,
                    "notebook": item.notebook,
                    "grades": grades,
                    "comments": item.comments,
                    "flagged": bool(item.flags),
                }
            )
        request = {"op": "merge", "db_path": str(self.course / "gradebook.db"), "records": records}
        deadline = time.monotonic() + 300
        proc = None
        while time.monotonic() < deadline:
            if proc is None:
                proc = next((p for p in workers if p.ready and p.busy is None), None)
                if proc is None:  # a restarted worker still starting: wait for its "ready"
                    ready = select.select([p.popen.stdout for p in workers], [], [], 0.5)[0]
                    for p in workers:
                        if p.popen.stdout in ready and any(line.get("ready") for line in p.read_lines()):
                            p.ready = True
                    continue
                proc.send(request, 300, ("merge", None))
            select.select([proc.popen.stdout], [], [], 0.5)
            lines = proc.read_lines()
            if lines:
                if lines[0].get("__eof__") or not lines[0].get("success"):
                    self.say(f"merging into the gradebook failed: {lines[0].get('error', 'the worker stopped')[-500:]}")
                return
        self.say("merging into the gradebook timed out")

    # ------------------------------------------------------------------ outputs
    def report(self) -> None:
        rows = [row for item in self.items for row in item.rows]
        fields = [
            "student",
            "notebook",
            "exercise",
            "grade_id",
            "score",
            "max_score",
            "nbgrader_score",
            "judge",
            "flags",
            "reason",
        ]
        item_of = {(it.student, it.notebook): it for it in self.items}
        with open(self.out / "grades.csv", "w", newline="", encoding="utf-8", errors="backslashreplace") as f:
            writer = csv.DictWriter(f, fieldnames=fields)
            writer.writeheader()
            for row in sorted(rows, key=lambda r: (r["student"], r["notebook"])):
                flags = item_of[(row["student"], row["notebook"])].row_flags(row["grade_id"])
                writer.writerow(_data_row({**row, "flags": _joined_flags(flags)}))
        with open(self.out / "summary.csv", "w", newline="", encoding="utf-8", errors="backslashreplace") as f:
            writer = csv.DictWriter(f, fieldnames=["student", "notebook", "score", "max_score", "status", "flags"])
            writer.writeheader()
            for item in sorted(self.items, key=lambda it: (it.student, it.notebook)):
                writer.writerow(
                    _data_row(
                        {
                            "student": item.student,
                            "notebook": item.notebook,
                            "score": sum(r["score"] for r in item.rows),
                            "max_score": sum(r["max_score"] for r in item.rows),
                            "status": item.status,
                            "flags": _joined_flags(item.flags),
                        }
                    )
                )
            for skipped in self.skipped:
                max_score = 0.0
                if skipped["notebook"]:
                    max_score = read_source_notebook(skipped["notebook"], Path(self.args.solutions)).max_score
                writer.writerow(
                    _data_row(
                        {
                            "student": skipped["student"],
                            "notebook": skipped["notebook"],
                            "score": 0,
                            "max_score": max_score,
                            "status": skipped.get("status", "unreadable"),
                            "flags": skipped["reason"],
                        }
                    )
                )
        total = time.monotonic() - self.t0
        flagged = sum(1 for r in rows if item_of[(r["student"], r["notebook"])].row_flags(r["grade_id"]))
        self.say(
            f"done in {total:.1f} s: {self.out / 'grades.csv'}, {self.out / 'summary.csv'}"
            + ("" if self.args.no_feedback else f", {self.out / 'feedback'}")
        )
        line = (
            f"{len(rows)} rows graded ({len(self.items)} notebooks, {len(self.skipped)} not gradable), "
            f"{flagged} rows flagged; {'sandboxed' if self.sandbox else 'UNSANDBOXED'}"
            + (f"; {self.memory_note}" if self.memory_note else "")
        )
        print(line, file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(
        prog="python -m instructor.grade",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    parser.add_argument("submissions", type=Path, help="one folder per student, holding their notebooks")
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel processes (default: cores)")
    parser.add_argument("--cell-timeout", type=int, default=60, help="seconds per cell (default 60)")
    parser.add_argument("--notebook-timeout", type=int, default=300, help="seconds per notebook (default 300)")
    parser.add_argument("--memory-gb", type=float, default=4.0, help="memory per kernel and probe child (default 4 GB)")
    parser.add_argument("--notebooks", nargs="+", help="grade only these notebooks (e.g. 01_layernorm)")
    parser.add_argument("--no-feedback", action="store_true", help="skip the feedback HTML")
    parser.add_argument(
        "--cold-kernels",
        action="store_true",
        help="start every kernel from scratch (python -m ipykernel_launcher) instead of forking warm ones",
    )
    parser.add_argument(
        "--no-sandbox",
        action="store_true",
        help="run learner code without the sandbox (instructor.sandbox); every row is flagged 'unsandboxed'",
    )
    parser.add_argument(
        "--engine",
        choices=["local", "ray"],
        default="local",
        help="local: this machine (default); ray: one Ray task per student on a Ray cluster (docs/cluster-grading.md)",
    )
    parser.add_argument(
        "--address", help="with --engine ray: the cluster's address (default: RAY_ADDRESS, or a local one)"
    )
    parser.add_argument(
        "--task-cpus", type=float, default=1, help="with --engine ray: CPUs per student's task (default 1)"
    )
    parser.add_argument(
        "--task-timeout",
        type=int,
        help="with --engine ray: seconds per task before it is cancelled (default: from the limits)",
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=2,
        help="with --engine ray: times a lost or crashed task is sent again (default 2)",
    )
    parser.add_argument("--solutions", type=Path, default=SOLUTIONS_DIR, help=argparse.SUPPRESS)
    parser.add_argument("--quiet", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return Grader(parse_args(argv)).run()


if __name__ == "__main__":
    sys.exit(main())
