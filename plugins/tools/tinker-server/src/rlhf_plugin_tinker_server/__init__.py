"""``rlhf serve tinker``: a Tinker-compatible training service that the official ``tinker`` SDK drives unchanged.

Many LoRA tenants train on one loaded base model (``forward``, ``forward_backward``, ``optim_step``) and sample
from snapshots of their adapters (``save_weights_for_sampler``, ``sample``, ``compute_logprobs``); see
docs/serve.md. This module runs at plugin load and only registers the command lazily; nothing heavy is imported here.
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_commands(register):
    # a two-word name: `serve` is shared with rlhf-plugin-reward-server's `serve reward` (docs/plugins/command.md)
    register(
        "serve tinker",
        "rlhf_plugin_tinker_server.command:ServeTinkerCommand",
        description="serve the Tinker training API to the tinker SDK: rlhf serve tinker --model PATH --port N",
    )
