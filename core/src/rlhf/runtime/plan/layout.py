"""Where every rank and engine of a run lands: the run's placement groups (the same :class:`Request` s the GPU-count
check and :class:`rlhf.runtime.cluster.placement.Placement` build) laid on the nodes bundle by bundle, first fit
in request order, as Ray's PACK strategy fills a node before the next."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from rlhf.config.checks import engines_colocated_with
from rlhf.planning.groups import ModelGroup, RunGroups
from rlhf.runtime.cluster.capacity import Request, shortfall
from rlhf.runtime.cluster.placement import colocated_sets, run_requests
from rlhf.runtime.plan.planned import PlannedConfig


@dataclass
class Seat:
    """One rank of a model group, or one tensor-parallel shard of an engine, on one GPU."""

    label: str  #: "actor rank 0", "engine 1 (TP 0/2)"
    group: str  #: "actor", "reward 1", "engine": the key of :func:`group_keys` the seat's memory is that of
    index: int  #: rank, or engine number


@dataclass
class GPU:
    node: int
    index: int
    seats: list[Seat] = field(default_factory=list)


def lay_out(config: PlannedConfig, groups: RunGroups, nodes: list[float], cluster: str = "the Ray cluster") -> tuple[list[GPU], str | None]:
    """Every GPU of ``nodes`` (GPUs per node, of ``cluster``) with the seats placed on it, and why the run cannot be
    placed (the GPU-count check's line, naming the groups left out of the placement) or None."""
    if groups.per_device:
        every = [GPU(n, i) for n, count in enumerate(nodes) for i in range(int(count))]
        for rank, gpu in enumerate(every):
            gpu.seats = [Seat(f"{key} rank {rank}", key, rank) for key in group_keys(groups)]
        return every, None
    ranks = {m.role: m.ranks for m in groups.models}
    copies = {role: sum(m.role == role for m in groups.models) for role in ranks}
    sets = colocated_sets(config.train, ranks)
    requests = run_requests(config, config.train, ranks, sets, groups.engines_in_rank or not groups.engine, True)
    problem = shortfall(requests, nodes, cluster)
    gpus = [[GPU(n, i) for i in range(int(count))] for n, count in enumerate(nodes)]
    free = [list(node) for node in gpus]
    bundles: dict[str, list[list[GPU]]] = {}
    for roles, request in zip([*sets, ["engine"]], requests):
        placed = [_take(free, int(request.bundle.get("GPU", 0))) for _ in range(request.bundles)]
        for role in roles:
            bundles[role] = placed
    for role in ranks:
        for rank, bundle in enumerate(bundles[role]):
            for copy in range(copies[role]):
                suffix = f" {copy}" if copies[role] > 1 else ""
                for gpu in bundle:
                    gpu.seats.append(Seat(f"{role}{suffix} rank {rank}", f"{role}{suffix}", rank))
    if groups.engine is not None and not groups.engines_in_rank:
        tp = groups.tensor_parallel
        host = engines_colocated_with(config.train, ranks)
        for engine in range(groups.engine_count):
            for shard in range(tp):
                if host:  # hybrid engine: engine i's shards on the host group's bundles i·tp + k, round the ranks
                    bundle = bundles[host][(engine * tp + shard) % len(bundles[host])]
                    where = bundle[:1]
                else:
                    bundle = bundles["engine"][engine]
                    where = bundle[shard:shard + 1]
                for gpu in where:
                    gpu.seats.append(Seat(f"engine {engine}" + (f" (TP {shard}/{tp})" if tp > 1 else ""), "engine", engine))
    elif groups.engine is not None:
        for gpu in (g for node in gpus for g in node):
            gpu.seats += [Seat(f"engine in {s.label}", "engine", s.index) for s in gpu.seats if s.group == "actor"]
    unplaced = [f"{name} ({missing} of {len(placed)} {unit})" for name, placed, unit in
                [*((role, bundles[role], "ranks") for role in ranks), ("engines", bundles.get("engine", []), "bundles")]
                if (missing := sum(not bundle for bundle in placed))]
    if problem and unplaced:
        problem += f" (left out of the placement below: {', '.join(unplaced)})"
    return [g for node in gpus for g in node if g.seats], problem


def group_keys(groups: RunGroups) -> dict[str, ModelGroup]:
    """Each model group by the key its seats carry: the role, numbered where a role has several groups."""
    keys = {}
    for model in groups.models:
        same = [m for m in groups.models if m.role == model.role]
        keys[model.role + (f" {same.index(model)}" if len(same) > 1 else "")] = model
    return keys


def _take(free: list[list[GPU]], count: int) -> list[GPU]:
    """``count`` free GPUs of one node, the first node that has them; none where no node has (a shortfall)."""
    for node in free:
        if len(node) >= count:
            taken, node[:] = node[:count], node[count:]
            return taken
    return []


def paper_nodes(gpus: int, per_node: int) -> list[float]:
    """A cluster of ``gpus`` GPUs in nodes of ``per_node`` (the last one holds the rest)."""
    full, rest = divmod(gpus, per_node)
    return [float(per_node)] * full + ([float(rest)] if rest else [])


def requested_gpus(config: PlannedConfig, groups: RunGroups) -> int:
    """The GPUs the run's placement groups ask for (the size of a cluster that holds it exactly); for a run of one
    process per GPU, its launcher's ``WORLD_SIZE`` (1 outside one)."""
    if groups.per_device:
        return int(os.environ.get("WORLD_SIZE", "1"))
    ranks = {m.role: m.ranks for m in groups.models}
    sets = colocated_sets(config.train, ranks)
    requests: list[Request] = run_requests(config, config.train, ranks, sets,
                                           groups.engines_in_rank or not groups.engine, True)
    return int(sum(r.gpus for r in requests))
