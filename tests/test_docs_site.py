"""The documentation site (mkdocs.yml, docs/) builds in strict mode: a broken link, a missing page or a public
module that does not import fails it; the API reference is generated from the public modules' docstrings."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(project / "mkdocs.yml"),
                           "-d", str(site)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def test_the_site_builds_strictly_with_the_api_reference(tmp_path: Path) -> None:
    done = build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stderr[-3000:]
    reference = (tmp_path / "site" / "reference" / "components" / "index.html").read_text()
    assert "RolloutScheduler" in reference and "check_config" in reference
    assert "rlhf_register_rollout_schedulers" in (tmp_path / "site" / "reference" / "hooks" / "index.html").read_text()


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    project = tmp_path / "project"
    shutil.copytree(ROOT / "docs", project / "docs")
    shutil.copy(ROOT / "mkdocs.yml", project / "mkdocs.yml")
    (project / "core").symlink_to(ROOT / "core")  # mkdocstrings reads core/src
    with (project / "docs" / "install.md").open("a") as page:
        page.write("\nSee [the missing page](no-such-page.md).\n")
    done = build(project, tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-page.md" in done.stderr
