"""The core's own plugin: registers the trainers whose runtime lives in the core, and its in-turn rollout scheduler.

The RL loop (``rlhf train ppo``, OpenRLHF's ``train_ppo_ray``) is core runtime; the
algorithms it runs (estimators, losses, filters, optimizers) all come from plugins.
"""

from __future__ import annotations

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_trainers(register):
    register(
        "ppo",
        "rlhf.runtime.control.trainer:PPOTrainer",
        description="RL from a prompt dataset: PPO, REINFORCE++, GRPO, RLOO… (OpenRLHF train_ppo_ray)",
    )


@rlhf.hookimpl
def rlhf_register_rollout_schedulers(register):
    register("sync", "rlhf.runtime.control.in_turn:InTurn",
             description="each step generates its batch, then trains on it (exact resume)")
    register("replay", "rlhf.runtime.control.replay:Replay",
             description="each step trains on the rollouts a run dumped (--rollout.replay_dir): no engine")
