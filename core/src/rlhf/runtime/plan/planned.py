"""What ``rlhf plan`` reads of a run's config: the sections every trainer's config tree has.

``rlhf train ppo``'s :class:`rlhf.config.ppo.PPOConfig` and a supervised trainer's config both have them; a third-party
trainer's config that has them is planned the same way. The sections only some trainers have (``rollout``, ``vllm``,
a role's own such as ``actor``, ``plugins``) are read where present, so they are not part of the protocol.
"""

from __future__ import annotations

from typing import Any, Protocol

from rlhf.config.sections import DeepSpeedSection


class PlannedTrain(Protocol):
    """``--train.*``: the backend that holds the models, and the sequences of a training micro-batch. A PPO run's
    section also carries the colocation flags the placement reads (:class:`rlhf.config.ppo.TrainSection`)."""

    backend: str
    micro_batch_size: int


class PlannedData(Protocol):
    """``--data.*``: the longest prompt and response, in tokens."""

    max_len: int


class PlannedConfig(Protocol):
    """A validated run config (a pydantic model) as the planner reads it; a change the search tries is a copy made
    through ``model_dump`` and ``model_validate`` (:func:`rlhf.runtime.plan.remedies.changed_config`)."""

    train: PlannedTrain
    data: PlannedData
    ds: DeepSpeedSection  #: the model section every backend reads (dtype, LoRA, attention, ring attention)

    def model_dump(self) -> dict[str, Any]: ...
