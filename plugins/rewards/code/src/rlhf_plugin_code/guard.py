"""Runs inside the sandbox process before the untrusted program: installs the audit hook.

An audit hook cannot be removed once added; it refuses process creation, sockets, ctypes
and file writes outside the working directory, then runs ``main.py``.
"""

import os
import runpy
import sys

ROOT = os.path.realpath(os.getcwd())
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
BLOCKED_PREFIXES = ("os.fork", "os.forkpty", "os.exec", "os.spawn", "os.posix_spawn", "os.system", "subprocess.Popen",
                    "socket.connect", "socket.bind", "socket.sendto", "socket.getaddrinfo", "ctypes.", "os.kill",
                    "os.killpg", "pty.spawn", "shutil.rmtree")


class SandboxViolation(RuntimeError):
    pass


def _writes(mode, flags) -> bool:
    if isinstance(mode, str) and any(c in mode for c in "wax+"):
        return True
    return isinstance(flags, int) and bool(flags & WRITE_FLAGS)


def _hook(event, args):
    if event.startswith(BLOCKED_PREFIXES):
        raise SandboxViolation(f"blocked: {event}")
    if event == "import" and args and str(args[0]).split(".")[0] in {"ctypes", "_ctypes"}:
        raise SandboxViolation("blocked: import ctypes")
    if event == "open" and args and _writes(args[1] if len(args) > 1 else None, args[2] if len(args) > 2 else None):
        path = args[0]
        if isinstance(path, int):
            return
        target = os.path.realpath(os.fsdecode(path))
        if not (target == ROOT or target.startswith(ROOT + os.sep)):
            raise SandboxViolation(f"blocked: write outside the sandbox ({target})")


sys.addaudithook(_hook)
sys.argv = ["main.py"]
runpy.run_path("main.py", run_name="__main__")
