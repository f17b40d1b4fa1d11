"""Protocols of the components plugins register.

Shapes use these names: ``B`` sequences in a (micro-)batch, ``T`` action (response)
tokens per sequence (right-padded, with ``action_mask`` of shape ``(B, T)`` marking
real tokens), ``P`` prompts and ``n`` samples per prompt (``B = P * n`` with the n
samples of one prompt adjacent). Tensors are ``torch.Tensor``; modules defining
components import torch inside methods or under ``TYPE_CHECKING`` only.

The runtime builds a selected component class with :func:`build`: through its
``from_config(config)`` classmethod when it defines one, else with no arguments;
a registered function or instance is used as it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlhf.components.algorithms import AdvantageEstimator, KLEstimator, PolicyLoss, RolloutCorrection, SampleFilter
from rlhf.components.models import ModelLoader, OptimizerFactory, Processor, SchedulerFactory
from rlhf.components.programs import Command, Trainer
from rlhf.components.prompts import PromptOutcome, PromptSource
from rlhf.components.rewards import (
    RewardBatch,
    RewardFunction,
    RewardManager,
    RewardResult,
    RewardShaper,
    RewardSource,
    RewardSources,
)
from rlhf.components.rollout import AgentExecutor, RolloutLoop, RolloutScheduler, StepRollout
from rlhf.components.systems import RolloutEngine, TrainedModel, TrainingBackend, WeightSource, WeightSyncTransport

__all__ = ["build", "AdvantageEstimator", "KLEstimator", "PolicyLoss", "SampleFilter", "RolloutCorrection", "ModelLoader", "OptimizerFactory",
           "Processor", "PromptSource", "PromptOutcome", "SchedulerFactory", "Command", "Trainer", "RewardFunction", "RewardShaper",
           "RewardManager", "RewardBatch", "RewardResult", "RewardSource", "RewardSources", "AgentExecutor",
           "RolloutLoop", "RolloutScheduler", "StepRollout",
           "RolloutEngine", "TrainedModel", "TrainingBackend", "WeightSource", "WeightSyncTransport"]

if TYPE_CHECKING:
    from rlhf.config.run import RunConfig


def build(component: Any, config: RunConfig) -> Any:
    """Instantiate a registered component class for a run; a registered function or instance is used as is."""
    if not isinstance(component, type):
        return component
    from_config = getattr(component, "from_config", None)
    return from_config(config) if from_config is not None else component()


