"""``rlhf train ppo``: the RL trainer (OpenRLHF's ``train_ppo_ray``).

This module holds the trainer's contract with the CLI: its config tree, the
cross-flag rules, and the run directory it writes. The Ray/DeepSpeed/vLLM step
loop it drives is built in ``rlhf.runtime`` (issue #3).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from rlhf.config.ppo import PPOConfig


class RuntimeUnavailableError(RuntimeError):
    """The requested runtime is not part of this build."""


class PPOTrainer:
    config_class: ClassVar[type[PPOConfig]] = PPOConfig

    def __init__(self, config: PPOConfig, plugins: Any, run_dir: Path) -> None:
        self.config = config
        self.plugins = plugins
        self.run_dir = run_dir

    @classmethod
    def prepare_config(cls, config: PPOConfig, plugins: Any) -> PPOConfig:
        from rlhf.config.ppo_rules import finalize_ppo_config

        return finalize_ppo_config(config, plugins)

    def run(self) -> None:
        raise RuntimeUnavailableError(
            "the Ray/DeepSpeed/vLLM RL runtime is not part of rlhf-core 0.1.0 yet; "
            "use --print-config to check a configuration"
        )
