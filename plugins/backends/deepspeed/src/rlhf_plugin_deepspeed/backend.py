"""DeepSpeed ZeRO (stages 0-3) as an rlhf training backend (``--train.backend deepspeed``, the default).

One :class:`DeepSpeedBackend` per process that holds a model (a Ray model worker's rank, a supervised
trainer's rank); :class:`DeepSpeedModel` adapts one ``DeepSpeedEngine`` to
:class:`rlhf.components.TrainedModel`. On CPU machines communication is gloo and no C++ op is
JIT-built in the default path (see :mod:`rlhf_plugin_deepspeed.config`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlhf_plugin_deepspeed.build_lock import clear_stale_build_lock
from rlhf_plugin_deepspeed.config import check_options, eval_config, on_gpu, optimizer_train_config, refusal_hint

#: DeepSpeed's default ``zero_optimization.reduce_bucket_size`` (elements), which :func:`train_config` leaves as is
REDUCE_BUCKET_SIZE = 500_000_000

#: what ``rlhf plan``'s search may raise ``--ds.zero_stage`` to: what it costs the run, and the parts it splits
_HIGHER_STAGES = {2: ("gradients reduce-scattered over the ranks", ("gradients", "optimizer states")),
                  3: ("the weights gathered layer by layer in every pass", ("weights", "gradients", "optimizer states"))}


class DeepSpeedBackend:
    """:class:`rlhf.components.TrainingBackend` over DeepSpeed: ZeRO 0-3, offload, AutoTP, ZeRO++,
    universal checkpoints, sleep between fits and EMA, all from the ``--ds.*`` flags."""

    def __init__(self, config: Any) -> None:
        self.config = config

    @classmethod
    def from_config(cls, config: Any) -> DeepSpeedBackend:
        return cls(config)

    @classmethod
    def check_config(cls, config: Any) -> None:
        check_options(config.ds)

    @classmethod
    def sharded_reason(cls, config: Any) -> str | None:
        """Why a trained model's parameters are not whole on each rank (in-rank rollout engines read it)."""
        ds = config.ds
        if ds.zero_stage == 3:
            return "--ds.zero_stage 3 splits its parameters over the ranks"
        if ds.tensor_parallel_size > 1:
            return f"--ds.tensor_parallel_size {ds.tensor_parallel_size} splits its layers over the ranks (AutoTP)"
        return None

    @classmethod
    def checkpoint_layout(cls, config: Any) -> dict[str, Any]:
        """How a trained model's states are split, as a checkpoint records it (rlhf.records.checkpoint_fit)."""
        return {"zero_stage": config.ds.zero_stage, "tensor_parallel_size": config.ds.tensor_parallel_size or 1}

    @classmethod
    def full_state_from_checkpoint(cls, directory: str, tag: str, module: Any, ema: bool = False) -> dict[str, Any]:
        """``rlhf checkpoint export``: the whole fp32 state saved under ``directory/tag`` (rlhf_plugin_deepspeed.checkpoint)."""
        from rlhf_plugin_deepspeed.checkpoint import full_state

        return full_state(Path(directory), tag, module, ema)

    @classmethod
    def optimizer_state_from_checkpoint(cls, directory: str, tag: str, module: Any) -> dict[str, Any]:
        """The optimizer's states saved under ``directory/tag`` by parameter name, for a resume under another
        ``--train.backend`` (rlhf_plugin_deepspeed.checkpoint)."""
        from rlhf_plugin_deepspeed.checkpoint import optimizer_state

        return optimizer_state(Path(directory), tag, module)

    def load_full_state(self, model: DeepSpeedModel, weights: dict[str, Any], optimizer_state: dict[str, Any]) -> None:
        """Every rank: another backend's checkpoint, as whole weights and per-parameter optimizer states by name
        (:func:`rlhf.config.training_backend.load_from_other_backend`), into this rank's ZeRO partitions
        (rlhf_plugin_deepspeed.neutral_state)."""
        from rlhf_plugin_deepspeed.neutral_state import load_full

        load_full(model.engine, weights, optimizer_state["state"], optimizer_state["steps"])

    @classmethod
    def plan_memory(cls, config: Any, model: Any) -> list[Any]:
        """One GPU of ``model`` (an :class:`rlhf.planning.PlannedModel`) for ``rlhf plan``: ZeRO's model states at
        ``--ds.zero_stage`` (DeepSpeed's own estimates), evaluated models in the stage :func:`eval_config` gives them
        (3 only under ZeRO-3, whose ``--ref.offload`` keeps the weights on the CPU); a trained model from stage 1 also
        reduces its gradients through DeepSpeed's bucket (``reduce_bucket_size`` elements, two with
        ``--ds.overlap_comm``), which DeepSpeed's estimators leave out but measured runs hold; AutoTP splits the weights over
        ``--ds.tensor_parallel_size``; ``--ds.enable_sleep`` moves the gradients, optimizer states and bucket off the GPU
        while the engines generate."""
        from dataclasses import replace

        from rlhf.planning import MemoryPart, dtype_bytes, zero_model_states

        ds = config.ds
        stage = ds.zero_stage if model.trained or ds.zero_stage == 3 else 0
        parts = zero_model_states(model, dtype_bytes(ds.param_dtype), stage, ds.adam_offload and model.trained)
        if not model.trained and model.offload and stage == 3:
            parts = [MemoryPart("weights", 0, f"on the CPU (--{model.role}.offload)"), *parts[1:]]
        if model.trained and stage >= 1:  # contiguous_gradients (DeepSpeed's default) reduces through this buffer
            element = 4 if stage == 1 else dtype_bytes(ds.param_dtype)
            buffers = 2 if ds.overlap_comm else 1
            parts.append(MemoryPart("reduce bucket", buffers * element * REDUCE_BUCKET_SIZE,
                                    f"{buffers} x {REDUCE_BUCKET_SIZE:.0e} elements x {element} B (reduce_bucket_size)"))
        if ds.tensor_parallel_size > 1:
            parts = [replace(p, nbytes=p.nbytes // ds.tensor_parallel_size, note=f"{p.note} / AutoTP {ds.tensor_parallel_size}")
                     if p.nbytes and p.part == "weights" else p for p in parts]
        if ds.enable_sleep and not ds.adam_offload and model.trained:
            parts = [replace(p, away_in=("generate",)) if p.part in ("gradients", "optimizer states", "reduce bucket") else p
                     for p in parts]
        return parts

    @classmethod
    def plan_remedies(cls, config: Any, run: Any) -> list[Any]:
        """What DeepSpeed offers ``rlhf plan``'s search where a run does not fit (an
        :class:`rlhf.planning.RemedyContext` in ``run``): a higher ZeRO stage, Adam on the CPU, and sleep between
        fits from stage 1 (stage 0 has no partitioned states to move), which the engines pair with their own."""
        from rlhf.planning import Remedy

        stage = config.ds.zero_stage
        found = [Remedy({"ds.zero_stage": higher}, "shard", reason, frees)
                 for higher, (reason, frees) in _HIGHER_STAGES.items() if stage < higher]
        found.append(Remedy({"ds.adam_offload": True}, "offload", "the optimizer step on the CPU, its states over PCIe",
                            ("optimizer states",)))
        if stage >= 1:
            found.append(Remedy({"ds.enable_sleep": True}, "sleep", "states moved off the GPU around every generate "
                                "phase", ("gradients", "optimizer states", "reduce bucket")))
        return found

    @classmethod
    def tensor_parallel_reason(cls, config: Any) -> str | None:
        """Why each layer is split over a model group's ranks (AutoTP), so that no rank can gather a whole one."""
        tp = config.ds.tensor_parallel_size or 1
        return f"--ds.tensor_parallel_size {tp} splits its layers over the ranks (AutoTP)" if tp > 1 else None

    @classmethod
    def error_hint(cls, exc: BaseException) -> str | None:
        """DeepSpeed's refusals the user can steer around (read by the core, :mod:`rlhf.components.first_use`)."""
        return refusal_hint(exc)

    @classmethod
    def preload(cls) -> None:
        """DeepSpeed's import (seconds), started as a model worker is created."""
        import deepspeed  # noqa: F401

    def init_distributed(self) -> None:
        import deepspeed
        import deepspeed.ops
        import torch.distributed as dist

        _forget_a_destroyed_world_group()
        if not on_gpu():  # also where another backend's in-process run made the group: DeepSpeed's comm starts later
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
            deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # avoids a 45 s JIT build; plain gloo
        if dist.is_initialized():
            return
        deepspeed.init_distributed(dist_backend="nccl" if on_gpu() else "gloo")

    def trained(self, load: Any, optimizer: Any, scheduler: Any, section: Any, data_parallel_size: int,
                num_training_steps: int) -> DeepSpeedModel:
        import deepspeed

        ds_config = optimizer_train_config(self.config, optimizer, section, data_parallel_size)
        if self.config.ds.adam_offload:  # DeepSpeedCPUAdam's op is loaded in deepspeed.initialize
            clear_stale_build_lock("cpu_adam")
        partitioning = zero3_context(ds_config)  # must outlive from_pretrained
        model = load()
        trainable = [p for p in model.parameters() if p.requires_grad]
        engine, *_ = deepspeed.initialize(
            model=model,
            model_parameters=trainable,
            # a factory without a DeepSpeed block builds its own torch optimizer
            optimizer=None if "optimizer" in ds_config else optimizer.build(trainable, section),
            config=ds_config,
            lr_scheduler=lambda opt: scheduler.build(opt, max(1, num_training_steps), section),
        )
        if self.config.ds.deepcompile:  # DeepSpeed's compiler passes over torch.compile's graph (GPU only)
            engine.compile()
        skip_lone_rank_allreduce(engine)
        return DeepSpeedModel(engine, self.config, partitioning)

    def evaluated(self, load: Any, offload: bool, micro_batch_size: int) -> Any:
        import deepspeed

        ds_config = eval_config(self.config, offload, micro_batch_size)
        partitioning = zero3_context(ds_config)
        engine, *_ = deepspeed.initialize(model=load(), config=ds_config)
        engine._rlhf_partitioning = partitioning  # kept alive with the engine
        return engine

    def gathered(self, module: Any) -> Any:
        if not is_partitioned(module):
            return contextlib.nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=0)


class DeepSpeedModel:
    """A ``DeepSpeedEngine`` as a :class:`rlhf.components.TrainedModel`."""

    def __init__(self, engine: Any, config: Any, partitioning: Any) -> None:
        from rlhf_plugin_deepspeed.sleep import SleepingStates

        self.engine, self.config, self._partitioning = engine, config, partitioning
        self.module, self.device = engine.module, engine.device
        #: every forward all-gathers ZeRO-3's partitions (or all-reduces AutoTP's slices): collective over the ranks
        self.sharded = is_partitioned(self.module) or engine.autotp_size() > 1
        self._live: dict[str, Any] | None = None
        self.optimizer, self.lr_scheduler = engine.optimizer, engine.lr_scheduler
        ds = config.ds  # --ds.enable_sleep: asleep from here on but for fits and checkpoints (OpenRLHF's order)
        self.sleeping = SleepingStates(engine, ds.enable_sleep and not ds.adam_offload)
        self.sleeping.sleep()

    def __call__(self, **inputs: Any) -> Any:
        return self.engine(**inputs)

    def train(self) -> None:
        self.engine.train()

    def eval(self) -> None:
        self.engine.eval()

    def accumulation_steps(self) -> int:
        return self.engine.gradient_accumulation_steps()

    def backward(self, loss: Any, boundary: bool | None = None) -> None:
        if boundary is not None:
            self.engine.set_gradient_accumulation_boundary(boundary)
        self.engine.backward(loss, scale_wrt_gas=boundary is None)

    def step(self) -> bool:
        before = self.engine.global_steps
        self.engine.step()
        return self.engine.global_steps != before

    def learning_rate(self) -> float:
        return float(self.engine.get_lr()[0])

    def state_dict(self, copy: bool = True) -> dict[str, Any] | None:
        if self.engine.autotp_size() > 1:  # DeepSpeed gathers the AutoTP shards; only rank 0 gets the dict
            return self.engine._consolidated_16bit_state_dict()
        copy = copy or is_partitioned(self.module)  # gathered weights are freed when the gather ends
        with self.gathered():
            return {k: v.detach().to("cpu", copy=copy) for k, v in self.module.state_dict().items()}

    def gathered(self) -> Any:
        return _gathered(list(self.module.parameters()))

    @contextlib.contextmanager
    def full_tensors(self, names: list[str]) -> Iterator[list[Any]]:
        if self._live is None:  # the module's tensors keep their identity: look them up once
            self._live = self.module.state_dict(keep_vars=True)
        tensors = [self._live[name] for name in names]
        with _gathered(tensors):  # ZeRO-3 makes these parameters whole in place, for this block
            yield tensors

    def full_shape(self, tensor: Any) -> tuple[int, ...]:
        return tuple(getattr(tensor, "ds_shape", tensor.shape))

    def save_checkpoint(self, directory: str, tag: str) -> None:
        self.engine.save_checkpoint(directory, tag=tag)

    def load_checkpoint(self, directory: str, tag: str) -> None:
        from rlhf_plugin_deepspeed.checkpoint import load_engine

        load_engine(self.engine, Path(directory), tag, universal=self.config.ds.use_universal_ckpt)

    def awake(self, phase: str) -> Any:
        return self.sleeping.awake(phase)

    def sleep_history(self) -> list[tuple[str, float]]:
        return list(self.sleeping.history)

    def ema(self, beta: float) -> Any:
        from rlhf_plugin_deepspeed.ema import ParameterEMA

        return ParameterEMA(self.module, beta)


def _gathered(tensors: list[Any]) -> Any:
    """Whole ZeRO-3 parameters among ``tensors`` for reading inside the block; a no-op for unsharded ones."""
    shards = list({id(t): t for t in tensors if hasattr(t, "ds_id")}.values())  # tied ones gather once
    if not shards:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(shards, modifier_rank=None)


def zero3_context(ds_config: dict[str, Any]) -> Any:
    """Under ZeRO-3, an object to keep alive across ``from_pretrained`` so weights are partitioned at load."""
    if ds_config["zero_optimization"]["stage"] != 3:
        return None
    from transformers.integrations import HfDeepSpeedConfig

    return HfDeepSpeedConfig(ds_config)


def full_state_dict(module: Any) -> dict[str, Any]:
    """Every rank: a copy of ``module``'s whole state dict on the CPU, gathered where ZeRO-3 shards it."""
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
        return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}


def is_partitioned(module: Any) -> bool:
    """Whether ZeRO-3 holds ``module``'s parameters in shards."""
    return any(hasattr(p, "ds_id") for p in module.parameters())


def skip_lone_rank_allreduce(engine: Any) -> None:
    """Turn off DeepSpeed's gradient all-reduce where the data-parallel world is one rank at ZeRO stage 0.

    There DeepSpeed still flattens every gradient, all-reduces the flat copy with itself,
    multiplies it by 1/1 and copies it back after each boundary backward (about 2.5 % of the actor's
    ``train`` on the tiny task): the gradients come out bit-identical without it. Stages 1-3 keep
    their own reduce (it also moves gradients into the optimizer's partitions)."""
    import torch.distributed as dist

    if engine.zero_optimization_stage() == 0 and dist.get_world_size() == 1:
        engine.enable_backward_allreduce = False


def _forget_a_destroyed_world_group() -> None:
    """DeepSpeed clones the world group once per process and keeps the clone. When the process group it was
    cloned from is destroyed (an in-process vLLM engine's shutdown destroys the default group), a later run in
    the same process (ranks in the controller's process: a test, a notebook) would hand DeepSpeed a group torch
    no longer knows; drop the clone so DeepSpeed makes one of the current group."""
    import torch.distributed as dist
    from deepspeed.utils import groups

    if groups._WORLD_GROUP is None:
        return
    try:
        if not dist.is_initialized():
            raise ValueError("no process group")
        dist.get_process_group_ranks(groups._WORLD_GROUP)
    except (ValueError, KeyError, RuntimeError):
        groups._WORLD_GROUP = None

