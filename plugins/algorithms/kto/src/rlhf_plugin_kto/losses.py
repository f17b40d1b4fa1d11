"""The KTO loss as pure tensor functions (Ethayarajh et al. 2024, Eq. 2-3; OpenRLHF's ``KTOLoss``).

Every tensor is *per sequence*: one value per sample, the log-probability summed over the
sample's completion tokens. Run inside :meth:`KTOTrainer.compute` on the trainer's device,
once per micro-batch; importable on its own so tests can check the formula.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def kl_estimate(policy_logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """``(M,), (M,) -> ()``: mean log π/π_ref over the mismatched (x_i, y_{i+1}) pairs, detached (not clamped)."""
    return (policy_logps - ref_logps).mean().detach()


def kto_loss(policy_logps: torch.Tensor, ref_logps: torch.Tensor, kl: torch.Tensor, desirable: torch.Tensor,
             beta: float, desirable_weight: float = 1.0, undesirable_weight: float = 1.0) -> torch.Tensor:
    """Per-sample KTO losses ``(N,)``.

    ``policy_logps``/``ref_logps``: ``(N,)`` Σ log p of each matched completion under the policy and
    the reference. ``kl``: the scalar reference point; it is detached and clamped at 0 here.
    ``desirable``: ``(N,)`` bool. Desirable: ``w_d · (1 − σ(β(r − KL)))``; undesirable:
    ``w_u · (1 − σ(β(KL − r)))`` with ``r = log π/π_ref(y|x)``.
    """
    import torch

    logratio = policy_logps.float() - ref_logps.float()
    reference = kl.detach().float().clamp(min=0)
    good = desirable_weight * (1 - torch.sigmoid(beta * (logratio - reference)))
    bad = undesirable_weight * (1 - torch.sigmoid(beta * (reference - logratio)))
    return torch.where(desirable.to(torch.bool), good, bad)
