"""Ray actor groups: N ranks of one role that form a torch.distributed group.

The controller creates every rank, learns rank 0's address, then calls
``setup`` on all ranks at once (they rendezvous there). Each worker reloads the
run's exact plugin set (``plugin_set`` of the config) before anything else.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
from collections.abc import Iterator
from typing import Any

from rlhf.errors import WorkerError, find_user_error

TIMEOUT_S = float(os.environ.get("RLHF_RAY_TIMEOUT", "1800"))

#: Ray actor id (hex) -> (group, rank) of every worker this process created, to name a dead one.
_MEMBERS: dict[str, tuple[str, int]] = {}
#: Ray actor id (hex) -> the reference to its :func:`whereabouts`, asked as it starts.
_WHEREABOUTS: dict[str, Any] = {}


def track(handle: Any, group: str, rank: int) -> Any:
    """Remember which group and rank the Ray actor ``handle`` is, and ask where it runs (node and
    log file), for :func:`wait`'s errors."""
    _MEMBERS[handle._actor_id.hex()] = (group, rank)
    _WHEREABOUTS[handle._actor_id.hex()] = handle.__ray_call__.remote(lambda _: whereabouts())
    return handle


def whereabouts() -> dict[str, Any]:
    """Inside a Ray actor: its node id and IP, placement group id, assigned resources, and the log
    file its stderr goes to (Ray redirects it to ``<session>/logs/worker-*.err``)."""
    import ray

    context = ray.get_runtime_context()
    try:
        log = os.readlink("/proc/self/fd/2")
    except OSError:  # not Linux: Ray's log folder then
        log = "the worker-*.err files under /tmp/ray/session_latest/logs"
    return {"node_id": context.get_node_id(), "node_ip": ray.util.get_node_ip_address(),
            "placement_group": context.get_placement_group_id(), "resources": context.get_assigned_resources(), "log": log}


def write_whereabouts(path: Any, groups: list[Any], engines: list[Any]) -> None:
    """``path`` (JSON): every rank's and engine's group, rank and :func:`whereabouts`, as each said when
    it started: which node each runs on, and its log file. ``groups``: the run's :class:`WorkerGroup` s
    (None for one the run lacks); ``engines``: the rollout engines' actor handles."""
    import json
    from pathlib import Path

    from rlhf.checkpoints.files import write_text_atomically

    handles = [w for group in groups if group is not None for w in group.workers] + list(engines)
    places = wait([_WHEREABOUTS[h._actor_id.hex()] for h in handles])
    rows = [{"group": _MEMBERS[h._actor_id.hex()][0], "rank": _MEMBERS[h._actor_id.hex()][1], **place}
            for h, place in zip(handles, places)]
    write_text_atomically(Path(path), json.dumps(rows, indent=1, default=str) + "\n", "workers.json")


#: how long a failed call waits for its other workers' results, to find a dead one among them
DEATH_GRACE_S = float(os.environ.get("RLHF_DEATH_GRACE_S", "30"))


def wait(refs: Any) -> Any:
    """``ray.get`` with the run's timeout; a dead or silent worker is a :class:`WorkerError` naming
    its group and rank. An exception raised inside a worker method passes through unchanged (the
    CLI finds a user error in its cause), unless another worker of the same call died: see
    :func:`_dead_peer`."""
    import ray

    try:
        return ray.get(refs, timeout=TIMEOUT_S)
    except ray.exceptions.GetTimeoutError as exc:
        raise WorkerError(f"Ray workers did not answer within {TIMEOUT_S:.0f} s: a worker is stuck or the cluster lacks "
                          "resources (`ray status`); raise RLHF_RAY_TIMEOUT for slow steps") from exc
    except ray.exceptions.RayError as exc:
        death = _worker_death(exc, refs if isinstance(refs, list) else [refs])
        if death is None:
            raise
        raise death from exc


@contextlib.contextmanager
def naming_dead_workers(handles: list[Any]) -> Iterator[None]:
    """Around Ray calls a component waits for itself (a weight-sync transport's ``ray.get``): a failure
    that a dead worker among ``handles`` caused is raised as :func:`wait` would, naming that worker."""
    import ray

    try:
        yield
    except ray.exceptions.RayError as exc:
        death = _worker_death(exc, [handle.__ray_call__.remote(_answer) for handle in handles])
        if death is None:
            raise
        raise death from exc


def _answer(_: Any) -> None:
    """What a worker runs to show it is alive (see :func:`naming_dead_workers`)."""


def _worker_death(exc: Exception, refs: list[Any]) -> Exception | None:
    """The :class:`WorkerError` naming the dead worker that made a call fail with ``exc``, or None where
    none did (``exc`` then stands: a worker's own exception, a user error). ``refs``: the call's other
    results, awaited for a death among them (see :func:`_dead_peer`)."""
    import ray

    if isinstance(exc, ray.exceptions.ActorDiedError):
        return _death(exc)
    if find_user_error(exc) is not None:
        return None
    dead = _dead_peer(refs)
    return None if dead is None else _death(dead)


def _dead_peer(refs: list[Any]) -> Any:
    """The :class:`ray.exceptions.ActorDiedError` of a worker of ``refs`` that died, or None.

    When a worker dies in the middle of a collective (the gloo weight sync, DeepSpeed's all-reduce), its
    peers fail at once ("Connection reset by peer", "Connection closed by peer"), while Ray declares
    the dead one's own call failed only once its raylet and the GCS have noticed: the first error
    ``ray.get`` meets is then the peer's, and names the wrong cause. So the call's other results are
    awaited (up to :data:`DEATH_GRACE_S`, until each is in): a death among them is the cause."""
    import time

    import ray

    pending, deadline = list(refs), time.monotonic() + DEATH_GRACE_S
    while pending and (left := deadline - time.monotonic()) > 0:
        ready, pending = ray.wait(pending, num_returns=1, timeout=left)
        for ref in ready:
            try:
                ray.get(ref, timeout=0)
            except ray.exceptions.ActorDiedError as exc:
                return exc
            except Exception:  # noqa: BLE001 - another peer's failure, or a result: keep looking
                continue
    return None


def _death(exc: Any) -> Exception:
    """What a dead worker means: its ``__init__`` raised (Ray keeps only the text), or its process exited."""
    group, rank = _MEMBERS.get(str(getattr(exc, "actor_id", "")), ("unknown", -1))
    who = f"Ray worker {group!r} rank {rank}"
    if getattr(exc, "actor_init_failed", False):
        lines = [line.strip() for line in str(getattr(exc, "error_msg", exc)).splitlines() if line.strip()]
        reason = lines[-1] if lines else "unknown reason"
        if reason.startswith("rlhf.errors."):  # a user error raised while the worker started
            return WorkerError(f"{who} failed to start: {reason.split(': ', 1)[-1]}")
        return RuntimeError(f"{who} failed to start: {reason}")
    pid = re.search(r"pid: (\d+)", str(exc))
    place = _known_whereabouts(str(getattr(exc, "actor_id", "")))
    where = f" on node {place['node_ip']} ({place['node_id'][:12]})" if place else ""
    log = f"read its log {place['log']}" if place else "its log is above"
    return WorkerError(f"{who}{f' (pid {pid.group(1)})' if pid else ''}{where} died: its process exited (killed, out of "
                       f"memory, or crashed; {log}); resume from the last checkpoint with --ckpt.load_enable")


def _known_whereabouts(actor_id: str) -> dict[str, Any] | None:
    """What a worker said about where it runs, if it answered before dying."""
    import ray

    ref = _WHEREABOUTS.get(actor_id)
    if ref is None:
        return None
    try:
        return ray.get(ref, timeout=5)
    except Exception:  # died before answering: the message goes without node and log
        return None


def use_cpu_share(processes: int) -> int:
    """Give this worker's torch ops an equal share of the machine's cores and return it.

    Ray starts ``num_cpus=0`` actors with ``OMP_NUM_THREADS=1``, which left every CPU
    forward, backward and ``generate`` on one core. ``processes`` is how many workers compute
    at the same time (every model rank: actor, reference and critic overlap; the engines
    generate while they wait), so each takes ``cores // processes`` and none oversubscribes.
    ``RLHF_WORKER_THREADS`` overrides the share.
    """
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = int(os.environ.get("RLHF_WORKER_THREADS") or max(1, cores // max(1, processes)))
    torch.set_num_threads(threads)
    return threads


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


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

    def preload(self) -> None:
        """Load the plugins, the config and the training backend's imports (its optional ``preload()``
        classmethod); called as the worker is created, so the imports overlap the controller's own
        start-up work instead of following it."""
        import transformers  # noqa: F401

        from rlhf.config.ppo import PPOConfig
        from rlhf.config.training_backend import backend_class
        from rlhf.plugin_selection import PluginSelection
        from rlhf.plugins import PluginHost

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
        from rlhf.config.training_backend import training_backend
        from rlhf.models.loading import seed_process

        os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))
        if not hasattr(self, "plugins"):  # preload ran first unless a caller set up a worker by hand
            self.preload()
        seed_process(self.config.train.seed, self.config.train.full_determinism_enable)
        #: the run's :class:`rlhf.components.TrainingBackend` in this process (--train.backend)
        self.backend = training_backend(self.config, self.plugins.registry)
        self.backend.init_distributed()
        self.plugins.worker_init(self.role, self.rank, self.config)


def _multi_node() -> bool:
    import ray

    return len([n for n in ray.nodes() if n.get("Alive")]) > 1


class WorkerGroup:
    """``num_workers`` Ray actors of ``worker_class`` forming one distributed group."""

    def __init__(self, worker_class: type, role: str, num_workers: int, config: dict[str, Any], *,
                 placement: Any, cpu_sharers: int | None = None, tensor_parallel: int = 1) -> None:
        """``placement``: the run's :class:`rlhf.runtime.placement.Placement` (bundle of each rank);
        ``tensor_parallel``: ranks per AutoTP group; :meth:`call_split_async` gives them the same share."""
        import ray

        remote = ray.remote(worker_class)
        self.role, self.tensor_parallel = role, tensor_parallel
        self.workers = [track(remote.options(**placement.options(role, rank)).remote(rank, num_workers, config, cpu_sharers),
                              role, rank) for rank in range(num_workers)]
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
