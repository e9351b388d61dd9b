"""The sandbox that every process running learner code lives in: bubblewrap, a memory cgroup, a uid of its own.

The grader (`instructor.grade`) and its nbgrader workers run outside; the warm template (`instructor.template
--serve`), which never runs learner code itself, runs inside one bubblewrap sandbox per grading run, and forks
every Jupyter kernel and every probe child of the judge from there. What that gives each process running learner code:

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
  later ones before it drops its privileges (a kernel keeps its own notebook's, which its checks build on); the
  probe template's children read only the earlier ones, after the fork (`instructor.template`);
- a network namespace of its own per child, with no interface up, and (but for kernels) no view of the kernels'
  socket folder: children cannot talk to each other.

`python -m instructor.grade --no-sandbox` runs the same template without any of this (every row is then flagged
`unsandboxed`).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
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
    """A cgroup (v1) for one grading run, under the grader's own, in one controller's hierarchy (memory by
    default; pids and cpu too): the template makes one per child in it."""

    def __init__(self, path: Path, controller: str = "memory"):
        self.path = path
        self.controller = controller

    @classmethod
    def create(cls, controller: str = "memory") -> tuple[MemoryCgroup | None, str]:
        """The run's cgroup, or None and why not."""
        root = CGROUP_ROOT.parent / controller
        if not root.is_dir():
            return None, f"no cgroup v1 {controller} hierarchy at {root}"
        own = ""
        try:
            for line in Path("/proc/self/cgroup").read_text().splitlines():
                _, controllers, path = line.split(":", 2)
                if controller in controllers.split(","):
                    own = path
        except OSError as err:
            return None, str(err)
        path = root / own.lstrip("/") / f"tfs-grade-{os.getpid()}"
        try:
            path.mkdir()
            (path / "memory.use_hierarchy").write_text("1") if (path / "memory.use_hierarchy").exists() else None
        except OSError as err:
            return None, f"cannot create a {controller} cgroup in {path.parent}: {err.strerror}"
        return cls(path, controller), ""

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
    cgroups: list[MemoryCgroup] = (),
    private_ro: dict[str, str] | None = None,
) -> list[str]:
    """`inner` run inside the sandbox. `rw`: directories shared read-write at the same path (sockets);
    `private_ro`: {outside: name} bound read-only under the root-only INSIDE_PRIVATE."""
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
        "0755",  # only root writes here: each child gets a /tmp of its own (Confinement.enter)
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
    for group in cgroups:
        args += ["--bind", str(group.path), f"{INSIDE_CGROUP}-{group.controller}"]
    if private_ro:
        args += ["--perms", "0700", "--dir", INSIDE_PRIVATE]
        for outside, name in private_ro.items():
            args += ["--ro-bind", outside, f"{INSIDE_PRIVATE}/{name}"]
    args += ["--setenv", "HOME", "/tmp", "--setenv", "TMPDIR", "/tmp", "--chdir", "/tmp", "--", *inner]
    return args


# ---------------------------------------------------------------------- inside: the template's children
# Per child: at most this many processes and threads (pids cgroup; a fork bomb stops there), and a fair share of
# the CPU (a cpu cgroup of its own at the default weight, so 48 busy processes in one child weigh as much as one
# in the next student's).
CHILD_PIDS = 256
_CLONE_NEWNS, _CLONE_NEWIPC, _CLONE_NEWNET = 0x00020000, 0x08000000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT = 0x1, 0x2, 0x4, 0x8, 0x20
_MS_BIND, _MS_REC, _MS_PRIVATE = 0x1000, 0x4000, 0x40000


def _libc():
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _mount(libc, source: str | None, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    import ctypes

    enc = [None if x is None else x.encode() for x in (source, target, fstype, data)]
    if libc.mount(enc[0], enc[1], enc[2], flags, enc[3]) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def cover(libc, folder: str) -> None:
    """`folder` hidden behind an empty read-only tmpfs (in this process's mount namespace)."""
    _mount(libc, "tmpfs", folder, "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_RDONLY, "size=4k,mode=0555")


def _mounts_under(top: str) -> list[str]:
    """The outermost mount points below `top` (the sandbox's binds there), from /proc/self/mountinfo."""
    points = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
            if point.startswith(top + "/"):
                points.append(point)
    outer = []
    for point in sorted(set(points), key=len):
        if not any(point.startswith(p + "/") for p in outer):
            outer.append(point)
    return outer


class Confinement:
    """What the template does in each child after the fork, before any learner code: its own memory, pids and
    cpu cgroups (or RLIMIT_DATA), its own mount and IPC namespaces with a fresh /tmp (its home) and /dev/shm that
    no other child can see and that vanish with it, its own uid, and no file descriptors but 0-2 and `keep`.
    Whatever the sandbox binds under /tmp (the kernels' sockets, the judge's probes, a course or environment that
    lives there) stays reachable. `scratch`: folders where children meet (the kernels' sockets), cleared of what a
    child left once it ends."""

    def __init__(
        self,
        cgroup_dir: str | None,
        extra_cgroups: dict[str, str] | None = None,
        scratch: list[str] = (),
        family: int = 0,
    ):
        self.cgroup_dir = cgroup_dir if cgroup_dir and os.path.isdir(cgroup_dir) else None
        self.extra = {k: v for k, v in (extra_cgroups or {}).items() if v and os.path.isdir(v)}
        self.scratch = [p for p in scratch if p]
        self.counter = 0
        # Three templates fork children in one sandbox (the main one's kernels and the two of the judge's probes): each its
        # own uids and cgroup names, so that none can reap, signal or share a cgroup with another's children.
        self.family = family
        self.prefix = "cbt"[family]

    def next_slot(self) -> int:
        self.counter += 1
        return self.counter

    def uid(self, slot: int) -> int:
        return UID_BASE + self.family * UID_COUNT + slot % UID_COUNT

    def charge(self, slot: int, memory_bytes: int) -> None:
        """This process, and what it starts, joins `slot`'s cgroups (memory, process count, CPU share): what it uses
        is the slot's, as root still (the probe feeder, which serves a learner's calls, is charged to that learner)."""
        if self.cgroup_dir:
            limit = str(int(memory_bytes)) if memory_bytes else ""
            limits = {"memory.limit_in_bytes": limit, "memory.memsw.limit_in_bytes": limit} if limit else {}
            self._join(self.cgroup_dir, slot, limits)
        if "pids" in self.extra:
            self._join(self.extra["pids"], slot, {"pids.max": str(CHILD_PIDS)})
        if "cpu" in self.extra:
            self._join(self.extra["cpu"], slot, {})

    def _join(self, folder: str, slot: int, limits: dict[str, str]) -> None:
        group = os.path.join(folder, f"{self.prefix}{slot}")
        os.makedirs(group, exist_ok=True)
        for name, value in limits.items():
            path = os.path.join(group, name)
            if os.path.exists(path):
                with open(path, "w") as f:
                    f.write(value)
        with open(os.path.join(group, "cgroup.procs"), "w") as f:
            f.write("0")  # this process, and everything it starts

    def _own(self, folder: str, uid: int) -> None:
        """The scratch folders themselves are root's and closed to children (0711: no listing, no new entries),
        so a name inside one cannot have been planted by a learner; what an earlier kernel left there goes."""
        folder = os.path.normpath(folder)
        if not any(os.path.dirname(folder) == os.path.normpath(top) for top in self.scratch):
            raise PermissionError(f"{folder} is not a folder of its own inside the kernels' shared folder")
        remove_tree(folder)
        os.mkdir(folder, 0o700)
        os.chown(folder, uid, uid)

    def _private_tmp(self, uid: int, size: int, probe: bool = False) -> str:
        """A new mount namespace: a fresh tmpfs on /tmp (root's; the child's home inside) and on /dev/shm, with
        every mount that was under /tmp bound back in. Returns the home. A `probe` child (not a kernel) gets
        everything it can write mounted noexec, and no /proc: no library of its own can be loaded (a C++ extension
        calling libtorch's kernels past the dispatcher, where the forbidden operators are taken out), and no
        memory rewritten through /proc/self/mem."""
        libc = _libc()
        # A network namespace of its own too, with no interface up: no child can reach another over loopback or
        # an abstract Unix socket (a kernel, which may hold the oracles, serving answers to a judge's probe).
        if libc.unshare(_CLONE_NEWNS | _CLONE_NEWIPC | _CLONE_NEWNET) != 0:
            import ctypes

            raise OSError(ctypes.get_errno(), "unshare")
        _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE, None)
        keep = [(p, os.open(p, os.O_PATH)) for p in _mounts_under("/tmp")]
        options = f"size={max(size, 64 << 20)},mode=0755,nr_inodes=100000"
        flags = _MS_NOSUID | _MS_NODEV | (_MS_NOEXEC if probe else 0)
        _mount(libc, "tmpfs", "/tmp", "tmpfs", flags, options)
        for path, fd in keep:
            if os.path.isdir(f"/proc/self/fd/{fd}"):
                os.makedirs(path, mode=0o755, exist_ok=True)
            else:  # a file bound on its own
                os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
                open(path, "a").close()
            _mount(libc, f"/proc/self/fd/{fd}", path, None, _MS_BIND | _MS_REC, None)
            os.close(fd)
            if probe and not os.statvfs(path).f_flag & os.ST_RDONLY:  # what it can write; not the environment's
                _mount(libc, None, path, None, _MS_REMOUNT | _MS_BIND | flags, None)
        if os.path.isdir("/dev/shm"):
            _mount(libc, "tmpfs", "/dev/shm", "tmpfs", flags, options.replace("0755", "1777"))
        home = "/tmp/home"
        os.mkdir(home, 0o700)
        os.chown(home, uid, uid)
        return home

    def enter(self, slot: int, memory_bytes: int, keep: tuple[int, ...] = (), own: tuple[str, ...] = ()) -> str:
        """In the child, as root: confine it; returns its private working directory. `own`: folders directly
        inside a scratch folder that this child alone may use (its kernel's sockets), made afresh for its uid."""
        close_fds_except(keep)
        uid = self.uid(slot)
        for folder in own:
            self._own(folder, uid)
        self.charge(slot, memory_bytes)
        try:
            home = self._private_tmp(uid, memory_bytes, probe=not own)
            if not own:  # not a kernel: the kernels' socket folders are out of its sight (no socket to reach)
                for folder in self.scratch:
                    if os.path.isdir(folder):
                        cover(_libc(), folder)
                cover(_libc(), "/proc")
        except OSError:  # no private mounts here: a fresh home all the same, made by root
            home = f"/tmp/j{self.prefix}{slot}"
            remove_tree(home)  # never one that something else made first
            os.mkdir(home, 0o700)
            os.chown(home, uid, uid)
        os.chdir(home)
        os.environ.update(HOME=home, TMPDIR=home, MPLCONFIGDIR=home, USER="learner")
        import tempfile

        tempfile.tempdir = None  # the template's choice, made before the fork, is not this child's (torch.compile)
        os.umask(0o077)
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        return home

    def reap(self, slot: int) -> None:
        """In the template, once a child has ended: kill anything it left behind (its cgroups; else its uid)."""
        for folder in filter(None, [self.cgroup_dir, *self.extra.values()]):
            group = os.path.join(folder, f"{self.prefix}{slot}")
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
        remove_tree(f"/tmp/j{self.prefix}{slot}")
        for folder in self.scratch:  # what it left where children meet (its sockets): removed
            _remove_owned_by(folder, uid)


def remove_tree(path) -> None:
    """`path` and everything under it, however deep (a learner's tree thousands of folders deep made
    `shutil.rmtree`, which recurses, raise RecursionError and stopped a whole batch): GNU `rm`, which walks
    without recursion and never leaves the file system; `shutil.rmtree` where there is no `rm`."""
    path = os.fspath(path)
    if not os.path.lexists(path):
        return
    try:
        subprocess.run(["rm", "-rf", "--one-file-system", "--", path], check=False, capture_output=True, timeout=300)
    except (OSError, subprocess.SubprocessError):
        try:
            shutil.rmtree(path, ignore_errors=True)
        except RecursionError:
            pass


def _remove_owned_by(folder: str, uid: int) -> None:
    """Whatever `uid` made in `folder`, at any depth (`find`, which walks without recursion)."""
    try:
        subprocess.run(
            ["find", folder, "-mindepth", "1", "-xdev", "-depth", "-user", str(uid), "-delete"],
            check=False,
            capture_output=True,
            timeout=300,
        )
    except (OSError, subprocess.SubprocessError):
        pass
    for entry in os.listdir(folder) if os.path.isdir(folder) else ():  # a folder of its own holding others' files
        path = os.path.join(folder, entry)
        try:
            if os.lstat(path).st_uid == uid:
                remove_tree(path)
        except OSError:
            pass


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
