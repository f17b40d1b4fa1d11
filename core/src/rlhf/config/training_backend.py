"""The run's training backend (``--train.backend``): chosen by name from the registered ones."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlhf.components import build
from rlhf.components.first_use import ComponentLabel
from rlhf.registry import ComponentKind

#: The plugin API (docs/plugin-api.md); the module's other names may change in any release.
__all__ = ["backend_label", "check_backend_config", "model_record", "training_backend"]

if TYPE_CHECKING:
    from rlhf.config.run import RunConfig
    from rlhf.planning.groups import ModelGroup


def backend_class(config: RunConfig, registry: Any) -> type:
    """The registered class ``--train.backend`` names; an unknown name is the usual one-line error."""
    return registry.get(ComponentKind.TRAINING_BACKEND, config.train.backend, flag="--train.backend")


def check_backend_config(config: RunConfig, registry: Any, groups: list[ModelGroup] | None = None) -> None:
    """In the CLI process, before anything starts: the backend's own ``check_config(config)`` refusals, then, given
    the run's model groups (what its trainer's ``plan_groups`` names, each with its role and ranks), the optional
    ``check_groups(config, groups)``: a backend that serves one rank per model, or only some roles, refuses the
    run here, naming the group's flag, instead of a minute later in a Ray worker."""
    cls = backend_class(config, registry)
    check = getattr(cls, "check_config", None)
    if check is not None:
        check(config)
    check_groups = getattr(cls, "check_groups", None)
    if check_groups is not None and groups is not None:
        check_groups(config, groups)


def training_backend(config: RunConfig, registry: Any) -> Any:
    """The backend of this process (a :class:`rlhf.components.TrainingBackend`), built from the run config."""

    return build(backend_class(config, registry), config)


def backend_label(config: RunConfig, registry: Any) -> ComponentLabel:
    """How a refusal by the library under the run's backend names it (:mod:`rlhf.components.first_use`)."""
    kind = ComponentKind.TRAINING_BACKEND
    return ComponentLabel.among(kind.label, config.train.backend, "--train.backend", registry.names(kind))


def model_record(config: RunConfig, registry: Any, world_size: int, model: str, *, ema: bool = False) -> dict[str, Any]:
    """What a checkpoint records of one trained model group of this run (``state.json``'s ``models``, checked by
    :func:`rlhf.records.checkpoint_fit.check_fit` at a resume): the backend, the group's ``world_size`` ranks, the
    backend's optional ``checkpoint_layout(config)``, the LoRA rank, whether it keeps an EMA, the ``model`` path it
    was loaded from, and whether training states are written (not under ``--ckpt.disable_ds``)."""
    layout = getattr(backend_class(config, registry), "checkpoint_layout", None)
    lora = getattr(getattr(config, "ds", None), "lora", None)
    return {"backend": config.train.backend, "world_size": world_size, "layout": layout(config) if layout else {},
            "lora_rank": int(getattr(lora, "rank", 0) or 0), "ema": ema, "model": model,
            "states": not getattr(config.ckpt, "disable_ds", False)}
