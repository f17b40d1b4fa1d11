"""Importance-sampling correction of the train/rollout mismatch (``--algo.advantage.is_correction_*``).

π_old (the trainer's recompute) and π_rollout (the engine's sampling log-probs)
differ; each token's policy loss is multiplied by a coefficient c_t:

* w_t = exp(log π_old − log π_rollout), detached;
* the gated statistic s: ``ratio`` → w_t (token) or exp(mean_t log w_t) (seq);
  ``binary_kl`` → p·log(p/q) + (1−p)·log((1−p)/(1−q)) and ``tv`` → |p − q|, with
  p = π_rollout(y_t), q = π_old(y_t) clamped to [1e−6, 1−1e−6] (seq: masked token mean);
* ``clip`` → c = clamp(s, lo, hi) (token level, ratio gating only);
  ``mask`` → c = w·[lo ≤ s ≤ hi].

Named schemes: TIS = token/clip/ratio, ICEPOP = token/mask/ratio, seq-mask-tis =
seq/mask/ratio, FlashREINFORCE trust region = seq/mask/binary_kl with one HIGH bound.
Built in the CLI process (to check the flags) and in each actor rank; called in the actor worker,
once per micro-batch; tensors are ``(B, T)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlhf.errors import ConfigError
from rlhf.ops import as_float, masked_mean

if TYPE_CHECKING:
    import torch


def bounds(threshold: list[float]) -> tuple[float, float]:
    """``[LOW, HIGH]``, or a single ``[HIGH]`` meaning ``[0, HIGH]``."""
    return (0.0, threshold[0]) if len(threshold) == 1 else (threshold[0], threshold[1])


def validate(level: str, mode: str, gating: str, threshold: list[float]) -> None:
    """Raise ValueError naming the flags for combinations that have no meaning."""
    if level == "off":
        return
    if len(threshold) not in (1, 2):
        raise ValueError(f"--algo.advantage.is_correction_threshold takes LOW HIGH or one HIGH value (got {threshold})")
    low, high = bounds(threshold)
    if low > high:
        raise ValueError(f"--algo.advantage.is_correction_threshold: LOW {low} is above HIGH {high}")
    if mode == "clip" and (level != "token" or gating != "ratio"):
        raise ValueError("--algo.advantage.is_correction_mode clip needs --algo.advantage.is_correction_level token "
                         "and --algo.advantage.is_correction_gating ratio")
    if gating != "ratio" and low != 0.0:
        raise ValueError(f"--algo.advantage.is_correction_gating {gating} bounds a divergence: give one HIGH threshold "
                         f"or LOW 0 (got LOW {low})")


def correction(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor, *, level: str, mode: str,
               gating: str, threshold: list[float]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The per-token coefficient ``(B, T)`` and the ``vllm_kl`` / ``is_filter_ratio`` metrics."""
    import torch

    old, rollout, mask = as_float(old_logprobs).detach(), as_float(rollout_logprobs).detach(), as_float(mask)
    log_w = (old - rollout) * mask
    w = torch.exp(log_w)
    if gating == "ratio":
        stat = torch.exp(masked_mean(log_w, mask, dim=1))[:, None].expand_as(w) if level == "seq" else w
    else:
        p = torch.exp(rollout).clamp(1e-6, 1 - 1e-6)
        q = torch.exp(old).clamp(1e-6, 1 - 1e-6)
        if gating == "binary_kl":
            stat = p * torch.log(p / q) + (1 - p) * torch.log((1 - p) / (1 - q))
        else:
            stat = (p - q).abs()
        if level == "seq":
            stat = masked_mean(stat, mask, dim=1)[:, None].expand_as(w)
    low, high = bounds(threshold)
    inside = (stat >= low) & (stat <= high)
    coefficient = stat.clamp(low, high) if mode == "clip" else w * inside
    if level == "seq":
        has_tokens = mask.sum(dim=1) > 0
        filtered = (~inside[:, 0] & has_tokens).float().sum() / has_tokens.float().sum().clamp(min=1)
    else:
        filtered = masked_mean((~inside).float(), mask)
    metrics = {"vllm_kl": masked_mean(rollout - old, mask), "is_filter_ratio": filtered}
    return coefficient * mask, metrics


class ImportanceSampling:
    """The :class:`rlhf.components.RolloutCorrection` of ``--algo.advantage.is_correction_*``: active unless
    ``--algo.advantage.is_correction_level off``."""

    def __init__(self, level: str = "off", mode: str = "mask", gating: str = "ratio",
                 threshold: tuple[float, ...] = (0.5, 5.0)) -> None:
        try:
            validate(level, mode, gating, list(threshold))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self.level, self.mode, self.gating, self.threshold = level, mode, gating, list(threshold)
        self.active = level != "off"

    @classmethod
    def from_config(cls, config: Any) -> ImportanceSampling:
        advantage = config.algo.advantage
        return cls(advantage.is_correction_level, advantage.is_correction_mode, advantage.is_correction_gating,
                   tuple(advantage.is_correction_threshold))

    def __call__(self, old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor,
                 action_mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return correction(old_log_probs, rollout_log_probs, action_mask, level=self.level, mode=self.mode,
                          gating=self.gating, threshold=self.threshold)
