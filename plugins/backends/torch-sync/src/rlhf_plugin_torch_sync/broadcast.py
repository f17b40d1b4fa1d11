"""``--vllm.sync_backend gloo`` / ``nccl``: a broadcast group of actor rank 0 and the engines.

A torch.distributed group of actor rank 0 (group rank 0) and the engines (group ranks 1..N),
separate from the training group. Weights go out bucket by bucket (:mod:`rlhf.weight_buckets`);
under ZeRO-3 every actor rank gathers one bucket's parameters at a time. The engines learn the
layout once, when the group forms, so each sync is only the broadcasts: no metadata round trip
through the controller. On CPU gloo is about 3x faster per sync than the object store
(benchmarks/weight_sync.py).
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterator
from typing import Any

from rlhf.config.checks import engines_colocated_with
from rlhf.distributed import free_port
from rlhf.weight_buckets import Entry, buckets, flatten, numel, unflatten


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


def send_weights(source: Any, group: BroadcastGroup | None, layout: list[Entry]) -> None:
    """Actor side, every rank calls it; rank 0 (the one holding ``group``) broadcasts each bucket as one flat tensor."""
    for _, tensors in source.gathered_buckets(layout):
        if group is not None:
            group.broadcast(flatten(tensors, group.device))


def receive_weights(group: BroadcastGroup, layout: list[Entry]) -> Iterator[tuple[str, Any]]:
    """Engine side: yields ``(name, tensor)`` as each bucket arrives (views into the bucket)."""
    import torch

    for bucket in buckets(layout):
        flat = torch.empty(sum(numel(shape) for _, shape, _ in bucket), dtype=getattr(torch, bucket[0][2]),
                           device=group.device)
        group.broadcast(flat)
        yield from unflatten(flat, bucket)


def broadcast_blocker(config: Any) -> str | None:
    """Why rank 0's own parameters are not what the engines need, or None."""
    if config.ds.lora.rank > 0:  # LoRA syncs the adapters folded into the base, which only the full state computes
        return "--ds.lora.rank syncs LoRA-merged weights"
    if config.ds.tensor_parallel_size > 1:
        return "--ds.tensor_parallel_size shards the weights"
    return None


class _Broadcast:
    """The transport: the group forms on :meth:`connect`; each sync is one broadcast per bucket.

    Each exchange starts the engines' side first: actor ranks in the controller's process run their call at once
    (``serves_in_process_actor``), and would wait there for engines not yet asked to join."""

    backend: str
    serves_in_process_actor = True

    def connect(self, actor: Any, engines: list[Any]) -> None:
        import ray

        address, port, layout = ray.get(actor.workers[0].weight_sync_call.remote(self, "address"))
        world = 1 + len(engines)
        # every member at once: forming the group blocks each of them until all have joined
        joining = [e.weight_sync_call.remote(self, "engine_join", address, port, 1 + i, world, layout)
                   for i, e in enumerate(engines)]
        ray.get([*joining, *actor.call_async("weight_sync_call", self, "join", address, port, world)])

    def sync(self, actor: Any, engines: list[Any]) -> None:
        import ray

        receiving = [e.weight_sync_call.remote(self, "engine_receive") for e in engines]
        ray.get([*receiving, *actor.call_async("weight_sync_call", self, "send")])

    def address(self, source: Any) -> tuple[str, int, list[Entry]]:
        """Rank 0's host, a free port for the group's TCP store, and the layout the engines will receive."""
        import ray

        return ray.util.get_node_ip_address(), free_port(), source.layout()

    def join(self, source: Any, address: str, port: int, world_size: int) -> None:
        """Actor side: rank 0 joins as the group's rank 0, the others only gather."""
        source.state["group"] = BroadcastGroup(address, port, 0, world_size, self.backend) if source.rank == 0 else None
        source.state["layout"] = source.layout()

    def send(self, source: Any) -> None:
        send_weights(source, source.state["group"], source.state["layout"])

    def engine_join(self, engine: Any, state: dict[str, Any], address: str, port: int, rank: int, world_size: int,
                    layout: list[Entry]) -> None:
        state["group"], state["layout"] = BroadcastGroup(address, port, rank, world_size, self.backend), layout

    def engine_receive(self, engine: Any, state: dict[str, Any]) -> None:
        engine.load_weights(dict(receive_weights(state["group"], state["layout"])))


class GlooBroadcast(_Broadcast):
    """gloo: CPU tensors; ``auto``'s choice on a machine without CUDA."""

    backend = "gloo"
    auto_preference = 20

    @classmethod
    def unavailable_reason(cls, config: Any, cuda: bool) -> str | None:
        return broadcast_blocker(config)


class NcclBroadcast(_Broadcast):
    """NCCL: GPU tensors; ``auto``'s choice on CUDA unless the engines share the actor's GPUs (then ``ipc`` for
    vLLM engines, else ``gloo``)."""

    backend = "nccl"
    auto_preference = 30

    @classmethod
    def unavailable_reason(cls, config: Any, cuda: bool) -> str | None:
        if not cuda:
            return "no CUDA GPU where the run's ranks and engines run (this machine, or the Ray cluster at RAY_ADDRESS)"
        if engines_colocated_with(config.train) is not None:  # an engine shares a rank's GPU: NCCL refuses two ranks there
            return ("--train.colocate_all or --train.colocate puts the engines on training GPUs, and NCCL refuses two "
                    "ranks on one GPU")
        return broadcast_blocker(config)
