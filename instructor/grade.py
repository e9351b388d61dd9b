"""Grade a batch of submissions: nbgrader autograding, a clean re-check of every test, feedback and a CSV.

    python -m instructor.grade SUBMISSIONS_DIR --out OUT_DIR [--jobs 2] [--cell-timeout 60] [--notebook-timeout 300]

SUBMISSIONS_DIR holds one folder per student with any of the course's notebooks, named as released
(`01_layernorm.ipynb`, ...). OUT_DIR receives:

- `grades.csv`: one row per student, notebook and graded test (exercise, grade_id, score, max_score, the
  nbgrader score, the re-check's verdict, flags, the reason for a failure);
- `summary.csv`: one row per student and notebook (score, max_score, flags);
- `feedback/<student>/<notebook>.html`: nbgrader's feedback (no hidden tests), with the grader's comments;
- `course/`: the nbgrader course directory (gradebook.db, submitted/, autograded/, feedback/, and recheck/ with
  each re-check's plan, result and log), usable with nbgrader's own tools (`cd OUT_DIR/course; nbgrader ...`).

A test's points are given only if nbgrader's run of the notebook passes it AND the clean re-check passes it
(see `instructor.recheck`). Notebooks are graded in parallel (`--jobs` nbgrader processes, each with its own copy
of the gradebook, merged at the end). A cell that runs past `--cell-timeout` is interrupted and fails; a notebook
past `--notebook-timeout` stops there and is scored for what ran; memory is limited per kernel (`--memory-gb`).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import selectors
import shutil
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from instructor.collect import Unreadable, find_notebooks, normalise, read_submission
from instructor.course import (
    REPO_ROOT,
    SOLUTIONS_DIR,
    build_course,
    dumps_notebook,
    notebook_names,
    read_json,
    read_source_notebook,
    solutions_digest,
)
from instructor.plan import build_plan

CACHE_DIR = REPO_ROOT / "grading" / "cache"


@dataclass
class Item:
    student: str
    notebook: str
    path: Path  # the normalised submission
    flags: list[str] = field(default_factory=list)
    autograde: dict | None = None
    recheck: dict | None = None
    worker: int | None = None
    final: dict | None = None
    started: float = 0.0
    rows: list[dict] = field(default_factory=list)
    overrides: dict = field(default_factory=dict)
    comments: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    timings: dict = field(default_factory=dict)


class Proc:
    """A child process speaking JSON lines on stdin/stdout."""

    def __init__(self, args: list[str], log: Path, env: dict, name: str):
        self.name = name
        self.log = open(log, "ab")  # noqa: SIM115 - closed in close()
        self.popen = subprocess.Popen(
            args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=env,
            start_new_session=True,
            cwd=str(log.parent),
        )
        os.set_blocking(self.popen.stdout.fileno(), False)
        self.buffer = b""
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
                lines.append(json.loads(line))
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


def _student_id(folder: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.@-]", "_", folder).strip(".") or "student"


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
        self.items: list[Item] = []
        self.skipped: list[dict] = []
        self.done = 0

    def say(self, text: str) -> None:
        if not self.args.quiet:
            print(f"[{time.monotonic() - self.t0:6.1f}s] {text}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ collection
    def collect(self) -> None:
        submissions = Path(self.args.submissions)
        if not submissions.is_dir():
            raise SystemExit(f"{submissions} is not a folder")
        wanted = self.args.notebooks or self.names
        students = sorted(p for p in submissions.iterdir() if p.is_dir() and not p.name.startswith("."))
        seen_ids = {}
        for folder in students:
            student = _student_id(folder.name)
            if student in seen_ids:
                raise SystemExit(f"student folders {seen_ids[student]} and {folder.name} map to the same id {student}")
            seen_ids[student] = folder.name
            found, notes = find_notebooks(folder, self.names)
            if not found:
                self.skipped.append(
                    {
                        "student": student,
                        "notebook": "",
                        "status": "no notebooks",
                        "reason": "; ".join(notes[:5]) or "the folder holds no course notebook",
                    }
                )
            for name in wanted:
                if name not in found:
                    continue
                flags = list(notes) if name == min(found) else []
                if student != folder.name:
                    flags.append(f"student folder {folder.name!r} graded as {student!r}")
                release = read_json(self.course / "release" / name / f"{name}.ipynb")
                try:
                    learner = read_submission(found[name])
                    nb, norm_flags = normalise(learner, release, name)
                except Unreadable as err:
                    self.skipped.append({"student": student, "notebook": name, "reason": str(err)})
                    continue
                except Exception as err:  # noqa: BLE001 - one broken file never stops the batch
                    self.skipped.append(
                        {
                            "student": student,
                            "notebook": name,
                            "reason": f"could not be normalised: {type(err).__name__}: {err}"[:300],
                        }
                    )
                    continue
                path = self.course / "submitted" / student / name / f"{name}.ipynb"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(dumps_notebook(nb), encoding="utf-8")
                self.items.append(Item(student, name, path, flags + norm_flags))
        self.say(
            f"{len(self.items)} notebooks from {len(students)} students to grade"
            + (f", {len(self.skipped)} unreadable" if self.skipped else "")
        )

    def write_plans(self) -> None:
        for item in self.items:
            folder = self.course / "recheck" / item.student
            folder.mkdir(parents=True, exist_ok=True)
            source = read_json(Path(self.args.solutions) / f"{item.notebook}.ipynb")
            plan = build_plan(
                source, read_json(item.path), item.notebook, self.names, slice_given=not self.args.recheck_all_cells
            )
            item.flags += plan["notes"]
            (folder / f"{item.notebook}.plan.json").write_text(json.dumps(plan, indent=1))

    # ------------------------------------------------------------------ processes
    def env(self) -> dict:
        env = dict(os.environ)
        env.setdefault("HF_HUB_OFFLINE", "1")
        env["TOKENIZERS_PARALLELISM"] = "false"
        env["MPLBACKEND"] = "Agg"
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        if self.args.jobs > 1:  # one core per process: more processes, not more threads
            for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
                env[var] = "1"
        return env

    def start_worker(self, index: int) -> Proc:
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
        (self.out / "logs").mkdir(parents=True, exist_ok=True)
        return Proc(args, self.out / "logs" / f"worker{index}.log", self.env(), f"worker{index}")

    def start_server(self) -> Proc:
        (self.out / "logs").mkdir(parents=True, exist_ok=True)
        args = [sys.executable, "-I", "-m", "instructor.recheck", "--serve"]
        env = self.env()
        env["OMP_NUM_THREADS"] = "1"
        return Proc(args, self.out / "logs" / "recheck.log", env, "recheck")

    # ------------------------------------------------------------------ the run
    def run(self) -> int:
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
        self.write_plans()
        if self.items:
            self.grade_all()
        self.report()
        return 0

    def grade_all(self) -> None:
        jobs = max(1, self.args.jobs)
        n_workers = min(jobs, len(self.items))
        workers = [self.start_worker(i) for i in range(n_workers)]
        server = self.start_server()
        selector = selectors.DefaultSelector()
        for proc in [*workers, server]:
            selector.register(proc.popen.stdout, selectors.EVENT_READ, proc)
        to_grade = deque(sorted(self.items, key=lambda it: (-self._weight(it.notebook), it.student)))
        to_check = deque(sorted(self.items, key=lambda it: (-self._weight(it.notebook), it.student)))
        running_checks: dict[str, Item] = {}
        finalize_queue: dict[int, deque] = {i: deque() for i in range(n_workers)}
        self.remaining = len(self.items)
        check_id = 0
        grading_budget = self.args.notebook_timeout + 120
        self.say(f"grading with {n_workers} nbgrader processes and the clean re-check")
        while self.remaining:
            # dispatch: finalize first (quick), then autograde / re-check within `jobs` busy slots
            for index, proc in enumerate(workers):
                if proc.ready and proc.busy is None and finalize_queue[index]:
                    item = finalize_queue[index].popleft()
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
                folder = self.course / "recheck" / item.student
                server.send(
                    {
                        "id": key,
                        "plan": str(folder / f"{item.notebook}.plan.json"),
                        "result": str(folder / f"{item.notebook}.result.jsonl"),
                        "log": str(folder / f"{item.notebook}.log"),
                        "cell_timeout": self.args.cell_timeout,
                        "notebook_timeout": self.args.notebook_timeout,
                        "memory_bytes": int(self.args.memory_gb * (1 << 30)),
                    },
                    float("inf"),
                    None,
                )
                server.busy = None
                busy += 1
            # wait for replies
            for key, _ in selector.select(timeout=0.2):
                proc = key.data
                for reply in proc.read_lines():
                    if reply.get("__eof__"):
                        selector.unregister(proc.popen.stdout)
                        if proc is server:
                            raise RuntimeError(f"the re-check process stopped; see {self.out / 'logs' / 'recheck.log'}")
                        self._worker_died(workers, proc, finalize_queue, to_grade, selector, "exited")
                        break
                    if reply.get("ready"):
                        proc.ready = True
                        continue
                    if proc is server:
                        item = running_checks.pop(reply["id"])
                        item.recheck = self._read_recheck(item, reply)
                        self.remaining -= self._maybe_finish(item, finalize_queue)
                        continue
                    op, item = proc.busy
                    proc.busy = None
                    proc.deadline = float("inf")
                    if op == "autograde":
                        item.autograde = reply
                        item.timings["nbgrader"] = time.monotonic() - item.started
                        self.remaining -= self._maybe_finish(item, finalize_queue)
                    else:
                        item.final = reply
                        self.remaining -= 1
                        self._progress(item)
            now = time.monotonic()
            for proc in workers:
                if proc.busy and now > proc.deadline:
                    self._worker_died(workers, proc, finalize_queue, to_grade, selector, "stopped (time limit)")
        self.merge(workers)
        for proc in workers:
            proc.close()
        server.close()
        shutil.rmtree(self.course / ".workers", ignore_errors=True)  # everything worth keeping was copied out

    @staticmethod
    def _weight(name: str) -> int:
        return int(name[:2]) if name[:2].isdigit() else 0  # later notebooks run longer: start them first

    def _worker_died(self, workers, proc, finalize_queue, to_grade, selector, why):
        index = workers.index(proc)
        busy = proc.busy
        proc.kill()
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
                finalize_queue[index].appendleft(item)

    def _read_recheck(self, item: Item, reply: dict) -> dict:
        path = self.course / "recheck" / item.student / f"{item.notebook}.result.jsonl"
        tests, events = {}, []
        if path.exists():
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if event.get("type") == "test":
                    tests[event["grade_id"]] = event
                elif event.get("type") in ("violation", "note", "excluded"):
                    events.append(event)
        status = reply.get("status")
        if status == "killed":
            events.append({"type": "note", "message": "the re-check was stopped at the notebook's time limit"})
        elif reply.get("returncode"):
            events.append({"type": "note", "message": f"the re-check process failed (exit {reply.get('returncode')})"})
        item.timings["re-check"] = reply.get("wall") or 0.0
        return {"tests": tests, "events": events, "wall": reply.get("wall")}

    def _maybe_finish(self, item: Item, finalize_queue) -> int:
        if item.autograde is None or item.recheck is None:
            return 0
        self._score(item)
        if item.worker is None:
            return 1
        finalize_queue[item.worker].append(item)
        return 0

    def _score(self, item: Item) -> None:
        source = read_source_notebook(item.notebook, Path(self.args.solutions))
        grades = item.autograde.get("grades", {})
        errors = item.autograde.get("errors", {})
        checks = item.recheck["tests"]
        item.overrides, item.comments = {}, {}
        flags = item.flags
        if not item.autograde.get("success"):
            flags.append((item.autograde.get("error") or "the nbgrader run failed").strip().splitlines()[-1][:300])
        flags += item.autograde.get("stopped", [])
        for event in item.recheck["events"]:
            if event["type"] == "violation":
                flags.append(f"re-check refused: {event['message']}"[:400])
            elif event["type"] == "excluded":
                flags.append(f"re-check left out {event['message']}"[:400])
        notes = [e["message"] for e in item.recheck["events"] if e["type"] == "note"]
        for test in source.tests:
            grade = grades.get(test.grade_id, {})
            auto = grade.get("auto_score")
            nb_score = float(auto) if auto is not None else 0.0
            check = checks.get(test.grade_id, {"passed": False, "message": "no re-check result"})
            passed = bool(check.get("passed"))
            score = nb_score if passed else 0.0
            reason = ""
            if nb_score < test.points:
                reason = errors.get(test.grade_id) or ("not graded by nbgrader" if auto is None else "failed")
            elif not passed:
                reason = f"the clean re-check failed: {check.get('message')}"
                flags.append(
                    f"{test.grade_id}: nbgrader passed it but the clean re-check did not ({check.get('message')})"[:400]
                )
            item.overrides[test.grade_id] = {"score": score if auto is None or score != nb_score else None}
            if not passed and test.exercise and nb_score > 0:
                item.comments[test.exercise] = (
                    f"The grader's clean re-check of {test.grade_id} failed, so it scores 0: {check.get('message')}"
                )
            item.rows.append(
                {
                    "student": item.student,
                    "notebook": item.notebook,
                    "exercise": test.exercise or "",
                    "grade_id": test.grade_id,
                    "score": score,
                    "max_score": test.points,
                    "nbgrader_score": nb_score,
                    "recheck": "passed" if passed else "failed",
                    "reason": reason[:500],
                }
            )
        item.notes = notes

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
        proc = next(p for p in workers if p.ready)
        proc.send(
            {"op": "merge", "db_path": str(self.course / "gradebook.db"), "records": records}, 300, ("merge", None)
        )
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            import select

            select.select([proc.popen.stdout], [], [], 0.5)
            lines = proc.read_lines()
            if lines:
                if not lines[0].get("success"):
                    self.say(f"merging into the gradebook failed: {lines[0].get('error', '')[-500:]}")
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
            "recheck",
            "flags",
            "reason",
        ]
        flags_of = {(it.student, it.notebook): " | ".join(it.flags) for it in self.items}
        with open(self.out / "grades.csv", "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=fields)
            writer.writeheader()
            for row in sorted(rows, key=lambda r: (r["student"], r["notebook"])):
                writer.writerow({**row, "flags": flags_of[(row["student"], row["notebook"])]})
        with open(self.out / "summary.csv", "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=["student", "notebook", "score", "max_score", "status", "flags"])
            writer.writeheader()
            for item in sorted(self.items, key=lambda it: (it.student, it.notebook)):
                writer.writerow(
                    {
                        "student": item.student,
                        "notebook": item.notebook,
                        "score": sum(r["score"] for r in item.rows),
                        "max_score": sum(r["max_score"] for r in item.rows),
                        "status": "graded",
                        "flags": " | ".join(item.flags),
                    }
                )
            for skipped in self.skipped:
                max_score = 0.0
                if skipped["notebook"]:
                    max_score = read_source_notebook(skipped["notebook"], Path(self.args.solutions)).max_score
                writer.writerow(
                    {
                        "student": skipped["student"],
                        "notebook": skipped["notebook"],
                        "score": 0,
                        "max_score": max_score,
                        "status": skipped.get("status", "unreadable"),
                        "flags": skipped["reason"],
                    }
                )
        total = time.monotonic() - self.t0
        self.say(
            f"done in {total:.1f} s: {self.out / 'grades.csv'}, {self.out / 'summary.csv'}"
            + ("" if self.args.no_feedback else f", {self.out / 'feedback'}")
        )


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
    parser.add_argument("--memory-gb", type=float, default=4.0, help="memory per kernel/re-check (default 4 GB)")
    parser.add_argument("--notebooks", nargs="+", help="grade only these notebooks (e.g. 01_layernorm)")
    parser.add_argument("--no-feedback", action="store_true", help="skip the feedback HTML")
    parser.add_argument(
        "--recheck-all-cells", action="store_true", help="re-check with every given cell, not only those the tests need"
    )
    parser.add_argument("--solutions", type=Path, default=SOLUTIONS_DIR, help=argparse.SUPPRESS)
    parser.add_argument("--quiet", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return Grader(parse_args(argv)).run()


if __name__ == "__main__":
    sys.exit(main())
