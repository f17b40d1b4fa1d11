"""The ``weighted`` reward manager: the run's reward sources as weighted terms with failure policies.

Selected by default (``--reward.manager weighted``); reads ``--reward.functions``,
``--reward.on_error`` and ``--reward.score_term``. This module runs at plugin load and imports
nothing heavy.
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_reward_managers(register):
    register("weighted", "rlhf_plugin_weighted_rewards.manager:WeightedRewards",
             description="sum of weighted reward terms (functions, remote, reward models, agent), each with a failure policy")
