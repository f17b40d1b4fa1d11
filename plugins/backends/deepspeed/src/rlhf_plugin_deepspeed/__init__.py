"""DeepSpeed ZeRO as an rlhf training backend (``--train.backend deepspeed``, the default).

ZeRO stages 0-3 (``--ds.zero_stage``), optimizer and parameter offload, AutoTP
(``--ds.tensor_parallel_size``), ZeRO++ (``--ds.zpg``), universal checkpoints
(``--ds.use_universal_ckpt``), sleep between fits (``--ds.enable_sleep``) and EMA
(``--train.enable_ema``); gloo on CPU machines, NCCL on GPUs.
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_training_backends(register):
    register("deepspeed", "rlhf_plugin_deepspeed.backend:DeepSpeedBackend",
             description="DeepSpeed ZeRO 0-3 with offload, AutoTP, ZeRO++, universal checkpoints, sleep and EMA")
