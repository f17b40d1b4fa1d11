"""``rlhf serve reward``: a reward function or reward model behind OpenRLHF's HTTP protocol.

``POST /get_reward`` with ``{"query": [str], "prompts": [str], "labels": [...]}`` answers
``{"rewards": [...], "scores": [...], "extra_logs": {...}}``; another run reads it with
``--reward.remote_url http://HOST:PORT/get_reward``.

This module runs at plugin load and only registers the command lazily; nothing heavy is imported here.
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_commands(register):
    # `serve reward`: the `serve` word is shared with other servers' plugins (`rlhf serve tinker`), docs/plugins/command.md
    register("serve reward", "rlhf_plugin_reward_server.command:ServeCommand",
             description="serve a reward over HTTP: rlhf serve reward --function NAME | --model PATH")
