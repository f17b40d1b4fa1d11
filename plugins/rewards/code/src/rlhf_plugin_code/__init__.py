"""``code_tests``: 1.0 when the response's Python code passes every one of the label's tests, else 0.0.

The code is the last fenced ```python block of the response (or the whole response); the label is test code
(asserts) run after it in the same namespace. Each sample runs in an operating-system sandbox
(:mod:`rlhf_plugin_code.sandbox`): bubblewrap (or unshare) namespaces with a read-only view of only the
interpreter, a small tmpfs as the only writable place, no network, no capabilities, a seccomp filter against
process creation, and wall / CPU / memory / file-size limits. ``assert EXPR == LITERAL`` tests are judged
outside the sandbox (:mod:`rlhf_plugin_code.checks`), so exiting early or faking results does not pass.
Every failure is a 0 reward with its reason counted in ``extra_logs`` (``code/<reason>``). Threat model and
what it needs (bubblewrap): docs/rewards.md, Code.
Options: ``--code.wall_s``, ``--code.cpu_s``, ``--code.memory_mb``, ``--code.output_kb``, ``--code.isolation``.
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_reward_functions(register):
    register("code_tests", "rlhf_plugin_code.reward:CodeTestsReward", description="run code against tests in a sandbox")


@rlhf.hookimpl
def rlhf_register_options(register):
    register("rlhf_plugin_code.sandbox:SandboxLimits", namespace="code")
