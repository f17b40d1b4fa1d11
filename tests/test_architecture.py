"""The core's layers (pyproject.toml [tool.importlinter], docs/architecture.md) hold: checked with import-linter."""

from __future__ import annotations

import ast
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
        assert children == {".".join(name.split(".")[:depth]) for name in names}, (
            f"give each package or module of {container} a layer in pyproject.toml [tool.importlinter]")
        for split in {name.rsplit(".", 1)[0] for name in names if name.count(".") >= depth}:  # a package layered by module
            parts = {".".join(m.split(".")[:depth + 1]) for m in graph.modules if m.startswith(split + ".")}
            assert parts <= names, f"give each module of {split} a layer: {sorted(parts - names)}"


def test_the_layers_hold() -> None:
    result = lint(ROOT / "core" / "src")
    assert result.returncode == 0, result.stdout[-3000:]


def test_an_import_upwards_breaks_the_layers(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "core" / "src" / "rlhf", tmp_path / "rlhf", ignore=shutil.ignore_patterns("__pycache__"))
    ops = tmp_path / "rlhf" / "ops.py"
    ops.write_text(ops.read_text() + "\n\ndef _upwards():\n    from rlhf.runtime.control import controller  # noqa: F401\n")
    result = lint(tmp_path)
    assert result.returncode == 1 and "rlhf.ops -> rlhf.runtime.control.controller" in result.stdout, result.stdout[-3000:]


def function_local_rlhf_imports(source: str) -> list[int]:
    """Lines of ``import rlhf…``/``from rlhf… import`` statements inside a function (TYPE_CHECKING blocks aside)."""
    found = []

    class Visitor(ast.NodeVisitor):
        depth = 0

        def visit_FunctionDef(self, node: ast.AST) -> None:
            self.depth += 1
            self.generic_visit(node)
            self.depth -= 1

        visit_AsyncFunctionDef = visit_FunctionDef

        def visit_If(self, node: ast.If) -> None:
            if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                self.generic_visit(node)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            if self.depth and node.level == 0 and (node.module or "").split(".")[0] == "rlhf":
                found.append(node.lineno)

        def visit_Import(self, node: ast.Import) -> None:
            if self.depth and any(alias.name.split(".")[0] == "rlhf" for alias in node.names):
                found.append(node.lineno)

    Visitor().visit(ast.parse(source))
    return found


def test_the_core_imports_its_own_modules_at_module_top() -> None:
    """Function-local imports are for deferring heavy libraries (torch, transformers, Ray, vLLM); the core's own
    modules are light, so they are imported at the top where the import graph shows them. The CLI is the
    exception: `rlhf --help` and a one-line error must not pay for loading every command's modules."""
    core = ROOT / "core" / "src" / "rlhf"
    hidden = [f"{path.relative_to(core)}:{line}" for path in sorted(core.rglob("*.py")) if "cli" not in path.parts
              for line in function_local_rlhf_imports(path.read_text())]
    assert not hidden, f"move these rlhf imports to the module top: {hidden}"


def test_the_scan_finds_a_function_local_import() -> None:
    source = ("from rlhf import ops\nif TYPE_CHECKING:\n    from rlhf.components import X\n"
              "def f():\n    import torch\n    from rlhf.runtime import control\n")
    assert function_local_rlhf_imports(source) == [6]
