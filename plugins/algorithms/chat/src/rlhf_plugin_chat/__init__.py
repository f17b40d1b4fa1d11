"""``rlhf chat``: an interactive chat with a trained model (OpenRLHF's ``interactive_chat``).

The conversation is rendered with the tokenizer's chat template (or ``--input_template``),
the reply is streamed to the terminal token by token, and a LoRA adapter can be put on the
model with ``--lora_path``. ``/reset`` starts a new conversation, ``/exit`` or Ctrl-D ends it.

This module runs at plugin load and only registers the command lazily; nothing heavy is imported here.
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_commands(register):
    register("chat", "rlhf_plugin_chat.command:ChatCommand",
             description="interactive chat with a model: chat template, streamed reply, optional LoRA adapter")
