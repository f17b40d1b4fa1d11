"""Pairwise reward-model losses, per pair: ``(N,)`` chosen and rejected rewards -> ``(N,)`` losses."""

from __future__ import annotations

from typing import Any


def pairwise_loss(chosen: Any, rejected: Any, loss_type: str, margin: Any = None) -> Any:
    """``sigmoid``: −log σ(r_c − r_r − m) (Bradley-Terry, margin m); ``logexp``: log(1 + e^(r_r − r_c))."""
    import torch.nn.functional as F

    if loss_type == "sigmoid":
        diff = chosen - rejected - (margin if margin is not None else 0.0)
        return -F.logsigmoid(diff)
    return F.softplus(rejected - chosen)
