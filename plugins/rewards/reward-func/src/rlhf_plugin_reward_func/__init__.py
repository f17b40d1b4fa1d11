"""OpenRLHF reward files: ``--reward.remote_url path/to/reward.py``.

The file defines ``reward_func(queries, prompts, labels, **kwargs)``: ``queries`` are
prompt + response texts, ``prompts`` the prompt texts, ``labels`` the dataset labels.
It returns a list/tensor of rewards or a dict with ``rewards``, ``scores`` and
``extra_logs`` (see :mod:`rlhf.reward_output`).
"""

import rlhf

rlhf_plugin_api = rlhf.PLUGIN_API_VERSION


@rlhf.hookimpl
def rlhf_register_reward_functions(register):
    register("reward_func_file", "rlhf_plugin_reward_func.file_reward:RewardFuncFile",
             description="reward_func(queries, prompts, labels) from a .py file")
