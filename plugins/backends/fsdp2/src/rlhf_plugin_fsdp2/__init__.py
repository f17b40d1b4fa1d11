"""torch FSDP2 (``torch.distributed.fsdp.fully_shard``) as an rlhf training backend (``--train.backend fsdp2``).

Every decoder block and then the whole model are sharded over the data-parallel ranks (like ZeRO-3);
fp32 master weights with ``--ds.param_dtype bf16|fp16`` compute; checkpoints through
``torch.distributed.checkpoint``; gloo on CPU machines, NCCL on GPUs; ``--fsdp2.cpu_offload`` keeps the trained
models' states on the CPU. The DeepSpeed-only ``--ds.*`` flags (offload, AutoTP, ZeRO++, universal checkpoints,
sleep, deepcompile, LoRA, 4-bit) are refused.
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_training_backends(register):
    register("fsdp2", "rlhf_plugin_fsdp2.backend:FSDP2Backend",
             description="torch FSDP2 fully_shard: sharded fp32 master weights, bf16/fp16 compute, DCP checkpoints")


@rlhf.hookimpl
def rlhf_register_options(register):
    register("rlhf_plugin_fsdp2.options:FSDP2Options", namespace="fsdp2")
