"""What a component offers ``rlhf plan``'s search for a run that does not fit: changes to its own flags.

A training backend's and a rollout engine's optional classmethod ``plan_remedies(config, run: RemedyContext) ->
list[Remedy]`` names the changes it knows, each with the flags to set, what it costs the run and which parts of
the plan it frees. The core never names a component's flag: it applies each offered change to a copy of the
config, plans the changed run, and ranks what fits by :data:`REMEDY_COSTS` (docs/plan.md, "the search").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: Kinds of change, by what they cost the run, cheapest first: the search tries single changes in this order and
#: pairs of changes by the sum of their costs. A remedy's ``kind`` is one of these keys.
REMEDY_COSTS: dict[str, int] = {
    "generate in pieces": 0,  # the same samples from more, smaller generate calls and experience forwards
    "share GPUs": 1,  # groups whose phases run one after another anyway take turns on the same GPUs
    "engine": 2,  # generation moved: into the actor's ranks, or to engines that hold a copy of the weights
    "recompute": 3,  # gradient checkpointing: about a third more compute in every fit
    "micro-batch": 4,  # the same gradients from more, smaller micro-batches: less efficient kernels
    "shard": 5,  # states split over more ranks: more communication in every step (ZeRO's stages)
    "offload": 6,  # states or the optimizer step on the CPU: host memory and PCIe traffic in every step
    "sleep": 7,  # states moved off the GPU and back around every generate phase
}


@dataclass(frozen=True)
class Remedy:
    """One change a run could make to fit: flags to set, as a user would type them."""

    #: dotted flag names as on the command line, without ``--`` (``"ds.zero_stage"``; a plugin's own options by
    #: namespace, ``"fsdp2.cpu_offload"``), and the values to set (True: a switch)
    flags: Mapping[str, Any]
    kind: str  #: a key of :data:`REMEDY_COSTS`
    reason: str  #: one line: what the change costs the run ("the optimizer step on the CPU")
    #: the parts (:class:`rlhf.planning.MemoryPart` names) it shrinks or moves off the GPU in some phase, in the
    #: offering component's own ``plan_memory``; empty where it moves the placement instead (another engine)
    frees: tuple[str, ...] = ()
    #: further kinds it changes too (a hybrid engine also shares GPUs and sleeps): never paired with a change of those
    touches: frozenset[str] = field(default_factory=frozenset)

    @property
    def axes(self) -> frozenset[str]:
        """Everything it changes: two remedies that share an axis are never tried as a pair."""
        return self.touches | {self.kind}

    def typed(self) -> str:
        """``--ds.zero_stage 3 --ds.adam_offload``, as a user types it."""
        def flag(key: str, value: Any) -> str:
            shown = " ".join(map(str, value)) if isinstance(value, list) else str(value)
            return f"--{key}" if value is True else f"--{key} {shown}"

        return " ".join(flag(key, value) for key, value in self.flags.items())


@dataclass(frozen=True)
class RemedyContext:
    """What a component's ``plan_remedies`` may need of the run beyond its config."""

    ranks: Mapping[str, int]  #: each model group's role and its ranks ("actor": 8)
    gpus: int  #: GPUs of the cluster planned on
    model_gpus: int  #: GPUs the model groups take (colocated groups counted once): ``gpus`` less these are free
    #: the run's rollout engine class; None where it generates nothing (then no engine is asked)
    engine: type | None
    #: the training backend's ``sleep`` remedies' flags (states off the GPU while engines generate), for an engine to
    #: pair with its own sleep: a backend's sleep is never tried alone, as it frees nothing unless engines use the room
    backend_sleep: tuple[Mapping[str, Any], ...] = ()
