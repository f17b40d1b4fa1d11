"""Run untrusted Python against tests in an operating-system sandbox (threat model: docs/rewards.md, Code).

Backends, best first: ``bwrap`` (bubblewrap builds the namespaces and the filesystem view), ``unshare``
(util-linux namespaces; ``runner.py`` builds the same view itself), ``weak`` (the old rlimits + audit hook +
empty network namespace, chosen with one warning when neither works). Both strong backends give fresh user,
mount, pid, network, IPC and UTS namespaces, a read-only view of only the interpreter and system libraries, a
size-capped tmpfs as the only writable place, no capabilities, and a seccomp filter that refuses process
creation. Pass/fail comes from the trusted comparison in :mod:`rlhf_plugin_code.checks`, never the exit status.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from rlhf.errors import ConfigError
from rlhf_plugin_code.checks import Step, steps

log = logging.getLogger(__name__)

RUNNER = Path(__file__).with_name("runner.py")
INTERPRETER = os.path.realpath(sys.executable)  # the base interpreter: a venv's python is a symlink to it
PREFIX = os.path.realpath(sys.base_prefix)
# An interpreter installed outside /usr (pyenv, conda, uv: often under a home directory) appears at /python, so
# the sandbox shows nothing of the path it lives at; its bin/ and lib/ only, with site-packages covered.
RELOCATED = not (PREFIX == "/usr" or PREFIX.startswith("/usr/")) and INTERPRETER.startswith(PREFIX + "/bin/")
SANDBOX_PREFIX = "/python" if RELOCATED else PREFIX
SANDBOX_INTERPRETER = SANDBOX_PREFIX + INTERPRETER[len(PREFIX):] if RELOCATED else INTERPRETER
SITE_PACKAGES = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")
ROOT_DIRS = ("/bin", "/lib", "/lib64")  # symlinks into /usr on merged-/usr systems, directories elsewhere
SANDBOX_UID = "65534"  # "nobody" inside bubblewrap's user namespace: exec leaves it no capabilities
RESULT_SLACK = 1024 * 1024  # result-pipe bytes allowed beyond the output cap (one repr per test)


class SandboxLimits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    wall_s: float = Field(5.0, gt=0, description="wall-clock limit per program, seconds")
    cpu_s: int = Field(5, gt=0, description="CPU-time limit per program, seconds")
    memory_mb: int = Field(512, gt=16, description="address-space limit, MiB")
    output_kb: int = Field(64, gt=0, description="stdout/stderr kept per program, KiB (files are capped at 16x)")
    isolation: Literal["auto", "bwrap", "unshare", "weak"] = Field(
        "auto", description="auto: bwrap, else unshare, else weak with a warning; or require one")


@dataclass
class SandboxResult:
    passed: bool
    reason: str  # passed, failed, timeout, cpu_limit, memory_limit, output_limit, blocked, bad_tests
    returncode: int | None
    stdout: str
    stderr: str
    tests_passed: int = 0
    tests_total: int = 0


def run(program: str, limits: SandboxLimits | None = None, tests: str = "") -> SandboxResult:
    """Run ``program`` then ``tests`` (Python source, typically asserts); passed only if every test passed."""
    limits = limits or SandboxLimits()
    try:
        plan = steps(tests)
    except SyntaxError as exc:
        return SandboxResult(False, "bad_tests", None, "", f"the tests are not Python: {exc}")
    return _execute(backend(limits.isolation), program, plan, limits)


def backend(choice: str) -> str:
    """The backend for an ``isolation`` choice, probed once per process (threads wait for the first probe);
    a named backend that cannot run here is a :class:`ConfigError` naming ``--code.isolation``."""
    with _CHOOSING:
        name, problem = _choose(choice)
    if problem:
        raise ConfigError(f"--code.isolation {choice}: unavailable here: {problem}; use --code.isolation auto")
    return name


_CHOOSING = threading.Lock()


@functools.cache
def _choose(choice: str) -> tuple[str, str | None]:
    """``(backend, None)``, or ``(choice, why it cannot run)``: cached either way, so a missing backend
    is probed once per process, not once per sample."""
    if choice != "auto":
        return choice, _unavailable(choice)
    problems = []
    for name in ("bwrap", "unshare"):
        problem = _unavailable(name)
        if problem is None:
            return name, None
        problems.append(problem)
    log.warning("code sandbox: %s; using weaker isolation (rlimits, audit hook, no network): a hostile program "
                "can read and delete host files (home directories, the grader's tests) and read the trainer's environment "
                "through /proc", "; ".join(problems))
    return "weak", None


def _unavailable(name: str) -> str | None:
    if name == "weak":
        return None
    if name == "bwrap" and not shutil.which("bwrap"):
        return "bubblewrap not found: install it (apt-get install bubblewrap) for full isolation"
    if name == "unshare" and not shutil.which("unshare"):
        return "unshare (util-linux) not found"
    probe = _execute(name, "", [], SandboxLimits(wall_s=30))
    if probe.passed:
        return None
    last = (probe.stderr.strip().splitlines() or [probe.reason])[-1]
    return f"the {name} sandbox does not start here ({last})"


@functools.cache
def _weak_namespaces() -> tuple[str, ...]:
    """``unshare -rn``: a user namespace (no privileges outside) with an empty network namespace."""
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-rn", "true"], capture_output=True).returncode == 0:
        return unshare, "-rn"
    return ()


def _view() -> tuple[list[tuple[str, str]], list[tuple[str, str]], list[str]]:
    """Read-only binds (source, target), symlinks (target, path) and covered directories (an empty read-only
    tmpfs over each) that make the interpreter run: no home, no /etc, no installed packages of the interpreter."""
    binds = [("/usr", "/usr")]
    covered = []
    if RELOCATED:
        binds += [(f"{PREFIX}/bin", f"{SANDBOX_PREFIX}/bin"), (f"{PREFIX}/lib", f"{SANDBOX_PREFIX}/lib")]
        if os.path.isdir(f"{PREFIX}/{SITE_PACKAGES}"):
            covered.append(f"{SANDBOX_PREFIX}/{SITE_PACKAGES}")
    elif PREFIX != "/usr" and not PREFIX.startswith("/usr/"):
        binds.append((PREFIX, PREFIX))
    links = []
    for path in ROOT_DIRS:
        if os.path.islink(path):
            links.append((os.readlink(path), path))
        elif os.path.isdir(path):
            binds.append((path, path))
    return binds, links, covered


def _environment(name: str, workdir: Path) -> dict[str, str]:
    """The program's whole environment: nothing of the trainer's (API keys, tokens, paths) is passed on."""
    home = str(workdir) if name == "weak" else "/sandbox"
    env = {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8"}
    if RELOCATED and name != "weak":  # the interpreter's RUNPATH names libpython's host directory, absent inside
        env["LD_LIBRARY_PATH"] = f"{SANDBOX_PREFIX}/lib"
    return env


def _command(name: str, tmpfs_bytes: int) -> tuple[list[str], dict | None]:
    """argv, and the ``confine`` job for a runner that builds its own view."""
    binds, links, covered = _view()
    if name == "bwrap":
        argv = [shutil.which("bwrap"), "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
                "--new-session", "--uid", SANDBOX_UID, "--gid", SANDBOX_UID, "--hostname", "sandbox"]
        for source, target in binds:
            argv += ["--ro-bind", source, target]
        for target, path in links:
            argv += ["--symlink", target, path]
        for path in covered:
            argv += ["--tmpfs", path, "--remount-ro", path]
        for device in DEVICES:
            argv += ["--dev-bind", device, device]
        argv += ["--ro-bind", str(RUNNER.parent), "/runner", "--size", str(tmpfs_bytes), "--tmpfs", "/sandbox",
                 "--chdir", "/sandbox", "--remount-ro", "/", "--clearenv"]
        for key, value in _environment(name, Path("/sandbox")).items():  # a setuid bwrap would drop LD_* itself
            argv += ["--setenv", key, value]
        return [*argv, SANDBOX_INTERPRETER, "-I", "-B", "/runner/runner.py"], None
    if name == "unshare":
        argv = [shutil.which("unshare"), "--user", "--map-root-user", "--mount", "--net", "--pid", "--ipc", "--uts",
                "--fork", "--kill-child"]
        # /tmp is only the mount point of the new root, inside the private mount namespace; the host's is untouched
        confine = {"root": "/tmp", "binds": binds, "links": links, "covered": covered, "devices": list(DEVICES),
                   "tmpfs_bytes": tmpfs_bytes, "prefix": [PREFIX, SANDBOX_PREFIX]}
        return [*argv, INTERPRETER, "-I", "-B", str(RUNNER)], confine
    return [*_weak_namespaces(), INTERPRETER, "-I", "-B", str(RUNNER)], None


def _execute(name: str, program: str, plan: list[Step], limits: SandboxLimits) -> SandboxResult:
    file_cap = limits.output_kb * 1024 * 16
    argv, confine = _command(name, 4 * file_cap + len(program.encode()))
    workdir = Path(tempfile.mkdtemp(prefix="rlhf-sandbox-"))
    read_fd, write_fd = os.pipe()
    try:
        job = {"result_fd": write_fd, "confine": confine, "seccomp": name != "weak", "program": program,
               "steps": [step.job() for step in plan],
               "limits": {"cpu_s": limits.cpu_s, "memory_bytes": limits.memory_mb * 2**20, "file_bytes": file_cap}}
        (workdir / "job.json").write_text(json.dumps(job))
        with open(workdir / "job.json", "rb") as stdin, open(workdir / "stdout", "wb") as out, \
                open(workdir / "stderr", "wb") as err:
            process = subprocess.Popen(argv, cwd=workdir, stdin=stdin, stdout=out, stderr=err, pass_fds=(write_fd,),
                                       env=_environment(name, workdir),
                                       start_new_session=True)
        os.close(write_fd)  # the sandbox holds the only write end now: EOF means it is gone
        write_fd = -1
        data, stop = _collect(read_fd, limits.wall_s, limits.output_kb * 1024 + RESULT_SLACK)
        returncode = _finish(process, 1.0 if stop is None else 0.0, nested=name != "weak")
        if name == "bwrap" and returncode is not None and returncode > 128:
            returncode = 128 - returncode  # bubblewrap reports a child killed by signal N as 128 + N
        stdout = (workdir / "stdout").read_bytes()[: limits.output_kb * 1024].decode(errors="replace")
        stderr = (workdir / "stderr").read_bytes()[: limits.output_kb * 1024].decode(errors="replace")
    finally:
        for fd in (read_fd, write_fd):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(workdir, ignore_errors=True)
    passed, count, errors = _outcome(data, plan)
    reason = stop or ("passed" if passed else _reason(returncode, "\n".join(errors) + "\n" + stderr))
    return SandboxResult(passed and stop is None, reason, returncode, stdout, stderr, count, len(plan))


def _collect(fd: int, wall_s: float, cap: int) -> tuple[bytes, str | None]:
    """Everything written to the result pipe until EOF; or what came before the deadline or the cap."""
    deadline = time.monotonic() + wall_s
    data = bytearray()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            return bytes(data), "timeout"
        chunk = os.read(fd, 65536)
        if not chunk:
            return bytes(data), None
        data += chunk
        if len(data) > cap:
            return bytes(data), "output_limit"


def _finish(process: subprocess.Popen, grace_s: float, nested: bool) -> int | None:
    """The exit status, or None when it had to be killed; either way nothing of the sandbox is left running."""
    try:
        return process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    # Kill the pid namespace's init (bubblewrap's or unshare's child): its parent can exit only after the kernel has
    # killed and reaped everything in the namespace. Killing the parent first would return while they still run.
    deadline = time.monotonic() + 2.0
    while nested and time.monotonic() < deadline:
        for child in _children(process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        try:
            process.wait(timeout=0.1)
            return None
        except subprocess.TimeoutExpired:
            continue
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    return None


def _children(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:  # a kernel without CONFIG_PROC_CHILDREN: only the process-group kill is left
        return []


def _outcome(data: bytes, plan: list[Step]) -> tuple[bool, int, list[str]]:
    """(all passed, tests passed, error texts) from the result lines; any line out of protocol fails the run."""
    try:
        records = [json.loads(line) for line in data.decode(errors="replace").splitlines()]
    except (ValueError, RecursionError):  # RecursionError: nesting deep enough to exhaust the parser
        return False, 0, ["the result channel was corrupted"]
    errors = [r["error"] for r in records if isinstance(r, dict) and isinstance(r.get("error"), str)]
    if not records or records[0] != {"loaded": True}:
        return False, 0, errors
    results = records[1: 1 + len(plan)]
    count = sum(isinstance(r, dict) and r.get("i") == i and step.passed(r) for i, (step, r) in enumerate(zip(plan, results)))
    complete = len(records) == len(plan) + 2 and records[-1] == {"done": True}
    return complete and count == len(plan), count, errors


def _reason(returncode: int | None, text: str) -> str:
    if returncode in (-signal.SIGXCPU, -signal.SIGKILL) or "CPU time limit exceeded" in text:
        return "cpu_limit"
    if returncode == -signal.SIGXFSZ or "[Errno 27] File too large" in text:
        return "output_limit"
    if "SandboxViolation" in text or "PermissionError: [Errno 1]" in text:  # audit hook, or seccomp's EPERM
        return "blocked"
    if "MemoryError" in text:
        return "memory_limit"
    return "failed"
