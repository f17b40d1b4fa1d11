"""``--vllm.sync_backend ipc``: the weight-sync transport by CUDA IPC between processes on one GPU.

With ``--train.colocate_all`` every vLLM engine worker shares its GPU with an actor rank. Per
bucket of the sync layout (:func:`rlhf.weight_buckets.buckets`, at most
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

Functions prefixed ``worker_`` run inside vLLM's worker (``LLM.collective_rpc``); :meth:`IpcTransport.send`
runs in every actor rank, the ``engine_`` methods in the engines' actors.
"""

from __future__ import annotations

from typing import Any

from rlhf.config.checks import engines_colocated_with
from rlhf.weight_buckets import Entry


class IpcTransport:
    """CUDA IPC to vLLM engines that share the actor's GPUs; ``auto`` prefers it wherever it can run."""

    auto_preference = 40

    @classmethod
    def unavailable_reason(cls, config: Any, cuda: bool) -> str | None:
        if not cuda:
            return "no CUDA GPU where the run's ranks and engines run (this machine, or the Ray cluster at RAY_ADDRESS)"
        if config.ds.lora.rank > 0:
            return "--ds.lora.rank syncs LoRA-merged weights"
        if config.ds.tensor_parallel_size > 1:
            return "--ds.tensor_parallel_size shards the weights"
        if engines_colocated_with(config.train) != "actor":
            return "the engines are not on the actor's GPUs (--train.colocate_all or --train.colocate actor+engines)"
        if not config.vllm.num_engines:
            return "--vllm.num_engines 0 generates with HF, not vLLM engines"
        if config.rollout.engine not in ("auto", "vllm"):
            return f"--rollout.engine {config.rollout.engine} is not vLLM"
        if config.train.async_enable:
            return "--train.async_enable generates while the actor trains, so the engines cannot share its GPUs' weights"
        return None

    def connect(self, actor: Any, engines: list[Any]) -> None:
        """Nothing to form: the handles go with each sync."""

    def sync(self, actor: Any, engines: list[Any]) -> None:
        import ray

        ray.get(actor.call_async("weight_sync_call", self, "send", engines))

    def send(self, source: Any, engines: list[Any]) -> None:
        """Actor side, every rank calls it each sync; rank 0 drives the engines."""
        import ray
        import torch
        import torch.distributed as dist
        from torch.multiprocessing.reductions import reduce_tensor

        from rlhf.weight_buckets import flatten

        is_sender = source.rank == 0
        device = torch.cuda.current_device()
        here = gpu_uuid(device)
        ranks = dist.get_world_size() if dist.is_initialized() else 1
        if is_sender:
            ray.get([e.weight_sync_call.remote(self, "engine_begin") for e in engines])
        for bucket, tensors in source.gathered_buckets(source.layout()):
            copy = flatten(tensors, device)  # a tensor of its own: it outlives this bucket's ZeRO-3 gather
            torch.cuda.synchronize(device)  # written before another process reads it
            handles: list[dict[str, tuple]] = [{here: reduce_tensor(copy)[1]}]
            if ranks > 1:
                mine, handles = handles[0], [{} for _ in range(ranks)]
                dist.all_gather_object(handles, mine)
            if is_sender:
                by_gpu = {uuid: args for rank_handles in handles for uuid, args in rank_handles.items()}
                ray.get([e.weight_sync_call.remote(self, "engine_load_bucket", bucket, by_gpu) for e in engines])
            if ranks > 1:
                dist.barrier()  # the engines have read every rank's copy: each may free its own
            del copy
        if is_sender:
            ray.get([e.weight_sync_call.remote(self, "engine_end") for e in engines])
        torch.cuda.ipc_collect()  # release the exported blocks the engines have closed

    def engine_begin(self, engine: Any, state: dict[str, Any]) -> None:
        engine.llm.collective_rpc(worker_begin_update)

    def engine_load_bucket(self, engine: Any, state: dict[str, Any], bucket: list[Entry], by_gpu: dict[str, tuple]) -> None:
        engine.llm.collective_rpc(worker_load_bucket, args=(bucket, by_gpu))

    def engine_end(self, engine: Any, state: dict[str, Any]) -> None:
        engine.llm.collective_rpc(worker_end_update)
        engine.weights_changed()


def gpu_uuid(device_index: int) -> str:
    """The physical GPU's UUID: the same whichever CUDA_VISIBLE_DEVICES numbering a process has."""
    import torch

    return str(torch.cuda.get_device_properties(device_index).uuid)


def worker_begin_update(worker: Any) -> None:
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload.layerwise import initialize_layerwise_reload

    with set_current_vllm_config(worker.vllm_config):
        initialize_layerwise_reload(worker.model_runner.get_model())


def worker_load_bucket(worker: Any, bucket: list[Entry], by_gpu: dict[str, tuple]) -> None:
    """Open this worker's GPU's copy of the bucket and load its tensors (a view each) into the model."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    from rlhf.weight_buckets import unflatten

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
