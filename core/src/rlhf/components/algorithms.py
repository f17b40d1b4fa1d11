"""The algorithm components of an RL step: advantage estimators, policy losses, KL estimators, sample filters,
rollout corrections.

Shapes and the build rules: :mod:`rlhf.components`."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch


@runtime_checkable
class AdvantageEstimator(Protocol):
    """Turns rewards into per-token advantages and returns.

    Constructed once per run in the controller with the run config; its methods run
    in the controller once per rollout batch, after reward shaping and filtering.

    Traits (class attributes) the core reads before the run starts:

    * ``needs_critic`` — the runtime builds a critic and passes ``values``;
    * ``min_samples_per_prompt`` — 2 for group estimators; the config is rejected
      when ``--rollout.n_samples_per_prompt`` is lower;
    * ``whiten`` — the core whitens the advantages globally (masked mean/std over
      every action token of the rollout batch) after :meth:`advantages`;
    * ``forces_unit_gamma`` — γ is forced to 1 (with a warning) when the user set another.
    """

    needs_critic: ClassVar[bool]
    min_samples_per_prompt: ClassVar[int]
    whiten: ClassVar[bool]
    forces_unit_gamma: ClassVar[bool]

    def group_rewards(self, rewards: torch.Tensor) -> torch.Tensor:
        """Baseline / normalise scalar rewards per prompt group: ``(P, n) -> (P, n)``, fp32."""
        ...

    def advantages(
        self,
        token_rewards: torch.Tensor,
        action_mask: torch.Tensor,
        values: torch.Tensor | None,
        gamma: float,
        lambd: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token advantages and returns, both ``(B, T)``, from per-token rewards ``(B, T)``
        (the scalar reward on the last action token plus any per-token KL term) and, when
        ``needs_critic``, critic values ``(B, T)``."""
        ...


@runtime_checkable
class PolicyLoss(Protocol):
    """The actor's policy loss. Constructed once per actor worker; called once per micro-batch.

    ``token_level`` says whether the result is aggregated per token (``--actor.loss_agg_mode``)
    or per sequence (GSPO forces per-sequence aggregation).
    """

    token_level: ClassVar[bool]

    def __call__(
        self,
        log_probs: torch.Tensor,
        old_log_probs: torch.Tensor,
        advantages: torch.Tensor,
        action_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Per-token loss ``(B, T)`` (unaggregated, zero where masked) and scalar metrics."""
        ...


@runtime_checkable
class KLEstimator(Protocol):
    """A per-token estimate of KL(π ‖ π_ref), selected by ``--algo.kl.estimator NAME``.

    Called with ``log_ratio`` = log π − log π_ref, fp32, ``(B, T)`` (padding positions hold
    0, as do the log-probs there); returns the per-token estimate ``(B, T)``, fp32. It must be
    elementwise (position t depends on ``log_ratio[:, t]`` only) and 0 where the ratio is 0;
    the core clamps the result to [−10, 10] and multiplies it by the action mask.

    Runs in the controller once per rollout batch (the KL metric and, without
    ``--algo.kl.use_loss``, the per-token KL penalty in the reward; no gradient) and in each
    actor worker once per micro-batch (``--algo.kl.use_loss``; the gradient flows through
    ``log_ratio``, so use differentiable torch ops).
    """

    def __call__(self, log_ratio: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class SampleFilter(Protocol):
    """Keeps or rejects whole prompt groups after rewarding (e.g. DAPO dynamic filtering).

    Runs in the controller, once per generated group batch (possibly several times per
    step while the batch refills).
    """

    def keep(self, scores: torch.Tensor) -> torch.Tensor:
        """Boolean ``(P,)``: which groups of the ``(P, n)`` score matrix to keep."""
        ...


@runtime_checkable
class RolloutCorrection(Protocol):
    """A per-token coefficient on the policy loss for the gap between the rollout engine's sampling
    distribution π_rollout and the trainer's π_old (TIS, ICEPOP, sequence-level masks…).

    Every registered correction is built (``from_config``) in the CLI process, to check its options, and
    in each actor rank; the one whose ``active`` is true applies (two active ones are a config error).
    While one is active the controller sends the engines' sampling log-probs to the actor.

    Called in the actor worker, once per training micro-batch, with ``old_log_probs`` and
    ``rollout_log_probs`` ``(B, T)`` (detached) and ``action_mask`` ``(B, T)``. Returns the coefficient
    ``c`` ``(B, T)``, 0 on padding, that multiplies a token-level policy loss, and metrics (scalar
    tensors, logged as means). A sequence-level loss (``token_level = False``, e.g. GSPO) is not
    multiplied: it takes its ratio against π_rollout directly.
    """

    active: bool

    def __call__(self, old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor,
                 action_mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]: ...
