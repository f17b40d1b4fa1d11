"""Ray placement groups for the model groups, and the OpenRLHF colocation flags.

Each model group gets one bundle per rank (``{"GPU": 1}`` on GPU machines; ``{"CPU": 0.01}`` on
CPU machines, where ranks share the cores by threads, so a bundle only fixes placement), with
``--train.placement_strategy`` (PACK, OpenRLHF's, by default; SPREAD spreads a group's ranks
over nodes).
Colocated groups share one placement group, rank i of each on bundle i, each taking an equal
fraction of the bundle:

* ``--train.colocate_actor_ref``: actor and reference;
* ``--train.colocate_critic_reward``: critic and reward model(s);
* ``--train.colocate_all`` (hybrid engine): every model group and the rollout engines (engine i
  on bundle i mod the actor's ranks).

Placement groups are created by the driver without ``lifetime="detached"``, so Ray removes them
when the run's job ends, whichever way it exits.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rlhf.errors import ConfigError
from rlhf.runtime.cluster.liveness import wait

if TYPE_CHECKING:
    from rlhf.config.ppo import PPOConfig

CPU_BUNDLE = 0.01


class Placement:
    """Which placement group and bundle every rank (and engine) of a run uses."""

    def __init__(self, config: PPOConfig, ranks: dict[str, int], gpu: bool, copies: dict[str, int] | None = None,
                 engines_in_rank: bool = False) -> None:
        """``ranks``: role -> rank count of every group the run creates; ``copies``: role -> how many
        groups of that role there are (reward models), 1 when absent; ``engines_in_rank``: the rollout
        engines live in the actor's ranks (no process of their own)."""
        copies = copies or {}
        self.model_ranks = sum(count * copies.get(role, 1) for role, count in ranks.items())
        self.engine_processes = 0 if engines_in_rank else max(1, config.vllm.num_engines or 0)
        self.gpu = gpu
        train = config.train
        sets: list[list[str]] = []
        if train.colocate_all:
            sets.append(list(ranks))
        else:
            if train.colocate_actor_ref and "ref" in ranks:
                sets.append(["actor", "ref"])
            if train.colocate_critic_reward and "critic" in ranks and "reward" in ranks:
                sets.append(["critic", "reward"])
        sets += [[role] for role in ranks if not any(role in s for s in sets)]
        self._groups: dict[str, tuple[Any, int]] = {}  # role -> (placement group, sharers per bundle)
        self.colocate_all = bool(train.colocate_all)
        from ray.util.placement_group import placement_group

        for roles in sets:
            counts = {ranks[r] for r in roles}
            if len(counts) > 1:
                flags = " / ".join(f"--{r}.num_nodes x --{r}.num_gpus_per_node = {ranks[r]}" for r in roles)
                raise ConfigError(f"colocated groups need the same number of ranks: {flags}")
            bundle = {"GPU": 1.0} if gpu else {"CPU": CPU_BUNDLE}
            group = placement_group([dict(bundle) for _ in range(counts.pop())], strategy=train.placement_strategy)
            sharers = sum(copies.get(r, 1) for r in roles) + (train.colocate_all and "actor" in roles and not engines_in_rank)  # engines too
            for role in roles:
                self._groups[role] = (group, sharers)

        wait([g.ready() for g in self._placement_groups()])  # a cluster short of bundles times out with a message

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

    def engine_options(self, index: int) -> dict[str, Any] | None:
        """With ``--train.colocate_all`` engine ``index``'s place on the actor's bundles; else None."""
        if not self.colocate_all:
            return None
        group, _ = self._groups["actor"]
        return self.options("actor", index % len(group.bundle_specs))

    @classmethod
    def for_run(cls, config: PPOConfig, *, with_ref: bool, with_critic: bool, reward_models: int, gpu: bool,
                engines_in_rank: bool = False) -> Placement:
        def ranks(section: Any) -> int:
            return section.num_nodes * section.num_gpus_per_node

        roles = {"actor": ranks(config.actor)}
        if with_ref:
            roles["ref"] = ranks(config.ref)
        if with_critic:
            roles["critic"] = ranks(config.critic)
        if reward_models:
            roles["reward"] = ranks(config.reward)
        return cls(config, roles, gpu, {"reward": reward_models}, engines_in_rank)

    def remove(self) -> None:
        """Give the bundles back now (a run's exit does it anyway; tests sharing a cluster call this)."""
        from ray.util.placement_group import remove_placement_group

        for group in self._placement_groups():
            remove_placement_group(group)

    def _placement_groups(self) -> list[Any]:
        return list({id(g): g for g, _ in self._groups.values()}.values())


def fraction(bundle: float, sharers: int) -> float:
    """An equal share of a bundle, rounded down to Ray's resource precision (1e-4) so the shares fit."""
    return math.floor(bundle / sharers * 1e4) / 1e4
