"""The "try it by hand" commands of the plugin pages run as written, on the tiny offline model, in seconds.

A page marks such a block with ``<!-- try-it-by-hand -->`` on the line before its fenced ``bash`` block
(``<!-- try-it-by-hand: your my_plugin.py -->`` when it runs a file the reader brings: the test writes a
minimal plugin there). The block runs in an empty folder with this environment's ``rlhf`` and ``python`` first
on ``PATH``. One thing is not as written: ``pip install -e DIR`` installs into a folder of the test's own
(``--target``, put on ``PYTHONPATH``) rather than into the environment running the tests.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlhf.records.metrics import read_metrics
from rlhf.testing.cli import child_env

DOCS = Path(__file__).resolve().parents[1] / "docs"
PAGES = sorted([DOCS / "writing-plugins.md", *(DOCS / "plugins").glob("*.md")])
BLOCK = re.compile(r"<!-- try-it-by-hand(?:: your ([\w.]+))? -->\n```bash\n(.*?)```", re.S)
#: what the reader's own plugin file holds for the test: a plugin that registers nothing
READERS_PLUGIN = "import rlhf\n\nrlhf_plugin_api = rlhf.PLUGIN_API_VERSION\n"


def try_it_blocks() -> list[tuple[str, str | None, str]]:
    """(page, the reader's file it needs, the commands) of every marked block."""
    return [(str(page.relative_to(DOCS)), yours, commands) for page in PAGES
            for yours, commands in BLOCK.findall(page.read_text())]


def as_run_here(commands: str, site: Path) -> str:
    """The block, with ``pip install -e DIR`` installing DIR into ``site`` (no index, no build isolation: offline)."""
    return re.sub(r"^pip install -e (\S+)", rf'"{sys.executable}" -m pip install --quiet --no-deps --no-build-isolation '
                  rf'--no-index --target "{site}" ./\1', commands, flags=re.M)


def test_the_pages_mark_their_complete_commands() -> None:
    """Every page with a complete `rlhf train` command (no "…" standing for the rest) marks it to run here."""
    blocks = try_it_blocks()
    assert {page for page, _, _ in blocks} >= {"writing-plugins.md", "plugins/rollout-engine.md"}
    for page in PAGES:
        for block in re.findall(r"(<!-- [^>]*-->\n)?```bash\n(.*?)```", page.read_text(), re.S):
            marker, commands = block
            if re.search(r"^rlhf .*train ppo", commands, re.M) and "…" not in commands:
                assert "try-it-by-hand" in marker, f"{page.name}: a complete command without the try-it-by-hand marker"


@pytest.mark.slow
@pytest.mark.parametrize(("page", "yours", "commands"), try_it_blocks(), ids=[page for page, _, _ in try_it_blocks()])
def test_a_try_it_by_hand_block_trains_two_steps_as_written(page: str, yours: str | None, commands: str,
                                                           tmp_path: Path) -> None:
    """The block runs as written and trains two steps, one rank per role. plugins/rollout-engine.md's block is where
    an engine written from its page (``rlhf plugin new rollout-engine``) installs and trains, in a Ray actor of its own
    (tests/test_backend_plugins.py runs the conformance kit on it)."""
    if yours:
        (tmp_path / yours).write_text(READERS_PLUGIN)
    site = tmp_path / ".site"
    env = child_env(PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
                    PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
                    PIP_DISABLE_PIP_VERSION_CHECK="1")
    done = subprocess.run(["bash", "-e", "-c", as_run_here(commands, site)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, f"{page}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    metrics = read_metrics(tmp_path / "out")
    assert [m["step"] for m in metrics] == [1, 2] and all("policy_loss" in m for m in metrics)  # two trained steps
    workers = json.loads((tmp_path / "out" / "workers.json").read_text())
    groups = [w["group"] for w in (workers if isinstance(workers, list) else workers.get("workers", []))]
    assert groups and all(groups.count(group) == 1 for group in groups), groups  # one rank per role, not 8
