"""Every first-party plugin is its own installable distribution with an entry point and a core range."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PLUGIN_DIRS = sorted(p for p in (ROOT / "plugins").glob("*/*") if (p / "pyproject.toml").is_file())


def test_there_are_first_party_plugins_of_several_kinds() -> None:
    assert {p.parent.name for p in PLUGIN_DIRS} >= {"algorithms", "optimizers"}


@pytest.mark.parametrize("plugin_dir", PLUGIN_DIRS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_plugin_builds_a_wheel_with_its_entry_point(plugin_dir: Path, tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "-w", str(tmp_path), str(plugin_dir)],
        check=True, timeout=300,
    )
    (wheel,) = tmp_path.glob("*.whl")
    assert wheel.name.startswith(f"rlhf_plugin_{plugin_dir.name.replace('-', '_')}-")
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        entry_points = next(n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt"))
        requires = [line for line in archive.read(metadata).decode().splitlines() if line.startswith("Requires-Dist:")]
        groups = archive.read(entry_points).decode()
    assert "Requires-Dist: rlhf-core<0.2,>=0.1" in requires  # every plugin targets the core with a range
    assert f"[rlhf.{plugin_dir.parent.name}]\n{plugin_dir.name} = " in groups
