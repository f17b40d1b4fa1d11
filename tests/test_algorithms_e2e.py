"""Each estimator and loss trains end to end on the tiny CPU setup; DAPO filtering rejects and refills.

One step each, except the cases whose second step depends on what the first left behind: GAE's critic trained once,
and the actor's weights synced to the rollout engine (a LoRA adapter's merged weights; the IS correction then compares
the engine's log-probs with the updated actor's).
"""

from __future__ import annotations

import pytest
from rlhf_test_support import base_flags

from rlhf.cli.main import main
from rlhf.records.metrics import read_metrics

pytestmark = pytest.mark.slow

CASES = {
    "gae+tis": (["--algo.advantage.estimator", "gae", "--rollout.n_samples_per_prompt", "1", "--train.batch_size", "4",
                 "--train.micro_batch_size", "4", "--rollout.micro_batch_size", "4",
                 "--algo.advantage.is_correction_level", "token", "--algo.advantage.is_correction_mode", "clip"],
                ("critic_loss", "vllm_kl", "is_filter_ratio")),
    "gae+lora": (["--algo.advantage.estimator", "gae", "--rollout.n_samples_per_prompt", "1", "--train.batch_size", "4",
                  "--train.micro_batch_size", "4", "--rollout.micro_batch_size", "4", "--ds.lora.rank", "4"],  # LoRA on actor and critic
                 ("critic_loss", "value_mean")),
    "reinforce+kl_loss": (["--algo.advantage.estimator", "reinforce", "--rollout.n_samples_per_prompt", "2",
                           "--algo.kl.use_loss", "--algo.kl.estimator", "k2", "--algo.advantage.gamma", "0.9"],
                          ("kl_loss",)),
    "reinforce_baseline+entropy+seq_mean": (["--algo.advantage.estimator", "reinforce_baseline", "--rollout.n_samples_per_prompt", "2",
                                             "--actor.entropy_coef", "0.01", "--actor.loss_agg_mode", "seq-mean-token-mean",
                                             "--algo.kl.init_coef", "0"], ("entropy",)),
    "rloo+icepop": (["--algo.advantage.estimator", "rloo", "--rollout.n_samples_per_prompt", "2", "--algo.kl.init_coef", "0",
                     "--algo.advantage.is_correction_level", "token"], ("is_filter_ratio",)),
    "dr_grpo+unbiased_kl": (["--algo.advantage.estimator", "dr_grpo", "--rollout.n_samples_per_prompt", "2", "--algo.kl.use_loss",
                             "--algo.kl.estimator", "k3", "--algo.kl.unbiased_gradient"], ("kl_loss",)),
    "flash_reinforce": (["--algo.advantage.estimator", "flash_reinforce", "--train.batch_size", "4", "--algo.kl.init_coef", "0",
                         "--train.micro_batch_size", "4", "--rollout.micro_batch_size", "4"], ()),
    "gspo+seq_is": (["--algo.preset", "gspo", "--rollout.n_samples_per_prompt", "2",
                     "--algo.advantage.is_correction_level", "seq", "--algo.advantage.is_correction_threshold", "0.5", "2"],
                    ("ppo_clip_ratio",)),
}

#: cases run for two steps (see the module docstring); the rest run one
TWO_STEPS = {"gae+tis", "gae+lora"}

PARITY_REWARD = '''
def reward_func(queries, prompts, labels, **kwargs):
    # 0/1 by response parity: with n = 2, about half the groups are all-equal and get filtered
    rewards = [float(len(query[len(prompt):]) % 2) for query, prompt in zip(queries, prompts)]
    return {"rewards": rewards, "scores": rewards}
'''


@pytest.mark.parametrize("case", list(CASES))
def test_algorithm_trains(case, ray_cluster, task_files, tiny_causal_lm_path, tmp_path) -> None:
    flags, keys = CASES[case]
    steps = 2 if case in TWO_STEPS else 1
    argv = [*base_flags(tiny_causal_lm_path, task_files["prompts"], tmp_path, "hf", steps=steps),
            "--reward.remote_url", str(task_files["reward"]), "--rollout.max_new_tokens", "8", *flags]
    if "--train.batch_size" not in flags:
        argv += ["--train.batch_size", "8"]
    assert main(["train", "ppo", *argv]) == 0
    metrics = read_metrics(tmp_path / "out")
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))
    for key in ("policy_loss", "reward", *keys):
        assert all(key in m for m in metrics), key
    assert all(m["policy_loss"] == m["policy_loss"] for m in metrics)  # not NaN
    if "--ds.lora.rank" in flags:  # the final save of a LoRA actor is its adapter
        assert (tmp_path / "out" / "adapter_config.json").exists() and not (tmp_path / "out" / "model.safetensors").exists()


def test_dapo_preset_filters_and_refills(ray_cluster, task_files, tiny_causal_lm_path, tmp_path) -> None:
    reward = tmp_path / "parity.py"
    reward.write_text(PARITY_REWARD)
    argv = [*base_flags(tiny_causal_lm_path, task_files["prompts"], tmp_path, "hf", steps=3),
            "--data.max_samples", "16", "--train.num_episodes", "1", "--algo.preset", "dapo",
            "--rollout.n_samples_per_prompt", "2", "--train.batch_size", "8", "--reward.remote_url", str(reward),
            "--rollout.temperature", "1.5"]
    assert main(["train", "ppo", *argv]) == 0
    metrics = read_metrics(tmp_path / "out")
    rates = [m["dynamic_filtering_pass_rate"] for m in metrics]
    assert any(rate < 100.0 for rate in rates), rates  # groups were rejected
    trained = [m for m in metrics if "policy_loss" in m]
    assert trained and all("kl_loss" in m for m in trained)
    # every accepted group has mixed scores, so the mean training score is strictly inside (0, 1)
    assert all(0.0 < m["score"] < 1.0 for m in trained)
