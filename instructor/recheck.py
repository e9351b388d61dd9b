"""The clean re-check: run a notebook's graded tests again, in a fresh interpreter, on the learner's definitions.

A template process imports torch, harness and TransformerLens and loads the reference model once, and never
runs learner code. For each submitted notebook it forks a child (a fresh copy of that pristine interpreter) which
installs the guards of `instructor.guards`, then executes the plan of `instructor.plan`: the instructor's given
cells, the learner's definitions and the course's test cells, in the course's order, each step under a time
limit. It writes one JSON line per test to a result file. The template stops a child that runs past the
notebook's time limit; the tests not reported by then count as failed.

    python -m instructor.recheck --serve          # the template (driven by instructor.grade over stdin/stdout)
    python -m instructor.recheck PLAN.json OUT.jsonl   # one plan, in this process (for debugging)
"""

from __future__ import annotations

import argparse
import builtins
import json
import linecache
import os
import random
import resource
import select
import signal
import sys
import time
import traceback
import types


class StepTimeout(BaseException):
    """Raised by the alarm when a step runs past its time limit (a BaseException, so `except Exception` won't eat it)."""


class _IPythonStub:
    """`get_ipython()` for given cells with magics: every magic is a no-op in the re-check."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def _short(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".strip()
    return text if len(text) < 600 else text[:600] + " ..."


class Runner:
    def __init__(self, plan: dict, out, cell_timeout: float, deadline: float, protected=()):
        self.protected = protected
        self.plan = plan
        self.out = out
        self.cell_timeout = cell_timeout
        self.deadline = deadline

    def emit(self, **record) -> None:
        self.out.write(json.dumps(record) + "\n")
        self.out.flush()

    def execute(self, code_text: str, filename: str, namespace: dict) -> str | None:
        """Run one step; the error (or None)."""
        try:
            code = compile(code_text, filename, "exec")
        except SyntaxError as err:
            return f"SyntaxError: {err.msg} (line {err.lineno})"
        linecache.cache[filename] = (len(code_text), None, code_text.splitlines(True), filename)
        timeout = max(0.5, min(self.cell_timeout, self.deadline - time.monotonic()))
        signal.setitimer(signal.ITIMER_REAL, timeout, 1.0)
        try:
            exec(code, namespace)  # noqa: S102 - running the notebook is the point
            return None
        except StepTimeout:
            return f"the cell ran past its {timeout:.0f} s limit"
        except BaseException as err:  # noqa: BLE001 - learner code may raise anything, SystemExit included
            return _short(err)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)

    def run(self) -> None:
        import torch

        import harness
        from instructor.guards import Guards

        plan = self.plan
        guards = Guards(plan["notebook"], plan["order"])
        guards.extra_protected_paths = list(self.protected)
        guards.install()
        module = types.ModuleType("__notebook__")
        sys.modules["__notebook__"] = module
        ns = module.__dict__
        ns["__builtins__"] = builtins
        ns["get_ipython"] = _IPythonStub()
        pristine = {name: getattr(harness, name) for name in harness.__all__}
        pristine["harness"] = harness
        for name in plan["exercise_names"]:
            pristine.pop(name, None)
        protected = set(plan["protected"])
        trusted: dict[str, object] = {}
        fingerprints: dict[str, tuple] = {}
        snapshot = guards.take_snapshot()
        exercise_problem: dict[str, str] = {}
        compromised: str | None = None
        allowed_globals = {ex: set(info.get("uses", [])) for ex, info in plan["solutions"].items()}

        def refresh(names):
            for name in names:
                value = trusted.get(name)
                if value is not None and Guards.is_instructor_data(value, torch):
                    fingerprints[name] = guards.fingerprint(value)
                else:
                    fingerprints.pop(name, None)

        def changed_data(exclude=()):
            changed = []
            guards._busy = True
            try:
                for name, fp in fingerprints.items():
                    if name not in exclude and guards.fingerprint(trusted[name]) != fp:
                        changed.append(name)
            finally:
                guards._busy = False
            return changed

        def restore_names():
            rebound = []
            for name in protected | set(pristine):
                expected = trusted.get(name, pristine.get(name))
                if name in ns and expected is not None and ns[name] is not expected:
                    rebound.append(name)
                    ns[name] = expected
            return rebound

        for name, model in getattr(sys.modules.get("harness.reference"), "_loaded", {}).items():
            trusted[f"<reference {name}>"] = model
            fingerprints[f"<reference {name}>"] = guards.fingerprint(model)

        reported = set()
        guards.active = True
        for step in plan["steps"]:
            if step.get("skip"):
                continue
            kind = step["kind"]
            if time.monotonic() > self.deadline:
                self.emit(type="note", message="the notebook ran past its time limit; later steps not run")
                break
            before = len(guards.violations)
            problem = None
            if kind == "given":
                error = self.execute(step["code"], step["filename"], ns)
                if error:
                    self.emit(type="note", message=f"given cell {step['cell']}: {error}")
                for name in step["binds"]:
                    if name in ns:
                        trusted[name] = ns[name]
            elif kind == "learner":
                ex = step.get("exercise")
                where = f"exercise {ex}" if ex else f"your cell {step['cell']}"
                if step.get("error"):
                    self.emit(type="note", message=f"{where}: {step['error']}")
                    continue
                if step["findings"]:
                    message = f"{where}: " + "; ".join(step["findings"][:3])
                    if ex:
                        exercise_problem[ex] = message
                        self.emit(type="violation", exercise=ex, cell=step["cell"], message=message)
                    else:
                        self.emit(type="excluded", cell=step["cell"], message=message)
                    continue
                error = self.execute(step["code"], step["filename"], ns)
                if error:
                    self.emit(type="note", message=f"{where}: {error}")
                for name in step.get("defines", []):
                    if isinstance(ns.get(name), type):
                        guards.learner_classes.add(id(ns[name]))
                rebound = restore_names()
                if rebound:
                    self.emit(type="note", message=f"{where} rebinds {', '.join(sorted(rebound))}: ignored")
            else:
                grade_id = step["grade_id"]
                ex = step.get("exercise")
                data_names = {n for n, v in trusted.items() if Guards.is_instructor_data(v, torch)}
                data_names -= allowed_globals.get(ex, set())
                if compromised:
                    problem = compromised
                elif ex in exercise_problem:
                    problem = exercise_problem[ex]
                else:
                    restore_names()
                    for name in step["exercise_names"]:
                        if name in ns:
                            problem = problem or guards.provenance_problem(name, ns[name], ns, data_names)
                    problem = problem or guards.tensor_subclass_problem()
                if problem is None:
                    ns.update(pristine)
                    torch.manual_seed(random.SystemRandom().randrange(2**31))
                    error = self.execute(step["code"], step["filename"], ns)
                    if len(guards.violations) > before:
                        problem = guards.violations[before]
                    elif error:
                        problem = error
                reported.add(grade_id)
            # after every step: nothing outside the notebook may have changed
            changes = guards.compare_and_restore(snapshot)
            if len(guards.violations) > before and problem is None:
                changes = guards.violations[before:] + changes
            exclude = set(step.get("binds", [])) if kind == "given" else set()
            data = changed_data(exclude)
            if data:
                changes.append(f"the instructor's {', '.join(sorted(data))} changed while learner code ran")
            if kind == "given":
                refresh(step["binds"])
            if changes:
                message = "; ".join(changes[:3])
                self.emit(type="violation", exercise=step.get("exercise"), cell=step.get("cell"), message=message)
                if kind == "test":
                    problem = problem or message
                elif kind == "learner" and step.get("exercise"):
                    exercise_problem[step["exercise"]] = message
                else:
                    compromised = f"learner code changed the grader's environment earlier: {message}"
                snapshot = guards.take_snapshot()
                refresh(list(fingerprints))
            if kind == "test":
                self.emit(type="test", grade_id=step["grade_id"], passed=problem is None, message=problem)
            try:
                import matplotlib.pyplot as plt

                plt.close("all")
            except Exception:  # noqa: BLE001, S110 - figures are only memory
                pass
        guards.active = False
        for grade_id in plan["tests"]:
            if grade_id not in reported:
                self.emit(type="test", grade_id=grade_id, passed=False, message="not run (time limit)")
        self.emit(type="done")


def _alarm(signum, frame):
    raise StepTimeout()


def run_plan(plan: dict, result_path: str, cell_timeout: float, notebook_timeout: float, protected=()) -> None:
    signal.signal(signal.SIGALRM, _alarm)
    with open(result_path, "w", encoding="utf-8") as out:
        Runner(plan, out, cell_timeout, time.monotonic() + notebook_timeout, protected).run()


# ---------------------------------------------------------------------- template (fork server)
def preload(kernels: bool = False) -> None:
    """What every child starts with: torch, einops, jaxtyping, TransformerLens, harness, the reference model."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    torch.set_num_threads(1)  # no thread pool in the template: children fork safely and size their own
    import einops  # noqa: F401
    import jaxtyping  # noqa: F401
    import matplotlib  # noqa: F401 - not pyplot: a kernel picks its own backend
    import transformer_lens  # noqa: F401

    import harness

    try:
        harness.load_reference_gpt2()
    except Exception:  # noqa: BLE001 - the child will report it where a test needs the model
        traceback.print_exc()
    if kernels:
        import ipykernel.kernelapp  # noqa: F401


def _vm_data() -> int:
    """Bytes of this process's data segment (what RLIMIT_DATA limits)."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    return 0


def _limit_memory(extra: int) -> None:
    if extra:
        limit = int(_vm_data() + extra)
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


def _child(job: dict) -> None:
    """A re-check: run one plan."""
    os.setsid()
    log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 20, 64 << 20))
    _limit_memory(job.get("memory_bytes", 0))
    os.environ.setdefault("MPLBACKEND", "Agg")
    with open(job["plan"], encoding="utf-8") as f:
        plan = json.load(f)
    run_plan(plan, job["result"], job["cell_timeout"], job["notebook_timeout"], job.get("protected", ()))


def _kernel_child(request: dict) -> None:
    """A Jupyter kernel, as `python -m ipykernel_launcher ARGS` would start it, on the warm state."""
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
        signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
    os.chdir(request["cwd"])
    env = request["env"]
    os.environ.clear()
    os.environ.update(env)
    os.environ["JPY_PARENT_PID"] = str(os.getppid())  # the kernel ends if the template does
    _limit_memory(int(env.get("TFS_KERNEL_MEMORY", "0") or 0))
    import torch

    torch.set_num_threads(int(env.get("OMP_NUM_THREADS") or os.cpu_count() or 1))
    sys.argv = ["ipykernel_launcher", *request["args"]]
    from ipykernel.kernelapp import IPKernelApp

    IPKernelApp.launch_instance(argv=request["args"])


def serve(kernel_socket: str | None = None) -> int:
    """The template: re-check jobs from stdin (JSON lines), and kernels for instructor.kernel_launcher."""
    import socket

    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    out = os.fdopen(fd, "w", buffering=1)
    listener = None
    if kernel_socket:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if os.path.exists(kernel_socket + ".tmp"):
            os.unlink(kernel_socket + ".tmp")
        listener.bind(kernel_socket + ".tmp")
        listener.listen(16)
    preload(kernels=listener is not None)
    if listener is not None:
        os.rename(kernel_socket + ".tmp", kernel_socket)  # launchers connect only once the template is warm
    out.write(json.dumps({"ready": True}) + "\n")
    children: dict[int, dict] = {}
    kernels: dict[int, socket.socket] = {}  # kernel pid -> its launcher's connection
    pending: dict[socket.socket, bytes] = {}  # launcher connections whose request is still coming
    buffer = b""
    closed = False

    def fork(target, *args) -> int:
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                out.close()
                if listener is not None:
                    listener.close()
                for conn in [*kernels.values(), *pending]:
                    conn.close()
                target(*args)
            except SystemExit as err:
                code = err.code if isinstance(err.code, int) else 1
            except BaseException:  # noqa: BLE001
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        return pid

    while not closed or children:
        watch = [] if closed else [0]
        if listener is not None and not closed:
            watch += [listener, *pending, *kernels.values()]
        readable = select.select(watch, [], [], 0.05)[0] if watch else []
        if not watch:
            time.sleep(0.05)
        for source in readable:
            if source == 0:
                data = os.read(0, 1 << 16)
                if not data:
                    closed = True
                    for pid in [*children, *kernels]:
                        _kill(pid)
                buffer += data
            elif source is listener:
                conn, _ = listener.accept()
                pending[conn] = b""
            elif source in pending:
                data = source.recv(1 << 20)
                pending[source] += data
                if not data:
                    pending.pop(source).close()
                elif b"\n" in pending[source]:
                    request = json.loads(pending.pop(source).split(b"\n", 1)[0])
                    pid = fork(_kernel_child, request)
                    kernels[pid] = source
                    source.sendall((json.dumps({"pid": pid}) + "\n").encode())
            else:  # a launcher went away (killed): its kernel goes too
                if not source.recv(1 << 16):
                    pid = next(p for p, c in kernels.items() if c is source)
                    _kill(pid)
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if not line.strip():
                continue
            job = json.loads(line)
            pid = fork(_child, job)
            children[pid] = {
                "id": job["id"],
                "start": time.monotonic(),
                "killed": False,
                "deadline": time.monotonic() + job["notebook_timeout"] + 30,
            }
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            _kill(pid)  # anything the learner's code left running in the child's session
            if pid in kernels:
                conn = kernels.pop(pid)
                try:
                    conn.sendall((json.dumps({"exit": os.waitstatus_to_exitcode(status)}) + "\n").encode())
                except OSError:
                    pass
                conn.close()
                continue
            info = children.pop(pid, None)
            if info is None:
                continue
            reply = {
                "id": info["id"],
                "status": "killed" if info["killed"] else "exited",
                "returncode": os.waitstatus_to_exitcode(status),
                "wall": time.monotonic() - info["start"],
            }
            if not closed:
                out.write(json.dumps(reply) + "\n")
        now = time.monotonic()
        for pid, info in children.items():
            if not info["killed"] and now > info["deadline"]:
                info["killed"] = True
                _kill(pid)
    if listener is not None:
        listener.close()
        for path in (kernel_socket, kernel_socket + ".tmp"):
            if os.path.exists(path):
                os.unlink(path)
    return 0


def _kill(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m instructor.recheck", description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", action="store_true")
    parser.add_argument("--kernel-socket", help="also fork Jupyter kernels for launchers connecting here")
    parser.add_argument("plan", nargs="?")
    parser.add_argument("result", nargs="?")
    parser.add_argument("--cell-timeout", type=float, default=60)
    parser.add_argument("--notebook-timeout", type=float, default=300)
    args = parser.parse_args(argv)
    if args.serve:
        return serve(args.kernel_socket)
    preload()
    with open(args.plan, encoding="utf-8") as f:
        plan = json.load(f)
    run_plan(plan, args.result, args.cell_timeout, args.notebook_timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
