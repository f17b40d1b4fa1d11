"""Calls to Ray workers that name the worker that died: a dead actor (or a collective whose peer died) becomes
one WorkerError naming its group, rank and host, instead of Ray's or gloo's own error. Also the CPU share every
rank takes. Runs in the controller (and, for ``use_cpu_share``, in every rank)."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from typing import Any

from rlhf.errors import WorkerError, find_user_error
from rlhf.records.checkpoints import write_text_atomically
from rlhf.runtime.cluster.local import LocalHandle, Ready

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


def write_whereabouts(path: Any, groups: list[Any], engines: list[Any]) -> list[dict[str, Any]]:
    """``path`` (JSON): every rank's and engine's group, rank and :func:`whereabouts`, as each said when
    it started: which node each runs on, and its log file. ``groups``: the run's :class:`WorkerGroup` s
    (None for one the run lacks); ``engines``: the rollout engines' actor handles. Returns the rows."""
    import json
    from pathlib import Path

    handles = [w for group in groups if group is not None for w in group.workers] + list(engines)
    actors = [h for h in handles if not isinstance(h, LocalHandle)]
    places = dict(zip(map(id, actors), wait([_WHEREABOUTS[h._actor_id.hex()] for h in actors])))
    rows = [h.whereabouts() if isinstance(h, LocalHandle) else
            {"group": _MEMBERS[h._actor_id.hex()][0], "rank": _MEMBERS[h._actor_id.hex()][1], **places[id(h)]}
            for h in handles]
    write_text_atomically(Path(path), json.dumps(rows, indent=1, default=str) + "\n", "workers.json")
    return rows


#: how long a failed call waits for its other workers' results, to find a dead one among them
DEATH_GRACE_S = float(os.environ.get("RLHF_DEATH_GRACE_S", "30"))


def wait(refs: Any) -> Any:
    """``ray.get`` with the run's timeout; a dead or silent worker is a :class:`WorkerError` naming
    its group and rank. An exception raised inside a worker method passes through unchanged (the
    CLI finds a user error in its cause), unless another worker of the same call died: see
    :func:`_dead_peer`. Calls to ranks in this process (:class:`rlhf.runtime.cluster.local.Ready`) are open already."""
    if isinstance(refs, Ready):
        return refs.result()
    if isinstance(refs, list) and all(isinstance(r, Ready) for r in refs):
        return [r.result() for r in refs]
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
    that a dead worker among ``handles`` caused is raised as :func:`wait` would, naming that worker.
    A rank in this process (:class:`LocalHandle`) fails in its own call, not through Ray: a gloo
    "Connection closed by peer" when an engine it broadcasts to died. So any exception is checked."""
    try:
        yield
    except Exception as exc:
        actors = [handle for handle in handles if not isinstance(handle, LocalHandle)]  # ranks in this process live on
        death = _worker_death(exc, [handle.__ray_call__.remote(_answer) for handle in actors]) if actors else None
        if death is None:
            raise
        raise death from exc


def _answer(_: Any) -> None:
    """What a worker runs to show it is alive (see :func:`naming_dead_workers`)."""


#: the end of a dead worker's line; the RL controller replaces it with the checkpoint to resume from
RESUME_ADVICE = "resume from the last checkpoint with --ckpt.load_enable"


def _worker_death(exc: Exception, refs: list[Any]) -> Exception | None:
    """The :class:`WorkerError` naming the dead worker that made a call fail with ``exc``, or None where
    none did (``exc`` then stands: a worker's own exception, a user error). ``refs``: the call's other
    results, awaited for a death among them (see :func:`_dead_peer`)."""
    import ray

    if isinstance(exc, ray.exceptions.ActorDiedError) or _node_lost(exc):
        return _death(exc)
    if find_user_error(exc) is not None:
        return None
    dead = _dead_peer(refs)
    return None if dead is None else _death(dead)


def _node_lost(exc: Any, wait_s: float | None = None) -> bool:
    """Whether ``exc`` is an actor that cannot be reached because its node died (its raylet is gone: a machine lost
    without warning). Ray says "unavailable" (:class:`ray.exceptions.ActorUnavailableError`) until its GCS has marked
    the node dead, so the node's state is awaited, up to ``wait_s`` (default :data:`DEATH_GRACE_S`)."""
    import time

    import ray

    if not isinstance(exc, ray.exceptions.ActorUnavailableError):
        return False
    place = _known_whereabouts(str(getattr(exc, "actor_id", "")))
    if place is None:
        return False
    deadline = time.monotonic() + (DEATH_GRACE_S if wait_s is None else wait_s)
    while True:
        if not _node_alive(place["node_id"]):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)


def _node_alive(node_id: str) -> bool:
    import ray

    return any(node["NodeID"] == node_id and node["Alive"] for node in ray.nodes())


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
            except ray.exceptions.ActorUnavailableError as exc:  # its node may be gone
                if _node_lost(exc, max(deadline - time.monotonic(), 0)):
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
    if place is not None and not _node_alive(place["node_id"]):
        return WorkerError(f"{who}{where} is lost with its node: the node's raylet is gone (the machine was lost, shut "
                           f"down or preempted, or its Ray stopped); {RESUME_ADVICE}")
    log = f"read its log {place['log']}" if place else "its log is above"
    return WorkerError(f"{who}{f' (pid {pid.group(1)})' if pid else ''}{where} died: its process exited (killed, out of "
                       f"memory, or crashed; {log}); {RESUME_ADVICE}")


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
