"""What a trainer's optional ``plan_groups(config, registry)`` returns for ``rlhf plan``: its model groups and engines."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelGroup:
    """One model group of a run, as a trainer's ``plan_groups`` names it."""

    role: str  #: "actor", "critic", "ref", "reward", "model"
    path: str  #: the model directory or hub name (only its config.json is read)
    flag: str  #: the flag that gave ``path``
    ranks: int  #: 0 with ``RunGroups.per_device``: one per GPU of the cluster
    trained: bool
    value_head: bool = False  #: a one-output head instead of the LM head (critic, reward model)
    section: Any = None  #: the group's config section (optimizer, offload)
    checkpointing: bool = False  #: gradient checkpointing in its training forward
    #: the flags (or launcher variable) that set ``ranks``, for a refusal to name: "--ref.num_nodes x --ref.num_gpus_per_node"
    ranks_from: str = ""


@dataclass
class RunGroups:
    """What a trainer's ``plan_groups(config, registry)`` returns: its model groups and rollout engines."""

    models: list[ModelGroup]
    engine: type | None = None  #: the rollout engine class, None when the run generates nothing
    engines_in_rank: bool = False
    engine_count: int = 0  #: engine processes (0 in rank)
    tensor_parallel: int = 1
    #: one process per GPU holds every group (a supervised run under torchrun or the DeepSpeed launcher): as many
    #: ranks as the cluster has GPUs, not placement groups of Ray
    per_device: bool = False
