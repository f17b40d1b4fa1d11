"""The trusted harness inside the sandbox (run by :mod:`rlhf_plugin_code.sandbox` as ``python -I -B runner.py``).

Reads the job (JSON) from stdin, confines itself when the backend asks (``unshare``), sets the limits, installs
the seccomp filter and the audit hook, runs the program as ``__main__``, then each test step in the program's
namespace. Every outcome goes to the result pipe as one JSON line; the exit status means nothing to the parent,
so an early ``os._exit(0)`` is just a run that never reported its tests. A value step sends the repr of its
expression's value and the parent compares it with the expected literal, which never enters the sandbox.
"""

import builtins
import json
import os
import resource
import signal
import sys
import traceback
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -I leaves the script's directory out
import jail  # noqa: E402

del sys.path[0]

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
BLOCKED_PREFIXES = ("os.fork", "os.forkpty", "os.exec", "os.spawn", "os.posix_spawn", "os.system", "subprocess.Popen",
                    "socket.connect", "socket.bind", "socket.sendto", "socket.getaddrinfo", "ctypes.", "os.kill",
                    "os.killpg", "pty.spawn", "shutil.rmtree")
CPU_LIMIT = "\nCPU time limit exceeded\n"  # sandbox.py reads it back as the reason
MAX_DEPTH = 100  # the parent's literal parser refuses deeper nesting anyway


class SandboxViolation(RuntimeError):
    """Raised by the audit hook: a named refusal, so the run's reason says ``blocked`` (the kernel stops the rest)."""


def audit_hook(root: str):
    def writes(mode, flags) -> bool:
        if isinstance(mode, str) and any(c in mode for c in "wax+"):
            return True
        return isinstance(flags, int) and bool(flags & WRITE_FLAGS)

    def hook(event, args):
        if event.startswith(BLOCKED_PREFIXES):
            raise SandboxViolation(f"blocked: {event}")
        if event == "import" and args and str(args[0]).split(".")[0] in {"ctypes", "_ctypes"}:
            raise SandboxViolation("blocked: import ctypes")
        if event == "open" and args and writes(args[1] if len(args) > 1 else None, args[2] if len(args) > 2 else None):
            if isinstance(args[0], int):
                return
            target = os.path.realpath(os.fsdecode(args[0]))
            if not (target == root or target.startswith(root + os.sep)):
                raise SandboxViolation(f"blocked: write outside the sandbox ({target})")

    return hook


def set_limits(limits: dict) -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"] + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    # Set here, inside the user namespace, so it counts this sandbox's tasks rather than all of the caller's.
    resource.setrlimit(resource.RLIMIT_NPROC, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # Say why, rather than die by a signal the caller may not see: unshare's pid-1 child ignores a default
    # SIGXCPU, and neither unshare nor bubblewrap reports a child's signal faithfully.
    signal.signal(signal.SIGXCPU, lambda *_: (os.write(2, CPU_LIMIT.encode()), os._exit(1)))


def plain(value, depth: int = 0):
    """The value as builtins with a literal repr (dict/list/int subclasses included), or TypeError."""
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    if value is None or type(value) in (bool, int, float, complex, str, bytes):
        return value
    for kind in (int, float, str):  # IntEnum, str subclasses...; bool cannot be subclassed
        if isinstance(value, kind):
            return kind(value)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, dict):
        return {plain(k, depth + 1): plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [plain(v, depth + 1) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, (set, frozenset)):
        return {plain(v, depth + 1) for v in value}
    raise TypeError(f"a {type(value).__name__} has no literal form to compare")


def relocate(host_prefix: str, sandbox_prefix: str) -> None:
    """This harness started on the host's paths; after the pivot its interpreter's prefix lives elsewhere."""
    def moved(path: str) -> str:
        return sandbox_prefix + path[len(host_prefix):] if path == host_prefix or path.startswith(host_prefix + "/") else path

    sys.path[:] = [moved(path) for path in sys.path]
    sys.path_importer_cache.clear()
    for module in list(sys.modules.values()):  # packages already imported (encodings…) import their submodules later
        if isinstance(getattr(module, "__path__", None), list):
            module.__path__[:] = [moved(path) for path in module.__path__]
        if isinstance(getattr(module, "__file__", None), str):
            module.__file__ = moved(module.__file__)
    sys.prefix, sys.exec_prefix, sys.executable = moved(sys.prefix), moved(sys.exec_prefix), moved(sys.executable)
    sys.base_prefix, sys.base_exec_prefix = moved(sys.base_prefix), moved(sys.base_exec_prefix)


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]


def main() -> None:
    job = json.loads(sys.stdin.buffer.read())
    # The parent's descriptor number can be anything (a busy parent has hundreds open); take the lowest free one so
    # the channel sits below RLIMIT_NOFILE like every descriptor the program can reach, whatever the caller holds.
    result_fd = os.dup(job["result_fd"])
    os.close(job["result_fd"])

    def report(**record) -> None:
        data = (json.dumps(record) + "\n").encode()
        while data:
            data = data[os.write(result_fd, data):]

    if job["confine"]:
        host_prefix, sandbox_prefix = job["confine"].pop("prefix")
        jail.confine(**job["confine"])
        relocate(host_prefix, sandbox_prefix)
    devnull = os.open("/dev/null", os.O_RDONLY)
    os.dup2(devnull, 0)  # the job file is no business of the program's
    os.close(devnull)
    with open("main.py", "w") as source:  # so tracebacks quote the program's lines
        source.write(job["program"])
    set_limits(job["limits"])
    if job["seccomp"]:
        jail.install_seccomp()
    for name in [m for m in sys.modules if m.split(".")[0] in {"ctypes", "_ctypes", "jail"}]:
        del sys.modules[name]  # importing them again is then an audited, refused import
    sys.addaudithook(audit_hook(os.path.realpath(os.getcwd())))

    module = types.ModuleType("__main__")
    module.__file__, module.__builtins__ = "main.py", builtins
    sys.modules["__main__"] = module
    sys.argv = ["main.py"]
    loaded = False
    try:
        exec(compile(job["program"], "main.py", "exec"), module.__dict__)
        loaded = True
    except SystemExit as exc:  # exiting is fine, skipping the tests is not: they run next
        loaded = exc.code in (None, 0)
        if not loaded:
            report(error=describe(exc))
    except BaseException as exc:
        traceback.print_exc()
        report(error=describe(exc))
    if loaded:
        report(loaded=True)
        for i, step in enumerate(job["steps"]):
            try:
                code = compile(step["source"], f"<test {i}>", "eval" if step["kind"] == "value" else "exec")
                if step["kind"] == "value":
                    report(i=i, value=repr(plain(eval(code, module.__dict__))))
                else:
                    exec(code, module.__dict__)
                    report(i=i, ok=True)
            except BaseException as exc:
                traceback.print_exc()
                report(i=i, error=describe(exc))
    report(done=True)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:
            pass
    os._exit(0)  # threads the program left running end here, with the process


main()
