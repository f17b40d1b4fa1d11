"""The actor's objective for one training micro-batch, as pure tensor math (no DeepSpeed, no Ray).

    L = agg(c·ℓ) + β·token_mean(KL) [--algo.kl.use_loss] − c_H·token_mean(H) [--actor.entropy_coef]

ℓ is the selected policy loss per token and c the coefficient of the active rollout correction
(:class:`rlhf.components.RolloutCorrection`). Only the policy term follows ``--actor.loss_agg_mode`` (forced to
seq-mean-token-mean when the loss is sequence-level, e.g. GSPO); the KL and entropy terms
are token means whatever the mode, as OpenRLHF 0.11.2 computes them (its ``aggregate_loss``
is called without ``token_level_loss`` for both).

Every mean divides by the normalisers of the whole optimizer step and multiplies by the
factor that cancels DeepSpeed's averaging, so summing the micro-batch losses of one
optimizer step (as DeepSpeed does) yields one exact mean over all of its tokens/sequences.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlhf.components import build
from rlhf.config.ppo_rules import active_correction
from rlhf.ops import aggregate_loss, compute_approx_kl, kl_with_unbiased_gradient, masked_mean
from rlhf.registry import ComponentKind

if TYPE_CHECKING:
    import torch

    from rlhf.components import KLEstimator, PolicyLoss, RolloutCorrection
    from rlhf.config.ppo import PPOConfig
    from rlhf.registry import ComponentRegistry


@dataclass(frozen=True)
class StepNormalisers:
    """Denominators of one optimizer step, over every accumulation micro-batch on every rank.

    ``sequences`` counts only sequences with at least one action token: an empty response
    adds to neither sum of seq-mean-token-mean. ``scale`` is accumulation steps × data-parallel
    size, undoing DeepSpeed's 1/accumulation loss scaling and its mean over ranks.
    """

    tokens: float
    sequences: float
    scale: float = 1.0


def step_counts(response_lengths: list[int]) -> tuple[float, float]:
    """``(action tokens, sequences with at least one action token)`` of some responses."""
    return float(sum(response_lengths)), float(sum(1 for n in response_lengths if n > 0))


@dataclass(frozen=True)
class ObjectiveSettings:
    """The flags the objective reads; ``from_config`` takes them from a ``PPOConfig`` and builds the
    ``--algo.kl.estimator`` component (needed only when the KL is a loss) and the active rollout correction."""

    loss_agg_mode: str = "token-mean"
    correction: RolloutCorrection | None = None
    kl_as_loss: bool = False
    kl_estimator: KLEstimator | None = None
    kl_unbiased_gradient: bool = False
    entropy_coef: float | None = None

    @classmethod
    def from_config(cls, config: PPOConfig, registry: ComponentRegistry | None = None) -> ObjectiveSettings:
        kl = config.algo.kl
        kl_estimator = None
        if kl.use_loss and registry is not None:

            kl_estimator = build(registry.get(ComponentKind.KL_ESTIMATOR, kl.estimator, flag="--algo.kl.estimator"), config)
        return cls(
            loss_agg_mode=config.actor.loss_agg_mode,
            correction=active_correction(config, registry) if registry is not None else None,
            kl_as_loss=kl.use_loss,
            kl_estimator=kl_estimator,
            kl_unbiased_gradient=kl.unbiased_gradient,
            entropy_coef=config.actor.entropy_coef,
        )

    @property
    def correcting(self) -> bool:
        return self.correction is not None


def policy_objective(
    policy_loss: PolicyLoss,
    settings: ObjectiveSettings,
    normalisers: StepNormalisers,
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    action_mask: torch.Tensor,
    *,
    rollout_log_probs: torch.Tensor | None = None,
    ref_log_probs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """The scalar loss of one micro-batch (to backpropagate) and its metrics.

    All per-token inputs are ``(B, T)``; ``log_probs`` and ``entropy`` carry the gradient.
    ``rollout_log_probs`` is needed when IS correction is on, ``ref_log_probs`` for KL as a
    loss; ``entropy`` (per token, from the same temperature-scaled logits) is given exactly
    when ``--actor.entropy_coef`` is set. Metrics are local masked means of this micro-batch.
    """

    policy_mode = settings.loss_agg_mode if policy_loss.token_level else "seq-mean-token-mean"
    step = {"num_tokens": normalisers.tokens, "num_sequences": normalisers.sequences, "scale": normalisers.scale}

    def token_mean(values: torch.Tensor) -> torch.Tensor:
        return aggregate_loss(values, action_mask, "token-mean", **step)

    if settings.correcting and not policy_loss.token_level:
        # sequence-level losses (GSPO) take the ratio against the rollout policy directly
        token_loss, metrics = policy_loss(log_probs, rollout_log_probs, advantages, action_mask)
    else:
        token_loss, metrics = policy_loss(log_probs, old_log_probs, advantages, action_mask)
        if settings.correction is not None:
            coefficient, is_metrics = settings.correction(old_log_probs.detach(), rollout_log_probs.detach(), action_mask)
            token_loss = token_loss * coefficient
            metrics.update(is_metrics)
    loss = aggregate_loss(token_loss, action_mask, policy_mode, **step)
    metrics["policy_loss"] = masked_mean(token_loss.detach(), action_mask)
    if settings.kl_as_loss and ref_log_probs is not None:
        if settings.kl_estimator is None:
            raise ValueError("KL as a loss needs ObjectiveSettings.kl_estimator (from_config(config, registry) builds it)")
        if settings.kl_unbiased_gradient:
            kl = kl_with_unbiased_gradient(log_probs, ref_log_probs, old_log_probs, settings.kl_estimator)
        else:
            kl = compute_approx_kl(log_probs, ref_log_probs, settings.kl_estimator)
        loss = loss + kl_coef * token_mean(kl)
        metrics["kl_loss"] = masked_mean(kl.detach(), action_mask)
    if entropy is not None:
        metrics["entropy"] = masked_mean(entropy.detach(), action_mask)
        if settings.entropy_coef:
            loss = loss - settings.entropy_coef * token_mean(entropy)
    return loss, metrics
