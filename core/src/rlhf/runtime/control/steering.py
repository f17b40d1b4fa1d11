"""The controller's side of ``rlhf_steer``: call the plugins, apply what they asked, say so.

Coefficients and prompt weights take effect at once (for the next step and the next prompt
batch); evaluation, checkpoint and stop come back as :class:`StepRequests` for the loop.
Every effect becomes a ``steer/…`` metric of the step and one console line; the state they set
(prompt weights: in the data state; ``entropy``/``lr_scale``: under ``steering``; β: ``kl_coef``)
is checkpointed by the controller.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rlhf.config.checks import parse_probabilities
from rlhf.steering import SteeringView

if TYPE_CHECKING:
    from rlhf.runtime.control.controller import PPOController


@dataclass
class StepRequests:
    """What the steering plugins asked of the loop this step, with the plugin and reason of each."""

    evaluate: str | None = None
    checkpoint: str | None = None
    #: checkpoints asked for apart from the rotation: folder under --ckpt.path -> how many to keep there (None: max_num)
    apart: dict[str, int | None] = field(default_factory=dict)
    stop: str | None = None
    notes: list[str] = field(default_factory=list)


def prompt_mix_metrics(prompts: list[dict[str, Any]], sources: int) -> dict[str, float]:
    """``prompt_mix/<i>``: the share of this step's prompts from source ``i`` (with several sources)."""
    if sources < 2 or not prompts:
        return {}
    return {f"prompt_mix/{i}": sum(p.get("prompt_source", 0) == i for p in prompts) / len(prompts) for i in range(sources)}


def steer(controller: PPOController, metrics: dict[str, float]) -> StepRequests:
    """Run every ``rlhf_steer`` hook on this step's ``metrics`` and apply the coefficient and
    prompt-weight requests; ``metrics`` gains a ``steer/…`` key per effect."""
    step = controller.step
    view = SteeringView(prompt_datasets=controller.prompt_sources, prompt_weights=prompt_weights(controller),
                        coefficients=coefficients(controller))
    requests = StepRequests()
    for handle in controller.plugins.steer(step, metrics, view):
        who = f"plugin {handle.plugin!r}"
        for name, value in handle.coefficients.items():
            set_coefficient(controller, name, value)
            metrics[f"steer/{name}"] = value
            requests.notes.append(f"step {step}: {who} set {name} to {value:.4g}")
        if handle.prompt_weights is not None:
            controller.schedule.set_weights(handle.prompt_weights)
            metrics.update({f"steer/prompt_weight/{i}": w for i, w in enumerate(handle.prompt_weights)})
            shown = ", ".join(f"{w:.3g}" for w in handle.prompt_weights)
            requests.notes.append(f"step {step}: {who} set the prompt datasets' weights to [{shown}]")
        for kind, reason in (("evaluate", handle.evaluate_reason), ("checkpoint", handle.checkpoint_reason),
                             ("stop", handle.stop_reason)):
            if reason is not None and kind == "evaluate" and not controller.eval_prompts:
                requests.notes.append(f"step {step}: {who} asked to evaluate ({reason}); skipped: the run has no --eval.dataset")
            elif reason is not None and kind == "checkpoint" and handle.checkpoint_under is not None:
                requests.apart[handle.checkpoint_under] = handle.checkpoint_keep
                metrics["steer/checkpoint"] = 1.0
                requests.notes.append(f"step {step}: {who} asked to checkpoint into {handle.checkpoint_under}/: {reason}")
            elif reason is not None:
                setattr(requests, kind, f"{who}: {reason}")
                metrics[f"steer/{kind}"] = 1.0
                requests.notes.append(f"step {step}: {who} asked to {kind}: {reason}")
    return requests


def prompt_weights(controller: PPOController) -> tuple[float, ...]:
    """The sources' current sampling weights: a plugin's, else ``--data.prompt_probs`` (or equal shares)."""

    if controller.schedule.weights is not None:
        return controller.schedule.weights
    return tuple(parse_probabilities(controller.config.data.prompt_probs, len(controller.prompt_sources),
                                     "--data.prompt_probs", "--data.prompt_dataset"))


def coefficients(controller: PPOController) -> dict[str, float]:
    """The steerable coefficients' current values (``entropy`` 0 when ``--actor.entropy_coef`` is unset)."""
    return {"kl": controller.kl.value,
            "entropy": controller.steered.get("entropy", controller.config.actor.entropy_coef or 0.0),
            "lr_scale": controller.steered.get("lr_scale", 1.0)}


def set_coefficient(controller: PPOController, name: str, value: float) -> None:
    """β is the KL controller's value (an adaptive one goes on from it); the others go to the actor's
    ``train`` with each step (``coefficients``)."""
    if name == "kl":
        controller.kl.value = value
    else:
        controller.steered[name] = value
