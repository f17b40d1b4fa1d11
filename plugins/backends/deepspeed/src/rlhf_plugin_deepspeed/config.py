"""The DeepSpeed configs of trained and evaluated models, from ``--ds.*`` and ``--train.*``.

On CPU machines communication is gloo and no C++ op is JIT-built in the default
path (``torch_adam`` and no shared-memory comm); ``--ds.adam_offload`` uses
DeepSpeedCPUAdam and pays its one-time build.
"""

from __future__ import annotations

from typing import Any

from rlhf.errors import ConfigError


def on_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


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


def refusal_hint(exc: BaseException) -> str | None:
    """The way out of a DeepSpeed refusal; None for one without a known flag (the core then names the other backends)."""
    message = str(exc)
    if "is not supported on your device" in message:  # DeepSpeed's check of fp16/bf16 against the accelerator
        return "this device has no kernels for that dtype: train in --ds.param_dtype fp32"
    if "out of memory" in message.lower():
        return "lower --train.micro_batch_size, or offload with --ds.adam_offload (or --ds.zero_stage 3)"
    return None


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
    if ds.use_universal_ckpt:  # resumes load the universal form (rlhf_plugin_deepspeed.universal)
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
