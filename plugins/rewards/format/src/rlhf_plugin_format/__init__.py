"""``format``: 1.0 when the response matches a pattern, else 0.0.

Default pattern: ``<think>…</think>`` followed by ``<answer>…</answer>`` and nothing else
(end-of-sequence tokens aside). ``--format.pattern REGEX`` (or ``plugins.format.pattern``
in YAML) sets another; it must match the whole response (``re.fullmatch``, DOTALL).
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_reward_functions(register):
    register("format", "rlhf_plugin_format.pattern:FormatReward", description="think/answer tags or any regex")


@rlhf.hookimpl
def rlhf_register_options(register):
    register("rlhf_plugin_format.pattern:FormatOptions", namespace="format")
