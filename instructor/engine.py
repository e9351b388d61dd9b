"""Grading a batch across machines on Ray: `python -m instructor.grade SUBMISSIONS --out OUT --engine ray`.

The coordinator (this module, in the `instructor.grade` process) reads the submissions as data, draws the judge's
probes for every student and keeps their expected outputs, and sends one Ray task per student: the grading
bundle (`make_bundle`, shipped once through Ray's object store), the student's normalised notebooks and the
judge's inputs. Each task runs `python -m instructor.grade_one` (the sandboxed grader of a single-machine batch,
on one student) in a scratch folder of its node and returns the job's output folder as a tar archive. The
coordinator then compares the judge's raw outputs with what it kept, scores every test exactly as a
single-machine batch does (`Grader._score`), sends a second task per student for nbgrader's feedback pages, and
alone writes the gradebook, the CSVs and the feedback folder.

Ray is used as an engine only: tasks, its object store and its scheduler. Nothing here keeps state on a worker
between tasks but the unpacked bundle (one per node, keyed by its digest). Failures are handled here rather than
by Ray's own `max_retries`, so that each is counted and logged (`OUT/logs/jobs.jsonl`): a task whose worker or
node was lost, that ran out of memory or whose job crashed is sent again up to `--retries` times, then its rows
are recorded as failed; a task past `--task-timeout` is cancelled (its job stops with its worker) and recorded;
a result that arrives for a student already done is dropped and counted.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from instructor import judge
from instructor.course import encodable

BUNDLE_CACHE = Path(tempfile.gettempdir()) / "tfs-bundles"
# Environment a job inherits from the coordinator, so that every machine grades in the same mode.
PASSED_ENV = ("COURSE_FAST", "HF_HUB_OFFLINE")


# ---------------------------------------------------------------------- files in and out of tasks
def pack(folder: Path, only: str = "") -> bytes:
    """The folder (or only its sub-folder `only`, at the same place in the archive) as a tar.gz."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=3) as tar:
        for path in sorted((folder / only).rglob("*")):
            if path.is_symlink() or not (path.is_file() or path.is_dir()):
                continue  # a job's output holds plain files and folders only
            tar.add(path, arcname=str(path.relative_to(folder)), recursive=False)
    return buffer.getvalue()


def unpack(data: bytes, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(dest, filter="data")  # no links out, no devices, no absolute paths


def make_bundle(grader, dest: Path) -> Path:
    """What every job needs from the coordinator: the nbgrader course, the solutions, the grading options."""
    course, solutions = dest / "course", dest / "solutions"
    course.mkdir(parents=True)
    for entry in ("source", "release"):
        shutil.copytree(grader.course / entry, course / entry)
    for entry in ("gradebook.db", "nbgrader_config.py"):
        shutil.copyfile(grader.course / entry, course / entry)
    solutions.mkdir()
    for name in grader.names:
        shutil.copyfile(Path(grader.args.solutions) / f"{name}.ipynb", solutions / f"{name}.ipynb")
    args = grader.args
    options = {
        "jobs": max(1, round(args.task_cpus)),
        "cell_timeout": args.cell_timeout,
        "notebook_timeout": args.notebook_timeout,
        "memory_gb": args.memory_gb,
        "notebooks": args.notebooks,
        "cold_kernels": args.cold_kernels,
        "no_sandbox": args.no_sandbox,
        "env": {key: os.environ[key] for key in PASSED_ENV if key in os.environ},
    }
    (dest / "options.json").write_text(json.dumps(options, indent=1))
    return dest


def _node_bundle(data: bytes, digest: str) -> Path:
    """The bundle, unpacked once per node (root-only: it holds the solutions)."""
    path = BUNDLE_CACHE / digest
    if (path / "options.json").exists():
        return path
    BUNDLE_CACHE.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{digest}.", dir=BUNDLE_CACHE))
    unpack(data, tmp)
    try:
        tmp.rename(path)
    except OSError:  # another task on this node got there first
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def run_task(kind: str, bundle: bytes, digest: str, payload: dict) -> dict:
    """The body of every Ray task: one `instructor.grade_one` job in a scratch folder, its output as bytes."""
    import ray

    started = time.time()
    node = _node_bundle(bundle, digest)
    work = Path(tempfile.mkdtemp(prefix="tfs-job-"))
    os.chmod(work, 0o700)
    try:
        out = work / "out"
        cmd = [sys.executable, "-m", "instructor.grade_one", "--bundle", str(node), "--out", str(out), "--quiet"]
        if kind == "grade":
            submission = work / "submission"
            submission.mkdir()
            for name, text in payload["notebooks"].items():
                (submission / f"{name}.ipynb").write_text(text, encoding="utf-8")
            cmd += [str(submission), "--student", payload["student"]]
            if payload.get("judge"):
                unpack(payload["judge"], work / "judge")
                cmd += ["--judge-inputs", str(work / "judge")]
        else:
            unpack(payload["job"], work / "job")
            (work / "records.json").write_text(json.dumps(payload["records"]))
            cmd += ["--feedback-for", str(work / "job"), "--records", str(work / "records.json")]
        from instructor.grade_one import die_with_parent

        run = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            check=False,
            cwd=work,
            preexec_fn=die_with_parent,  # a job never outlives its task
            timeout=payload.get("timeout"),
        )
        return {
            "returncode": run.returncode,
            "log": run.stderr[-4000:],
            "tar": pack(out) if out.is_dir() else None,
            "node": ray.get_runtime_context().get_node_id(),
            "host": os.uname().nodename,
            "seconds": time.time() - started,
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------------- the coordinator
def _why(err: Exception) -> str:
    """One line for the log and the rows: the task's own exception where it raised one (Ray wraps it in a
    RayTaskError whose first line is a coloured header), else Ray's (a node died, out of memory, ...)."""
    cause = getattr(err, "cause", None)
    shown = cause if isinstance(cause, BaseException) else err
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(shown)).strip()
    return f"{type(shown).__name__}: {(text.splitlines() or [''])[0][:300]}"


@dataclass
class Task:
    key: str
    kind: str
    payload: (
        object  # a dict, or a function making it when the task is sent (so a class's inputs are never all in memory)
    )
    attempt: int = 0
    started: float = 0.0
    failures: list[str] = field(default_factory=list)


class RayBatch:
    def __init__(self, grader):
        self.g = grader
        self.args = grader.args
        self.log = grader.out / "logs" / "jobs.jsonl"
        self.retried = self.duplicates = self.cancelled = 0
        if self.args.task_timeout is None:  # every notebook's own limit, with room for the job's start and finish
            per_student = max(
                len([it for it in grader.items if it.student == s]) for s in {i.student for i in grader.items}
            )
            self.args.task_timeout = 600 + (self.args.notebook_timeout + 120) * per_student

    def record(self, **entry) -> None:
        with open(self.log, "a", encoding="utf-8") as f:
            f.write(json.dumps({"time": round(time.time(), 3), **entry}) + "\n")

    def connect(self):
        try:
            import ray
        except ImportError:
            raise SystemExit(
                "--engine ray needs Ray on this machine and every node: pip install -e '.[cluster]' "
                "(docs/cluster-grading.md)"
            ) from None
        address = self.args.address or os.environ.get("RAY_ADDRESS")
        # The job runs its own interpreter (the worker's), found on the worker's own sys.path: the course must be
        # installed on every node (docs/cluster-grading.md); nothing of this machine's working folder is shipped.
        if address and address != "auto" and ":" in address:
            # Ray retries an unreachable head for minutes, silently: one connection attempt says it at once.
            host, _, port = address.rpartition(":")
            try:
                socket.create_connection((host.split("://")[-1], int(port)), timeout=5).close()
            except (OSError, ValueError) as err:
                raise SystemExit(
                    f"cannot reach the Ray cluster at {address} ({err}). Is `ray start --head` running there, and "
                    "its port open to this machine?"
                ) from None
        try:
            ray.init(address=address, logging_level="WARNING", log_to_driver=False)
        except Exception as err:  # noqa: BLE001 - said in one line, with what to check
            raise SystemExit(
                f"cannot connect to the Ray cluster at {address}: {type(err).__name__}: {str(err)[:300]}. Is "
                "`ray start --head` running there, with the same Ray version and RAY_AUTH_TOKEN as here?"
            ) from None
        cpus = ray.cluster_resources().get("CPU", 0)
        self.g.say(f"ray: {len(ray.nodes())} nodes, {cpus:g} CPUs ({address or 'a local cluster started here'})")
        if cpus < self.args.task_cpus:
            self.g.say(
                f"WARNING: the cluster has {cpus:g} CPUs and each task needs {self.args.task_cpus:g}: tasks wait for "
                "a node to join (`ray start --address ...`) and are cancelled after --task-timeout"
            )
        return ray

    def slots(self, ray) -> int:
        """Tasks to keep in flight: as many as the live nodes can run at once, so that a task's clock starts about
        when it runs (a node lost or added changes it)."""
        return max(1, int(ray.cluster_resources().get("CPU", 0) // self.args.task_cpus))

    def gather(self, ray, remote, tasks: list[Task], what: str, bundle_ref, digest, on_result=None) -> dict[str, dict]:
        """Run every task; key -> the job's reply (what `on_result(task, reply)` makes of it, as it arrives, so that
        a class's outputs are never all in memory), or {"failed": why} once its attempts are spent."""
        queue, pending, results = list(tasks), {}, {}
        total = len(tasks)
        last_line = 0.0
        while queue or pending:
            while queue and len(pending) < self.slots(ray):
                task = queue.pop(0)
                task.attempt += 1
                task.started = time.monotonic()
                payload = task.payload() if callable(task.payload) else task.payload
                ref = remote.remote(task.kind, bundle_ref, digest, payload)
                del payload
                pending[ref] = task
                self.record(event="sent", what=what, key=task.key, attempt=task.attempt)
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            for ref in ready:
                task = pending.pop(ref)
                try:
                    reply = ray.get(ref)
                    problem = self.job_problem(reply)
                except ray.exceptions.RayError as err:
                    reply, problem = None, _why(err)
                if task.key in results:  # once per student, whatever arrives later
                    self.duplicates += 1
                    self.record(event="duplicate", what=what, key=task.key)
                    continue
                if problem:
                    task.failures.append(problem)
                    self.record(event="lost", what=what, key=task.key, attempt=task.attempt, why=problem)
                    if task.attempt <= self.args.retries:
                        self.retried += 1
                        queue.insert(0, task)
                        self.g.say(f"{what} {task.key}: {problem}; sending it again (attempt {task.attempt + 1})")
                    else:
                        results[task.key] = {"failed": f"{task.attempt} attempts: {' / '.join(task.failures)}"}
                    continue
                results[task.key] = on_result(task, reply) if on_result else reply
                self.record(
                    event="done",
                    what=what,
                    key=task.key,
                    attempt=task.attempt,
                    node=reply["node"],
                    host=reply["host"],
                    seconds=round(reply["seconds"], 2),
                    returncode=reply["returncode"],
                )
            now = time.monotonic()
            for ref, task in list(pending.items()):
                if now - task.started > self.args.task_timeout:
                    ray.cancel(ref, force=True)  # kills its worker; the job goes with it (die_with_parent)
                    pending.pop(ref)
                    self.cancelled += 1
                    why = f"cancelled after {self.args.task_timeout} s (--task-timeout)"
                    self.record(event="cancelled", what=what, key=task.key, attempt=task.attempt)
                    results[task.key] = {"failed": why}
            if ready or now - last_line > 30:
                last_line = now
                failed = sum(1 for r in results.values() if "failed" in r)
                self.g.say(
                    f"{what}: {len(results)}/{total} done ({len(pending)} running, {len(queue)} waiting; "
                    f"{self.retried} sent again, {failed} failed)"
                )
        return results

    @staticmethod
    def job_problem(reply: dict) -> str | None:
        """Why a job that ran to its end is to be sent again: it wrote nothing (it refused to grade, say, where a
        node has no sandbox), or its grader stopped (a template that would not start on that node)."""
        if reply.get("tar") and reply.get("returncode") != 2:
            return None
        last = [line for line in (reply.get("log") or "").splitlines() if line.strip()][-1:] or [""]
        what = "its grader stopped" if reply.get("tar") else "the job returned no output"
        return f"{what} (exit {reply.get('returncode')}) on {reply.get('host')}: {last[0][-300:]}"

    def run(self) -> None:
        g = self.g
        ray = self.connect()
        remote = ray.remote(num_cpus=self.args.task_cpus, max_retries=0)(run_task)
        by_student: dict[str, list] = {}
        for item in g.items:
            by_student.setdefault(item.student, []).append(item)
        with tempfile.TemporaryDirectory(prefix="tfs-coordinator-") as scratch:
            scratch = Path(scratch)
            bundle = make_bundle(g, scratch / "bundle")
            data = pack(bundle)
            digest = hashlib.sha256(data).hexdigest()[:16]
            bundle_ref = ray.put(data)
            # The judge's probes for each student, drawn when its task is sent (afresh for a task sent again): the
            # inputs travel with the task, the expected outputs stay here until its result comes back.
            prepared: dict[tuple[str, str], judge.Prepared] = {}
            jobs = scratch / "jobs"

            def grading_payload(student: str, items: list):
                def make() -> dict:
                    inputs = scratch / "judge" / student
                    shutil.rmtree(inputs, ignore_errors=True)
                    for item in items:
                        if item.notebook in judge.PROBES:
                            self.prepare(item, inputs, prepared)
                    return {
                        "student": student,
                        "notebooks": {it.notebook: it.path.read_text(encoding="utf-8") for it in items},
                        "judge": pack(inputs) if inputs.is_dir() else None,
                        "timeout": self.args.task_timeout,
                    }

                return make

            def graded(task: Task, reply: dict) -> dict:
                self.guarded(self.take, task.key, by_student[task.key], reply, jobs / task.key, prepared)
                return {"host": reply["host"]}

            tasks = [Task(student, "grade", grading_payload(student, items)) for student, items in by_student.items()]
            g.say(f"grading {len(tasks)} students on Ray, one task each ({self.args.task_cpus:g} CPUs per task)")
            results = self.gather(ray, remote, tasks, "grading", bundle_ref, digest, graded)
            for student, reply in results.items():
                if "failed" in reply:
                    self.take(student, by_student[student], reply, jobs / student, prepared)
            # nbgrader's feedback pages, once the scores are known: a second, short task per student.
            if not self.args.no_feedback:

                def feedback_payload(student: str, records: list):
                    return lambda: {
                        "job": pack(jobs / student, "course/autograded"),
                        "records": records,
                        "timeout": self.args.task_timeout,
                    }

                def fed(task: Task, reply: dict) -> dict:
                    self.guarded(self.take_feedback, task.key, reply, by_student[task.key])
                    return {"host": reply["host"]}

                fb_tasks = []
                for student, items in by_student.items():
                    records = [self.gradebook_record(it) for it in items if it.status == "graded"]
                    if records and (jobs / student / "course" / "autograded").is_dir():
                        fb_tasks.append(Task(student, "feedback", feedback_payload(student, records)))
                feedback = self.gather(ray, remote, fb_tasks, "feedback", bundle_ref, digest, fed)
                for student, reply in feedback.items():
                    if "failed" in reply:
                        self.take_feedback(student, reply, by_student[student])
        self.write_gradebook()
        g.say(
            f"ray: {self.retried} tasks sent again, {self.cancelled} cancelled, {self.duplicates} duplicate results "
            f"dropped; every task in {self.log}"
        )

    def prepare(self, item, inputs: Path, prepared: dict) -> None:
        try:
            prepared[(item.student, item.notebook)] = judge.prepare(item.notebook, inputs / item.notebook)
        except Exception as err:  # noqa: BLE001 - a broken judge fails its tests (flagged), never the batch
            message = f"the judge could not prepare its probes: {type(err).__name__}: {err}"[:300]
            if message not in item.flags:
                item.flags.append(message)
            item.judged = judge.no_result(item.notebook, message)

    def take(self, student: str, items: list, reply: dict, job: Path, prepared: dict) -> None:
        """One job's results into the coordinator's items: the judge's verdicts computed here, then the scores."""
        g = self.g
        if "failed" in reply:
            for item in items:
                self.fail(item, f"the grading job failed: {reply['failed']}")
            return
        unpack(reply.pop("tar"), job)
        result = encodable(json.loads((job / "result.json").read_text()))
        returned = {entry["notebook"]: entry for entry in result["items"]}
        course = g.course
        (course / "judge" / student).mkdir(parents=True, exist_ok=True)
        for folder in ("autograded", "judge"):
            src = job / "course" / folder / student
            if src.is_dir():
                shutil.copytree(src, course / folder / student, dirs_exist_ok=True)
        # everything of a student's in a folder named by the id alone: a path made of an id and a suffix is another
        # student's folder for some id (`alice` and `alice.stderr.log` stopped a batch with no CSVs: round 25)
        logs = g.out / "logs" / "jobs" / student
        if (job / "logs").is_dir():
            shutil.copytree(job / "logs", logs / "job", dirs_exist_ok=True)
        logs.mkdir(parents=True, exist_ok=True)
        (logs / "task.stderr.log").write_text(reply.get("log") or "")
        for item in items:
            entry = returned.get(item.notebook)
            if entry is None or entry["autograde"] is None or entry["probed"] is None:
                why = result.get("not_graded") or "the job returned no result for this notebook"
                self.fail(item, f"not graded: {why}".splitlines()[0][:500])
                continue
            item.autograde, item.probed = entry["autograde"], entry["probed"]
            item.flags += entry["flags"]
            item.timings = entry["timings"]
            key = (student, item.notebook)
            if key in prepared:
                run = prepared.pop(key)
                outputs = job / "probes" / item.notebook
                if entry["judge_outputs"] and outputs.is_dir():
                    run.folder = outputs  # judge.verdicts reads run.folder/out, then removes the folder
                    item.probes = run
                    g._judge(item)
                else:
                    item.judged = judge.no_result(
                        item.notebook, "no output returned (the judge's probes did not finish)"
                    )
            g._score(item)
            g.done += 1
            score = sum(r["score"] for r in item.rows)
            total = sum(r["max_score"] for r in item.rows)
            g.say(f"{g.done}/{len(g.items)} {student}/{item.notebook}: {score:g}/{total:g} on {reply['host']}")

    def guarded(self, take, student: str, *args) -> None:
        """`take(student, *args)`, whose failure is recorded on that student's rows: one student's results never end
        the batch (a folder where a file was due stopped it with no CSVs: red-team round 25)."""
        try:
            take(student, *args)
        except Exception as err:  # noqa: BLE001 - the rest of the batch goes on
            traceback.print_exc()
            why = f"the coordinator could not take this student's results: {type(err).__name__}: {err}"
            for item in self.g.items:
                if item.student != student:
                    continue
                if item.rows:
                    item.flags.append(why[:400])
                else:
                    self.fail(item, why)

    def fail(self, item, reason: str) -> None:
        item.status = "failed"
        item.flags.append(reason[:400])
        item.zero_rows(Path(self.args.solutions), reason[:500])

    @staticmethod
    def gradebook_record(item) -> dict:
        """What a single-machine batch's nbgrader worker stores: nbgrader's auto score, and a manual score only
        where the grader's differs (or nbgrader gave none)."""
        autos = (item.autograde or {}).get("grades", {})
        grades = {}
        for row in item.rows:
            auto = autos.get(row["grade_id"], {}).get("auto_score")
            manual = item.overrides.get(row["grade_id"], {}).get("score")
            grades[row["grade_id"]] = {"auto_score": auto, "manual_score": manual}
        return {
            "student": item.student,
            "notebook": item.notebook,
            "grades": grades,
            "comments": item.comments,
            "flagged": bool(item.flags),
        }

    def take_feedback(self, student: str, reply: dict, items: list) -> None:
        g = self.g
        if "failed" in reply or not reply.get("tar"):
            for item in items:
                item.flags.append(f"no feedback page: {reply.get('failed') or 'the feedback job returned nothing'}")
            return
        with tempfile.TemporaryDirectory() as tmp:
            unpack(reply["tar"], Path(tmp))
            for item in items:
                page = Path(tmp) / student / f"{item.notebook}.html"
                note = page.with_suffix(".note")
                if note.is_file() and not note.is_symlink():  # the worker's stand-in page, as the local batch flags it
                    item.flags.append(note.read_text(encoding="utf-8", errors="replace")[:400])
                if not page.is_file():
                    if item.status == "graded":
                        item.flags.append("no feedback page: nbgrader could not make it")
                    continue
                dest = g.out / "feedback" / student / f"{item.notebook}.html"
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(page, dest)
                master = g.course / "feedback" / student / item.notebook
                master.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(page, master / f"{item.notebook}.html")

    def write_gradebook(self) -> None:
        """The coordinator alone writes the gradebook, once every result is in."""
        from instructor.worker import Worker

        g = self.g
        records = []
        for item in g.items:
            record = self.gradebook_record(item)
            for row in item.rows:
                if item.status != "graded":
                    record["grades"][row["grade_id"]] = {"auto_score": None, "manual_score": 0.0}
            records.append(record)
        worker = Worker(g.course, self.args.cell_timeout, self.args.notebook_timeout)
        with warnings.catch_warnings():  # nbgrader's SQLAlchemy use warns on every new submission; it is harmless
            warnings.simplefilter("ignore")
            worker.merge(str(g.course / "gradebook.db"), records)


def run_ray(grader) -> None:
    RayBatch(grader).run()
