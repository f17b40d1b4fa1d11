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


@pytest.fixture(scope="module")
def plugin_wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every first-party plugin's wheel, built by one pip call (pip's own start-up is most of a single build)."""
    wheels = tmp_path_factory.mktemp("wheels")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "-w", str(wheels), *map(str, PLUGIN_DIRS)],
        check=True, timeout=600,
    )
    return wheels


@pytest.mark.parametrize("plugin_dir", PLUGIN_DIRS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_plugin_builds_a_wheel_with_its_entry_point(plugin_dir: Path, plugin_wheels: Path) -> None:
    (wheel,) = plugin_wheels.glob(f"rlhf_plugin_{plugin_dir.name.replace('-', '_')}-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        entry_points = next(n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt"))
        requires = [line for line in archive.read(metadata).decode().splitlines() if line.startswith("Requires-Dist:")]
        groups = archive.read(entry_points).decode()
    assert "Requires-Dist: rlhf-core<0.2,>=0.1" in requires  # every plugin targets the core with a range
    assert f"[rlhf.{plugin_dir.parent.name}]\n{plugin_dir.name} = " in groups


def _requirement_name(requirement: str) -> str:
    from packaging.requirements import Requirement

    return Requirement(requirement).name


def test_the_meta_distribution_depends_on_the_core_and_every_first_party_plugin() -> None:
    import tomllib

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    plugins = {tomllib.loads((p / "pyproject.toml").read_text())["project"]["name"] for p in PLUGIN_DIRS}
    assert sorted(map(_requirement_name, meta)) == sorted({"rlhf-core", *plugins})


def test_the_install_hints_table_is_generated_from_the_plugins_registrations() -> None:
    """core/src/rlhf/first_party.json (rlhf.host.catalogue's hints) equals what the installed plugins register."""
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_catalogue.py"), "--check"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
