"""One grading job: one student's notebooks and the course's grading bundle in, that student's results out.

    python -m instructor.grade_one SUBMISSION_DIR --bundle BUNDLE --student ID --out JOB_OUT [--judge-inputs DIR]
    python -m instructor.grade_one --feedback-for JOB_OUT --bundle BUNDLE --records RECORDS.json --out FEEDBACK_OUT

This is what `python -m instructor.grade --engine ray` runs on each machine, one task per student. It needs nothing
from the coordinator's disk but what it is given, shares nothing with other jobs but files, and opens no gradebook
but a private copy, so any engine that can run a command and move files can run it.

- BUNDLE (made by the coordinator, `instructor.engine.make_bundle`): the nbgrader course (`course/`: source with
  the hidden tests, release, an empty gradebook, nbgrader_config.py), the solution notebooks (`solutions/`, which
  the sandbox shows to the template only) and `options.json` (time and memory limits, notebooks to grade).
- `--judge-inputs DIR`: the judge's probes for this student, drawn by the coordinator (`DIR/<notebook>/`: the
  inputs and random weights, never the expected outputs). The job runs them in the sandbox and
  hands back the learner's raw outputs (`JOB_OUT/probes/<notebook>/out/`); the coordinator compares them with the
  outputs it kept, so the judge's secrets never reach a worker.
- JOB_OUT, written atomically (built beside it, then renamed): `result.json` (per notebook: nbgrader's scores,
  how its probe job ended, flags, timings), `course/autograded/`, `course/judge/` (plans, the probe
  children's logs), `probes/`, `logs/`. Nothing is scored here: the score needs the judge's verdicts.

The second form makes the feedback pages once the coordinator has scored the job: RECORDS.json holds, per
notebook, the grades and comments the coordinator decided; the pages go to FEEDBACK_OUT/<student>/<notebook>.html.

The job runs the same sandboxed grader as a single-machine batch (`instructor.grade.Grader`), so every protection
described in docs/grading.md holds on every machine: learner code has no network (so no way to Ray's ports), no
view of the bundle's solutions or of this job's outputs, a uid and cgroups of its own.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import signal
import socket
import sys
import time
from pathlib import Path
from types import SimpleNamespace

# Stops the job at once when whatever started it dies (a Ray worker killed with its node, a cancelled task): the
# grader's own clean-up then runs and the sandbox, which dies with its parent, goes with it.
PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """For subprocess's preexec_fn: SIGTERM when the parent goes."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the engine's own time limit still applies
        pass


def _on_term(signum, frame):
    raise SystemExit(f"stopped by signal {signum}")


def _kill_descendants() -> None:
    try:
        import psutil

        children = psutil.Process().children(recursive=True)
    except Exception:  # noqa: BLE001
        return
    for child in children:
        try:
            child.kill()
        except Exception:  # noqa: BLE001, S110 - already gone
            pass


def _atomic_dir(out: Path) -> Path:
    """A fresh folder beside `out`, to be renamed onto it once complete: a reader sees all of a job or none."""
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def _publish(tmp: Path, out: Path) -> None:
    if out.exists():  # a retried job: the newer complete result replaces the older one whole
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(out)


def _course_from_bundle(bundle: Path, course: Path) -> None:
    course.mkdir(parents=True, exist_ok=True)
    for entry in ("source", "release"):
        shutil.copytree(bundle / "course" / entry, course / entry, dirs_exist_ok=True)
    for entry in ("gradebook.db", "nbgrader_config.py"):
        shutil.copyfile(bundle / "course" / entry, course / entry)


def grade_job(
    submission: Path, bundle: Path, student: str, out: Path, judge_inputs: Path | None = None, quiet: bool = False
) -> int:
    """Grade one student's folder; 0 when every notebook was graded, 2 when the grader had to stop (the result
    then says why, and which notebooks were not graded)."""
    from instructor.grade import Grader, TemplateFailed

    options = json.loads((bundle / "options.json").read_text())
    for key, value in (options.get("env") or {}).items():
        os.environ.setdefault(key, value)
    out = Path(out).resolve()
    tmp = _atomic_dir(out)
    args = SimpleNamespace(
        submissions=Path(submission),
        out=tmp,
        jobs=options.get("jobs", 1),
        cell_timeout=options["cell_timeout"],
        notebook_timeout=options["notebook_timeout"],
        memory_gb=options["memory_gb"],
        notebooks=options.get("notebooks"),
        no_feedback=True,
        cold_kernels=options.get("cold_kernels", False),
        no_sandbox=options.get("no_sandbox", False),
        solutions=(bundle / "solutions").resolve(),
        quiet=quiet,
        job_student=student,
        judge_inputs=Path(judge_inputs).resolve() if judge_inputs else None,
    )
    t0 = time.monotonic()
    grader = Grader(args)
    grader.check_sandbox()
    _course_from_bundle(bundle, grader.course)
    grader.collect()
    collected = {id(item): len(item.flags) for item in grader.items}
    grader.write_plans()
    try:
        if grader.items:
            grader.grade_all()
    except TemplateFailed as err:
        grader.not_graded = str(err)
    finally:
        _kill_descendants()
        grader.end_sandbox()
    items = []
    for item in grader.items:
        items.append(
            {
                "notebook": item.notebook,
                "autograde": item.autograde,
                "probed": item.probed,
                # the coordinator collected this folder too and keeps its own collection flags
                "flags": item.flags[collected[id(item)] :],
                "timings": item.timings,
                "judge_outputs": item.notebook in grader.job_outputs,
            }
        )
    result = {
        "student": student,
        "items": items,
        "skipped": grader.skipped,
        "not_graded": grader.not_graded,
        "seconds": time.monotonic() - t0,
        "host": socket.gethostname(),
        "sandboxed": grader.sandbox,
        "memory_note": grader.memory_note,
    }
    shutil.rmtree(tmp / "course" / "submitted", ignore_errors=True)  # the coordinator has the submission
    for entry in ("source", "release", "gradebook.db", "nbgrader_config.py", ".runtime", ".kernels"):
        path = tmp / "course" / entry
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    (tmp / "result.json").write_text(json.dumps(result, indent=1))
    _publish(tmp, out)
    return 2 if grader.not_graded else 0


def feedback_job(job: Path, bundle: Path, records: list[dict], out: Path) -> int:
    """nbgrader's feedback pages for a job the coordinator has scored, from a private copy of the gradebook."""
    from instructor.worker import Worker

    options = json.loads((bundle / "options.json").read_text())
    out = Path(out).resolve()
    tmp = _atomic_dir(out)
    root = tmp / ".course"
    _course_from_bundle(bundle, root)
    autograded = Path(job) / "course" / "autograded"
    if autograded.is_dir():
        shutil.copytree(autograded, root / "autograded", symlinks=True)
    worker = Worker(root, options["cell_timeout"], options["notebook_timeout"])
    worker.merge(str(root / "gradebook.db"), records)
    failed = 0
    for record in records:
        student, notebook = record["student"], record["notebook"]
        reply = worker.finalize(student, notebook, {}, record.get("comments", {}), record.get("flagged"), True)
        if reply.get("feedback"):
            dest = tmp / student / f"{notebook}.html"
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(reply["feedback"], dest)
            if reply.get("feedback_note"):  # a page that says why it stands in: the coordinator flags the row
                (tmp / student / f"{notebook}.note").write_text(reply["feedback_note"], encoding="utf-8")
        else:
            failed += 1
            print(f"no feedback for {student}/{notebook}: {reply.get('feedback_error', '')[-500:]}", file=sys.stderr)
    shutil.rmtree(root)
    _publish(tmp, out)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m instructor.grade_one",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    parser.add_argument("submission", type=Path, nargs="?", help="one student's folder of notebooks")
    parser.add_argument("--bundle", type=Path, required=True, help="the coordinator's grading bundle")
    parser.add_argument("--out", type=Path, required=True, help="the job's output folder (written atomically)")
    parser.add_argument("--student", help="the student's id (default: the folder's name)")
    parser.add_argument("--judge-inputs", type=Path, help="the judge's probes for this student, per notebook")
    parser.add_argument("--feedback-for", type=Path, metavar="JOB_OUT", help="make feedback pages for this job")
    parser.add_argument("--records", type=Path, help="with --feedback-for: the coordinator's grades (JSON)")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _on_term)
    if args.feedback_for:
        if not args.records:
            parser.error("--feedback-for needs --records")
        return feedback_job(args.feedback_for, args.bundle, json.loads(args.records.read_text()), args.out)
    if args.submission is None:
        parser.error("SUBMISSION_DIR is required")
    if args.submission.is_symlink() or not args.submission.is_dir():
        parser.error(f"{args.submission} is not a folder of its own")
    student = args.student or args.submission.name
    return grade_job(args.submission, args.bundle, student, args.out, args.judge_inputs, args.quiet)


if __name__ == "__main__":
    sys.exit(main())
