"""`bounded`: run a function of the grader's own on a submission's content in a forked child, for a bounded time.

The grader's processes (the coordinator, the nbgrader workers) read what a submission holds: its cells, its
markdown, its outputs. Some of that work is super-linear in what a learner can write (IPython's transformer in the
number of magics, an HTML parser in how deep markup nests, a regular expression in repeated tags), and the batch
waits on it. Each such step runs here, and is killed past its time: one notebook loses that step, never the batch.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import time

from instructor.course import encodable

MEMORY = 2 << 30  # bytes a bounded step may allocate beyond what the grader's process already holds


def _limit_memory(extra: int) -> None:
    """RLIMIT_DATA at what this process holds now plus `extra`: a step that would allocate past it fails with a
    MemoryError in the child (a notebook converted from nbformat 3 grew to 2.9 GB in the grader's own process,
    red-team round 45), never taking the grader's memory."""
    import resource

    with open("/proc/self/status") as status:
        held = next((int(line.split()[1]) * 1024 for line in status if line.startswith("VmData:")), None)
    if held is not None:
        resource.setrlimit(resource.RLIMIT_DATA, (held + extra, held + extra))


def bounded(fn, *args, timeout: float = 60.0, memory: int = MEMORY):
    """`fn(*args)` in a forked child, its JSON result read back: `TimeoutError` past `timeout` seconds (the child
    killed), `ChildFailed` with the child's error (a `MemoryError` past `memory` bytes more than the grader held)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        try:
            with contextlib.suppress(OSError, ValueError):
                _limit_memory(memory)
            payload = {"ok": fn(*args)}
        except BaseException as err:  # noqa: BLE001 - said to the parent
            payload = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
        try:
            data = json.dumps(payload).encode()
        except Exception as err:  # noqa: BLE001
            data = json.dumps({"error": f"{type(err).__name__}: {str(err)[:300]}"}).encode()
        view = memoryview(data)
        while view:
            view = view[os.write(write, view) :]
        os._exit(0)
    os.close(write)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read], [], [], left)[0]:
                raise TimeoutError(f"it took more than {timeout:.0f} s")
            chunk = os.read(read, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    result = encodable(json.loads(b"".join(chunks) or b'{"error": "the child ended with no result"}'))
    if "error" in result:
        raise ChildFailed(result["error"])
    return result["ok"]


class ChildFailed(RuntimeError):
    """What `bounded`'s child raised, as "Type: message"."""
