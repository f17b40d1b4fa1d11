"""Ray actor groups: N ranks of one role that form a torch.distributed group.

The controller creates every rank, learns rank 0's address, then calls
``setup`` on all ranks at once (they rendezvous there). Each worker reloads the
run's exact plugin set (``plugin_set`` of the config) before anything else.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

from rlhf.components.first_use import FirstUse
from rlhf.config.ppo import PPOConfig
from rlhf.config.training_backend import backend_class, backend_label, training_backend
from rlhf.distributed import free_port
from rlhf.host.plugin_host import PluginHost
from rlhf.host.selection import PluginSelection
from rlhf.models.loading import seed_process
from rlhf.runtime.cluster.host_memory import keep_freed_memory
from rlhf.runtime.cluster.liveness import track, use_cpu_share, wait, whereabouts
from rlhf.runtime.cluster.local import LocalHandle


class BaseWorker:
    """Base of every model worker (runs inside a Ray actor)."""

    role = "worker"

    def __init__(self, rank: int, world_size: int, config: dict[str, Any], cpu_sharers: int | None = None) -> None:
        """``cpu_sharers``: how many worker processes compute at the same time as this one (default: its group)."""
        self.rank, self.world_size = rank, world_size
        self._config_dict = config
        # Ray gives each GPU actor its own device as cuda:0, so the local rank is always 0.
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK="0")
        use_cpu_share(cpu_sharers or world_size)
        keep_freed_memory()

    def preload(self) -> None:
        """Load the plugins, the config and the training backend's imports (its optional ``preload()``
        classmethod); called as the worker is created, so the imports overlap the controller's own
        start-up work instead of following it."""
        import transformers  # noqa: F401

        self.plugins = PluginHost.load(PluginSelection.from_resolved(self._config_dict.get("plugin_set", [])))
        self.config = PPOConfig.model_validate(self._config_dict)
        preload = getattr(backend_class(self.config, self.plugins.registry), "preload", None)
        if preload is not None:
            preload()

    def where(self) -> dict[str, Any]:
        """This rank's :func:`whereabouts` (node, placement group, log file)."""
        return whereabouts()

    def address(self) -> tuple[str, int]:
        return socket.gethostbyname(socket.gethostname()) if _multi_node() else "127.0.0.1", free_port()

    def _init_common(self, master_addr: str, master_port: int) -> None:
        os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))
        if not hasattr(self, "plugins"):  # preload ran first unless a caller set up a worker by hand
            self.preload()
        seed_process(self.config.train.seed, self.config.train.full_determinism_enable)
        #: the run's :class:`rlhf.components.TrainingBackend` in this process (--train.backend)
        self.backend = training_backend(self.config, self.plugins.registry)
        #: its set-up, model loads and first step are where the library under it refuses the run
        self.backend_use = FirstUse(backend_label(self.config, self.plugins.registry), type(self.backend))
        with self.backend_use.watch("init_distributed", "while it joined the distributed group"):
            self.backend.init_distributed()
        self.plugins.worker_init(self.role, self.rank, self.config)


def _multi_node() -> bool:
    ray = sys.modules.get("ray")  # ranks in the controller's process never import it
    return ray is not None and ray.is_initialized() and len([n for n in ray.nodes() if n.get("Alive")]) > 1


class WorkerGroup:
    """``num_workers`` Ray actors of ``worker_class`` forming one distributed group, or its one rank in this process."""

    def __init__(self, worker_class: type, role: str, num_workers: int, config: dict[str, Any], *,
                 placement: Any = None, cpu_sharers: int | None = None, tensor_parallel: int = 1,
                 beside_ray_actors: bool = False) -> None:
        """``placement``: the run's :class:`rlhf.runtime.cluster.placement.Placement` (bundle of each rank), or None
        for one rank in this process (:mod:`rlhf.runtime.cluster.local`); ``tensor_parallel``: ranks per AutoTP
        group; :meth:`call_split_async` gives them the same share. ``beside_ray_actors``: the rank in this process
        answers with Ray references, which the run's engine actors can be handed."""
        self.role, self.tensor_parallel = role, tensor_parallel
        if placement is None:  # beside engine processes in async mode the controller's process shares the cores
            self.workers: list[Any] = [LocalHandle(worker_class(0, 1, config, cpu_sharers or 1), role, beside_ray_actors)]
        else:
            import ray

            remote = ray.remote(worker_class)
            self.workers = [track(remote.options(**placement.options(role, rank)).remote(rank, num_workers, config,
                                                                                          cpu_sharers), role, rank)
                            for rank in range(num_workers)]
        self._booting = [*self.call_async("preload"), self.workers[0].address.remote()]  # imports start now

    def setup_async(self, *args: Any, **kwargs: Any) -> list[Any]:
        """Start every rank's ``setup`` (they rendezvous at rank 0's address); returns the refs."""
        *_, (master_addr, master_port) = wait(self._booting)
        return self.call_async("setup", master_addr, master_port, *args, **kwargs)

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        return wait(self.call_async(method, *args, **kwargs))

    def call_async(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        return [getattr(w, method).remote(*args, **kwargs) for w in self.workers]

    def call_split_async(self, method: str, columns: dict[str, list | None], **kwargs: Any) -> list[Any]:
        """Give each rank a contiguous share of the samples in ``columns`` (per-sample lists, or
        None for a column that is absent), as a dict of the same shape."""
        count = len(next(v for v in columns.values() if v is not None))
        bounds = split_bounds(count, len(self.workers) // self.tensor_parallel)
        return [getattr(w, method).remote({k: (v[a:b] if v is not None else None) for k, v in columns.items()}, **kwargs)
                for i, w in enumerate(self.workers) for a, b in [bounds[i // self.tensor_parallel]]]

    def call_split(self, method: str, columns: dict[str, list | None], **kwargs: Any) -> list[Any]:
        """:meth:`call_split_async`, waited for, with the per-rank result lists concatenated."""
        parts = wait(self.call_split_async(method, columns, **kwargs))
        return [x for part in parts for x in part]


def split_bounds(count: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous ``[start, end)`` ranges over ``count`` items, sizes differing by at most one."""
    size, extra = divmod(count, parts)
    bounds, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def split_evenly(items: list[Any], parts: int) -> list[list[Any]]:
    return [items[a:b] for a, b in split_bounds(len(items), parts)]
