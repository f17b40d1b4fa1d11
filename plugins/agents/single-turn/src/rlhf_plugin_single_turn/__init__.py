"""The default agent executor: each request is one generation from its prompt token ids.

The response token ids and log-probs are taken from the engine as they are: the
trajectory is never decoded and re-tokenised.
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


class SingleTurnExecutor:
    """``run`` executes in the controller once per rollout batch."""

    one_generation_per_request = True  # a response is at most --rollout.max_new_tokens long (rlhf plan reads it)

    def run(self, requests, engines, sampling):
        return engines.generate(requests, sampling["temperature"], sampling["top_p"])


@rlhf.hookimpl
def rlhf_register_agent_executors(register):
    register("single_turn", SingleTurnExecutor, description="one generation per prompt")
