"""Rollout engines and weight-sync transports are plugins: listed, chosen by name, and one written
from docs/plugins/rollout-engine.md alone trains."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from rlhf_test_support import base_flags

from rlhf.records.metrics import read_metrics
from rlhf.scaffold import write_plugin
from rlhf.testing.cli import assert_ok, assert_user_error, run_rlhf


def run_flags(task_files, model: Path, run: Path, steps: int) -> list[str]:
    """A tiny GRPO run on the HF engine (``--vllm.num_engines 0``)."""
    return [*base_flags(model, task_files["prompts"], run, "hf", steps=steps),
            "--reward.remote_url", str(task_files["reward"]), "--algo.advantage.estimator", "group_norm",
            "--rollout.n_samples_per_prompt", "2", "--train.batch_size", "8", "--algo.kl.init_coef", "0"]


def test_rlhf_plugins_lists_the_engines_and_transports() -> None:
    records = json.loads(assert_ok(run_rlhf("plugins", "--json")).stdout)
    components: dict[str, set[str]] = {}
    for record in records:
        for kind, names in (record.get("components") or {}).items():
            components.setdefault(kind, set()).update(names)
    assert {"vllm", "hf"} <= components["rollout_engine"]
    assert {"object_store", "gloo", "nccl", "ipc"} <= components["weight_sync_transport"]
    kinds = {record["name"]: record["kind"] for record in records}
    assert kinds["vllm"] == kinds["hf-generate"] == kinds["torch-sync"] == "backends"


@pytest.mark.parametrize("flags,names", [
    (["--vllm.num_engines", "1", "--plugins", "no:vllm"], ["--rollout.engine", "'vllm'", "pip install rlhf-plugin-vllm"]),
    (["--rollout.engine", "hf", "--plugins", "no:hf-generate"], ["--rollout.engine", "'hf'", "pip install rlhf-plugin-hf-generate"]),
    (["--rollout.engine", "sglang"], ["--rollout.engine", "'sglang'", "hf, vllm"]),
    (["--vllm.sync_backend", "gloo", "--plugins", "no:torch-sync"], ["--vllm.sync_backend", "'gloo'", "rlhf-plugin-torch-sync"]),
], ids=["vllm blocked", "hf blocked", "unknown engine", "transport blocked"])
def test_an_engine_or_transport_that_is_not_installed_is_one_line_naming_its_distribution(
        flags, names, task_files, tiny_causal_lm_path, tmp_path) -> None:
    assert_user_error(run_rlhf("train", "ppo", *run_flags(task_files, tiny_causal_lm_path, tmp_path, 1), *flags), *names)


@pytest.mark.slow
def test_an_engine_written_from_its_docs_page_passes_the_kit_and_trains_two_steps(task_files, tiny_causal_lm_path,
                                                                                  tmp_path: Path) -> None:
    from rlhf.testing.conformance import check_rollout_engine

    package = write_plugin("rollout-engine", "stepwise", tmp_path)
    source = package / "src"
    sys.path.insert(0, str(source))
    try:
        from rlhf_plugin_stepwise.engine import StepwiseEngine

        check_rollout_engine(StepwiseEngine, tiny_causal_lm_path)
    finally:
        sys.path.remove(str(source))
    # a file item adds the package's hooks to the installed plugins (a bare name would be an allow-list)
    argv = [*run_flags(task_files, tiny_causal_lm_path, tmp_path, 2),
            "--plugins", str(source / "rlhf_plugin_stepwise" / "__init__.py"), "--rollout.engine", "stepwise"]
    result = assert_ok(run_rlhf("train", "ppo", *argv, env={"PYTHONPATH": str(source), "RAY_ADDRESS": ""}, timeout=900))
    metrics = read_metrics(tmp_path / "out")
    assert [m["step"] for m in metrics] == [1, 2], result.stderr[-2000:]
    assert all("policy_loss" in m for m in metrics)


@pytest.mark.parametrize("engine,num_engines,expected", [
    ("auto", None, "hf"), ("auto", 0, "hf"), ("auto", 2, "vllm"), ("hf", 2, "hf"), ("stepwise", 0, "stepwise")])
def test_auto_keeps_the_meaning_of_vllm_num_engines(engine, num_engines, expected) -> None:
    from rlhf.config.ppo import PPOConfig
    from rlhf.runtime.rollout.engines import rollout_engine_name

    config = PPOConfig()
    config.rollout.engine, config.vllm.num_engines = engine, num_engines
    assert rollout_engine_name(config) == expected


def test_an_engine_for_the_training_ranks_is_refused_until_the_core_places_one(plugin_host, register_plugin) -> None:
    import types

    import rlhf
    from rlhf.config.ppo import PPOConfig
    from rlhf.errors import ConfigError
    from rlhf.runtime.rollout.engines import rollout_engine_class

    class InRank:
        in_training_rank = True

    class InActor:
        in_training_rank = False

    def rlhf_register_rollout_engines(register):
        register("in_rank", InRank)
        register("in_actor", InActor)

    register_plugin(types.SimpleNamespace(rlhf_plugin_api=rlhf.PLUGIN_API_VERSION,
                                          rlhf_register_rollout_engines=rlhf.hookimpl(rlhf_register_rollout_engines)),
                    name="engines")
    config = PPOConfig()
    config.rollout.engine = "in_actor"
    assert rollout_engine_class(config, plugin_host.registry) is InActor
    config.rollout.engine = "in_rank"
    with pytest.raises(ConfigError, match="--rollout.engine in_rank: an engine that lives inside the training ranks"):
        rollout_engine_class(config, plugin_host.registry)
