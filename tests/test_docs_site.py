"""The documentation site (mkdocs.yml, docs/) builds in strict mode: a broken link, a missing page or a public
module that does not import fails it; the API reference is generated from the public modules' docstrings. Served from
a folder and opened in headless Chromium with the network off, its diagrams are drawn and its pictures load."""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from headless_chromium import CHROMIUM, Tab, chromium_tab, classes, elements
from rlhf_test_support import built_once

ROOT = Path(__file__).resolve().parent.parent


def build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(project / "mkdocs.yml"),
                           "-d", str(site)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def build_this_checkouts_site(site: Path) -> None:
    done = build(ROOT, site)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site of this checkout, built once for the session's tests (both xdist workers share it)."""
    return built_once(tmp_path_factory, "docs-site", build_this_checkouts_site)


def test_the_site_builds_strictly_with_the_api_reference(site: Path) -> None:
    reference = (site / "reference" / "components" / "index.html").read_text()
    assert "RolloutScheduler" in reference and "check_config" in reference
    assert "rlhf_register_rollout_schedulers" in (site / "reference" / "hooks" / "index.html").read_text()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass


@pytest.fixture
def served(site: Path) -> Iterator[str]:
    """The built site from its folder on 127.0.0.1, as a reader without a network would open it."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


#: page -> (its mermaid diagrams, the pictures it shows)
PAGES = {"": (0, []), "architecture/": (2, []), "performance/": (0, ["grpo_step_time.png", "memory_scaling.png"]),
         "agents/": (0, ["async_reward_curves.png"])}


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed: scripts/install.sh installs it where "
                    "apt is available (apt-get install chromium)")
def test_in_a_browser_offline_diagrams_are_drawn_and_pictures_load(served: str, tmp_path: Path) -> None:
    with chromium_tab(tmp_path / "profile") as tab:
        for page, (diagrams, pictures) in PAGES.items():
            tab.open(f"{served}/{page}")
            drawn, sources = wait_for_diagrams(tab, diagrams)
            assert (drawn, sources) == (diagrams, 0), f"/{page}: {drawn} of {diagrams} mermaid diagrams drawn as SVG, " \
                f"{sources} left as source; errors: {tab.errors()}"
            images = tab.evaluate("Promise.all(Array.from(document.querySelectorAll('article img'), i => i.decode()"
                                  ".catch(() => null).then(() => [i.getAttribute('src'), i.naturalWidth])))")
            assert [Path(src).name for src, _ in images] == pictures, (page, images)
            assert all(width > 0 for _, width in images), f"/{page}: a picture did not load: {images}"
            wide = [] if page else tab.evaluate("Array.from(document.querySelectorAll('article pre > code'))"
                                ".filter(c => c.scrollWidth > c.clientWidth).map(c => c.textContent.slice(0, 80))")
            assert wide == [], f"the home page's code blocks scroll sideways at 1280 px: {wide}"
            assert tab.errors() == [], (page, tab.errors())
            assert all(url.startswith((served, "data:", "blob:")) for url in tab.requested()), tab.requested()


def wait_for_diagrams(tab: Tab, expected: int, timeout: float = 30) -> tuple[int, int]:
    """How many mermaid diagrams became an SVG (Material draws each in a closed shadow root), and how many blocks are
    still mermaid source, once all are drawn or ``timeout`` is up."""
    deadline = time.monotonic() + timeout
    while True:
        root = tab.document()
        hosts = [div for div in elements(root, "div") if "mermaid" in classes(div)]
        drawn = sum(1 for host in hosts if any(elements(shadow, "svg") for shadow in host.get("shadowRoots", ())))
        sources = sum(1 for pre in elements(root, "pre") if "mermaid" in classes(pre))
        if drawn >= expected and sources == 0 or time.monotonic() > deadline:
            return drawn, sources
        time.sleep(0.2)


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    project = tmp_path / "project"
    shutil.copytree(ROOT / "docs", project / "docs")
    shutil.copy(ROOT / "mkdocs.yml", project / "mkdocs.yml")
    (project / "core").symlink_to(ROOT / "core")  # mkdocstrings reads core/src
    (project / "docs_overrides").symlink_to(ROOT / "docs_overrides")
    with (project / "docs" / "install.md").open("a") as page:
        page.write("\nSee [the missing page](no-such-page.md).\n")
    done = build(project, tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-page.md" in done.stderr
