"""Testing kit for rlhf and its plugins (also a pytest plugin, auto-enabled with rlhf-core).

Fixtures (see :mod:`rlhf.testing.pytest_plugin`): ``tiny_tokenizer_path``,
``tiny_causal_lm_path``, ``tiny_reward_model_path`` (built offline once per test
session), ``plugin_host`` (a host with autoload off) and ``register_plugin``.

Conformance kits (:mod:`rlhf.testing.conformance`): one per component kind, run a plugin's
component against its contract on random inputs; docs/plugins/ describes each.
"""

from rlhf.testing.tiny import build_causal_lm, build_reward_model, build_tokenizer

__all__ = ["build_causal_lm", "build_reward_model", "build_tokenizer"]
