"""Run untrusted Python in a separate, limited process (see the package docstring)."""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

GUARD = Path(__file__).with_name("guard.py")


class SandboxLimits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    wall_s: float = Field(5.0, gt=0, description="wall-clock limit per program, seconds")
    cpu_s: int = Field(5, gt=0, description="CPU-time limit per program, seconds")
    memory_mb: int = Field(512, gt=16, description="address-space limit, MiB")
    output_kb: int = Field(64, gt=0, description="stdout/stderr kept per program, KiB (files are capped at 16x)")


@dataclass
class SandboxResult:
    passed: bool
    reason: str  # passed, failed, timeout, cpu_limit, memory_limit, output_limit, blocked
    returncode: int | None
    stdout: str
    stderr: str


def _namespaces() -> list[str]:
    """``unshare -rn``: a user namespace (no privileges outside) with an empty network namespace."""
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-rn", "true"], capture_output=True).returncode == 0:
        return [unshare, "-rn"]
    return []


NAMESPACES = _namespaces()


def run(source: str, limits: SandboxLimits | None = None) -> SandboxResult:
    limits = limits or SandboxLimits()
    workdir = Path(tempfile.mkdtemp(prefix="rlhf-sandbox-"))
    try:
        (workdir / "main.py").write_text(source)
        shutil.copy(GUARD, workdir / "guard.py")
        file_cap = limits.output_kb * 1024 * 16

        def limit() -> None:  # runs in the child before exec
            resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
            resource.setrlimit(resource.RLIMIT_AS, (limits.memory_mb * 2**20,) * 2)
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_cap, file_cap))
            resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
            resource.setrlimit(resource.RLIMIT_NPROC, (64, 64))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

        with open(workdir / "stdout", "wb") as out, open(workdir / "stderr", "wb") as err:
            process = subprocess.Popen(
                [*NAMESPACES, sys.executable, "-I", "guard.py"], cwd=workdir, stdout=out, stderr=err,
                stdin=subprocess.DEVNULL, env={"PATH": "/usr/bin:/bin", "HOME": str(workdir)}, preexec_fn=limit,
                start_new_session=True,
            )
            try:
                returncode: int | None = process.wait(timeout=limits.wall_s)
                timed_out = False
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                returncode, timed_out = None, True
        stdout = (workdir / "stdout").read_bytes()[: limits.output_kb * 1024].decode(errors="replace")
        stderr = (workdir / "stderr").read_bytes()[: limits.output_kb * 1024].decode(errors="replace")
        return SandboxResult(returncode == 0, _reason(returncode, timed_out, stderr), returncode, stdout, stderr)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _reason(returncode: int | None, timed_out: bool, stderr: str) -> str:
    if timed_out:
        return "timeout"
    if returncode == 0:
        return "passed"
    if returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return "cpu_limit"
    if returncode == -signal.SIGXFSZ or "[Errno 27] File too large" in stderr:
        return "output_limit"
    if "SandboxViolation" in stderr:
        return "blocked"
    if "MemoryError" in stderr:
        return "memory_limit"
    return "failed"
