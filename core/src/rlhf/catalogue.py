"""Which first-party distribution provides which component name.

Used only for hints: when a name is unknown (e.g. its plugin is not installed or
was blocked), the error says which package to install. Third-party names are
not listed here; ``rlhf plugins`` shows what is installed.
"""

from __future__ import annotations

from rlhf.registry import ComponentKind as K

FIRST_PARTY_PROVIDERS: dict[tuple[K, str], str] = {
    (K.ADVANTAGE_ESTIMATOR, "gae"): "rlhf-plugin-ppo",
    (K.POLICY_LOSS, "ppo"): "rlhf-plugin-ppo",
    (K.KL_ESTIMATOR, "k1"): "rlhf-plugin-kl",
    (K.KL_ESTIMATOR, "k2"): "rlhf-plugin-kl",
    (K.KL_ESTIMATOR, "k3"): "rlhf-plugin-kl",
    (K.ADVANTAGE_ESTIMATOR, "group_norm"): "rlhf-plugin-grpo",
    (K.OPTIMIZER, "adam"): "rlhf-plugin-adamw",
    (K.SCHEDULER, "cosine_with_min_lr"): "rlhf-plugin-adamw",
    (K.REWARD_FUNCTION, "reward_func_file"): "rlhf-plugin-reward-func",
    (K.AGENT_EXECUTOR, "single_turn"): "rlhf-plugin-single-turn",
    (K.ADVANTAGE_ESTIMATOR, "reinforce"): "rlhf-plugin-reinforce",
    (K.ADVANTAGE_ESTIMATOR, "reinforce_baseline"): "rlhf-plugin-reinforce",
    (K.ADVANTAGE_ESTIMATOR, "rloo"): "rlhf-plugin-rloo",
    (K.ADVANTAGE_ESTIMATOR, "dr_grpo"): "rlhf-plugin-dr-grpo",
    (K.ADVANTAGE_ESTIMATOR, "flash_reinforce"): "rlhf-plugin-flash-reinforce",
    (K.POLICY_LOSS, "gspo"): "rlhf-plugin-gspo",
    (K.SAMPLE_FILTER, "dynamic_filtering"): "rlhf-plugin-dapo",
    (K.PRESET, "dapo"): "rlhf-plugin-dapo",
    (K.PRESET, "gspo"): "rlhf-plugin-gspo",
    (K.PRESET, "reinforce_pp"): "rlhf-plugin-reinforce",
    (K.REWARD_FUNCTION, "math_answer"): "rlhf-plugin-math",
    (K.REWARD_FUNCTION, "format"): "rlhf-plugin-format",
    (K.REWARD_FUNCTION, "remote_http"): "rlhf-plugin-remote",
    (K.REWARD_FUNCTION, "code_tests"): "rlhf-plugin-code",
    (K.REWARD_SHAPER, "overlong_penalty"): "rlhf-plugin-length-penalties",
    (K.REWARD_SHAPER, "stop_properly_penalty"): "rlhf-plugin-length-penalties",
    (K.TRAINER, "sft"): "rlhf-plugin-sft",
    (K.TRAINER, "rm"): "rlhf-plugin-rm",
    (K.TRAINER, "dpo"): "rlhf-plugin-dpo",
    (K.TRAINER, "kto"): "rlhf-plugin-kto",
    (K.TRAINER, "prm"): "rlhf-plugin-prm",
    (K.TRAINER, "kd"): "rlhf-plugin-kd",
    (K.COMMAND, "generate"): "rlhf-plugin-best-of-n",
    (K.ROLLOUT_ENGINE, "vllm"): "rlhf-plugin-vllm",
    (K.ROLLOUT_ENGINE, "hf"): "rlhf-plugin-hf-generate",
    (K.WEIGHT_SYNC_TRANSPORT, "ipc"): "rlhf-plugin-vllm",
    (K.WEIGHT_SYNC_TRANSPORT, "object_store"): "rlhf-plugin-torch-sync",
    (K.WEIGHT_SYNC_TRANSPORT, "gloo"): "rlhf-plugin-torch-sync",
    (K.WEIGHT_SYNC_TRANSPORT, "nccl"): "rlhf-plugin-torch-sync",
}
