"""Sleep mode: ``--ds.enable_sleep`` (DeepSpeed states offloaded between fits) and ``--vllm.enable_sleep``
(rollout engines asleep outside generation), checked by what DeepSpeed reports and what training produces."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path
from typing import Any

import pytest
from rlhf_test_support import base_flags

pytestmark = pytest.mark.slow

CHECKS = Path(__file__).resolve().parents[1] / "plugins" / "backends" / "deepspeed" / "tests" / "checks"


def test_deepspeed_states_sleep_between_steps_and_training_is_unchanged(tiny_causal_lm_path: Path, capsys) -> None:
    """ZeRO-2 and ZeRO-3, each trained plain and asleep between steps (deepspeed_sleep.py, run for each stage in this
    process, as a trainer runs its ranks here: in this process's one-rank group, the environment and transformers'
    ZeRO-3 switch put back after each stage; rlhf.distributed)."""
    from rlhf.distributed import group_environment, restored_process

    script, argv = str(CHECKS / "deepspeed_sleep.py"), sys.argv
    for stage in ("2", "3"):
        with restored_process():
            group_environment(launcher=False)  # the group this process is in, or a one-rank one (the script's defaults)
            sys.argv = [script, str(tiny_causal_lm_path), stage]
            try:
                runpy.run_path(script, run_name="__main__")
            finally:
                sys.argv = argv
    stdout = capsys.readouterr().out
    printed = [json.loads(line) for line in stdout.splitlines() if line.startswith('{"plain"')]
    assert len(printed) == 2, stdout[-4000:]
    for stage, runs in zip((2, 3), printed):
        plain, slept = runs["plain"], runs["slept"]
        # what DeepSpeed itself reports offloaded: every wanted state it moves at this stage, between every step
        moved = {2: ["hp_params", "lp_grads", "optim_states"], 3: ["contiguous_grad_buffer", "lp_grads"]}[stage]
        assert slept["asleep"] == [moved] * 4 and slept["awake"] == [[]] * 4, stage
        assert plain["asleep"] == [[]] * 4, stage  # without the flag nothing moves
        assert slept["losses"] == pytest.approx(plain["losses"], abs=1e-6, rel=0), stage
        assert plain["losses"][-1] != plain["losses"][0], stage  # it trained
        assert slept["asleep_loss"] == pytest.approx(plain["asleep_loss"], abs=1e-6, rel=0), stage  # forwards work asleep


def _controller(flags: list[str], run: Path) -> Any:
    from rlhf.config.loading import ConfigParser
    from rlhf.config.ppo import PPOConfig
    from rlhf.host.plugin_host import PluginHost
    from rlhf.runtime.control.controller import PPOController
    from rlhf.runtime.control.trainer import PPOTrainer

    host = PluginHost.load()
    config, _ = ConfigParser(PPOConfig, host, prog="t").parse(flags)
    config = PPOTrainer.prepare_config(config, host)
    config.plugin_set = host.resolved()
    return PPOController(config, host, run)


def _release(controller: Any) -> None:
    import ray

    from rlhf.runtime.cluster.local import LocalHandle

    for group in (controller.actor, controller.critic):
        for worker in group.workers:
            if not isinstance(worker, LocalHandle):  # ranks in this process end with the run
                ray.kill(worker)
    for engine in controller.engines.engines:
        ray.kill(engine)


def test_sleeping_engines_and_states_train_exactly_as_awake_ones(ray_cluster, task_files, tiny_causal_lm_path,
                                                                 tmp_path) -> None:
    """PPO with a critic, actor and critic colocated with one vLLM engine: with both sleep flags the
    engine gets OpenRLHF's sleep/wake sequence, the critic fits before the actor (each model's
    states reloaded only around its own fit), and every loss equals the run without them. Both runs
    keep their ZeRO-2 ranks in this process beside the engine process (no rank processes to start):
    where the ranks live changes no number, and DeepSpeed's offload of a rank is the same there."""
    import ray

    from rlhf.records.metrics import read_metrics

    def run(name: str, *extra: str) -> tuple[list[dict], list[list[str]], list[tuple[str, str]]]:
        flags = base_flags(tiny_causal_lm_path, task_files["prompts"], tmp_path / name, "vllm", steps=2)
        flags += ["--reward.remote_url", str(task_files["reward"]), "--critic.model_name_or_path", str(tiny_causal_lm_path),
                  "--algo.kl.init_coef", "0", "--rollout.n_samples_per_prompt", "2", "--train.batch_size", "8",
                  "--train.colocate_all", "--eval.dataset", str(task_files["prompts"]), "--eval.steps", "2",
                  "--eval.n_samples_per_prompt", "1", *extra]
        controller = _controller(flags, tmp_path / name / "out")
        try:
            controller.run()
            history = ray.get(controller.engines.engines[0].sleep_history.remote())
            # both models' DeepSpeed sleep logs, merged into one order by their wall-clock times
            logged = [(time, model, event) for model, group in (("actor", controller.actor), ("critic", controller.critic))
                      for event, time in ray.get(group.workers[0].sleep_history.remote())]
        finally:
            _release(controller)
        return read_metrics(tmp_path / name / "out"), history, [(model, event) for _, model, event in sorted(logged)]

    awake_metrics, awake_history, awake_states = run("awake", "--train.in_process", "on")
    slept_metrics, slept_history, slept_states = run("slept", "--train.in_process", "on", "--vllm.enable_sleep",
                                                     "--ds.enable_sleep")
    assert awake_history == [] and awake_states == []  # without the flags nothing is ever put to sleep
    # both asleep after set-up (set up side by side: either first); then each step the critic alone
    # is reloaded, fits and is offloaded, and only then the actor
    assert sorted(slept_states[:2]) == [("actor", "offload"), ("critic", "offload")]
    one_step = [("critic", "reload"), ("critic", "train"), ("critic", "offload"),
                ("actor", "reload"), ("actor", "train"), ("actor", "offload")]
    assert slept_states[2:] == one_step * 2
    generate, sync = [["wake_up"], ["sleep"]], [["wake_up", "weights"], ["sleep"]]
    # created → asleep; per step: generate, then the weight sync after training; step 2 also evaluates
    assert slept_history == [["sleep"], *generate, *sync, *generate, *sync, *generate]
    compared = ("policy_loss", "critic_loss", "reward", "eval/reward")
    assert [sorted(k for k in m if k in compared) for m in awake_metrics] == [sorted(compared[:3]), sorted(compared)]
    for key in compared:
        got, want = ([m[key] for m in run if key in m] for run in (slept_metrics, awake_metrics))
        assert got == pytest.approx(want, abs=1e-6, rel=0), key
    assert awake_metrics[1]["critic_loss"] != awake_metrics[0]["critic_loss"]  # both steps trained on new samples
