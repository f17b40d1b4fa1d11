"""Composed rewards in the tiny CPU loop: a pip-installed third-party pack next to first-party packs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from rlhf_test_support import PRIVATE, base_flags

from rlhf.cli.main import main
from rlhf.records.metrics import read_metrics
from rlhf.testing.cli import run_in_process

pytestmark = pytest.mark.slow


def test_third_party_pack_trains_composed_with_first_party_rewards(third_party_site: Path, task_files,
                                                                  tiny_causal_lm_path: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The pip-installed pack's term (echo_length, with its own --echo.scale) trains beside first-party terms and
    length penalties: every term is logged each step and the run records the plugins and their settings. The pack's
    site dir is on this process's path for the test only: the run (HF engine, no critic, no reference, no reward
    model) keeps its ranks and reward terms in this process and starts no Ray."""
    monkeypatch.syspath_prepend(str(third_party_site))
    monkeypatch.syspath_prepend(str(PRIVATE))
    flags = [*base_flags(tiny_causal_lm_path, task_files["prompts"], tmp_path, "hf", steps=2),
             "--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt", "4", "--train.batch_size", "16",
             "--algo.kl.init_coef", "0",
             "--reward.functions", "echo_length:0.01,math_answer:1.0,format:0.1:zero", "--reward.score_term", "math_answer",
             "--echo.scale", "0.5", "--reward.overlong_buffer_len", "2", "--reward.stop_properly_penalty_coef", "0.5"]
    result = run_in_process("train", "ppo", *flags)
    assert result.returncode == 0, result.stderr[-4000:]
    metrics = read_metrics(tmp_path / "out")
    assert [m["step"] for m in metrics] == [1, 2]
    for key in ("reward/echo_length", "reward/math_answer", "reward/format", "policy_loss"):
        assert all(key in m for m in metrics), key
    config = yaml.safe_load((tmp_path / "out" / "rlhf_config.yaml").read_text())
    assert {"echo", "math", "format", "length-penalties"} <= {p["name"] for p in config["plugin_set"]}
    assert config["plugins"]["echo"]["scale"] == 0.5


BROKEN_TERM = '''
import rlhf

rlhf_plugin_api = rlhf.PLUGIN_API_VERSION


def crashes_on_sevens(queries, prompts, labels, **kwargs):
    if any("7" in str(label) for label in labels):
        raise ValueError("cannot handle sevens")
    return [1.0] * len(queries)


@rlhf.hookimpl
def rlhf_register_reward_functions(register):
    register("crashes_on_sevens", crashes_on_sevens)
'''


def test_a_broken_term_does_not_stop_the_run(ray_cluster, task_files, tiny_causal_lm_path, tmp_path) -> None:
    plugin = tmp_path / "broken_term.py"
    plugin.write_text(BROKEN_TERM)
    argv = [*base_flags(tiny_causal_lm_path, task_files["prompts"], tmp_path, "hf", steps=2), "--plugins", str(plugin),
            "--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt", "2", "--train.batch_size", "8",
            "--algo.kl.init_coef", "0", "--reward.functions", "crashes_on_sevens:1.0:skip-sample,math_answer:1.0"]
    labels = [json.loads(line)["label"] for line in task_files["prompts"].read_text().splitlines()]
    assert any("7" in label for label in labels[:8])
    assert main(["train", "ppo", *argv]) == 0
    metrics = read_metrics(tmp_path / "out")
    assert sum(m.get("reward_failures/crashes_on_sevens", 0.0) for m in metrics) > 0
    assert sum(m.get("reward_skipped_groups", 0.0) for m in metrics) > 0


def test_two_reward_models_are_summed_and_normalised(ray_cluster, task_files, tiny_causal_lm_path, tiny_reward_model_path,
                                                     tmp_path) -> None:
    import shutil

    paths = []
    for name, mean, std in (("rm_a", 0.0, 1.0), ("rm_b", 1.0, 2.0)):  # same weights, different stored statistics
        target = tmp_path / name
        shutil.copytree(tiny_reward_model_path, target)
        config = json.loads((target / "config.json").read_text())
        (target / "config.json").write_text(json.dumps({**config, "mean": mean, "std": std}))
        paths.append(str(target))
    argv = [*base_flags(tiny_causal_lm_path, task_files["prompts"], tmp_path, "hf", steps=1), "--algo.kl.init_coef", "0",
            "--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt", "2", "--train.batch_size", "8",
            "--reward.model_name_or_path", ",".join(paths), "--reward.normalize_enable"]
    assert main(["train", "ppo", *argv]) == 0
    (metrics,) = read_metrics(tmp_path / "out")
    assert metrics["reward/reward_model_1"] == pytest.approx((metrics["reward/reward_model_0"] - 1.0) / 2.0, abs=1e-5)
    assert metrics["reward"] == pytest.approx(metrics["reward/reward_model_0"] + metrics["reward/reward_model_1"], abs=1e-5)
