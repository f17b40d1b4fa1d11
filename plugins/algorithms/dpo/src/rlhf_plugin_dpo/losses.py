"""Preference losses per pair: ``(N,)`` summed response log-probs in, ``(N,)`` losses out."""

from __future__ import annotations

from typing import Any


def preference_margin(policy_chosen: Any, policy_rejected: Any, ref_chosen: Any, ref_rejected: Any) -> Any:
    """z = (log π_c − log π_r) − (log π_ref,c − log π_ref,r)."""
    return (policy_chosen - policy_rejected) - (ref_chosen - ref_rejected)


def dpo_loss(z: Any, beta: float, label_smoothing: float = 0.0, ipo: bool = False) -> Any:
    """DPO/cDPO: −(1−ε)·log σ(βz) − ε·log σ(−βz); IPO: (z − 1/(2β))²."""
    import torch.nn.functional as F

    if ipo:
        return (z - 1.0 / (2.0 * beta)) ** 2
    return -(1.0 - label_smoothing) * F.logsigmoid(beta * z) - label_smoothing * F.logsigmoid(-beta * z)
