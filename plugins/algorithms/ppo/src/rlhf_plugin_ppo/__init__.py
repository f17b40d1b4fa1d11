"""PPO (Schulman et al., 2017) for rlhf.

Registers the ``gae`` advantage estimator (``--algo.advantage.estimator gae``, the
default) and the ``ppo`` clipped policy loss (``--actor.policy_loss_type ppo``).
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_advantage_estimators(register):
    register("gae", "rlhf_plugin_ppo.gae:GAE", description="generalised advantage estimation with a critic")


@rlhf.hookimpl
def rlhf_register_policy_losses(register):
    register("ppo", "rlhf_plugin_ppo.loss:PPOClipLoss", description="PPO-clip with clip-higher and dual-clip")
