"""The core's layers (pyproject.toml [tool.importlinter], docs/architecture.md) hold: checked with import-linter."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import tomllib

ROOT = Path(__file__).resolve().parents[1]
LINT = str(Path(sys.executable).with_name("lint-imports"))


def lint(source_root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(source_root)}
    return subprocess.run([LINT, "--config", str(ROOT / "pyproject.toml"), "--no-cache"], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)


def layered() -> dict[str, set[str]]:
    """Container package -> the packages its layers contract names."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    out = {}
    for contract in contracts:
        for container in contract.get("containers", ["rlhf"]):
            prefix = "" if container == "rlhf" else container + "."
            out[container] = {prefix + name.strip() for layer in contract["layers"] for name in layer.split("|")}
    return out


def test_every_package_of_the_core_and_of_its_runtime_has_a_layer() -> None:
    graph = grimp.build_graph("rlhf", cache_dir=None)
    for container, names in layered().items():
        depth = container.count(".") + 2
        children = {".".join(m.split(".")[:depth]) for m in graph.modules if m.startswith(container + ".")}
        assert children == names, f"give each package or module of {container} a layer in pyproject.toml [tool.importlinter]"


def test_the_layers_hold() -> None:
    result = lint(ROOT / "core" / "src")
    assert result.returncode == 0, result.stdout[-3000:]


def test_an_import_upwards_breaks_the_layers(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "core" / "src" / "rlhf", tmp_path / "rlhf", ignore=shutil.ignore_patterns("__pycache__"))
    ops = tmp_path / "rlhf" / "ops.py"
    ops.write_text(ops.read_text() + "\n\ndef _upwards():\n    from rlhf.runtime.control import controller  # noqa: F401\n")
    result = lint(tmp_path)
    assert result.returncode == 1 and "rlhf.ops -> rlhf.runtime.control.controller" in result.stdout, result.stdout[-3000:]
