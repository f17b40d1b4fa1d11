"""``rlhf train ppo``: the RL trainer (OpenRLHF's ``train_ppo_ray``).

This module holds the trainer's contract with the CLI: its config tree, the
cross-flag rules, and the run directory it writes; the Ray/DeepSpeed/vLLM step
loop lives in :mod:`rlhf.runtime.control.controller`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from rlhf.config.ppo import PPOConfig
from rlhf.config.ppo_rules import finalize_ppo_config
from rlhf.runtime.control.controller import PPOController


class PPOTrainer:
    config_class: ClassVar[type[PPOConfig]] = PPOConfig

    def __init__(self, config: PPOConfig, plugins: Any, run_dir: Path) -> None:
        self.config = config
        self.plugins = plugins
        self.run_dir = run_dir

    @classmethod
    def prepare_config(cls, config: PPOConfig, plugins: Any) -> PPOConfig:
        return finalize_ppo_config(config, plugins)

    def run(self) -> None:
        PPOController(self.config, self.plugins, self.run_dir).run()
