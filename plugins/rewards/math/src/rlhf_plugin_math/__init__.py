"""``math_answer``: 1.0 when the response's final answer equals the label mathematically, else 0.0.

The answer is the content of the last ``\\boxed{…}`` in the response, else its last number
(integers, decimals, fractions). Equivalence is decided by math-verify (symbolic: ``1/2``,
``0.5`` and ``\\frac{1}{2}`` agree), not by string comparison.
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_reward_functions(register):
    register("math_answer", "rlhf_plugin_math.answer:MathAnswer", description="boxed/last-number answer, math-verify equivalence")
