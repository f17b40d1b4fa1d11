"""`rlhf train ppo` options that change what is trained and saved, end to end on tiny models:
EMA, critic freezing, the critic's save, the best checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rlhf_test_support import base_flags
from safetensors.torch import load_file

from rlhf.cli.main import main
from rlhf.records.metrics import read_metrics

pytestmark = pytest.mark.slow


def grpo(reward: Path) -> list[str]:
    return ["--reward.remote_url", str(reward), "--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt",
            "4", "--train.batch_size", "16", "--algo.kl.init_coef", "0", "--actor.lr_warmup_ratio", "0"]


def test_ema_is_what_the_run_saves_and_the_best_eval_is_kept(ray_cluster, task_files, tiny_causal_lm_path, tmp_path) -> None:
    """Two identical 2-step runs but for EMA: the EMA run's model is β²·θ0 + β(1−β)·θ1 + (1−β)·θ2
    of the plain run's weights after each step."""
    def flags(run: Path) -> list[str]:
        return [*base_flags(tiny_causal_lm_path, task_files["prompts"], run, "hf", steps=2), *grpo(task_files["reward"]),
                "--eval.dataset", str(task_files["prompts"]), "--eval.steps", "1", "--eval.n_samples_per_prompt", "2",
                "--ckpt.save_steps", "1", "--ckpt.save_hf", "--ckpt.max_num", "2"]

    beta = 0.6
    assert main(["train", "ppo", *flags(tmp_path / "plain")]) == 0
    assert main(["train", "ppo", *flags(tmp_path / "ema"), "--train.enable_ema", "--train.ema_beta", str(beta),
                 "--ckpt.best_metric_key", "eval/pass1"]) == 0
    plain, ema = read_metrics(tmp_path / "plain" / "out"), read_metrics(tmp_path / "ema" / "out")
    assert [m["policy_loss"] for m in ema] == pytest.approx([m["policy_loss"] for m in plain], rel=1e-6)  # same training
    theta0 = load_file(tiny_causal_lm_path / "model.safetensors")
    theta1 = load_file(tmp_path / "plain" / "ckpt" / "global_step1" / "hf" / "model.safetensors")
    theta2 = load_file(tmp_path / "plain" / "out" / "model.safetensors")
    saved = load_file(tmp_path / "ema" / "out" / "model.safetensors")
    moved = 0.0
    for name, initial in theta0.items():
        expected = beta**2 * initial + beta * (1 - beta) * theta1[name] + (1 - beta) * theta2[name]
        torch.testing.assert_close(saved[name], expected, rtol=0, atol=1e-6, msg=name)
        moved = max(moved, float((saved[name] - theta2[name]).abs().max()))
    assert moved > 1e-4  # the EMA is not the last weights
    # the best eval's checkpoint sits in best/, apart from the two rotating ones
    best = list((tmp_path / "ema" / "ckpt" / "best").iterdir())
    passes = [m["eval/pass1"] for m in ema]
    assert [p.name for p in best] == [f"global_step{1 + (passes[1] > passes[0])}"]
    assert (best[0] / "actor").is_dir() and (best[0] / "actor_ema" / "ema_rank0.pt").is_file()


def test_a_frozen_actor_stays_put_while_the_critic_trains_and_is_saved(ray_cluster, task_files, tiny_causal_lm_path,
                                                                       tiny_reward_model_path, tmp_path) -> None:
    from rlhf.models.loading import load_value_model

    flags = base_flags(tiny_causal_lm_path, task_files["prompts"], tmp_path, "hf", steps=2)
    flags += ["--reward.model_name_or_path", str(tiny_reward_model_path), "--rollout.n_samples_per_prompt", "2",
              "--train.batch_size", "8", "--critic.freezing_steps", "1", "--critic.save_value_network",
              "--actor.lr_warmup_ratio", "0", "--critic.lr_warmup_ratio", "0", "--critic.adam.lr", "1e-2"]
    assert main(["train", "ppo", *flags]) == 0
    metrics = read_metrics(tmp_path / "out")
    assert "critic_loss" in metrics[0] and "policy_loss" not in metrics[0]  # step 1: the critic alone
    assert "critic_loss" in metrics[1] and "policy_loss" in metrics[1]
    critic = load_value_model(str(tmp_path / "out_critic"), torch.float32, "eager", require_head=True)
    reward_model = load_value_model(str(tiny_reward_model_path), torch.float32, "eager", require_head=True)
    assert not torch.equal(critic.score.weight, reward_model.score.weight)  # the critic (from the RM) trained
    assert (tmp_path / "out_critic" / "tokenizer_config.json").is_file()


def test_an_actor_frozen_for_the_whole_run_saves_the_initial_weights(ray_cluster, task_files, tiny_causal_lm_path,
                                                                     tiny_reward_model_path, tmp_path) -> None:
    flags = base_flags(tiny_causal_lm_path, task_files["prompts"], tmp_path, "hf", steps=1)
    flags += ["--reward.model_name_or_path", str(tiny_reward_model_path), "--rollout.n_samples_per_prompt", "2",
              "--train.batch_size", "8", "--critic.freezing_steps", "1"]
    assert main(["train", "ppo", *flags]) == 0
    initial, saved = load_file(tiny_causal_lm_path / "model.safetensors"), load_file(tmp_path / "out" / "model.safetensors")
    assert all(torch.equal(saved[name], tensor) for name, tensor in initial.items())


def gae_run(run: Path, task_files: dict[str, Path], model: Path, *extra: str) -> tuple[list[dict], Path]:
    """2 steps of GAE with a critic grown from the actor (its new value head is drawn from the seeded RNG),
    fully deterministic: the metrics without timings, and the saved model's directory."""
    flags = [*base_flags(model, task_files["prompts"], run, "hf", steps=2), "--reward.remote_url", str(task_files["reward"]),
             "--rollout.n_samples_per_prompt", "2", "--train.batch_size", "8", "--train.full_determinism_enable",
             "--data.dataloader_num_workers", "2", *extra]
    assert main(["train", "ppo", *flags]) == 0
    metrics = [{k: v for k, v in m.items() if not k.startswith("timing/")} for m in read_metrics(run / "out")]
    return metrics, run / "out"


@pytest.fixture(scope="module")
def one_rank_gae_run(ray_cluster, task_files, tiny_causal_lm_path, tmp_path_factory) -> tuple[list[dict], Path]:
    """The run both the determinism and the tensor-parallel tests compare theirs against."""
    return gae_run(tmp_path_factory.mktemp("gae-one-rank"), task_files, tiny_causal_lm_path)


def test_full_determinism_gives_bit_identical_runs(one_rank_gae_run, task_files, tiny_causal_lm_path, tmp_path) -> None:
    (first, first_out), (second, second_out) = one_rank_gae_run, gae_run(tmp_path, task_files, tiny_causal_lm_path)
    assert "critic_loss" in first[0] and first == second  # every metric, bit for bit
    # the runs' ranks lived in this process: its later runs are not left on deterministic algorithms (2-3x slower)
    assert not torch.are_deterministic_algorithms_enabled()
    first_model, second_model = load_file(first_out / "model.safetensors"), load_file(second_out / "model.safetensors")
    assert all(torch.equal(first_model[k], second_model[k]) for k in first_model)


def test_tensor_parallel_actor_trains_as_one_rank(one_rank_gae_run, task_files, tiny_causal_lm_path, tmp_path) -> None:
    """--ds.tensor_parallel_size 2 with 2 actor and 2 critic ranks (one AutoTP group each): the metrics and
    model of 1 rank each."""
    from transformers import AutoModelForCausalLM

    one, one_out = one_rank_gae_run
    split, split_out = gae_run(tmp_path, task_files, tiny_causal_lm_path, "--actor.num_gpus_per_node", "2",
                               "--critic.num_gpus_per_node", "2", "--ds.tensor_parallel_size", "2")
    one_model, split_model = (AutoModelForCausalLM.from_pretrained(out).state_dict() for out in (one_out, split_out))
    for key in ("reward", "response_length", "policy_loss", "critic_loss", "value_mean", "kl"):
        assert [m[key] for m in split] == pytest.approx([m[key] for m in one], rel=1e-4, abs=1e-6), key
    assert set(split_model) == set(one_model)
    for name, tensor in one_model.items():
        assert split_model[name].shape == tensor.shape and (split_model[name] - tensor).abs().max() < 1e-4, name
    assert split[1]["reward"] == pytest.approx(one[1]["reward"])  # step 2 sampled with the synced (gathered) weights
