"""Weight sync: actor rank 0's weights into every rollout engine, by the transport ``--vllm.sync_backend`` names.

The transports themselves are :class:`rlhf.components.WeightSyncTransport` components (the object
store, gloo/NCCL broadcast, CUDA IPC from first-party plugins). This module holds what the core
owns: the choice (``auto``: the most preferred transport that can run for the config), the
controller's handle, the actor ranks' :class:`rlhf.components.WeightSource`, and the bucketing
every streaming transport shares: weights go out in buckets of at most ``BUCKET_BYTES`` of one
dtype; with sharded weights (ZeRO-3, FSDP2) every actor rank gathers one bucket's parameters at a
time, so no rank ever holds the whole model unsharded.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from rlhf.components import build
from rlhf.errors import ConfigError
from rlhf.host.plugin_host import PluginHost
from rlhf.registry import ComponentKind
from rlhf.runtime.cluster.liveness import naming_dead_workers
from rlhf.weight_buckets import Entry, buckets

if TYPE_CHECKING:
    from rlhf.config.ppo import PPOConfig


def _transports(registry: Any) -> dict[str, type]:
    return {name: registry.get(ComponentKind.WEIGHT_SYNC_TRANSPORT, name)
            for name in registry.names(ComponentKind.WEIGHT_SYNC_TRANSPORT)}


def backend_for(config: PPOConfig, cuda: bool | None = None, registry: Any = None) -> str:
    """The transport a run uses (``cuda``: whether the ranks and engines have CUDA GPUs, which the controller
    reads from the Ray cluster's resources, since a driver on a node without GPUs may run a GPU cluster; asked
    of torch in this process when None; ``registry``: the run's components, the plugins loaded by default
    when None).

    ``auto`` (the default) is the installed transport with the highest ``auto_preference`` whose
    ``unavailable_reason`` is None; with the first-party ones that is ``ipc`` when the vLLM engines
    share the actor's GPUs, else a broadcast (``nccl`` on CUDA, ``gloo`` on CPU), else (LoRA, AutoTP)
    the object store. An explicit transport that cannot run is a :class:`ConfigError` naming why,
    rather than a silent switch."""

    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    if registry is None:

        registry = PluginHost.load().registry
    choice = config.vllm.sync_backend
    if choice == "auto":
        runnable = [(cls.auto_preference, name) for name, cls in _transports(registry).items()
                    if cls.unavailable_reason(config, cuda) is None]
        if not runnable:
            raise ConfigError("--vllm.sync_backend auto: no installed weight-sync transport can run for this config; "
                              "install rlhf-plugin-torch-sync (object_store, gloo, nccl)")
        return max(runnable)[1]
    transport = registry.get(ComponentKind.WEIGHT_SYNC_TRANSPORT, choice, flag="--vllm.sync_backend")
    reason = transport.unavailable_reason(config, cuda)
    if reason:
        raise ConfigError(f"--vllm.sync_backend {choice} cannot run: {reason}; "
                          "use --vllm.sync_backend object_store (or leave it unset: auto picks what runs)")
    return choice


def transport_before_ray(config: PPOConfig, registry: Any) -> str | None:
    """The transport as far as it can be chosen before Ray starts, so that a wrong choice fails first.

    It is chosen first as for devices without CUDA, which needs no torch import: that import takes seconds, and
    Ray starts only after this returns (torch then imports while Ray starts). Only a choice that needs CUDA goes
    further. A local cluster's devices are this machine's, so torch is asked. A cluster joined at ``RAY_ADDRESS``
    may have GPUs that this driver lacks (a head node without any), so there the choice is None here. Either way
    the controller settles it with :func:`backend_for` and the cluster's GPUs once Ray is up."""
    try:
        return backend_for(config, cuda=False, registry=registry)
    except ConfigError:
        if os.environ.get("RAY_ADDRESS"):
            return None
        return backend_for(config, registry=registry)


def _sync_tensors(module: Any) -> dict[str, Any]:
    """What a sync sends: the state dict's entries as live tensors, tied ones under each name (vLLM
    wants ``lm_head.weight`` even when tied, and reloads it wrongly without)."""
    return module.state_dict(keep_vars=True)


def module_layout(model: Any) -> list[Entry]:
    """The tensors a sync sends of a :class:`rlhf.components.TrainedModel`, in order, with their full shapes."""
    return [(name, model.full_shape(t), str(t.dtype).removeprefix("torch."))
            for name, t in _sync_tensors(model.module).items()]


def gathered_buckets(model: Any, layout: list[Entry]) -> Iterator[tuple[list[Entry], list[Any]]]:
    """Actor side, every rank iterates it (sharded weights gather collectively): each bucket of
    ``layout`` with its full tensors, valid until the next iteration (gathered for this bucket only)."""
    for bucket in buckets(layout):
        with model.full_tensors([name for name, _, _ in bucket]) as tensors:
            yield bucket, tensors


class ActorWeights:
    """The :class:`rlhf.components.WeightSource` of one actor rank: its trained model and full state."""

    def __init__(self, worker: Any, state: dict[str, Any]) -> None:
        self.worker, self.state = worker, state
        self.rank, self.world_size = worker.rank, worker.world_size

    def layout(self) -> list[Entry]:
        return module_layout(self.worker.model)

    def gathered_buckets(self, layout: list[Entry]) -> Iterator[tuple[list[Entry], list[Any]]]:
        return gathered_buckets(self.worker.model, layout)

    def full_state(self) -> dict[str, Any] | None:
        return self.worker.full_state()


class WeightSync:
    """The controller's handle: builds the chosen transport, connects it once, runs one sync per call."""

    def __init__(self, config: PPOConfig, actor: Any, engines: Any, registry: Any = None, backend: str | None = None) -> None:
        """``backend``: the transport the controller chose (:func:`backend_for`); chosen here when None."""
        if registry is None:

            registry = PluginHost.load().registry
        self.backend = backend or backend_for(config, registry=registry)
        self.actor, self.engines = actor, engines
        self.transport = build(registry.get(ComponentKind.WEIGHT_SYNC_TRANSPORT, self.backend), config)
        with self._naming_dead_workers():
            self.transport.connect(actor, engines.engines)

    def sync(self) -> None:
        with self._naming_dead_workers():
            self.transport.sync(self.actor, self.engines.engines)

    def _naming_dead_workers(self) -> Any:
        """A transport waits for its Ray calls itself: a rank or engine that died in them is named, not
        the peer whose collective failed first."""

        return naming_dead_workers([*self.actor.workers, *self.engines.engines])
