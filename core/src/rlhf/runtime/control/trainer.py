"""``rlhf train ppo``: the RL trainer (OpenRLHF's ``train_ppo_ray``).

This module holds the trainer's contract with the CLI: its config tree, the
cross-flag rules, and the run directory it writes; the Ray/DeepSpeed/vLLM step
loop lives in :mod:`rlhf.runtime.control.controller`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar

from rlhf.config.ppo import PPOConfig
from rlhf.config.ppo_rules import finalize_ppo_config
from rlhf.config.rollout_engine import rollout_engine_class, uses_engine
from rlhf.config.training_backend import backend_class, check_backend_config
from rlhf.errors import ConfigError
from rlhf.planning.groups import ModelGroup, RunGroups
from rlhf.registry import ComponentKind
from rlhf.runtime.cluster.placement import ranks_of
from rlhf.runtime.control.controller import PPOController
from rlhf.runtime.control.rewarding import reward_model_paths


class PPOTrainer:
    config_class: ClassVar[type[PPOConfig]] = PPOConfig

    def __init__(self, config: PPOConfig, plugins: Any, run_dir: Path) -> None:
        self.config = config
        self.plugins = plugins
        self.run_dir = run_dir

    @classmethod
    def prepare_config(cls, config: PPOConfig, plugins: Any) -> PPOConfig:
        config = finalize_ppo_config(config, plugins)
        groups = None  # planned only for a backend that asks (they need the actor's path and the engine)
        if config.actor.model_name_or_path and hasattr(backend_class(config, plugins.registry), "check_groups"):
            groups = cls.plan_groups(config, plugins.registry).models
        check_backend_config(config, plugins.registry, groups)
        return config

    @classmethod
    def plan_groups(cls, config: PPOConfig, plugins_registry: Any) -> Any:
        """The run's model groups and engines for ``rlhf plan`` (:mod:`rlhf.planning`): the groups the controller
        creates, by the same rules (a reference with a KL coefficient, a critic for an estimator that needs one, a
        reward model per path)."""
        actor_path = config.actor.model_name_or_path
        if not actor_path:
            raise ConfigError("--actor.model_name_or_path is required")
        estimator = plugins_registry.get(ComponentKind.ADVANTAGE_ESTIMATOR, config.algo.advantage.estimator)
        models = [ModelGroup("actor", actor_path, "--actor.model_name_or_path", ranks_of(config.actor), True,
                             section=config.actor, checkpointing=config.actor.gradient_checkpointing_enable)]
        if config.algo.kl.init_coef > 0:
            models.append(ModelGroup("ref", actor_path, "--actor.model_name_or_path", ranks_of(config.ref), False,
                                     section=config.ref))
        if estimator.needs_critic:  # its worker trains without gradient checkpointing: planned as the run does
            models.append(ModelGroup("critic", config.critic.model_name_or_path or actor_path,
                                     "--critic.model_name_or_path", ranks_of(config.critic), True, True, config.critic))
        models += [ModelGroup("reward", path, "--reward.model_name_or_path", ranks_of(config.reward), False, True,
                              config.reward) for path in reward_model_paths(config)]
        models = [dataclasses.replace(group, ranks_from=f"--{group.role}.num_nodes x --{group.role}.num_gpus_per_node")
                  for group in models]
        if not uses_engine(config, plugins_registry):  # replayed rollouts: nothing generates
            return RunGroups(models)
        engine = rollout_engine_class(config, plugins_registry)
        return RunGroups(models, engine, engine.in_training_rank, max(1, config.vllm.num_engines or 0),
                         config.vllm.tensor_parallel_size)

    def run(self) -> None:
        PPOController(self.config, self.plugins, self.run_dir).run()
