"""Masked tensor math shared by algorithm plugins (one implementation, many estimators/losses).

Shapes: ``values`` and ``mask`` are ``(B, T)``; reductions over ``dim`` follow torch.
All results are computed in at least fp32, whatever the input dtype.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def as_float(x: torch.Tensor) -> torch.Tensor:
    """Promote to at least fp32 (bf16/fp16 -> fp32, fp64 stays fp64)."""
    import torch

    return x.to(torch.promote_types(x.dtype, torch.float32))


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Σ values·mask / Σ mask over ``dim`` (all elements when None); 0 where the mask is empty."""
    values, mask = as_float(values), as_float(mask)
    total = (values * mask).sum() if dim is None else (values * mask).sum(dim)
    count = mask.sum() if dim is None else mask.sum(dim)
    return total / count.clamp(min=1)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, *, shift_mean: bool = True, std_norm: bool = True) -> torch.Tensor:
    """Global masked whitening: (A − μ)·rsqrt(max(σ², 1e−8)) with μ, σ² the masked mean and
    biased variance over every masked element; ``std_norm=False`` keeps only the mean shift."""
    import torch

    values = as_float(values)
    mean = masked_mean(values, mask)
    out = values - mean if shift_mean else values
    if std_norm:
        var = masked_mean((values - mean) ** 2, mask)
        out = out * torch.rsqrt(var.clamp(min=1e-8))
    return out


def discounted_returns(token_rewards: torch.Tensor, action_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = Σ_{k≥t} γ^{k−t} r_k over masked tokens, ``(B, T) -> (B, T)``, zero where masked."""
    import torch

    rewards = as_float(token_rewards) * action_mask
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
    return returns * action_mask


def compute_approx_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, estimator: str = "k1") -> torch.Tensor:
    """Per-token KL estimate from ℓ = log π − log π_ref (fp32), clamped to [−10, 10].

    k1 = ℓ; k2 = ℓ²/2; k3 = e^(−ℓ) − 1 + ℓ with ℓ clamped at ≥ −10 before the exp.
    """
    import torch

    ratio = as_float(log_probs) - as_float(ref_log_probs)
    if estimator == "k1":
        kl = ratio
    elif estimator == "k2":
        kl = ratio**2 / 2.0
    elif estimator == "k3":
        ratio = ratio.clamp(min=-10.0)
        kl = torch.exp(-ratio) - 1.0 + ratio
    else:
        raise ValueError(f"--algo.kl.estimator {estimator!r}: expected k1, k2 or k3")
    return kl.clamp(-10.0, 10.0)
