"""Ray placement groups for the model groups and the rollout engines, and the OpenRLHF colocation flags.

Each model group gets one bundle per rank (``{"GPU": 1}`` where the Ray cluster has GPUs; ``{"CPU": 0.01}``
on CPU clusters, where ranks share the cores by threads, so a bundle only fixes placement), with
``--train.placement_strategy`` (PACK, OpenRLHF's, by default; SPREAD spreads a group's ranks
over nodes). Rollout engines in processes of their own get a placement group too, one bundle per
engine (``{"GPU": --vllm.tensor_parallel_size}``), so that every GPU a run takes is waited for in one place.
Colocated groups share one placement group, rank i of each on bundle i, each taking an equal
fraction of the bundle:

* ``--train.colocate_actor_ref``: actor and reference;
* ``--train.colocate_critic_reward``: critic and reward model(s);
* ``--train.colocate_all`` (hybrid engine): every model group and the rollout engines (engine i
  on bundle i mod the actor's ranks);
* ``--train.colocate a+b …``: each set of names shares one placement group; a set with ``engines`` puts
  engine i on bundle i mod the ranks of the set's first model group (``actor+engines``, ``ref+engines``).

Before any group is created the run's requests are checked against the cluster's GPUs
(:mod:`rlhf.runtime.cluster.capacity`): a run that can never fit is a :class:`ConfigError` naming the flags
and the colocation flag that makes it fit, if one does. rlhf never colocates by itself: colocation puts
the engines' and the models' memory on the same GPUs and changes the weight-sync transport ``auto`` picks,
so it stays the user's choice. Groups that could fit but are not placed within ``RLHF_PLACEMENT_TIMEOUT_S``
seconds (60; other jobs hold the GPUs) end the run with one line naming them.

Placement groups are created by the driver without ``lifetime="detached"``, so Ray removes them
when the run's job ends, whichever way it exits.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

from rlhf.config.checks import colocation_sets, engines_colocated_with
from rlhf.errors import ConfigError, WorkerError
from rlhf.runtime.cluster.capacity import Request, describe_nodes, free_resources, node_gpus, shortfall

if TYPE_CHECKING:
    from rlhf.config.ppo import PPOConfig, TrainSection

CPU_BUNDLE = 0.01
#: the colocation flags tried, in order, for a run that does not fit: the first that makes it fit is the fix named
COLOCATIONS = (("colocate_actor_ref",), ("colocate_critic_reward",), ("colocate_actor_ref", "colocate_critic_reward"),
               ("colocate_all",))


class Placement:
    """Which placement group and bundle every rank (and engine) of a run uses."""

    def __init__(self, config: PPOConfig, ranks: dict[str, int], nodes: list[float], copies: dict[str, int] | None = None,
                 engines_in_rank: bool = False) -> None:
        """``ranks``: role -> rank count of every group the run creates; ``nodes``: the GPUs of each node of the Ray
        cluster (:func:`rlhf.runtime.cluster.capacity.node_gpus`); ``copies``: role -> how many groups of that role
        there are (reward models), 1 when absent; ``engines_in_rank``: the rollout engines live in the actor's
        ranks (no process of their own)."""
        copies = copies or {}
        self.model_ranks = sum(count * copies.get(role, 1) for role, count in ranks.items())
        self.engine_processes = 0 if engines_in_rank else max(1, config.vllm.num_engines or 0)
        self.gpu = sum(nodes) > 0
        train = config.train
        sets = colocated_sets(train, ranks)
        self.engine_host = engines_colocated_with(train, ranks)
        requests = run_requests(config, train, ranks, sets, engines_in_rank, self.gpu)
        if self.gpu:
            check_fits(config, ranks, engines_in_rank, nodes, requests)
        from ray.util.placement_group import placement_group

        self._groups: dict[str, tuple[Any, int]] = {}  # role (or "engines") -> (placement group, sharers per bundle)
        created: list[tuple[Any, Request]] = []
        for roles, request in zip([*sets, ["engines"]], requests):
            group = placement_group([dict(request.bundle) for _ in range(request.bundles)], strategy=request.strategy)
            created.append((group, request))
            sharers = sum(copies.get(r, 1) for r in roles) + (self.engine_host in roles and not engines_in_rank)
            for role in roles:
                self._groups[role] = (group, sharers)
            if roles == ["engines"]:  # each engine takes its whole bundle: what the fit check counted
                self._engine_share = {"num_gpus": request.bundle.get("GPU", 0.0), "num_cpus": request.bundle.get("CPU", 0.0)}
        wait_until_placed(created)

    def options(self, role: str, rank: int) -> dict[str, Any]:
        """Ray actor options for ``role``'s rank ``rank``: its bundle and its share of it."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        group, sharers = self._groups[role]
        share = {"num_gpus": fraction(1.0, sharers), "num_cpus": 0} if self.gpu else {"num_gpus": 0, "num_cpus": fraction(CPU_BUNDLE, sharers)}
        return {**share, "scheduling_strategy": PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=rank)}

    def cpu_sharers(self, config: PPOConfig, engine: bool) -> int:
        """How many worker processes compute at the same time as one model rank (``engine=False``) or one
        rollout engine (``engine=True``), for :func:`rlhf.runtime.cluster.liveness.use_cpu_share`. In sync mode the
        engines generate while the ranks wait, and the reverse; with ``--train.async_enable`` they overlap."""
        if config.train.async_enable:
            return self.engine_processes + self.model_ranks
        return self.engine_processes if engine else self.model_ranks

    def engine_options(self, index: int) -> dict[str, Any]:
        """Ray actor options of rollout engine ``index``: where the engines share a group's GPUs (``--train.colocate_all``:
        the actor's; ``--train.colocate``) a share of that group's bundle ``index`` mod its ranks, else the whole of its
        own bundle in the engines' placement group."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if self.engine_host is not None:
            group, _ = self._groups[self.engine_host]
            return self.options(self.engine_host, index % len(group.bundle_specs))
        group, _ = self._groups["engines"]
        return {**self._engine_share, "scheduling_strategy": PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)}

    @classmethod
    def for_run(cls, config: PPOConfig, *, with_ref: bool, with_critic: bool, reward_models: int,
                engines_in_rank: bool = False) -> Placement:
        """The run's placement on the Ray cluster this process is connected to."""
        roles = {"actor": ranks_of(config.actor)}
        if with_ref:
            roles["ref"] = ranks_of(config.ref)
        if with_critic:
            roles["critic"] = ranks_of(config.critic)
        if reward_models:
            roles["reward"] = ranks_of(config.reward)
        return cls(config, roles, node_gpus(), {"reward": reward_models}, engines_in_rank)

    @classmethod
    def for_engines(cls, config: PPOConfig) -> Placement:
        """The rollout engines' placement where the model ranks share the controller's process (a Ray cluster with
        no GPU, :func:`rlhf.runtime.cluster.local.ranks_in_process`): a bundle per engine and nothing to colocate
        them with. The controller's process computes as one more sharer of the cores."""
        own_bundles = config.model_copy(update={"train": config.train.model_copy(update={"colocate_all": False})})
        placement = cls(own_bundles, {}, node_gpus())
        placement.model_ranks = 1
        return placement

    def remove(self) -> None:
        """Give the bundles back now (a run's exit does it anyway; tests sharing a cluster call this)."""
        remove_groups(self._placement_groups())

    def _placement_groups(self) -> list[Any]:
        return list({id(g): g for g, _ in self._groups.values()}.values())


def ranks_of(section: Any) -> int:
    """A model group's ranks: ``--<group>.num_nodes x --<group>.num_gpus_per_node``."""
    return section.num_nodes * section.num_gpus_per_node


def colocated_sets(train: TrainSection, ranks: dict[str, int]) -> list[list[str]]:
    """The roles that share each placement group, by the colocation flags of ``train``; colocated groups need
    the same rank count (a :class:`ConfigError` naming their flags otherwise)."""
    sets: list[list[str]] = []
    if train.colocate_all:
        sets.append(list(ranks))
    else:
        for names in colocation_sets(train.colocate):  # --train.colocate, before the older flags
            present = [name for name in names if name in ranks]
            if len(present) > 1:
                sets.append(present)
        if train.colocate_actor_ref and "ref" in ranks and not any("actor" in x or "ref" in x for x in sets):
            sets.append(["actor", "ref"])
        if (train.colocate_critic_reward and "critic" in ranks and "reward" in ranks
                and not any("critic" in x or "reward" in x for x in sets)):
            sets.append(["critic", "reward"])
    sets += [[role] for role in ranks if not any(role in s for s in sets)]
    for roles in sets:
        if len({ranks[r] for r in roles}) > 1:
            flags = " / ".join(f"--{r}.num_nodes x --{r}.num_gpus_per_node = {ranks[r]}" for r in roles)
            raise ConfigError(f"colocated groups need the same number of ranks: {flags}")
    return sets


def run_requests(config: PPOConfig, train: TrainSection, ranks: dict[str, int], sets: list[list[str]],
                 engines_in_rank: bool, gpu: bool) -> list[Request]:
    """One :class:`Request` per set of ``sets`` (in order), then one for the rollout engines where they have
    processes and bundles of their own (not in the actor's ranks, not ``--train.colocate_all``)."""
    model_bundle = {"GPU": 1.0} if gpu else {"CPU": CPU_BUNDLE}
    requests = []
    for roles in sets:
        section = getattr(config, roles[0])
        flags = f"--{roles[0]}.num_nodes {section.num_nodes} x --{roles[0]}.num_gpus_per_node {section.num_gpus_per_node}"
        requests.append(Request(" + ".join(roles), flags, ranks[roles[0]], model_bundle, train.placement_strategy))
    if not engines_in_rank and engines_colocated_with(train, ranks) is None:
        vllm = config.vllm
        count = max(1, vllm.num_engines or 0)
        flags = (f"--vllm.num_engines {vllm.num_engines or 0}{' (one engine process)' if not vllm.num_engines else ''} "
                 f"x --vllm.tensor_parallel_size {vllm.tensor_parallel_size}")
        engine_bundle = {"GPU": float(vllm.tensor_parallel_size)} if gpu else {"CPU": CPU_BUNDLE}
        requests.append(Request("rollout engines", flags, count, engine_bundle, train.placement_strategy))
    return requests


def check_fits(config: PPOConfig, ranks: dict[str, int], engines_in_rank: bool, nodes: list[float],
               requests: list[Request]) -> None:
    """A :class:`ConfigError` when a cluster with ``nodes`` (GPUs per node) can never hold ``requests``: what the
    run needs and what the cluster has, and the fix: the colocation flag that makes it fit, or fewer ranks."""
    problem = shortfall(requests, nodes)
    if problem is None:
        return
    fix = colocation_that_fits(config, ranks, engines_in_rank, nodes)
    if fix == ("colocate_all",):
        advice = ("add --train.colocate_all, OpenRLHF's hybrid engine: the rollout engines and every model share the "
                  f"actor's GPUs{_colocated_engine_advice(config)}")
    elif fix:
        advice = f"add {' '.join('--train.' + name for name in fix)} so that those groups share GPUs"
    else:
        advice = ("ask for fewer GPUs with the flags named, or run on a Ray cluster that has them (`ray start` on more "
                  "nodes, then RAY_ADDRESS; docs/scale.md)")
    raise ConfigError(f"{problem}; {advice}")


def _colocated_engine_advice(config: PPOConfig) -> str:
    """What else vLLM engines on the actor's GPUs need: their memory shared with training (vLLM's sleep mode,
    OpenRLHF's recipe). The weight sync needs nothing: ``auto`` skips NCCL for colocated engines."""
    vllm = bool(config.vllm.num_engines) and config.rollout.engine in ("auto", "vllm")
    return (" (with vLLM also --vllm.enable_sleep, and --ds.enable_sleep under ZeRO 1-3, or a lower "
            "--vllm.gpu_memory_utilization, so that generation and training share the memory)") if vllm else ""


def colocation_that_fits(config: PPOConfig, ranks: dict[str, int], engines_in_rank: bool,
                         nodes: list[float]) -> tuple[str, ...] | None:
    """The first of :data:`COLOCATIONS` not set already with which the run fits a cluster with ``nodes``, or None."""
    for names in COLOCATIONS:
        if all(getattr(config.train, name) for name in names):
            continue
        train = config.train.model_copy(update=dict.fromkeys(names, True))
        try:
            sets = colocated_sets(train, ranks)
        except ConfigError:  # the groups it would put together differ in ranks
            continue
        if shortfall(run_requests(config, train, ranks, sets, engines_in_rank, gpu=True), nodes) is None:
            return names
    return None


def placement_timeout_s() -> float:
    """How long :func:`wait_until_placed` waits: ``RLHF_PLACEMENT_TIMEOUT_S`` seconds, 60 by default."""
    return float(os.environ.get("RLHF_PLACEMENT_TIMEOUT_S", "60"))


def wait_until_placed(groups: list[tuple[Any, Request]]) -> None:
    """Wait until every placement group of ``groups`` is placed, at most :func:`placement_timeout_s` seconds; then
    give them all back and raise a :class:`WorkerError` naming the groups not placed and what the cluster has."""
    import ray

    timeout = placement_timeout_s()
    waiting = {group.ready(): request for group, request in groups}
    _, pending = ray.wait(list(waiting), num_returns=len(waiting), timeout=timeout)
    if not pending:
        return
    unplaced = [waiting[ref] for ref in pending]
    has = free_resources(key for request in unplaced for key in request.bundle)
    if any(request.gpus for request in unplaced):
        has += f" ({describe_nodes(node_gpus())})"
    remove_groups([group for group, _ in groups])
    raise WorkerError(f"the Ray cluster did not place {'; '.join(r.describe() for r in unplaced)} within {timeout:g} s "
                      f"(RLHF_PLACEMENT_TIMEOUT_S); the cluster has {has}: other jobs "
                      "hold what is missing (`ray status`), free it, or raise RLHF_PLACEMENT_TIMEOUT_S to wait longer")


def remove_groups(groups: list[Any]) -> None:
    from ray.util.placement_group import remove_placement_group

    for group in groups:
        remove_placement_group(group)


def fraction(bundle: float, sharers: int) -> float:
    """An equal share of a bundle, rounded down to Ray's resource precision (1e-4) so the shares fit."""
    return math.floor(bundle / sharers * 1e4) / 1e4
