"""From rewarded samples to per-token advantages (OpenRLHF's order of operations).

1. rewards ≥ fp32; 2. group step of the estimator on the ``(P, n)`` reward matrix;
3. clamp to ``--reward.clip_range``, place on the last action token, subtract
β·KL per token (the ``--algo.kl.estimator`` component) when the KL is in the reward; 4. the estimator's advantages and
returns; 5. global masked whitening when the estimator asks for it.
Runs in the controller, once per rollout batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlhf.ops import compute_approx_kl, masked_mean, masked_whiten
from rlhf.runtime.workers.batch import Sample, pad_list

if TYPE_CHECKING:
    from rlhf.config.ppo import PPOConfig


def compute_advantages(
    samples: list[Sample],
    n: int,
    config: PPOConfig,
    estimator: Any,
    kl_coef: float,
    old_logprobs: list[list[float]] | None,
    ref_logprobs: list[list[float]] | None,
    values: list[list[float]] | None,
    kl_estimator: Any = None,
) -> tuple[list[list[float]], list[list[float]], dict[str, float]]:
    import torch

    width = max(1, max(len(s.response_ids) for s in samples))
    mask = pad_list([s.mask() for s in samples], width)  # multi-turn: environment tokens are 0
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
    metrics: dict[str, float] = {}
    if n > 1:
        metrics["group_reward_std"] = float(rewards.view(-1, n).std(dim=1).mean())
    shaped = estimator.group_rewards(rewards.view(-1, n)).reshape(-1)
    low, high = config.reward.clip_range
    shaped = shaped.clamp(low, high)

    token_rewards = torch.zeros_like(mask)
    has_tokens = mask.sum(dim=1) > 0
    rows = torch.arange(len(samples))[has_tokens]
    # the last action token: the last index where the mask is 1 (a trajectory may end on feedback)
    last_action = width - 1 - mask.flip(dims=[1]).argmax(dim=1)
    token_rewards[rows, last_action[has_tokens]] = shaped[has_tokens]
    if ref_logprobs is not None and old_logprobs is not None:
        if kl_estimator is None:
            raise ValueError("reference log-probs were given without the --algo.kl.estimator component")
        kl = compute_approx_kl(pad_list(old_logprobs, width), pad_list(ref_logprobs, width), kl_estimator) * mask
        metrics["kl"] = float(masked_mean(kl, mask, dim=1).mean())
        if not config.algo.kl.use_loss:
            token_rewards = token_rewards - max(kl_coef, 0.0) * kl
    value_tensor = pad_list(values, width) if values is not None else None
    advantages, returns = estimator.advantages(token_rewards, mask, value_tensor, config.algo.advantage.gamma, config.algo.advantage.lambd)
    if estimator.whiten:
        advantages = masked_whiten(advantages, mask, std_norm=not config.algo.advantage.no_std_norm) * mask
    metrics["advantage_mean"] = float(masked_mean(advantages, mask))
    if value_tensor is not None:
        metrics["value_mean"] = float(masked_mean(value_tensor, mask))
    adv_rows = [advantages[i, : len(s.response_ids)].tolist() for i, s in enumerate(samples)]
    ret_rows = [returns[i, : len(s.response_ids)].tolist() for i, s in enumerate(samples)]
    return adv_rows, ret_rows, metrics
