"""Helpers shared by the cross-package tests: fixture plugin packages and a real `rlhf` subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixture_plugins"
PRIVATE = FIXTURES / "private"
PACKAGES = ("rlhf-plugin-echo", "rlhf-plugin-echo-shadow", "rlhf-plugin-broken", "rlhf-plugin-badsig",
            "rlhf-plugin-typo", "rlhf-plugin-future")


def pip_install_target(target: Path, *packages: str) -> None:
    """``pip install --target`` fixture packages (no deps: rlhf-core is already installed)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "--target", str(target), *(str(FIXTURES / p) for p in packages)],
        check=True, timeout=300, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )


class RlhfCli:
    """Runs the real ``rlhf`` command in a subprocess with chosen extra site dirs and env."""

    def __init__(self, *site_dirs: Path) -> None:
        self.site_dirs = [str(d) for d in site_dirs]

    def __call__(self, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
                 check: bool = True) -> subprocess.CompletedProcess[str]:
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("RLHF_")}
        full_env["PYTHONPATH"] = os.pathsep.join([*self.site_dirs, str(PRIVATE)])
        full_env.update(env or {})
        result = subprocess.run([sys.executable, "-m", "rlhf", *args], capture_output=True, text=True,
                                env=full_env, cwd=cwd, timeout=120)
        if check and result.returncode != 0:
            raise AssertionError(f"rlhf {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
        return result

    def plugins(self, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> dict[str, dict]:
        result = self("plugins", "--json", *args, env=env, cwd=cwd)
        return {record["name"]: record for record in json.loads(result.stdout)}
