"""The KL coefficient β across steps (``--algo.kl.init_coef``, ``--algo.kl.target``, ``--algo.kl.horizon``).

OpenRLHF picks ``AdaptiveKLController if args.kl_target else FixedKLController``: a target
of 0 is falsy there, so it means the fixed controller, exactly like no target.
"""

from __future__ import annotations


class KLController:
    """Fixed coefficient, or the adaptive controller of Ziegler et al. when ``target`` is set and
    non-zero: e = clip(KL/target − 1, ±0.2), β ← β·(1 + e·n_steps/horizon)."""

    def __init__(self, init_coef: float, target: float | None, horizon: int) -> None:
        self.value, self.target, self.horizon = init_coef, target, horizon

    @property
    def adaptive(self) -> bool:
        return bool(self.target)

    def update(self, current_kl: float, n_steps: int) -> None:
        if not self.adaptive:
            return
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


def observed_kl(metrics: dict[str, float], kl_as_loss: bool) -> float:
    """The step's KL that the controller tracks (OpenRLHF: ``kl_ctl.update(status["kl"], …)``).

    With ``--algo.kl.use_loss`` OpenRLHF's actor overwrites ``status["kl"]`` with its KL loss
    (the masked-mean KL between the policy and the reference, averaged over micro-batches), which
    rlhf's actor reports as ``kl_loss``; otherwise it is the KL of experience making, ``kl``.
    Without a reference model there is no KL, and 0 is fed, as in OpenRLHF.
    """
    return float(metrics.get("kl_loss" if kl_as_loss else "kl", 0.0))
