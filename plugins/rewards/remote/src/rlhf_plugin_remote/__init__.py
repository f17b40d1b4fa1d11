"""Remote rewards: ``--reward.remote_url http://host:5000/get_reward[,http://other…]``.

Each batch is split evenly over the URLs (round-robin start, rotating per call) and sent as
``POST {"query": [...], "prompts": [...], "labels": [...]}``; the answer is
``{"rewards": [...], "scores": [...]?, "extra_logs": {...}?}``. A request is retried with
exponential backoff (``--remote.retries``, ``--remote.backoff_s``) within a timeout of
``--remote.timeout_s`` per try; the last failure raises, and the term's failure policy
(``--reward.on_error``) decides what happens to the samples.
"""

import rlhf

rlhf_plugin_api = rlhf.PLUGIN_API_VERSION


@rlhf.hookimpl
def rlhf_register_reward_functions(register):
    register("remote_http", "rlhf_plugin_remote.client:RemoteReward", description="OpenRLHF HTTP reward protocol")


@rlhf.hookimpl
def rlhf_register_options(register):
    register("rlhf_plugin_remote.client:RemoteOptions", namespace="remote")
