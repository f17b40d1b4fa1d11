"""The run's rollout engine (``--rollout.engine``): chosen by name, or by ``auto`` from the installed ones.

Lives beside the training-backend choice because the two meet: an engine that generates inside the
actor's training ranks (trait ``in_training_rank``) can only use the actor's own weights where the
training backend keeps them whole on every rank, or where it gathers the shards itself. Read in the CLI process (the check before Ray
starts), in the controller and in every actor rank (which builds an in-rank engine itself).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlhf.components.first_use import ComponentLabel
from rlhf.config.training_backend import backend_class
from rlhf.errors import ConfigError
from rlhf.registry import ComponentKind

if TYPE_CHECKING:
    from rlhf.config.ppo import PPOConfig


def sharding_conflict(engine_class: type, config: PPOConfig, registry: Any) -> str | None:
    """Why an in-rank engine cannot generate with this run's actor, or None: its training backend splits the
    parameters over the ranks and the engine does not gather them (trait ``gathers_sharded_parameters``); or
    the backend splits each layer over the ranks (its optional ``tensor_parallel_reason``, e.g. AutoTP), whose ranks
    would all need the same requests where each rank gets its own share;
    or the gathering engine's collective forwards would meet the training step's in a different order on each
    rank, as generation runs beside training (``--train.async_enable``)."""
    if not engine_class.in_training_rank:
        return None
    backend = backend_class(config, registry)
    reason_of = getattr(backend, "sharded_reason", None)
    reason = reason_of(config) if reason_of is not None else None
    if not getattr(engine_class, "gathers_sharded_parameters", False) or reason is None:
        return reason
    split_of = getattr(backend, "tensor_parallel_reason", None)
    split = split_of(config) if split_of is not None else None
    if split is not None:
        return f"{split}, whose ranks would each generate a share of their own"
    if config.train.async_enable:
        return (f"{reason}, and with --train.async_enable each rank could meet a batch's generation and a "
                "training step in a different order")
    return None


def rollout_engine_name(config: PPOConfig, registry: Any) -> str:
    """The engine a run uses: ``--rollout.engine``, or for ``auto`` the installed engine with the highest
    ``auto_preference(config)`` (an optional classmethod; None or absent: never picked by ``auto``) that
    can serve the run. The first-party ones keep OpenRLHF's meaning of ``--vllm.num_engines``: above 0,
    vLLM engines; 0 or unset, HF ``generate`` inside the actor's ranks (whole weights, or ZeRO-3/FSDP2
    shards it gathers layer by layer), else (AutoTP; shards with ``--train.async_enable``) in an engine process
    of its own."""
    choice = config.rollout.engine
    if choice != "auto":
        return choice
    ranked = []
    for name in registry.names(ComponentKind.ROLLOUT_ENGINE):
        engine_class = registry.get(ComponentKind.ROLLOUT_ENGINE, name)
        preference = getattr(engine_class, "auto_preference", None)
        rank = preference(config) if preference is not None else None
        if rank is not None and sharding_conflict(engine_class, config, registry) is None:
            ranked.append((rank, name))
    if not ranked:  # the engine OpenRLHF's flags mean, so that the error names the distribution to install
        return "vllm" if (config.vllm.num_engines or 0) > 0 else "hf"
    return max(ranked)[1]


def engine_label(config: PPOConfig, registry: Any) -> ComponentLabel:
    """How a refusal by the library under the run's engine names it (:mod:`rlhf.components.first_use`)."""
    kind = ComponentKind.ROLLOUT_ENGINE
    return ComponentLabel.among(kind.label, rollout_engine_name(config, registry), "--rollout.engine", registry.names(kind))


def rollout_engine_class(config: PPOConfig, registry: Any) -> type:
    """The selected engine class, checked against the run (its ``check_config``, and the training backend for
    an engine inside the training ranks); an unknown name is a one-line error naming the distribution to install."""
    name = rollout_engine_name(config, registry)
    engine_class = registry.get(ComponentKind.ROLLOUT_ENGINE, name, flag="--rollout.engine")
    conflict = sharding_conflict(engine_class, config, registry)
    if conflict:
        raise ConfigError(f"--rollout.engine {name} generates inside the actor's training ranks with their own weights, "
                          f"but {conflict}; train with whole weights on each rank (e.g. --ds.zero_stage 2), or use an engine "
                          "in its own process (--rollout.engine hf, or --vllm.num_engines 1)")
    check = getattr(engine_class, "check_config", None)
    if check is not None:
        check(config)
    return engine_class


def uses_engine(config: PPOConfig, registry: Any) -> bool:
    """Whether the run generates at all: False when its rollout scheduler (resolved by the config's rules) declares
    ``needs_engines = False`` (``replay``); the run then builds, plans and places no rollout engine."""
    kind, name = ComponentKind.ROLLOUT_SCHEDULER, config.train.rollout_scheduler
    if name not in registry.names(kind):  # auto before the rules resolved it, or an unknown name the rules report
        return True
    return bool(getattr(registry.get(kind, name), "needs_engines", True))
