"""Weight-sync transports built on torch and Ray alone (``--vllm.sync_backend NAME``).

* ``object_store``: actor rank 0 returns its full CPU state dict, Ray puts it in the object store
  once and every engine reads it from there (``auto``'s choice with LoRA or AutoTP);
* ``gloo`` / ``nccl``: a torch.distributed broadcast group of actor rank 0 and the engines,
  bucket by bucket (``auto``'s choice on CPU / on CUDA).
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_weight_sync_transports(register):
    register("object_store", "rlhf_plugin_torch_sync.object_store:ObjectStoreTransport",
             description="rank 0's full state dict through the Ray object store (LoRA, AutoTP)")
    register("gloo", "rlhf_plugin_torch_sync.broadcast:GlooBroadcast", description="gloo broadcast, bucket by bucket (CPU)")
    register("nccl", "rlhf_plugin_torch_sync.broadcast:NcclBroadcast", description="NCCL broadcast, bucket by bucket (CUDA)")
