"""Remote rewards: ``--reward.remote_url http://host:5000/get_reward[,http://other…]``.

Each batch is split evenly over the URLs (round-robin start, rotating per call) and sent as
``POST {"query": [...], "prompts": [...], "labels": [...]}``; the answer is
``{"rewards": [...], "scores": [...]?, "extra_logs": {...}?}``. A request is retried with
exponential backoff (``--remote.retries``, ``--remote.backoff_s``) within a timeout of
``--remote.timeout_s`` per try. An HTTP 4xx other than 408/429 is not retried (the same
request gets the same answer). The last failure raises a :class:`rlhf.errors.RewardSourceError`
naming the URL and the reason in words (cannot connect, no answer within the timeout, the
status and the server's ``error`` text, a body that is not JSON, no ``rewards``, rewards of
the wrong length or not numbers), and the term's failure policy (``--reward.on_error``)
decides what happens to the samples. A URL that is not http(s) with a host is a
:class:`rlhf.errors.ConfigError` at start.
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_reward_functions(register):
    register("remote_http", "rlhf_plugin_remote.client:RemoteReward", description="OpenRLHF HTTP reward protocol")


@rlhf.hookimpl
def rlhf_register_options(register):
    register("rlhf_plugin_remote.client:RemoteOptions", namespace="remote")
