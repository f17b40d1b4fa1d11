"""The run's training backend (``--train.backend``): chosen by name from the registered ones."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlhf.components import build
from rlhf.components.first_use import ComponentLabel
from rlhf.registry import ComponentKind

#: The plugin API (docs/plugin-api.md); the module's other names may change in any release.
__all__ = ["backend_label", "check_backend_config", "converts_from", "load_from_other_backend",
           "load_trained_checkpoint", "model_record", "training_backend"]

log = logging.getLogger("rlhf.checkpoint")

#: What a backend that wrote a checkpoint must have for another backend to resume it (docs/plugins/training-backend.md)
NEUTRAL_EXPORT = ("full_state_from_checkpoint", "optimizer_state_from_checkpoint")

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


def converts_from(config: RunConfig, registry: Any) -> Callable[[str], bool]:
    """Whether this run resumes a checkpoint that the named ``--train.backend`` wrote: that backend exports the
    backend-neutral full state (``full_state_from_checkpoint`` and ``optimizer_state_from_checkpoint``) and this
    run's backend imports it (``load_full_state``). For :func:`rlhf.records.checkpoints.resume`'s ``converts``."""
    kind = ComponentKind.TRAINING_BACKEND
    imports = hasattr(backend_class(config, registry), "load_full_state")

    def converts(backend: str) -> bool:
        if not imports or backend not in registry.names(kind):
            return False
        writer = registry.get(kind, backend, flag="--train.backend")
        return all(hasattr(writer, method) for method in NEUTRAL_EXPORT)

    return converts


# config: Any (a RunConfig) because the signature is public and snapshot-tested in plugin API 3: a typed one is a
# changed signature, which waits for the next API bump
def load_trained_checkpoint(config: Any, backend: Any, model: Any, writer: str | None, directory: Path, tag: str,
                            registry: Any) -> None:
    """Every rank of a resume: the states of ``model`` (a :class:`rlhf.components.TrainedModel` of ``backend``, this
    run's ``--train.backend``) under ``directory/tag``. ``writer`` is the backend that wrote them, as the checkpoint
    records it (``state.json``; None where it does not say): this run's own loads natively
    (``model.load_checkpoint``), another one through the backend-neutral full state (:func:`load_from_other_backend`;
    the fit check, ``resume``'s ``converts``, has already refused the backends this run cannot convert from)."""
    if writer is None or writer == config.train.backend:
        model.load_checkpoint(str(directory), tag)
    else:
        load_from_other_backend(backend, model, writer, directory, tag, registry)


def load_from_other_backend(backend: Any, model: Any, writer: str, directory: Path, tag: str, registry: Any) -> None:
    """Every rank of a resume whose checkpoint ``directory/tag`` the ``writer`` backend wrote: its backend-neutral
    full state (whole fp32 weights, and the optimizer's per-parameter states, both by ``model.module``'s parameter
    names, and the optimizer steps taken: ``{"state": {name: {key: tensor}}, "steps": int}``) goes into ``model`` (a :class:`rlhf.components.TrainedModel` of
    ``backend``) through ``backend.load_full_state``; the LR scheduler is stepped as often as the optimizer was.
    Each rank reads the whole state (it is the size of the model's fp32 weights and moments). One line says what was
    converted and how long it took. The data position and step count are the core's (``state.json``)."""
    import warnings

    import torch.distributed as dist

    started = time.perf_counter()
    writer_class = registry.get(ComponentKind.TRAINING_BACKEND, writer, flag="--train.backend")
    weights = writer_class.full_state_from_checkpoint(str(directory), tag, model.module)
    optimizer = writer_class.optimizer_state_from_checkpoint(str(directory), tag, model.module)
    backend.load_full_state(model, weights, optimizer)
    with warnings.catch_warnings():  # "lr_scheduler.step() before optimizer.step()": the steps were taken elsewhere
        warnings.simplefilter("ignore", UserWarning)
        for _ in range(optimizer["steps"]):
            model.lr_scheduler.step()
    if not dist.is_initialized() or dist.get_rank() == 0:
        log.warning("checkpoint %s (written by --train.backend %s): loaded %d weights and the optimizer states of %d "
                    "parameters after %d steps through the backend-neutral full state in %.1f s", directory / tag,
                    writer, len(weights), len(optimizer["state"]), optimizer["steps"], time.perf_counter() - started)
