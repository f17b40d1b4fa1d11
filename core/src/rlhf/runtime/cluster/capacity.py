"""What a run asks of the Ray cluster, set beside what the cluster has, before anything waits for it.

Ray waits for a placement group that does not fit, silently and for as long as the driver lives: on
one GPU a run whose actor took the GPU and whose rollout engine wanted another printed nothing until
it was killed. So the run's placement groups are described as :class:`Request` s and compared with
the GPUs of every alive node, read from Ray's own resources (``ray.nodes()``), never from
``torch.cuda`` in the driver: the controller may sit on a node without GPUs, and a CPU test can
declare ``num_gpus`` for a cluster that has none. Only what can never fit is refused (the sums, and
what one node must hold); a group that could fit but is not placed in time is
:func:`rlhf.runtime.cluster.placement.wait_until_placed` 's to report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Request:
    """One placement group of a run: ``bundles`` bundles of ``bundle`` each, with ``strategy``."""

    what: str  #: who sits on it: "actor", "actor + ref", "rollout engines"
    flags: str  #: the flags that set its size, with their values
    bundles: int
    bundle: dict[str, float]
    strategy: str

    @property
    def gpus(self) -> float:
        """GPUs the whole group holds."""
        return self.bundles * self.bundle.get("GPU", 0.0)

    def describe(self) -> str:
        resources = ", ".join(f"{key}: {value:g}" for key, value in self.bundle.items())
        return f"{self.what}: {self.bundles} bundle(s) of {{{resources}}}, {self.strategy} ({self.flags})"


def node_gpus() -> list[float]:
    """The GPUs of every alive node of the Ray cluster this process is connected to, by Ray's resources."""
    import ray

    return [float(node.get("Resources", {}).get("GPU", 0.0)) for node in ray.nodes() if node.get("Alive")]


def describe_nodes(nodes: Sequence[float]) -> str:
    """``"1 node with 1 GPU"``, ``"3 nodes with 8 + 8 + 4 GPUs"``."""
    counts = " + ".join(f"{n:g}" for n in sorted(nodes, reverse=True)) or "0"
    return f"{len(nodes)} node{'s' if len(nodes) != 1 else ''} with {counts} GPU{'s' if sum(nodes) != 1 else ''}"


def shortfall(requests: Sequence[Request], nodes: Sequence[float], cluster: str = "the Ray cluster") -> str | None:
    """Why a cluster with ``nodes`` (GPUs per node) can never hold every one of ``requests`` at once, or None.

    Necessary conditions only, so that no run Ray could place is refused: each bundle within one node,
    a ``STRICT_PACK`` group within one node, a ``STRICT_SPREAD`` group on as many nodes as it has bundles,
    and the GPUs of all groups within the cluster's. ``cluster`` names it in the line (``rlhf plan`` of a cluster
    that exists only on paper does not call it the Ray cluster)."""
    largest = max(nodes, default=0.0)
    for request in requests:
        per_bundle = request.bundle.get("GPU", 0.0)
        if not per_bundle:
            continue
        if per_bundle > largest:
            return (f"{request.what} ({request.flags}): {per_bundle:g} GPUs on one node per bundle, and the largest "
                    f"node of {cluster} has {largest:g}")
        if request.strategy == "STRICT_PACK" and request.gpus > largest:
            return (f"{request.what} ({request.flags}) with --train.placement_strategy STRICT_PACK: {request.gpus:g} "
                    f"GPUs on one node, and the largest node of {cluster} has {largest:g}")
        fitting_nodes = sum(n >= per_bundle for n in nodes)
        if request.strategy == "STRICT_SPREAD" and request.bundles > fitting_nodes:
            return (f"{request.what} ({request.flags}) with --train.placement_strategy STRICT_SPREAD: {request.bundles} "
                    f"nodes with {per_bundle:g} GPU(s) each, and {cluster} has {fitting_nodes}")
    needed, have = sum(r.gpus for r in requests), sum(nodes)
    if needed > have:
        parts = "; ".join(f"{r.what} {r.gpus:g} = {r.flags}" for r in requests if r.gpus)
        return f"this run needs {needed:g} GPUs and {cluster} has {have:g} ({describe_nodes(nodes)}): {parts}"
    return None


def free_resources(keys: Any) -> str:
    """What the cluster has of each resource in ``keys``, in all and free now (``"GPU 1, 0 free"``)."""
    import ray

    total, free = ray.cluster_resources(), ray.available_resources()
    return "; ".join(f"{key} {total.get(key, 0):g}, {free.get(key, 0):g} free" for key in sorted(set(keys)))
