"""``--vllm.sync_backend ipc``: weight sync by CUDA IPC between processes on one GPU.

With ``--train.colocate_all`` every vLLM engine worker shares its GPU with an actor rank. Per
bucket of the sync layout (:func:`rlhf.runtime.weight_sync.buckets`, at most
``RLHF_SYNC_BUCKET_MB`` of one dtype):

1. every actor rank gathers the bucket (ZeRO-3: collectively), copies it into one new flat tensor
   on its own GPU and exports it with ``torch.multiprocessing.reductions.reduce_tensor`` (a CUDA
   IPC handle: the tensor's device memory, openable by another process on that GPU);
2. the handles are all-gathered over the actor's DeepSpeed group into ``{GPU UUID: handle}``;
3. actor rank 0 hands that map to every engine; each engine worker opens the handle of its own
   GPU (``rebuild_cuda_tensor`` with its own device index, as vLLM's IPC weight-transfer engine
   does), copies the bucket's tensors out of it and loads them through the model's ``load_weights``;
4. a barrier of the actor ranks: every engine has read the bucket, each rank frees its copy.

The engines reload layer-wise as vLLM's ``reload_weights`` does (``initialize_layerwise_reload``
before the first bucket, ``finalize_layerwise_reload`` after the last), so a sync gives the same
weights as the object-store path's one-shot ``reload_weights``. Beyond the model, each GPU holds
the actor rank's copy of one bucket and the engine's copies of the layers not yet complete.

Functions prefixed ``worker_`` run inside vLLM's worker (``LLM.collective_rpc``); ``send_weights_ipc``
runs in every actor rank.
"""

from __future__ import annotations

from typing import Any

from rlhf.runtime.weight_sync import Entry, flatten, gathered_buckets, unflatten


def gpu_uuid(device_index: int) -> str:
    """The physical GPU's UUID: the same whichever CUDA_VISIBLE_DEVICES numbering a process has."""
    import torch

    return str(torch.cuda.get_device_properties(device_index).uuid)


def send_weights_ipc(module: Any, layout: list[Entry], engines: list[Any], is_sender: bool) -> None:
    """Actor side, every rank calls it each sync; ``is_sender`` (rank 0) drives the engines."""
    import ray
    import torch
    import torch.distributed as dist
    from torch.multiprocessing.reductions import reduce_tensor

    device = torch.cuda.current_device()
    here = gpu_uuid(device)
    ranks = dist.get_world_size() if dist.is_initialized() else 1
    if is_sender:
        ray.get([e.begin_weight_update.remote() for e in engines])
    for bucket, tensors in gathered_buckets(module, layout):
        copy = flatten(tensors, device)  # a tensor of its own: it outlives this bucket's ZeRO-3 gather
        torch.cuda.synchronize(device)  # written before another process reads it
        handles: list[dict[str, tuple]] = [{here: reduce_tensor(copy)[1]}]
        if ranks > 1:
            mine, handles = handles[0], [{} for _ in range(ranks)]
            dist.all_gather_object(handles, mine)
        if is_sender:
            by_gpu = {uuid: args for rank_handles in handles for uuid, args in rank_handles.items()}
            ray.get([e.load_weight_bucket.remote(bucket, by_gpu) for e in engines])
        if ranks > 1:
            dist.barrier()  # the engines have read every rank's copy: each may free its own
        del copy
    if is_sender:
        ray.get([e.end_weight_update.remote() for e in engines])
    torch.cuda.ipc_collect()  # release the exported blocks the engines have closed


def worker_begin_update(worker: Any) -> None:
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload.layerwise import initialize_layerwise_reload

    with set_current_vllm_config(worker.vllm_config):
        initialize_layerwise_reload(worker.model_runner.get_model())


def worker_load_bucket(worker: Any, bucket: list[Entry], by_gpu: dict[str, tuple]) -> None:
    """Open this worker's GPU's copy of the bucket and load its tensors (a view each) into the model."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    device_index = worker.device.index
    here = gpu_uuid(device_index)
    if here not in by_gpu:
        raise RuntimeError(f"no actor rank shares this engine's GPU {here} (actor GPUs: {sorted(by_gpu)}); "
                           "--vllm.sync_backend ipc needs every engine on an actor rank's GPU (--train.colocate_all)")
    args = list(by_gpu[here])
    args[6] = device_index  # reduce_tensor's device index is the sender's numbering; the GPU is the same
    flat = rebuild_cuda_tensor(*args)
    # copies, not views: the layer-wise reload keeps a layer's tensors until the layer is complete,
    # possibly buckets later, and the actor frees (and may reuse) this memory after this bucket
    weights = [(name, view.clone()) for name, view in unflatten(flat, bucket)]
    del flat
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(worker.vllm_config):
        worker.model_runner.get_model().load_weights(weights)


def worker_end_update(worker: Any) -> None:
    """After the last bucket: vLLM's post-load processing of every reloaded layer, and the caches
    derived from the old weights dropped (what ``reload_weights`` does after its one-shot load)."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

    runner = worker.model_runner
    with set_current_vllm_config(worker.vllm_config):
        finalize_layerwise_reload(runner.get_model(), worker.vllm_config.model_config)
    runner.reset_lora_state()
    runner.reset_encoder_cache()
    runner.reset_mm_cache()
