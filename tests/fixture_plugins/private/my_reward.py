"""A private plugin file, loaded with --plugins ./my_reward.py."""

import rlhf

rlhf_plugin_api = rlhf.PLUGIN_API_VERSION


@rlhf.hookimpl
def rlhf_register_reward_functions(register):
    register("file_reward", contains_answer)


def contains_answer(queries, prompts, labels, **kwargs):
    return [float(str(label) in q) for q, label in zip(queries, labels)]
