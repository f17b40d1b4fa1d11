"""torch FSDP2 as an rlhf training backend (``--train.backend fsdp2``).

One :class:`FSDP2Backend` per process that holds a model. The model is loaded whole on every rank,
then ``fully_shard`` is applied to each block of its layer lists and to the root, so each rank keeps
1/world of the parameters, gradients and optimizer states (ZeRO-3's layout; ``--ds.zero_stage`` is not
read). Weights stay fp32 (the optimizer's master copy); ``--ds.param_dtype bf16|fp16`` is the compute
dtype FSDP2 all-gathers in, with gradients reduced in fp32. ``--fsdp2.cpu_offload`` keeps a trained model's
shards, gradients and optimizer states in host memory (torch's ``CPUOffloadPolicy``).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from rlhf.devices import local_device
from rlhf.errors import ConfigError
from rlhf_plugin_fsdp2.model import EvaluatedModel, FSDP2Model
from rlhf_plugin_fsdp2.options import fsdp2_options

#: ``--ds.*`` fields only DeepSpeed honours: (field under ``config.ds``, "set away from its default" test, what it is)
_DEEPSPEED_ONLY: list[tuple[str, Any, str]] = [
    ("adam_offload", bool, "optimizer offload"),
    ("zpg", lambda value: (value or 1) > 1, "ZeRO++ hierarchical partitioning"),
    ("tensor_parallel_size", lambda value: (value or 1) > 1, "AutoTP tensor parallelism"),
    ("use_universal_ckpt", bool, "universal checkpoints"),
    ("deepcompile", bool, "DeepSpeed's compiler"),
    ("enable_sleep", bool, "sleep between fits"),
    ("load_in_4bit", bool, "4-bit loading"),
]

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def on_gpu() -> bool:
    return torch.cuda.is_available()


class FSDP2Backend:
    """:class:`rlhf.components.TrainingBackend` over ``torch.distributed.fsdp.fully_shard``."""

    def __init__(self, config: Any) -> None:
        self.config = config

    @classmethod
    def from_config(cls, config: Any) -> FSDP2Backend:
        return cls(config)

    @classmethod
    def check_config(cls, config: Any) -> None:
        """Refuse the DeepSpeed-only flags a user set, rather than silently ignoring them."""
        ds = config.ds
        for field, is_set, what in _DEEPSPEED_ONLY:
            value = getattr(ds, field, None)  # not every config class has every field
            if is_set(value):
                shown = "" if isinstance(value, bool) else f" {value}"
                raise ConfigError(f"--ds.{field}{shown} ({what}) is a DeepSpeed option; drop it or use "
                                  "--train.backend deepspeed")
        rank = getattr(getattr(ds, "lora", None), "rank", 0)
        if rank > 0:
            raise ConfigError(f"--ds.lora.rank {rank}: LoRA is not supported on --train.backend fsdp2 yet; drop it or "
                              "use --train.backend deepspeed")

    @classmethod
    def sharded_reason(cls, config: Any) -> str | None:
        """Why a trained model's parameters are not whole on each rank (in-rank rollout engines read it)."""
        return "--train.backend fsdp2 shards its parameters over the ranks (fully_shard)"

    @classmethod
    def checkpoint_layout(cls, config: Any) -> dict[str, Any]:
        """How a trained model's states are split, as a checkpoint records it (rlhf.records.checkpoint_fit)."""
        return {"sharding": "fully_shard"}

    @classmethod
    def optimizer_state_from_checkpoint(cls, directory: str, tag: str, module: Any) -> dict[str, Any]:
        """The optimizer's states saved under ``directory/tag`` by parameter name, for a resume under another
        ``--train.backend`` (DCP, read in this process)."""
        from pathlib import Path

        from rlhf_plugin_fsdp2.checkpoint import optimizer_state

        return optimizer_state(Path(directory), tag)

    def load_full_state(self, model: Any, weights: dict[str, Any], optimizer_state: dict[str, Any]) -> None:
        """Every rank: another backend's checkpoint, as whole weights and per-parameter optimizer states by name
        (:func:`rlhf.config.training_backend.load_from_other_backend`), into this rank's shards."""
        from rlhf_plugin_fsdp2.checkpoint import load_full

        load_full(model.module, model.optimizer, weights, optimizer_state["state"], optimizer_state["steps"])

    @classmethod
    def full_state_from_checkpoint(cls, directory: str, tag: str, module: Any, ema: bool = False) -> dict[str, Any]:
        """``rlhf checkpoint export``: the whole fp32 weights saved under ``directory/tag`` (DCP, read in this process)."""
        from pathlib import Path

        from rlhf_plugin_fsdp2.checkpoint import full_state

        if ema:
            raise ConfigError("--train.backend fsdp2 keeps no EMA, so its checkpoints have none; export --model actor")
        return full_state(Path(directory), tag)

    @classmethod
    def plan_memory(cls, config: Any, model: Any) -> list[Any]:
        """One GPU of ``model`` (an :class:`rlhf.planning.PlannedModel`) for ``rlhf plan``: fp32 weights, fp32
        gradients and the optimizer's states, each 1/ranks (``fully_shard``); while a block computes, it and the
        next one prefetched are whole in the compute dtype. An evaluated model with ``--<role>.offload`` keeps its
        shards on the CPU."""
        from rlhf.planning import MemoryPart, dtype_bytes

        ranks, shape = model.ranks, model.shape
        compute = dtype_bytes(config.ds.param_dtype)
        split = f" / {ranks} ranks" if ranks > 1 else ""
        offloaded = model.offload and not model.trained
        host = "on the CPU (--fsdp2.cpu_offload)" if model.trained and fsdp2_options(config).cpu_offload else None
        parts = [MemoryPart("weights", 0 if offloaded or host else 4 * shape.parameters // ranks,
                            "on the CPU (offload)" if offloaded else host or f"fp32 x {shape.parameters:.3g}{split}"),
                 MemoryPart("gather buffer", 2 * compute * shape.largest_layer,
                            f"2 blocks x {compute} B x largest layer {shape.largest_layer:.3g}")]
        if model.trained:
            optimizer = model.optimizer_state_bytes
            states = None if optimizer is None else optimizer // ranks
            parts += [MemoryPart("gradients", 0 if host else 4 * model.trainable // ranks,
                                 host or f"fp32 x {model.trainable:.3g}{split}"),
                      MemoryPart("optimizer states", 0 if host else states, host or (
                          "the optimizer does not say" if optimizer is None else f"{optimizer:.3g} B{split}"))]
        return parts

    @classmethod
    def plan_remedies(cls, config: Any, run: Any) -> list[Any]:
        """What FSDP2 offers ``rlhf plan``'s search where a run does not fit: its trained models' states on the CPU.
        (Its shards already span every rank of a group, so a smaller shard group would only hold more.)"""
        from rlhf.planning import Remedy

        return [Remedy({"fsdp2.cpu_offload": True}, "offload", "the weights copied in block by block and the "
                       "optimizer step on the CPU", ("weights", "gradients", "optimizer states"))]

    def init_distributed(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            return
        if on_gpu():
            torch.cuda.set_device(local_device())
        # offloaded shards and gradients are host tensors: their collectives (the clipping norm, a gather) need gloo
        backend = ("cpu:gloo,cuda:nccl" if fsdp2_options(self.config).cpu_offload else "nccl") if on_gpu() else "gloo"
        dist.init_process_group(backend=backend, init_method="env://")

    def trained(self, load: Any, optimizer: Any, scheduler: Any, section: Any, data_parallel_size: int,
                num_training_steps: int) -> FSDP2Model:
        """Load whole, shard, then build the optimizer over the shards (its states are sharded alike, and on the CPU
        with ``--fsdp2.cpu_offload``, where the optimizer steps)."""
        from torch.distributed.fsdp import CPUOffloadPolicy

        model = load()
        # on a machine without a GPU the shards are in host memory already
        offload = CPUOffloadPolicy() if fsdp2_options(self.config).cpu_offload and on_gpu() else None
        shard(model, self._precision(model), offload)
        # by name, so that an optimizer can treat the embeddings and head apart (Muon gives them to AdamW)
        torch_optimizer = optimizer.build([(n, p) for n, p in model.named_parameters() if p.requires_grad], section)
        lr_scheduler = scheduler.build(torch_optimizer, max(1, num_training_steps), section)
        train = self.config.train
        accumulation = max(1, train.batch_size // (train.micro_batch_size * data_parallel_size))
        return FSDP2Model(model, local_device(), torch_optimizer, lr_scheduler, accumulation, section.max_norm)

    def evaluated(self, load: Any, offload: bool, micro_batch_size: int) -> EvaluatedModel:
        """Sharded like a trained model, frozen; ``micro_batch_size`` is not needed (FSDP2 has no batch config)."""
        from torch.distributed.fsdp import CPUOffloadPolicy

        model = load()
        # offloading keeps the shards in pinned host memory between forwards; on a CPU machine they are there already
        shard(model, self._precision(model), CPUOffloadPolicy() if offload and on_gpu() else None)
        model.requires_grad_(False)
        return EvaluatedModel(model, local_device())

    def gathered(self, module: Any) -> Any:
        """Models are loaded whole and sharded only after ``load()`` returns, so a part initialised at load
        time is whole already; a write persists on every rank as long as each rank writes the same values."""
        return contextlib.nullcontext()

    def _precision(self, model: nn.Module) -> Any:
        """The mixed-precision policy for ``--ds.param_dtype``; with bf16/fp16 the loaded weights become the
        fp32 master copy (the optimizer steps in fp32 like DeepSpeed's) and only compute runs in that dtype."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        dtype = _DTYPES.get(self.config.ds.param_dtype)
        if dtype is None:
            return MixedPrecisionPolicy()
        model.float()
        return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def shard(model: nn.Module, precision: Any, offload: Any = None) -> None:
    """``fully_shard`` every block and every untied child of the root, then the root (what is left).

    One FSDP unit per block means one all-gather per block in the forward, freed after it, so no rank
    ever holds more than a block of whole weights beyond its shards. ``fully_shard`` moves each unit's
    weights to this rank's device (the default mesh's: ``cuda:LOCAL_RANK`` once :meth:`FSDP2Backend.init_distributed`
    has set it) as it shards them, so the model is not moved whole first: at load too a GPU holds at most
    one unit whole."""
    from torch.distributed.fsdp import fully_shard

    options: dict[str, Any] = {"mp_policy": precision}
    if offload is not None:
        options["offload_policy"] = offload
    for unit in [*blocks(model), *independent_children(model)]:
        fully_shard(unit, **options)
    fully_shard(model, **options)


def independent_children(model: nn.Module) -> list[nn.Module]:
    """The root's children with parameters that share none with a sibling: their own FSDP units, so code that
    calls one directly (a value model's backbone, then its head: ``rlhf.models.loading.token_values``) runs
    its gather hooks. Tied siblings (embeddings and a tied LM head) stay in the root's unit together."""
    owned = {name: {id(p) for p in child.parameters()} for name, child in model.named_children()}
    return [child for name, child in model.named_children()
            if owned[name] and not any(owned[name] & other for sibling, other in owned.items() if sibling != name)]


def blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks of ``model``: the children (with parameters) of every ``nn.ModuleList`` that is not
    inside another one.

    That is ``model.model.layers`` for HF decoders and, for a VLM, the vision tower's blocks too, while the
    ModuleLists inside a block (MoE experts) stay in their block's unit rather than becoming one tiny
    all-gather each."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    nested = {id(inner) for outer in lists for inner in outer.modules() if inner is not outer and isinstance(inner, nn.ModuleList)}
    return [child for outer in lists if id(outer) not in nested for child in outer
            if next(child.parameters(), None) is not None]
