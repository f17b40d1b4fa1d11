"""The HF-generate engine passes the rollout-engine kit."""

from rlhf_plugin_hf_generate.engine import HFEngine

from rlhf.testing.conformance import RolloutEngineKit


class TestHFEngine(RolloutEngineKit):
    component = HFEngine
    plugin_module = "rlhf_plugin_hf_generate"
    registered_name = "hf"
