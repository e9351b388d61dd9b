"""The sandbox that every process running learner code lives in: bubblewrap, a memory cgroup, a uid of its own.

The grader (`instructor.grade`) and its nbgrader workers run outside; the warm template (`instructor.recheck
--serve`), which never runs learner code itself, runs inside one bubblewrap sandbox per grading run, and forks
every Jupyter kernel and every re-check from there. What that gives each process running learner code:

- bubblewrap (`bwrap`, a small, widely reviewed setuid-free tool used by Flatpak): new PID, network, IPC and UTS
  namespaces (no network at all, nothing outside the sandbox can be seen or signalled, and when the template
  ends every process left in the namespace is killed by the kernel: a detached process cannot outlive the run);
  a read-only view of only the system's directories, the Python installation and the course's `harness` and
  `instructor` packages; nothing of the repository's `solutions/`, `grading/` or `.git`, nor of the output or
  submissions folders, nor of /root or /home; a private /tmp; and only the file descriptors bwrap is given
  (the template's stdin/stdout pipes to the grader);
- a uid of its own (20000 + n), set by the template after the fork: the process cannot signal, trace or read
  the files of the template (root) or of any other student's process, and has no capabilities;
- a memory cgroup of its own (cgroup v1 here; `memory.limit_in_bytes`, and `memory.memsw.limit_in_bytes` where
  the kernel has it): it counts every page the process and its children use, shared memory and tmpfs included,
  which RLIMIT_DATA/RLIMIT_AS do not. Where no memory cgroup can be created (no write access to the memory
  hierarchy), the template falls back to RLIMIT_DATA and the grader says so: that limit does not count shared
  mmaps;
- the course's answers: the template reads the `component` cells of every solution notebook (which later
  notebooks build on) from a root-only directory inside the sandbox before any fork, and each child forgets the
  ones of its own notebook and the later ones before it drops its privileges.

`python -m instructor.grade --no-sandbox` runs the same template without any of this (every row is then flagged
`unsandboxed`).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path

from instructor.course import REPO_ROOT

UID_BASE = 20000
UID_COUNT = 10000
CGROUP_ROOT = Path("/sys/fs/cgroup/memory")
# paths as the template sees them inside the sandbox
INSIDE_CGROUP = "/run/tfs/cgroup"
INSIDE_PRIVATE = "/run/tfs/private"  # root-only: the solutions, read by the template before it forks
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")


def find_bwrap() -> str | None:
    return shutil.which("bwrap")


def works(bwrap: str) -> str | None:
    """Why `bwrap` cannot make the sandbox here (None if it can)."""
    import subprocess

    try:
        run = subprocess.run(
            [bwrap, *namespace_args(), "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return str(err)
    return None if run.returncode == 0 else (run.stderr.strip() or f"exit {run.returncode}")


def namespace_args() -> list[str]:
    # Not --unshare-all: that adds a user namespace, in which the template could not give its children uids of
    # their own. The grader runs as root for that (and for the cgroup); the children never keep root.
    return ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]


class MemoryCgroup:
    """A memory cgroup (v1) for one grading run, under the grader's own; the template makes one per child in it."""

    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def create(cls) -> tuple[MemoryCgroup | None, str]:
        """The run's cgroup, or None and why not."""
        if not CGROUP_ROOT.is_dir():
            return None, f"no cgroup v1 memory hierarchy at {CGROUP_ROOT}"
        own = ""
        try:
            for line in Path("/proc/self/cgroup").read_text().splitlines():
                _, controllers, path = line.split(":", 2)
                if "memory" in controllers.split(","):
                    own = path
        except OSError as err:
            return None, str(err)
        path = CGROUP_ROOT / own.lstrip("/") / f"tfs-grade-{os.getpid()}"
        try:
            path.mkdir()
            (path / "memory.use_hierarchy").write_text("1") if (path / "memory.use_hierarchy").exists() else None
        except OSError as err:
            return None, f"cannot create a memory cgroup in {path.parent}: {err.strerror}"
        return cls(path), ""

    def remove(self) -> None:
        """Kill whatever is left in it (nothing should be) and remove it."""
        for sub in sorted(self.path.glob("**/"), key=lambda p: -len(p.parts)):
            for _ in range(50):
                pids = _read_pids(sub / "cgroup.procs")
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                try:
                    sub.rmdir()
                    break
                except OSError:
                    import time

                    time.sleep(0.05)

    def empty(self) -> bool:
        return not any(_read_pids(sub / "cgroup.procs") for sub in self.path.glob("**/"))


def _read_pids(path: Path) -> list[int]:
    try:
        return [int(x) for x in path.read_text().split()]
    except (OSError, ValueError):
        return []


def _system_binds() -> list[str]:
    args = []
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    return args


def _environment_paths() -> list[str]:
    """Every directory the running interpreter loads code from, as it names them: its prefixes, the directory of
    its executable, and each `sys.path` entry (a user site-packages, a conda environment's, an editable install's)."""
    paths = [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix, os.path.dirname(sys.executable)]
    paths += [p for p in sys.path if p]
    out = []
    for p in paths:
        p = os.path.abspath(p)
        if os.path.isfile(p):  # a zipped standard library
            p = os.path.dirname(p)
        if os.path.isdir(p) and p not in out:
            out.append(p)
    return out


def python_binds() -> list[tuple[str, str]]:
    """(source, destination) read-only binds that give the sandbox the Python installation the grader runs on.

    Derived from the running interpreter (`_environment_paths`), not from any layout: each directory is bound at
    its resolved path and, where a link leads to it (a `.venv` that links to an environment elsewhere, as conda,
    pyenv, uv or a shared lab install arrange), at the path the interpreter uses too, so that `sys.executable`,
    `pyvenv.cfg` and every `sys.path` entry resolve inside as they do outside. The repository itself, or a folder
    holding it, is never bound (that would bring in `solutions/`): its packages are bound one by one."""
    repo = str(REPO_ROOT)
    inside_system = tuple(d + os.sep for d in SYSTEM_DIRS)
    wanted: list[tuple[str, str]] = []
    for path in _environment_paths():
        real = os.path.realpath(path)
        for dest in dict.fromkeys((real, path)):
            if (repo + os.sep).startswith(dest + os.sep) or (os.path.realpath(repo) + os.sep).startswith(real + os.sep):
                continue  # the repository or an ancestor (the working directory on sys.path, say)
            if (dest + os.sep).startswith(inside_system):
                continue  # already there with the system's directories (a link there leads to a real path bound)
            wanted.append((real, dest))
    out: list[tuple[str, str]] = []
    for real, dest in sorted(set(wanted), key=lambda b: (len(b[1]), b[1])):
        covered = any(
            (dest + os.sep).startswith(d + os.sep) and os.path.join(r, os.path.relpath(dest, d)) == real for r, d in out
        )  # a parent bound already holds it, at the same place
        if not covered:
            out.append((real, dest))
    return out


def python_path() -> list[str]:
    """The grader's `sys.path`, for the template to use as its own (`python -I` would drop a user site-packages
    and any PYTHONPATH the instructor relies on)."""
    return [os.path.abspath(p) for p in sys.path if p and os.path.exists(p)]


def bwrap_command(
    bwrap: str,
    inner: list[str],
    *,
    rw: list[str] = (),
    cgroup: MemoryCgroup | None = None,
    private_ro: dict[str, str] | None = None,
    hide: list[str] = (),
) -> list[str]:
    """`inner` run inside the sandbox. `rw`: directories shared read-write at the same path (sockets);
    `private_ro`: {outside: name} bound read-only under the root-only INSIDE_PRIVATE; `hide`: paths covered by an
    empty tmpfs (in case they lie under something that is bound)."""
    args = [bwrap, *namespace_args(), "--die-with-parent", "--new-session"]
    args += _system_binds()
    # The private /tmp and /run first: the course or its virtual environment may live under /tmp (a CI clone), and
    # a tmpfs mounted after their binds would hide them.
    args += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--perms",
        "1777",
        "--tmpfs",
        "/tmp",
        "--tmpfs",
        "/run",
        "--dir",
        "/run/tfs",
    ]
    binds = [*python_binds(), *((str(REPO_ROOT / p),) * 2 for p in ("harness", "instructor"))]
    mounts = {"/", "/tmp", "/run"}
    parents = sorted(
        {str(parent) for _, d in binds for parent in Path(d).parents if str(parent) not in mounts}, key=len
    )
    for parent in parents:  # bwrap would make them 0700: the children, under other uids, could not get through
        args += ["--perms", "0755", "--dir", parent]
    for source, dest in binds:
        args += ["--ro-bind", source, dest]
    for path in rw:
        args += ["--bind", path, path]
    if cgroup is not None:
        args += ["--bind", str(cgroup.path), INSIDE_CGROUP]
    if private_ro:
        args += ["--perms", "0700", "--dir", INSIDE_PRIVATE]
        for outside, name in private_ro.items():
            args += ["--ro-bind", outside, f"{INSIDE_PRIVATE}/{name}"]
    for path in hide:
        if os.path.exists(path):
            args += ["--tmpfs", path]
    args += ["--setenv", "HOME", "/tmp", "--setenv", "TMPDIR", "/tmp", "--chdir", "/tmp", "--", *inner]
    return args


# ---------------------------------------------------------------------- inside: the template's children
class Confinement:
    """What the template does in each child after the fork, before any learner code: its own memory cgroup
    (or RLIMIT_DATA), its own uid, home and working directory, and no file descriptors but 0-2 and `keep`."""

    def __init__(self, cgroup_dir: str | None):
        self.cgroup_dir = cgroup_dir if cgroup_dir and os.path.isdir(cgroup_dir) else None
        self.counter = 0

    def next_slot(self) -> int:
        self.counter += 1
        return self.counter

    def uid(self, slot: int) -> int:
        return UID_BASE + slot % UID_COUNT

    def enter(self, slot: int, memory_bytes: int, keep: tuple[int, ...] = ()) -> str:
        """In the child, as root: confine it; returns its private working directory."""
        close_fds_except(keep)
        if self.cgroup_dir:
            group = os.path.join(self.cgroup_dir, f"c{slot}")
            os.makedirs(group, exist_ok=True)
            if memory_bytes:
                limit = str(int(memory_bytes))
                with open(os.path.join(group, "memory.limit_in_bytes"), "w") as f:
                    f.write(limit)
                memsw = os.path.join(group, "memory.memsw.limit_in_bytes")
                if os.path.exists(memsw):
                    with open(memsw, "w") as f:
                        f.write(limit)
            with open(os.path.join(group, "cgroup.procs"), "w") as f:
                f.write("0")  # this process, and everything it starts
        uid = self.uid(slot)
        home = f"/tmp/j{slot}"
        os.makedirs(home, mode=0o700, exist_ok=True)
        os.chown(home, uid, uid)
        os.chdir(home)
        os.environ.update(HOME=home, TMPDIR=home, MPLCONFIGDIR=home, USER="learner")
        os.umask(0o077)
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        return home

    def reap(self, slot: int) -> None:
        """In the template, once a child has ended: kill anything it left behind (its cgroup; else its uid)."""
        if self.cgroup_dir:
            group = os.path.join(self.cgroup_dir, f"c{slot}")
            for _ in range(100):
                pids = _read_pids(Path(group) / "cgroup.procs")
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                try:
                    os.rmdir(group)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    import time

                    time.sleep(0.02)
        uid = self.uid(slot)
        for entry in os.listdir("/proc"):  # our own PID namespace: only the sandbox's processes
            if entry.isdigit():
                try:
                    if os.stat(f"/proc/{entry}").st_uid == uid:
                        os.kill(int(entry), signal.SIGKILL)
                except OSError:
                    pass
        shutil.rmtree(f"/tmp/j{slot}", ignore_errors=True)


def close_fds_except(keep: tuple[int, ...]) -> None:
    fds = []
    try:
        fds = [int(x) for x in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 1024))
    for fd in fds:
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
