"""Code shown in the docs is the code the tests run."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ECHO = ROOT / "tests" / "fixture_plugins" / "rlhf-plugin-echo"


def test_reward_pack_page_shows_the_tested_fixture_verbatim() -> None:
    page = (ROOT / "docs" / "rewards.md").read_text()
    for path in (ECHO / "pyproject.toml", ECHO / "rlhf_plugin_echo" / "__init__.py", ECHO / "rlhf_plugin_echo" / "rewards.py"):
        assert path.read_text().rstrip() in page, f"docs/rewards.md does not show {path.relative_to(ROOT)} as it is"
