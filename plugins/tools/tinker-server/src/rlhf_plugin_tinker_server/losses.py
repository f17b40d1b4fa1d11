"""The Tinker losses this server computes, per datum, from the target tokens' log-probs under the tenant's model.

All of them sum over tokens (Tinker reports and differentiates ``loss:sum``, never a mean), each token's term
multiplied by its ``weights`` input (default 1; the PPO term takes them as its mask):

- ``cross_entropy``: ``-Σ logp``;
- ``importance_sampling``: ``-Σ exp(logp − q)·A``, with ``q`` the sampler's ``logprobs`` and ``A`` the ``advantages``;
- ``ppo``: ``-Σ min(ρ·A, clip(ρ, lo, hi)·A)`` with ``ρ = exp(logp − q)`` and ``lo``/``hi`` the ``loss_fn_config``
  keys ``clip_low_threshold``/``clip_high_threshold`` (default 0.8 and 1.2). The term is rlhf's own PPO-clip policy
  loss (the ``ppo`` policy loss of rlhf-plugin-ppo, handed in by the command);
- ``cispo``: ``-Σ sg(clip(ρ, lo, hi))·logp·A``, the clipped ratio a constant of the gradient (default lo 0, hi 4:
  Tinker's one-sided clip);
- ``dro``: ``-Σ (logp·A − β/2·(logp − q)²)``, with ``β`` the ``loss_fn_config`` key ``beta`` (required: Tinker's docs
  give no default).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: Every loss and the ``loss_fn_inputs`` it needs; each also reads ``weights``, a per-token factor of its terms
#: (default 1: 0 leaves a token out, e.g. the prompt's)
LOSS_INPUTS: dict[str, tuple[str, ...]] = {
    "cross_entropy": ("target_tokens",),
    "importance_sampling": ("target_tokens", "logprobs", "advantages"),
    "ppo": ("target_tokens", "logprobs", "advantages"),
    "cispo": ("target_tokens", "logprobs", "advantages"),
    "dro": ("target_tokens", "logprobs", "advantages"),
}
#: The ``loss_fn_config`` keys each loss reads, with their defaults (None: the request must give it)
LOSS_CONFIG: dict[str, dict[str, float | None]] = {
    "ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "cispo": {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0},
    "dro": {"beta": None},
}


class LossInputError(ValueError):
    """A request whose loss or loss inputs cannot be computed; the message names the loss or the field."""


def check_loss_request(loss_fn: str, config: dict[str, Any], data: list[Any]) -> None:
    """Refuse, before any compute, an unsupported loss, a missing or unknown input, an input whose length differs
    from the datum's tokens, or a config key the loss does not read. ``data``: :class:`wire.WireDatum` items."""
    if loss_fn not in LOSS_INPUTS:
        raise LossInputError(f"loss_fn {loss_fn!r} is not supported by this server yet; it computes {', '.join(LOSS_INPUTS)}")
    if not data:
        raise LossInputError("data: no datums were sent")
    known = {*LOSS_INPUTS[loss_fn], "weights"}
    for index, datum in enumerate(data):
        if not datum.tokens:
            raise LossInputError(f"data[{index}].model_input: no tokens")
        for name in LOSS_INPUTS[loss_fn]:
            if name not in datum.loss_fn_inputs:
                raise LossInputError(
                    f"data[{index}].loss_fn_inputs: {loss_fn} needs {name!r} (it reads {', '.join(sorted(known))})"
                )
        for name, values in datum.loss_fn_inputs.items():
            if name not in known:
                raise LossInputError(
                    f"data[{index}].loss_fn_inputs[{name!r}]: {loss_fn} reads no such input "
                    f"(it reads {', '.join(sorted(known))})"
                )
            if len(values) != len(datum.tokens):
                raise LossInputError(
                    f"data[{index}].loss_fn_inputs[{name!r}]: {len(values)} values for "
                    f"{len(datum.tokens)} input tokens; each input has one value per input token"
                )
    allowed = LOSS_CONFIG.get(loss_fn, {})
    for key in config:
        if key not in allowed:
            raise LossInputError(
                f"loss_fn_config[{key!r}]: {loss_fn} reads {', '.join(sorted(allowed)) if allowed else 'no config keys'}"
            )
        if not isinstance(config[key], float | int):
            raise LossInputError(f"loss_fn_config[{key!r}]: a number is needed, got {config[key]!r}")
    for key, default in allowed.items():
        if default is None and key not in config:
            raise LossInputError(f"loss_fn_config[{key!r}]: {loss_fn} needs it")


def config_value(loss_fn: str, config: dict[str, Any], key: str) -> float:
    """The request's value of a config key, else the loss's default."""
    return float(config.get(key, LOSS_CONFIG[loss_fn][key]))


def datum_loss(
    loss_fn: str, logprobs: Any, inputs: dict[str, Any], config: dict[str, Any], ppo_loss: Callable[..., Any]
) -> Any:
    """The datum's summed loss (a 0-d tensor that carries the gradient). ``logprobs``: ``(T,)`` fp32 log-probs of
    the target tokens; ``inputs``: the loss inputs as ``(T,)`` tensors on the same device; ``ppo_loss``: rlhf's
    PPO-clip loss class, built here with the request's clip thresholds."""
    import torch

    weights = inputs.get("weights", torch.ones_like(logprobs))
    if loss_fn == "cross_entropy":
        return -(logprobs * weights).sum()
    sampler_logprobs, advantages = inputs["logprobs"], inputs["advantages"]
    if loss_fn == "importance_sampling":
        return -(torch.exp(logprobs - sampler_logprobs) * advantages * weights).sum()
    if loss_fn == "dro":
        beta = config_value(loss_fn, config, "beta")
        return -((logprobs * advantages - 0.5 * beta * (logprobs - sampler_logprobs) ** 2) * weights).sum()
    low = config_value(loss_fn, config, "clip_low_threshold")
    high = config_value(loss_fn, config, "clip_high_threshold")
    if loss_fn == "cispo":
        clipped = torch.exp(logprobs - sampler_logprobs).clamp(low, high).detach()
        return -(clipped * logprobs * advantages * weights).sum()
    clip = ppo_loss(eps_low=1.0 - low, eps_high=high - 1.0)
    per_token, _ = clip(logprobs[None], sampler_logprobs[None], advantages[None], weights[None])
    return per_token.sum()
