"""Plugins made by the API 1 and API 2 templates (tests/fixture_plugins/old_api/, from the templates' git history),
with their original `rlhf-core>=0.1,<0.2`, installed from wheels into today's core: each loads with one warning
line, passes its kit and trains; an old plugin that imports a removed name is refused with one line while the
rest goes on (docs/plugin-api.md)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rlhf_test_support import FIXTURES, base_flags, built_once, install_built

from rlhf.records.metrics import read_metrics
from rlhf.testing.cli import assert_ok, assert_user_error, child_env, run_rlhf

OLD = FIXTURES / "old_api"
OLD_PACKAGES = sorted(p for p in OLD.glob("api*/*") if (p / "pyproject.toml").is_file())
OLD_PLUGINS = sorted(p.name.removeprefix("rlhf-plugin-").replace("-", "_") for p in OLD_PACKAGES)
CAP = "rlhf-core<0.2,>=0.1"


@pytest.fixture(scope="module")
def old_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The old packages and rlhf-plugin-legacy built as wheels (from copies: backends build in the source tree) and
    installed by pip from those wheels alone, as a user's index would serve them; once per session (the xdist workers
    share it)."""
    def build(root: Path) -> None:
        copies = [Path(shutil.copytree(p, root / "src" / p.name)) for p in [*OLD_PACKAGES, FIXTURES / "rlhf-plugin-legacy"]]
        install_built(root / "site", copies)

    return built_once(tmp_path_factory, "old-plugins", build) / "site"


def on_path(site: Path) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}


def test_the_fixtures_are_the_templates_of_api_1_and_2_with_their_cap() -> None:
    assert len(OLD_PLUGINS) == 6 and {p.parent.name for p in OLD_PACKAGES} == {"api1", "api2"}
    for package in OLD_PACKAGES:
        assert f'dependencies = ["{CAP.replace("<0.2,>=0.1", ">=0.1,<0.2")}"]' in (package / "pyproject.toml").read_text()


@pytest.mark.slow
def test_old_plugins_load_with_one_warning_line_each(old_site: Path) -> None:
    result = assert_ok(run_rlhf("plugins", "--json", env=on_path(old_site)))
    records = {r["name"]: r for r in json.loads(result.stdout)}
    for name in OLD_PLUGINS:
        assert records[name]["status"] == "ok", records[name]
        assert CAP in records[name]["warning"] and "--strict-plugins refuses it" in records[name]["warning"]
    warnings = [line for line in result.stderr.splitlines() if CAP in line]
    assert sorted(line.split("'")[1] for line in warnings) == OLD_PLUGINS  # one line per old plugin
    legacy = records["legacy"]
    assert legacy["status"] == "incompatible" and "rlhf.engines.hf_models, removed in plugin API 2" in legacy["reason"]
    assert records["ppo"]["status"] == "ok" and records["ppo"]["warning"] == ""
    table = assert_ok(run_rlhf("plugins", env=on_path(old_site))).stdout
    row = next(line for line in table.splitlines() if "api1_reward_function " in line)
    assert "ok: its requirement" in row  # the table shows the warning beside the status


def test_strict_plugins_keeps_refusing_the_cap(old_site: Path) -> None:
    result = run_rlhf("plugins", "--strict-plugins", "--plugins", "api1_reward_function", env=on_path(old_site))
    assert_user_error(result, "plugin 'api1_reward_function'", CAP, "--strict-plugins refuses an upper cap")


def test_old_plugins_pass_their_own_kits_without_a_deprecated_name(old_site: Path, tmp_path: Path) -> None:
    """Their generated tests as they were, with rlhf's deprecation warnings made errors as a plugin's CI would."""
    tests = [shutil.copytree(p / "tests", tmp_path / p.name / "tests") for p in OLD_PACKAGES]
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                             "-W", "error::rlhf.errors.RlhfDeprecationWarning", *map(str, tests)],
                            capture_output=True, text=True, timeout=600, cwd=tmp_path, env=child_env(**on_path(old_site)))
    assert result.returncode == 0, result.stdout[-4000:]
    assert " passed" in result.stdout and "failed" not in result.stdout and "skipped" not in result.stdout


def test_an_api_2_trainer_runs(old_site: Path, tmp_path: Path) -> None:
    assert_ok(run_rlhf("train", "api2_trainer", "--message", "old", "--ckpt.output_dir", str(tmp_path), env=on_path(old_site)))
    assert json.loads((tmp_path / "api2_trainer.json").read_text()) == {"message": "old"}


def test_a_run_selecting_the_plugin_that_imports_a_removed_name_is_one_line(old_site: Path) -> None:
    result = run_rlhf("train", "ppo", "--plugins", "ppo,legacy", "--actor.model_name_or_path", "m", env=on_path(old_site))
    assert_user_error(result, "plugin 'legacy'", "rlhf.engines.hf_models", "removed in plugin API 2", "rlhf.models.loading")


@pytest.mark.slow
def test_old_components_train_two_steps_beside_a_refused_plugin(old_site: Path, task_files, tiny_causal_lm_path,
                                                                  tmp_path: Path) -> None:
    """An API 1 estimator and agent executor, API 1 and API 2 reward functions; legacy is installed too (autoload):
    it is skipped with one line and the run goes on without it."""
    flags = [*base_flags(tiny_causal_lm_path, task_files["prompts"], tmp_path, "hf", steps=2),
             "--vllm.num_engines", "0", "--rollout.n_samples_per_prompt", "2", "--train.batch_size", "8",
             "--algo.advantage.estimator", "api1_advantage_estimator", "--train.agent_executor", "api1_agent_executor",
             "--reward.functions", "api1_reward_function:1.0,api2_reward_function:0.5"]
    result = assert_ok(run_rlhf("train", "ppo", *flags, env=on_path(old_site), timeout=600))
    skipped = [line for line in result.stderr.splitlines() if "plugin 'legacy'" in line]
    assert len(skipped) == 1 and "is incompatible" in skipped[0] and "skipped" in skipped[0], result.stderr[-3000:]
    metrics = read_metrics(tmp_path / "out")
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["reward"] == pytest.approx(m["reward/api1_reward_function"] + 0.5 * m["reward/api2_reward_function"], abs=1e-5)
