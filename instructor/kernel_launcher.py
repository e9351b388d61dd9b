"""Start a Jupyter kernel forked from the grader's warm template process (standard library only).

nbgrader starts one fresh kernel per notebook, and each pays for importing torch, TransformerLens and harness
and loading the reference model (about 8 s of CPU) before the first cell. The grader's template process
(`python -m instructor.template --serve`) has done that once; this launcher, which the grading kernelspec runs
in place of `python -m ipykernel_launcher`, asks the template to fork a new kernel process from that state
and then stands in for it: Jupyter's signals (interrupt, terminate) are sent to the template, which passes
them on to the kernel's process group, and the launcher exits when the kernel does, with its exit status, so that a dead kernel is seen as dead.
If the template cannot be reached, it starts an ordinary kernel instead, unless the grader is sandboxed
(TFS_SANDBOXED=1): a kernel started here would run the learner's code outside the sandbox, so it fails instead.

    python -I -S kernel_launcher.py -f CONNECTION_FILE [kernel arguments...]
"""

import json
import os
import signal
import socket
import sys
import time


def _fallback(args):
    if os.environ.get("TFS_SANDBOXED") == "1":
        sys.stderr.write("the grader's sandboxed template could not start this kernel\n")
        sys.exit(1)
    os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", *args])


def main() -> None:
    args = sys.argv[1:]
    path = os.environ.get("TFS_KERNEL_SOCKET")
    if not path:
        _fallback(args)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    deadline = time.monotonic() + float(os.environ.get("TFS_KERNEL_WAIT", "120"))
    while True:
        try:
            sock.connect(path)
            break
        except OSError:
            if time.monotonic() > deadline:
                _fallback(args)
            time.sleep(0.2)
    request = {"kernel": True, "args": args, "env": dict(os.environ), "cwd": os.getcwd()}
    if "-f" in args:  # the connection file may be where the sandbox cannot see it: its content goes along
        try:
            with open(args[args.index("-f") + 1], encoding="utf-8") as f:
                request["connection"] = f.read()
        except (OSError, IndexError):
            pass
    sock.sendall((json.dumps(request) + "\n").encode())
    stream = sock.makefile("r")
    reply = json.loads(stream.readline() or "{}")
    pid = reply.get("pid")
    if not pid:
        _fallback(args)

    def forward(signum, frame):
        # The template signals the kernel: `pid` is a pid in the sandbox's own PID namespace, not this one's.
        try:
            sock.sendall((json.dumps({"signal": int(signum)}) + "\n").encode())
        except OSError:
            pass
        if signum != signal.SIGINT:
            sys.exit(128 + signum)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, forward)
    line = stream.readline()  # the template writes the kernel's exit status when it ends
    try:
        code = int(json.loads(line).get("exit", 1)) if line else 1
    except ValueError:
        code = 1
    sys.exit(code if 0 <= code < 256 else 1)


if __name__ == "__main__":
    main()
