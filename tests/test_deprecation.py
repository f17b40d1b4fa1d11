"""Moved modules keep their old import path for a window (an alias that warns once with the new path and the
release that removes it); removed ones raise one clear ImportError; a plugin that uses a moved module loads with
one warning line (rlhf.deprecation, docs/plugin-api.md). Each import runs in a fresh interpreter: the alias warns
once per process."""

from __future__ import annotations

import subprocess
import sys
import types
import warnings
from pathlib import Path

import pytest

from rlhf.deprecation import MOVED_MODULES, deprecated_names
from rlhf.errors import RlhfDeprecationWarning
from rlhf.testing.cli import assert_ok, child_env, run_rlhf


def python(code: str, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *options, "-c", code], capture_output=True, text=True, timeout=120, env=child_env())


def test_a_moved_module_imports_by_its_old_path_and_warns_once_naming_the_new_one() -> None:
    result = python("import rlhf.supervised.trainer as old, rlhf_supervised.trainer as new\n"
                    "import rlhf.supervised.pairs, rlhf.supervised\n"
                    "assert old is new and old.SupervisedTrainer is new.SupervisedTrainer\n")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "RlhfDeprecationWarning" in line]
    assert len(lines) == 1, result.stderr
    assert "rlhf.supervised is deprecated: it moved to rlhf_supervised (distribution rlhf-supervised)" in lines[0]
    assert "removed in rlhf-core 0.5 (plugin API 5)" in lines[0]


@pytest.mark.parametrize("move", MOVED_MODULES, ids=lambda m: m.old)
def test_every_old_path_is_the_new_module(move) -> None:
    result = python(f"import importlib, {move.new} as new\nassert importlib.import_module({move.old!r}) is new")
    assert result.returncode == 0, result.stderr
    assert move.new in result.stderr and "RlhfDeprecationWarning" in result.stderr


def test_a_plugins_test_suite_can_make_the_warning_an_error(tmp_path: Path) -> None:
    """pytest's -W (or filterwarnings) resolves rlhf's category; a test importing an old path then fails."""
    (tmp_path / "test_old_import.py").write_text("def test_old_path():\n    import rlhf.agents  # noqa: F401\n")
    command = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", str(tmp_path)]
    assert subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=child_env()).returncode == 0
    strict = subprocess.run([*command, "-W", "error::rlhf.errors.RlhfDeprecationWarning"], capture_output=True, text=True,
                            timeout=300, cwd=tmp_path, env=child_env())
    assert strict.returncode == 1 and "RlhfDeprecationWarning: rlhf.agents is deprecated" in strict.stdout, strict.stdout[-3000:]


def test_a_removed_module_names_its_release_and_replacement() -> None:
    result = python("import rlhf.engines.hf_models")
    assert "RemovedNameError: rlhf.engines.hf_models was removed in plugin API 2; use rlhf.models.loading" in result.stderr
    assert python("import rlhf.runtime.workers.batch").returncode == 0  # a package that exists is not shadowed


def test_a_plugin_using_a_moved_module_loads_with_one_warning_line(tmp_path: Path) -> None:
    plugin = tmp_path / "old_agent.py"
    plugin.write_text("import rlhf\nfrom rlhf.agents import AgentInstanceBase\n\nrlhf_plugin_api = 2\n\n\n"
                      "class Agent(AgentInstanceBase):\n    pass\n")
    result = assert_ok(run_rlhf("plugins", "--json", "--plugins", str(plugin)))
    lines = [line for line in result.stderr.splitlines() if "rlhf.agents" in line]
    assert len(lines) == 1 and lines[0].startswith("WARNING") and "plugin 'old_agent'" in lines[0], result.stderr
    assert "moved to rlhf_agents" in lines[0]


def test_deprecated_names_serves_a_moved_name_and_warns_once() -> None:
    module = types.ModuleType("my_pkg.old")
    module.__getattr__ = deprecated_names("my_pkg.old", {"masked": ("rlhf.ops:masked_mean", "my-pkg 2.0")})
    from rlhf.ops import masked_mean

    with pytest.warns(RlhfDeprecationWarning, match=r"my_pkg.old.masked is deprecated: import masked_mean from rlhf.ops"):
        assert module.masked is masked_mean
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert module.masked is masked_mean  # once
    with pytest.raises(AttributeError, match="has no attribute 'other'"):
        module.other  # noqa: B018


def test_a_moved_name_of_a_library_warns_and_is_the_new_one() -> None:
    """run_processor left the agent executors for rlhf.run_context in plugin API 3; both old paths still give it."""
    result = python("from rlhf_agents.executors import run_processor\nfrom rlhf.runtime.agent_engine import run_processor as old\n"
                    "from rlhf.run_context import run_processor as new\nassert run_processor is new and old is new\n")
    assert result.returncode == 0, result.stderr
    assert "rlhf_agents.executors.run_processor is deprecated: import run_processor from rlhf.run_context" in result.stderr
    assert "rlhf.runtime.agent_engine is deprecated: it moved to rlhf_agents.executors" in result.stderr
