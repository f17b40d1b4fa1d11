"""The config a run hands to its components and hooks: `rlhf train ppo`'s or another trainer's."""

from __future__ import annotations

from pydantic import BaseModel

from rlhf.config.ppo import PPOConfig

#: What ``from_config`` and the lifecycle hooks receive: ``PPOConfig`` under ``rlhf train ppo``, else the
#: ``config_class`` of the trainer plugin that runs (a pydantic model); a supervised trainer's subclasses
#: ``rlhf_supervised.config.SupervisedConfig`` (distribution rlhf-supervised).
RunConfig = PPOConfig | BaseModel
