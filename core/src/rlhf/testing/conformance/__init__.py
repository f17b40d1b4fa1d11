"""Conformance kits: one per component kind, checking a plugin's component against its contract
on random inputs (docs/plugins/ describes each contract and its kit).

Two ways to use a kit:

* subclass its pytest class in your tests, which turns every property into a test::

      from rlhf.testing.conformance import AdvantageEstimatorKit

      class TestMyEstimator(AdvantageEstimatorKit):
          component = MyEstimator          # built like the runtime does (from_config)
          plugin_module = "my_pkg"         # the module with the @rlhf.hookimpl functions
          registered_name = "my_estimator"

* or call its ``check_*`` function on a built component (``check_advantage_estimator(obj)``).

A broken property raises :class:`ConformanceFailure`, whose one-line message names the kind,
the property, the smallest input that shows it, and what went wrong.
"""

from rlhf.testing.conformance._core import ComponentKit, ConformanceFailure, check_import_is_light, check_picklable, ppo_config
from rlhf.testing.conformance.backends import (
    RolloutEngineKit,
    WeightSyncTransportKit,
    WholeTrainedModel,
    check_rollout_engine,
    check_weight_sync_transport,
)
from rlhf.testing.conformance.estimators import AdvantageEstimatorKit, check_advantage_estimator
from rlhf.testing.conformance.losses import KLEstimatorKit, PolicyLossKit, check_kl_estimator, check_policy_loss
from rlhf.testing.conformance.parts import (
    AgentExecutorKit,
    ModelLoaderKit,
    OptimizerKit,
    ProcessorKit,
    SampleFilterKit,
    SchedulerKit,
    ScriptedEngines,
    check_agent_executor,
    check_model_loader,
    check_optimizer,
    check_processor,
    check_sample_filter,
    check_scheduler,
)
from rlhf.testing.conformance.planning import (
    check_backend_plan,
    check_backend_remedies,
    check_engine_plan,
    check_engine_remedies,
    check_optimizer_plan,
)
from rlhf.testing.conformance.programs import (
    CommandKit,
    LifecycleObserverKit,
    TrainerKit,
    check_command,
    check_lifecycle_observer,
    check_trainer,
    kit_rollout_samples,
)
from rlhf.testing.conformance.prompts import PromptSourceKit, check_prompt_source
from rlhf.testing.conformance.rewards import RewardFunctionKit, RewardShaperKit, check_reward_function, check_reward_shaper
from rlhf.testing.conformance.steps import (
    KIT_REWARD_FUNCTIONS,
    KitRolloutLoop,
    RewardManagerKit,
    RolloutCorrectionKit,
    RolloutSchedulerKit,
    check_reward_manager,
    check_rollout_correction,
    check_rollout_scheduler,
    kit_reward_sources,
)
from rlhf.testing.conformance.training import TrainingBackendKit, check_training_backend

__all__ = [
    "ppo_config",
    "PromptSourceKit",
    "check_prompt_source",
    "KIT_REWARD_FUNCTIONS",
    "KitRolloutLoop",
    "RewardManagerKit",
    "RolloutCorrectionKit",
    "RolloutSchedulerKit",
    "check_reward_manager",
    "check_rollout_correction",
    "check_rollout_scheduler",
    "kit_reward_sources",
    "check_backend_plan",
    "check_backend_remedies",
    "check_engine_plan",
    "check_engine_remedies",
    "check_optimizer_plan",
    "RolloutEngineKit",
    "WeightSyncTransportKit",
    "WholeTrainedModel",
    "check_rollout_engine",
    "check_weight_sync_transport",
    "TrainingBackendKit",
    "check_training_backend",
    "AdvantageEstimatorKit",
    "AgentExecutorKit",
    "CommandKit",
    "ComponentKit",
    "ConformanceFailure",
    "KLEstimatorKit",
    "LifecycleObserverKit",
    "ModelLoaderKit",
    "OptimizerKit",
    "PolicyLossKit",
    "ProcessorKit",
    "RewardFunctionKit",
    "RewardShaperKit",
    "SampleFilterKit",
    "SchedulerKit",
    "ScriptedEngines",
    "TrainerKit",
    "check_advantage_estimator",
    "check_agent_executor",
    "check_command",
    "check_import_is_light",
    "check_kl_estimator",
    "check_lifecycle_observer",
    "check_model_loader",
    "check_optimizer",
    "check_picklable",
    "check_policy_loss",
    "check_processor",
    "check_reward_function",
    "check_reward_shaper",
    "check_sample_filter",
    "check_scheduler",
    "check_trainer",
    "kit_rollout_samples",
]
