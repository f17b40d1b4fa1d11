"""The models of the supervised trainers, in the trainer's own process(es), through the training backend.

A supervised run is one process per device: ``rlhf train sft …`` alone is one rank;
under ``torchrun``/``deepspeed`` launchers every rank runs the same command and the
launcher's ``RANK``/``WORLD_SIZE``/``MASTER_*`` variables form the group (gloo on CPU).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from rlhf.components import build
from rlhf.config.checks import check_optimizer
from rlhf.distributed import group_environment
from rlhf.models.extensions import active, load_model
from rlhf.models.loading import dtype_of, load_causal_lm, load_value_model
from rlhf.models.lora import apply_lora, quantization_kwargs
from rlhf.registry import ComponentKind as K

if TYPE_CHECKING:
    from rlhf_supervised.config import SupervisedConfig


def join_process_group(backend: Any, local_rank: int = -1) -> tuple[int, int]:
    """Initialise torch.distributed through ``backend`` (a one-rank group when no launcher set it up);
    ``(rank, world_size)``.

    ``local_rank`` (``--local_rank``, passed by launchers that do not export ``LOCAL_RANK``, such as
    ``torch.distributed.launch`` without ``--use_env``) picks this process's device on the node.
    """
    import torch.distributed as dist

    group_environment(local_rank)
    backend.init_distributed()
    return dist.get_rank(), dist.get_world_size()


def optimizer_section(config: SupervisedConfig) -> SimpleNamespace:
    """The view optimizer and scheduler plugins read (``section.adam``, ``section.lr_warmup_ratio``…)."""
    train = config.train
    return SimpleNamespace(adam=config.adam, muon=config.muon, optim=train.optim, lr_scheduler=train.lr_scheduler,
                           lr_warmup_ratio=train.lr_warmup_ratio, min_lr_ratio=train.min_lr_ratio, max_norm=train.max_norm)


def supervised_flag(field: str) -> str:
    """The flag of an optimizer-section field in the supervised CLIs: ``--adam.*``/``--muon.*``, else ``--train.*``."""
    return f"--{field}" if field.startswith(("adam.", "muon.")) else f"--train.{field}"


def load_trained(config: SupervisedConfig, *, value_head: str | None, gathered: Any = None) -> Any:
    """The trained model: a causal LM, or (``value_head`` set) a model with that one-output head;
    gradient checkpointing and LoRA per the config. ``gathered``: the backend's, for a new head's init."""

    path = config.model.model_name_or_path  # checked by SupervisedTrainer.run before anything loads
    attn, extra = config.ds.attn_implementation, {**quantization_kwargs(config.ds), "experts": config.ds.experts_implementation}
    if value_head:
        model = load_value_model(path, dtype_of(config), attn, value_head, gathered=gathered, **extra)
    else:
        model = load_causal_lm(path, dtype_of(config), attn, **extra)
    checkpointing = config.train.gradient_checkpointing_enable
    if checkpointing:
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": config.train.gradient_checkpointing_reentrant})
    return apply_lora(model, config.ds, value_head=value_head, gradient_checkpointing=checkpointing)


def trained_model(backend: Any, config: SupervisedConfig, plugins: Any, world_size: int, num_steps: int, *,
                  value_head: str | None) -> Any:
    """The :class:`rlhf.components.TrainedModel` of the run: loaded through the model plugins, trained with the
    selected optimizer and scheduler."""

    section = optimizer_section(config)
    optimizer = build(plugins.registry.get(K.OPTIMIZER, section.optim, flag="--train.optim"), config)
    check_optimizer(optimizer, section, supervised_flag)
    scheduler = build(plugins.registry.get(K.SCHEDULER, section.lr_scheduler, flag="--train.lr_scheduler"), config)

    def load() -> Any:
        return load_model(active(config, plugins.registry), "actor", config, config.model.model_name_or_path,
                          lambda: load_trained(config, value_head=value_head, gathered=backend.gathered))

    return backend.trained(load, optimizer, scheduler, section, world_size, num_steps)


def frozen_model(backend: Any, config: SupervisedConfig, path: str, offload: bool) -> Any:
    """An evaluated-only causal LM (reference, teacher): sharded when training is, offloadable."""

    def load() -> Any:
        return load_causal_lm(path, dtype_of(config), config.ds.attn_implementation, experts=config.ds.experts_implementation)

    model = backend.evaluated(load, offload, config.train.micro_batch_size)
    model.eval()
    return model
