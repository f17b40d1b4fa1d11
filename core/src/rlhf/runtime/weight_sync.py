"""Weight sync: actor rank 0's weights into every rollout engine, chosen by ``--vllm.sync_backend``.

Backends:

* ``object_store``: rank 0 returns its full CPU state dict, Ray puts it in the object store
  once and every engine reads it from there (what ``auto`` picks with LoRA or with AutoTP).
* ``gloo`` / ``nccl``: a torch.distributed broadcast group of actor rank 0 (group rank 0) and the
  engines (group ranks 1..N), separate from DeepSpeed's training group. Weights go out in
  buckets of at most ``BUCKET_BYTES`` of one dtype; under ZeRO-3 every actor rank gathers one
  bucket's parameters at a time, so no rank ever holds the whole model unsharded.
* ``ipc``: vLLM engines on the actor's own GPUs (``--train.colocate_all``): each actor rank copies
  a bucket into a new tensor on its GPU and hands a CUDA IPC handle of it to the engine workers on
  that GPU, which read it in place (``rlhf.runtime.ipc_weight_sync``); nothing crosses a network.

The engines learn the layout (names, shapes, dtypes, bucket split) once, when the group forms,
so each sync is only the broadcasts: no metadata round trip through the controller.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterator
from typing import Any

SYNC_BACKENDS = ("auto", "ipc", "nccl", "gloo", "object_store")
BUCKET_BYTES = int(os.environ.get("RLHF_SYNC_BUCKET_MB", "64")) << 20

#: one tensor of the layout: (name, shape, dtype name)
Entry = tuple[str, tuple[int, ...], str]


def backend_for(config: Any, cuda: bool | None = None) -> str:
    """The backend a run uses (``cuda``: whether this machine has CUDA; asked of torch when None).

    ``auto`` (the default) is, where one can run: ``ipc`` when the vLLM engines share the actor's
    GPUs (OpenRLHF's choice with ``--train.colocate_all``); else a broadcast (no LoRA, no AutoTP):
    ``nccl`` on CUDA, ``gloo`` on CPU (about 3x faster per sync than the object store there,
    benchmarks/weight_sync.py); else the object store. An explicit backend that cannot run is a
    :class:`ConfigError` naming why, rather than a silent switch."""
    from rlhf.errors import ConfigError

    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    choice = config.vllm.sync_backend
    # LoRA syncs the adapters folded into the base, which only the full-state path computes
    broadcast_blocker = ("--ds.lora.rank syncs LoRA-merged weights" if config.ds.lora.rank > 0 else
                         "--ds.tensor_parallel_size shards the weights" if config.ds.tensor_parallel_size > 1 else None)
    blocker = "this machine has no CUDA" if not cuda else broadcast_blocker
    ipc_blocker = blocker or _ipc_blocker(config)
    if choice == "auto":
        if broadcast_blocker:
            return "object_store"
        return "gloo" if blocker else "nccl" if ipc_blocker else "ipc"
    if choice in ("nccl", "ipc") and (blocker if choice == "nccl" else ipc_blocker):
        raise ConfigError(f"--vllm.sync_backend {choice} cannot run: {blocker if choice == 'nccl' else ipc_blocker}; "
                          "use --vllm.sync_backend object_store (or leave it unset: auto picks what runs)")
    return choice


def _ipc_blocker(config: Any) -> str | None:
    """Why CUDA IPC cannot hand the actor's weights to the engines, or None."""
    if not config.train.colocate_all:
        return "the engines are not on the actor's GPUs (--train.colocate_all puts them there)"
    if not config.vllm.num_engines:
        return "--vllm.num_engines 0 generates with HF, not vLLM engines"
    if config.train.async_enable:
        return "--train.async_enable generates while the actor trains, so the engines cannot share its GPUs' weights"
    return None


def buckets(layout: list[Entry], bucket_bytes: int = BUCKET_BYTES) -> list[list[Entry]]:
    """Consecutive runs of one dtype, each at most ``bucket_bytes`` (a larger tensor goes alone)."""
    import torch

    result: list[list[Entry]] = []
    size = 0
    for entry in layout:
        nbytes = _numel(entry[1]) * getattr(torch, entry[2]).itemsize
        if not result or result[-1][0][2] != entry[2] or size + nbytes > bucket_bytes:
            result.append([])
            size = 0
        result[-1].append(entry)
        size += nbytes
    return result


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


class BroadcastGroup:
    """A stand-alone gloo or NCCL process group (its own TCP store), so it lives beside DeepSpeed's
    default group in the actor and beside vLLM's in the engines without touching either."""

    def __init__(self, address: str, port: int, rank: int, world_size: int, backend: str) -> None:
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=float(os.environ.get("RLHF_RAY_TIMEOUT", "1800")))
        store = dist.TCPStore(address, port, world_size, is_master=rank == 0, timeout=timeout)
        if backend == "nccl":
            self.group = dist.ProcessGroupNCCL(store, rank, world_size)
            self.device = "cuda"
        else:
            self.group = dist.ProcessGroupGloo(store, rank, world_size, timeout)
            self.device = "cpu"

    def broadcast(self, tensor: Any) -> None:
        self.group.broadcast(tensor, 0).wait()


def _sync_tensors(module: Any) -> dict[str, Any]:
    """What a sync sends: the state dict's entries as live tensors, tied ones under each name (vLLM
    wants ``lm_head.weight`` even when tied, and reloads it wrongly without)."""
    return module.state_dict(keep_vars=True)


def module_layout(module: Any) -> list[Entry]:
    """The tensors a sync sends, in order (under ZeRO-3 their full shapes, ``ds_shape``)."""
    return [(name, tuple(getattr(t, "ds_shape", t.shape)), str(t.dtype).removeprefix("torch."))
            for name, t in _sync_tensors(module).items()]


def gathered_buckets(module: Any, layout: list[Entry]) -> Iterator[tuple[list[Entry], list[Any]]]:
    """Actor side, every rank iterates it (the ZeRO-3 gathers are collective): each bucket of
    ``layout`` with its full tensors, valid until the next iteration (under ZeRO-3 they are
    gathered for this bucket only)."""
    from rlhf.engines.deepspeed_strategy import is_partitioned

    live = _sync_tensors(module)
    partitioned = is_partitioned(module)
    for bucket in buckets(layout):
        tensors = [live[name] for name, _, _ in bucket]
        if partitioned:
            import deepspeed

            shards = list({id(t): t for t in tensors if hasattr(t, "ds_id")}.values())  # tied ones gather once
            gather = deepspeed.zero.GatheredParameters(shards, modifier_rank=None)
        else:
            import contextlib

            gather = contextlib.nullcontext()
        with gather:
            yield bucket, tensors


def flatten(tensors: list[Any], device: Any) -> Any:
    """One bucket's tensors as one new flat tensor on ``device``."""
    import torch

    return torch.cat([t.detach().reshape(-1) for t in tensors]).to(device)


def unflatten(flat: Any, bucket: list[Entry]) -> Iterator[tuple[str, Any]]:
    """``(name, view)`` of every tensor of ``bucket`` inside its flat tensor."""
    offset = 0
    for name, shape, _ in bucket:
        count = _numel(shape)
        yield name, flat[offset:offset + count].view(shape)
        offset += count


def send_weights(module: Any, group: BroadcastGroup | None, layout: list[Entry]) -> None:
    """Actor side, every rank calls it; rank 0 (the one holding ``group``) broadcasts each bucket as one flat tensor."""
    for _, tensors in gathered_buckets(module, layout):
        if group is not None:
            group.broadcast(flatten(tensors, group.device))


def receive_weights(group: BroadcastGroup, layout: list[Entry]) -> Iterator[tuple[str, Any]]:
    """Engine side: yields ``(name, tensor)`` as each bucket arrives (views into the bucket)."""
    import torch

    for bucket in buckets(layout):
        flat = torch.empty(sum(_numel(shape) for _, shape, _ in bucket), dtype=getattr(torch, bucket[0][2]),
                           device=group.device)
        group.broadcast(flat)
        yield from unflatten(flat, bucket)


class WeightReceiver:
    """Mixed into the rollout engines: join the broadcast group, then take each sync from it."""

    def join_weight_group(self, address: str, port: int, rank: int, world_size: int, backend: str,
                          layout: list[Entry]) -> None:
        self._weight_group = BroadcastGroup(address, port, rank, world_size, backend)
        self._weight_layout = layout

    def receive_weights(self) -> None:
        self.load_weights(dict(receive_weights(self._weight_group, self._weight_layout)))  # type: ignore[attr-defined]


class WeightSync:
    """The controller's handle: forms the group (broadcast backends) and runs one sync per call."""

    def __init__(self, config: Any, actor: Any, engines: Any) -> None:
        from rlhf.runtime.worker_group import wait

        self.backend = backend_for(config)
        self.actor, self.engines = actor, engines
        if self.backend in ("object_store", "ipc"):  # ipc: no group to form, the handles go with each sync
            return
        address, port = wait(actor.workers[0].address.remote())
        layout = wait(actor.workers[0].weight_layout.remote())
        world = 1 + len(engines.engines)
        wait([*actor.call_async("join_weight_group", address, port, world, self.backend),
              *[e.join_weight_group.remote(address, port, 1 + i, world, self.backend, layout)
                for i, e in enumerate(engines.engines)]])

    def sync(self) -> None:
        from rlhf.runtime.worker_group import wait

        if self.backend == "object_store":
            refs = self.actor.call_async("full_state")
            self.engines.load_weights(refs[0])  # the engines read rank 0's result as soon as it exists
            wait(refs)
            return
        if self.backend == "ipc":
            wait(self.actor.call_async("send_weights_ipc", self.engines.engines))
            return
        wait([*self.actor.call_async("broadcast_weights"), *[e.receive_weights.remote() for e in self.engines.engines]])
