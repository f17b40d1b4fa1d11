"""Rollout engines and weight-sync transports are plugins: listed, chosen by name, and one written
from docs/plugins/rollout-engine.md alone passes the conformance kit (its page's try-it-by-hand block, run by
tests/test_docs_try_it.py, installs it and trains two steps)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from rlhf_plugin_scaffold.scaffold import write_plugin
from rlhf_test_support import base_flags

from rlhf.testing.cli import assert_ok, assert_user_error, refused_in_process, run_rlhf


def run_flags(task_files, model: Path, run: Path, steps: int) -> list[str]:
    """A tiny GRPO run on the HF engine (``--vllm.num_engines 0``)."""
    return [*base_flags(model, task_files["prompts"], run, "hf", steps=steps),
            "--reward.remote_url", str(task_files["reward"]), "--algo.advantage.estimator", "group_norm",
            "--rollout.n_samples_per_prompt", "2", "--train.batch_size", "8", "--algo.kl.init_coef", "0"]


def refused_before_ray(capsys: pytest.CaptureFixture[str], run: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """``rlhf train ppo ARGV`` in this process as far as the controller's checks before Ray starts, where an engine
    or transport that cannot run is refused (:func:`rlhf.testing.cli.refused_in_process`)."""
    from rlhf.runtime.control.controller import PPOController

    return refused_in_process(capsys, "ppo", *argv,
                              then=lambda config, host: PPOController(config, host, run)._check_sources())


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
    (["--vllm.num_engines", "1", "--plugins", "no:vllm"], ["--rollout.engine", "'vllm'", "installed (plugin 'vllm', rlhf-plugin-vllm) but blocked by --plugins no:vllm"]),
    (["--rollout.engine", "hf", "--plugins", "no:hf-generate"], ["--rollout.engine", "'hf'", "rlhf-plugin-hf-generate) but blocked by --plugins no:hf-generate"]),
    (["--plugins", "no:hf-generate"], ["--rollout.engine", "'hf'", "rlhf-plugin-hf-generate) but blocked by --plugins no:hf-generate"]),
    (["--rollout.engine", "sglang"], ["--rollout.engine", "'sglang'", "hf, hf-inprocess, vllm"]),
    (["--vllm.sync_backend", "gloo", "--plugins", "no:torch-sync"], ["--vllm.sync_backend", "'gloo'", "rlhf-plugin-torch-sync"]),
], ids=["vllm blocked", "hf blocked", "auto finds no hf engine", "unknown engine", "transport blocked"])
def test_an_engine_or_transport_that_is_blocked_or_not_installed_is_one_line_naming_its_distribution(
        flags, names, request, capsys, task_files, tiny_causal_lm_path, tmp_path) -> None:
    """The first case through the real command (its exit status and stderr), the others in this process."""
    argv = [*run_flags(task_files, tiny_causal_lm_path, tmp_path, 1), *flags]
    real = request.node.callspec.id == "vllm blocked"
    assert_user_error(run_rlhf("train", "ppo", *argv) if real else refused_before_ray(capsys, tmp_path, *argv), *names)


@pytest.mark.slow
def test_an_engine_written_from_its_docs_page_passes_the_kit(tiny_causal_lm_path, tmp_path: Path) -> None:
    """The rollout-engine template (what ``rlhf plugin new rollout-engine`` writes) passes the conformance kit, and its
    package's ``__init__.py`` given as a ``--plugins`` file registers the engine beside the installed ones. That it
    installs and trains two steps, in a Ray actor of its own, is the page's try-it-by-hand block, which
    tests/test_docs_try_it.py runs as written."""
    from rlhf.cli.main import split_plugin_args
    from rlhf.host.plugin_host import PluginHost
    from rlhf.registry import ComponentKind
    from rlhf.testing.conformance import check_rollout_engine

    source = write_plugin("rollout-engine", "stepwise", tmp_path) / "src"
    sys.path.insert(0, str(source))
    try:
        from rlhf_plugin_stepwise.engine import StepwiseEngine

        check_rollout_engine(StepwiseEngine, tiny_causal_lm_path)
        # a file item adds the package's hooks to the installed plugins (a bare name would be an allow-list)
        selection, _ = split_plugin_args(["--plugins", str(source / "rlhf_plugin_stepwise" / "__init__.py")])
        registry = PluginHost.load(selection).registry
        assert registry.get(ComponentKind.ROLLOUT_ENGINE, "stepwise") is StepwiseEngine
        assert {"stepwise", "hf", "vllm"} <= set(registry.names(ComponentKind.ROLLOUT_ENGINE))
    finally:
        sys.path.remove(str(source))


@pytest.mark.parametrize("engine,num_engines,flags,expected", [
    ("auto", None, [], "hf-inprocess"), ("auto", 0, [], "hf-inprocess"), ("auto", 2, [], "vllm"), ("hf", 2, [], "hf"),
    ("stepwise", 0, [], "stepwise"),
    ("auto", 0, ["--ds.zero_stage", "3"], "hf-inprocess"), ("auto", 0, ["--ds.tensor_parallel_size", "2"], "hf"),
    ("auto", 0, ["--train.backend", "fsdp2"], "hf-inprocess"),
    ("auto", 0, ["--ds.zero_stage", "3", "--train.async_enable", "1"], "hf")])
def test_auto_keeps_the_meaning_of_vllm_num_engines(engine, num_engines, flags, expected) -> None:
    """0 or unset: HF generate inside the actor's ranks (whole weights, or ZeRO-3/FSDP2 shards it gathers), else
    (AutoTP, whose ranks would need the same requests; shards in async mode, where generation and training
    would interleave differently on each rank) in its own process."""
    from rlhf.config.ppo import PPOConfig
    from rlhf.config.rollout_engine import rollout_engine_name
    from rlhf.host.plugin_host import PluginHost

    config = PPOConfig()
    config.rollout.engine, config.vllm.num_engines = engine, num_engines
    for flag, value in zip(flags[::2], flags[1::2]):  # --section.field value
        section, field = flag.removeprefix("--").split(".")
        setattr(getattr(config, section), field, type(getattr(getattr(config, section), field))(value))
    assert rollout_engine_name(config, PluginHost.load().registry) == expected


@pytest.mark.parametrize("engine,flags,conflict", [
    ("vllm-inprocess", ["--ds.zero_stage", "3"], "--ds.zero_stage 3 splits its parameters over the ranks"),
    ("vllm-inprocess", ["--train.backend", "fsdp2"], "--train.backend fsdp2 shards its parameters"),
    # hf-inprocess gathers ZeRO-3's and FSDP2's shards, but AutoTP's ranks would each generate a share of their own
    ("hf-inprocess", ["--ds.tensor_parallel_size", "2", "--actor.num_gpus_per_node", "2"],
     "--ds.tensor_parallel_size 2 splits its layers over the ranks (AutoTP)"),
], ids=["zero3", "fsdp2", "hf-autotp"])
def test_an_engine_in_the_training_ranks_is_refused_where_their_weights_are_sharded(
        engine, flags, conflict, capsys, task_files, tiny_causal_lm_path, tmp_path) -> None:
    assert_user_error(refused_before_ray(capsys, tmp_path, *run_flags(task_files, tiny_causal_lm_path, tmp_path, 1),
                                        "--rollout.engine", engine, *flags),
                      f"--rollout.engine {engine} generates inside the actor's training ranks", conflict,
                      "--rollout.engine hf")


ONE_RANK_BACKEND = '''
import rlhf
from rlhf.errors import ConfigError

rlhf_plugin_api = rlhf.PLUGIN_API_VERSION


class OneRankBackend:
    """Serves one rank per model (a plain_torch-like backend); refuses before anything starts."""

    @classmethod
    def check_groups(cls, config, groups):
        for group in groups:
            if group.ranks > 1:
                raise ConfigError(f"--train.backend one_rank trains one rank per model, but the {group.role} has "
                                  f"{group.ranks} ({group.ranks_from}); set them to 1")


@rlhf.hookimpl
def rlhf_register_training_backends(register):
    register("one_rank", OneRankBackend)
'''


def test_a_backend_sees_the_runs_groups_and_refuses_a_role_before_ray_starts(capsys, task_files, tiny_causal_lm_path,
                                                                             tmp_path) -> None:
    """Issue 61: ``check_groups(config, groups)`` gets the groups the trainer plans (roles, ranks and the flags that
    set them), in the CLI process, so a one-rank backend names ``--ref.num_gpus_per_node`` instead of failing in a
    Ray worker a minute later."""
    plugin = tmp_path / "one_rank.py"
    plugin.write_text(ONE_RANK_BACKEND)
    argv = [*run_flags(task_files, tiny_causal_lm_path, tmp_path, 1), "--plugins", str(plugin), "--train.backend",
            "one_rank", "--algo.kl.init_coef", "0.01", "--ref.num_gpus_per_node", "2"]
    assert_user_error(refused_in_process(capsys, "ppo", *argv),
                      "--train.backend one_rank trains one rank per model, but the ref has 2 "
                      "(--ref.num_nodes x --ref.num_gpus_per_node); set them to 1")
