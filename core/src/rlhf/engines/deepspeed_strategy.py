"""DeepSpeed ZeRO (stages 0-3) for one trained or evaluated model inside a Ray worker.

On CPU machines communication is gloo and no C++ op is JIT-built in the default
path (``torch_adam`` and no shared-memory comm); ``--ds.adam_offload`` uses
DeepSpeedCPUAdam and pays its one-time build.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from rlhf.errors import ConfigError


def on_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def init_distributed() -> None:
    """Join the worker group's default process group (env vars set by the group)."""
    import deepspeed
    import deepspeed.ops
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if not on_gpu():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # avoids a 45 s JIT build; plain gloo
    deepspeed.init_distributed(dist_backend="nccl" if on_gpu() else "gloo")


def check_options(ds: Any) -> None:
    """``--ds.*`` combinations DeepSpeed cannot run, as one clear error before anything loads."""
    if ds.zpg > 1 and ds.zero_stage != 3:
        raise ConfigError(f"--ds.zpg {ds.zpg} (ZeRO++ hierarchical weight partitioning) needs --ds.zero_stage 3 "
                          f"(got {ds.zero_stage})")
    if ds.tensor_parallel_size > 1 and ds.lora.rank > 0:
        raise ConfigError("--ds.tensor_parallel_size > 1 cannot be combined with --ds.lora.rank (AutoTP shards the base "
                          "layers LoRA wraps); use one of them")
    if ds.deepcompile and not on_gpu():
        raise ConfigError("--ds.deepcompile needs a CUDA GPU: DeepSpeed's deepcompile op builds against CUDA; "
                          "drop the flag on CPU machines")


def compile_if_asked(engine: Any, ds: Any) -> Any:
    """``--ds.deepcompile``: DeepSpeed's compiler passes over the engine's torch.compile graph (GPU only)."""
    if ds.deepcompile:
        engine.compile()
    return engine


def skip_lone_rank_allreduce(engine: Any) -> None:
    """Turn off DeepSpeed's gradient all-reduce where the data-parallel world is one rank at ZeRO stage 0.

    There DeepSpeed still flattens every gradient, all-reduces the flat copy with itself,
    multiplies it by 1/1 and copies it back after each boundary backward (about 2.5 % of the actor's
    ``train`` on the tiny task): the gradients come out bit-identical without it. Stages 1-3 keep
    their own reduce (it also moves gradients into the optimizer's partitions). Called once, right
    after ``deepspeed.initialize``, in the training worker's process."""
    import torch.distributed as dist

    if engine.zero_optimization_stage() == 0 and dist.get_world_size() == 1:
        engine.enable_backward_allreduce = False


def seed_process(seed: int, full_determinism: bool) -> None:
    """Seed python, numpy and torch in this worker (OpenRLHF's ``set_seed`` on every rank), so
    random initialisations (a critic's new value head) repeat from run to run.

    ``--train.full_determinism_enable`` also switches torch to deterministic algorithms, with
    the CUDA settings they need (``transformers.enable_full_determinism``: cuDNN deterministic
    and without benchmarking, a fixed cuBLAS workspace, deterministic flash-attention backward,
    and ``CUDA_LAUNCH_BLOCKING=1``, which serialises kernel launches: expect GPU steps to be
    markedly slower). An op without a deterministic implementation then raises instead of
    running.
    """
    import transformers

    if full_determinism:
        transformers.enable_full_determinism(seed)
    else:
        transformers.set_seed(seed)


def torch_dtype(name: str) -> Any:
    """``--ds.param_dtype`` value -> torch dtype."""
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def dtype_of(config: Any) -> Any:
    return torch_dtype(config.ds.param_dtype)


def train_config(config: Any, optimizer_block: dict[str, Any] | None, world_size: int, max_norm: float,
                 zero_overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """ZeRO config of a trained model; reads ``config.ds`` and ``config.train.micro_batch_size/batch_size``.

    ``world_size``: the data-parallel ranks (all ranks over ``--ds.tensor_parallel_size``).
    ``zero_overrides`` are ``zero_optimization`` entries the optimizer requires (they win over the defaults).
    """
    ds = config.ds
    micro = config.train.micro_batch_size
    accumulation = max(1, config.train.batch_size // (micro * world_size))
    zero: dict[str, Any] = {"stage": ds.zero_stage, "overlap_comm": ds.overlap_comm}
    if ds.zero_stage == 3:
        zero.update(stage3_param_persistence_threshold="auto", reduce_scatter=True)
    if ds.zpg > 1:  # ZeRO++ hpZ: a second copy of the weights sharded within groups of zpg ranks (one node)
        zero["zero_hpz_partition_size"] = ds.zpg
    if ds.adam_offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": on_gpu()}
    zero.update(zero_overrides or {})
    block: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accumulation,
        "gradient_clipping": max_norm,
        "zero_optimization": zero,
        "bf16": {"enabled": ds.param_dtype == "bf16"},
        "fp16": {"enabled": ds.param_dtype == "fp16"},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if ds.grad_accum_dtype:
        block["data_types"] = {"grad_accum_dtype": ds.grad_accum_dtype}
    if ds.deepcompile:
        block["compile"] = {"deepcompile": True}
    if ds.tensor_parallel_size > 1:  # DeepSpeed AutoTP shards the linear layers over groups of this many ranks;
        # the output head stays whole, so every rank has the full-vocabulary logits the losses read
        block["tensor_parallel"] = {"autotp_size": ds.tensor_parallel_size, "vocab_parallel_lm_head": False}
    if ds.use_universal_ckpt:  # resumes load the universal form (rlhf.engines.universal_checkpoint)
        block["checkpoint"] = {"load_universal": True}
    if optimizer_block is not None:
        optimizer_block = {**optimizer_block, "params": dict(optimizer_block.get("params", {}))}
        if not ds.adam_offload and not on_gpu():
            # no fused_adam JIT build on CPU; foreach (one kernel call per op for all tensors)
            # instead of torch's CPU default of a Python loop over every tensor
            optimizer_block["params"].update(torch_adam=True, foreach=True)
        block["optimizer"] = optimizer_block
    return block


def optimizer_train_config(config: Any, optimizer: Any, section: Any, world_size: int) -> dict[str, Any]:
    """:func:`train_config` for a registered optimizer factory: its ``deepspeed_config(section)`` block and,
    when it defines the optional ``zero_config(stage)``, the ZeRO settings it requires at this stage."""
    zero_config = getattr(optimizer, "zero_config", None)
    overrides = zero_config(config.ds.zero_stage) if zero_config is not None else None
    return train_config(config, optimizer.deepspeed_config(section), world_size, section.max_norm, overrides)


def eval_config(config: Any, offload: bool, micro_batch_size: int | None = None) -> dict[str, Any]:
    """ZeRO config of a model that is only evaluated; ZeRO-3 (when training uses it) partitions it too."""
    stage = 3 if config.ds.zero_stage == 3 else 0
    zero: dict[str, Any] = {"stage": stage}
    if offload and stage == 3:
        zero["offload_param"] = {"device": "cpu", "pin_memory": on_gpu()}
    return {
        "train_micro_batch_size_per_gpu": micro_batch_size or config.rollout.micro_batch_size,
        "zero_optimization": zero,
        "bf16": {"enabled": config.ds.param_dtype == "bf16"},
        "fp16": {"enabled": config.ds.param_dtype == "fp16"},
        "steps_per_print": 10**9,
    }


def zero3_context(ds_config: dict[str, Any]) -> Any:
    """Keep this object alive across ``from_pretrained`` so ZeRO-3 partitions weights at load."""
    if ds_config["zero_optimization"]["stage"] != 3:
        return None
    from transformers.integrations import HfDeepSpeedConfig

    return HfDeepSpeedConfig(ds_config)


def is_partitioned(module: Any) -> bool:
    """Whether ZeRO-3 holds ``module``'s parameters in shards."""
    return any(hasattr(p, "ds_id") for p in module.parameters())


@contextlib.contextmanager
def gathered(module: Any):
    """Full parameters of a (possibly ZeRO-3 partitioned) module, on every rank of the group."""
    if is_partitioned(module):
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
            yield
    else:
        yield


def engine_state_dict(engine: Any, *, copy: bool = True) -> dict[str, Any] | None:
    """The full state dict of a DeepSpeed engine's model on the CPU; every rank must call it. Under AutoTP
    (``--ds.tensor_parallel_size``) DeepSpeed gathers the shards and only rank 0 gets the dict (others None)."""
    if engine.autotp_size() > 1:
        return engine._consolidated_16bit_state_dict()
    return full_state_dict(engine.module, copy=copy)


def full_state_dict(module: Any, *, copy: bool = True) -> dict[str, Any]:
    """The full state dict on the CPU; every rank must call it (ZeRO-3 gathers collectively).

    ``copy=False`` returns the live CPU tensors where they are whole already (no ZeRO-3), for a
    caller that serialises them before the next optimizer step (the weight sync).
    """
    copy = copy or is_partitioned(module)  # gathered weights are freed when the gather ends
    with gathered(module):
        return {k: v.detach().to("cpu", copy=copy) for k, v in module.state_dict().items()}
