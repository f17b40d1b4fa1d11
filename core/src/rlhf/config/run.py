"""The config a run hands to its components and hooks: `rlhf train ppo`'s or a supervised trainer's."""

from __future__ import annotations

from rlhf.config.ppo import PPOConfig
from rlhf.config.supervised import SupervisedConfig

#: What ``from_config`` and the lifecycle hooks receive; a supervised trainer's config subclasses SupervisedConfig.
RunConfig = PPOConfig | SupervisedConfig
