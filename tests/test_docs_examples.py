"""Code shown in the docs is the code the tests run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ECHO = ROOT / "tests" / "fixture_plugins" / "rlhf-plugin-echo"


def test_reward_pack_page_shows_the_tested_fixture_verbatim() -> None:
    page = (ROOT / "docs" / "rewards.md").read_text()
    for path in (ECHO / "pyproject.toml", ECHO / "rlhf_plugin_echo" / "__init__.py", ECHO / "rlhf_plugin_echo" / "rewards.py"):
        assert path.read_text().rstrip() in page, f"docs/rewards.md does not show {path.relative_to(ROOT)} as it is"


PLUGIN_PAGES = ROOT / "docs" / "plugins"


def test_plugin_pages_show_the_generated_and_tested_code() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "sync_plugin_docs.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_every_kind_has_a_page_showing_its_whole_worked_example() -> None:
    from rlhf_plugin_scaffold.scaffold import KINDS, render

    for kind, spec in KINDS.items():
        page = (PLUGIN_PAGES / spec.doc).read_text()
        shown = set(re.findall(rf"<!-- generated: {kind} (\w+) (\S+) -->", page))
        names = {name for name, _ in shown}
        assert len(names) == 1, f"{spec.doc}: expected one worked example of {kind}, got {names}"
        (name,) = names
        wanted = {path for path in render(kind, name) if path.endswith(".py")}
        assert {path for _, path in shown} == wanted, f"{spec.doc} does not show every file of its example"
        assert spec.doc in (PLUGIN_PAGES / "README.md").read_text()


def test_the_async_reward_example_passes_the_reward_kit_as_a_plugin_file(plugin_host, register_plugin) -> None:
    from rlhf.registry import ComponentKind
    from rlhf.testing.conformance import check_reward_function

    register_plugin(PLUGIN_PAGES / "examples" / "async_judge.py")
    reward = plugin_host.registry.get(ComponentKind.REWARD_FUNCTION, "ends_with_label")
    check_reward_function(reward)
    from rlhf.reward_terms import call_reward

    assert call_reward(reward, ["Q: 2+3 = 5", "Q: no"], ["Q:", "Q:"], ["5", "5"], source="t").rewards == [1.0, 0.0]


def test_the_packaged_plugin_of_writing_plugins_md_works_as_written(tmp_path: Path) -> None:
    """The page's module, component and test, copied into files, pass their own test and kit."""
    page = (ROOT / "docs" / "writing-plugins.md").read_text()
    blocks = re.findall(r"^`(rlhf_plugin_length/\w+\.py)`[^\n]*\n(?:[^\n]+\n)*?\n?```python\n(.*?)```", page, re.M | re.S)
    assert [path for path, _ in blocks] == ["rlhf_plugin_length/__init__.py", "rlhf_plugin_length/reward.py"]
    for path, code in blocks:
        (tmp_path / path).parent.mkdir(exist_ok=True)
        (tmp_path / path).write_text(code)
    (test_code,) = re.findall(r"## Testing it.*?```python\n(.*?)```", page, re.S)
    (tmp_path / "test_length.py").write_text(test_code)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", str(tmp_path / "test_length.py")],
                            capture_output=True, text=True, cwd=tmp_path, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert result.returncode == 0, result.stdout[-3000:]
    # the page's own test, and the kit's: import, registration, pickling and its 4 properties, one test each
    assert "8 passed" in result.stdout, result.stdout[-500:]
