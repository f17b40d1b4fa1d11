"""Steering: what a plugin's ``rlhf_steer`` hook may ask of a run between two steps.

The controller calls ``rlhf_steer(step, metrics, steering)`` once per global step, after the
step (and its evaluation, if due) and before the step's metrics are logged. Each plugin gets
its own :class:`Steering` handle, so every effect names the plugin that asked for it. The
handle only *records* requests; the controller applies them in the order below, logs each one
(one console line, and ``steer/…`` keys in that step's ``metrics.jsonl`` record) and stores
the state they change in the checkpoint, so a resumed run continues with it:

1. coefficients (``kl``, ``entropy``, ``lr_scale``) — from the next training step on;
2. prompt-dataset weights — for the prompt batches drawn from then on;
3. an evaluation of this step (needs ``--eval.dataset``);
4. a checkpoint of this step;
5. a stop: the run ends after this step, saves its model as a finished run does and ends
   with status ``stopped`` (``rlhf_train_end``), the reason in ``run_status.json``.

Nothing here runs per token or per micro-batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["COEFFICIENTS", "Steering", "SteeringView"]

#: The coefficients a plugin may set: the KL coefficient β (``--algo.kl.init_coef``; an adaptive
#: controller, ``--algo.kl.target``, goes on from the new value), the entropy bonus
#: (``--actor.entropy_coef``) and a factor on the actor's scheduled learning rate.
COEFFICIENTS = ("kl", "entropy", "lr_scale")


@dataclass(frozen=True)
class SteeringView:
    """What a steering plugin can read about the run (a snapshot taken before the hooks run)."""

    #: The ``--data.prompt_dataset`` sources, in flag order.
    prompt_datasets: tuple[str, ...]
    #: The sampling weight of each source: ``--data.prompt_probs`` (or equal shares) until a
    #: plugin sets them; they always sum to 1.
    prompt_weights: tuple[float, ...]
    #: The current value of each of :data:`COEFFICIENTS` (``entropy`` is 0 when unset).
    coefficients: dict[str, float]


@dataclass
class Steering:
    """The handle one plugin's ``rlhf_steer`` receives; its methods record requests, applied by the
    controller once every plugin's hook returned. Later calls of the same kind replace earlier ones."""

    plugin: str
    view: SteeringView
    stop_reason: str | None = None
    checkpoint_reason: str | None = None
    evaluate_reason: str | None = None
    prompt_weights: tuple[float, ...] | None = None
    coefficients: dict[str, float] = field(default_factory=dict)
    #: where :meth:`save_checkpoint` asked to write (a folder under ``--ckpt.path``; None: the rotation) and how many to keep
    checkpoint_under: str | None = None
    checkpoint_keep: int | None = None

    @property
    def prompt_datasets(self) -> tuple[str, ...]:
        return self.view.prompt_datasets

    @property
    def current_prompt_weights(self) -> tuple[float, ...]:
        return self.view.prompt_weights

    @property
    def current_coefficients(self) -> dict[str, float]:
        return dict(self.view.coefficients)

    def stop(self, reason: str) -> None:
        """End the run after this step (it is saved and reported as ``stopped``, with ``reason``)."""
        self.stop_reason = _reason(reason)

    def save_checkpoint(self, reason: str = "", *, under: str | None = None, keep: int | None = None) -> None:
        """Write a checkpoint of this step, besides the ``--ckpt.save_steps`` ones. ``under``: a folder name under
        ``--ckpt.path`` that keeps it apart from the rotation and from resume (e.g. ``best``), where the newest
        ``keep`` are kept (default ``--ckpt.max_num``)."""
        if under is not None and (not under or "/" in under or under.startswith((".", "global_step"))):
            raise ValueError(f"save_checkpoint(under={under!r}): give one folder name, not a path or a global_step dir")
        if keep is not None and keep < 1:
            raise ValueError(f"save_checkpoint(keep={keep}): keep at least 1")
        self.checkpoint_reason = _reason(reason or "requested")
        self.checkpoint_under, self.checkpoint_keep = under, keep

    def evaluate(self, reason: str = "") -> None:
        """Evaluate this step on ``--eval.dataset``, besides the ``--eval.steps`` ones."""
        self.evaluate_reason = _reason(reason or "requested")

    def set_prompt_weights(self, weights: Sequence[float]) -> None:
        """Sample the prompt datasets by ``weights`` (one non-negative number per source, not all 0;
        normalised to sum to 1) from the next prompt batch on."""
        values = tuple(float(w) for w in weights)
        if len(values) != len(self.view.prompt_datasets):
            raise ValueError(f"set_prompt_weights got {len(values)} weights for {len(self.view.prompt_datasets)} "
                             f"prompt datasets ({', '.join(self.view.prompt_datasets)})")
        if any(not math.isfinite(w) or w < 0 for w in values) or sum(values) <= 0:
            raise ValueError(f"set_prompt_weights needs finite non-negative weights, not all 0; got {list(values)}")
        total = sum(values)
        self.prompt_weights = tuple(w / total for w in values)

    def set_coefficient(self, name: str, value: float) -> None:
        """Set one of :data:`COEFFICIENTS` (``kl``, ``entropy``, ``lr_scale``) to a finite value ≥ 0."""
        if name not in COEFFICIENTS:
            raise ValueError(f"unknown coefficient {name!r}; steerable: {', '.join(COEFFICIENTS)}")
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"coefficient {name!r} must be finite and >= 0, got {value}")
        self.coefficients[name] = float(value)


def _reason(reason: str) -> str:
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError("a steering request needs a non-empty reason string")
    return reason.strip()
