"""A private plugin module, loaded with --plugins private_plugins.corp_rewards (no packaging)."""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs


@rlhf.hookimpl
def rlhf_register_reward_functions(register):
    register("corp_policy", exact_match)


def exact_match(queries, prompts, labels, **kwargs):
    return [float(q.endswith(str(label))) for q, label in zip(queries, labels)]
