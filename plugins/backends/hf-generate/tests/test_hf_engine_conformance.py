"""Both HF-generate engines pass the rollout-engine kit."""

from rlhf_plugin_hf_generate.engine import HFEngine, InProcessHFEngine

from rlhf.testing.conformance import RolloutEngineKit


class TestHFEngine(RolloutEngineKit):
    component = HFEngine
    plugin_module = "rlhf_plugin_hf_generate"
    registered_name = "hf"


class TestInProcessHFEngine(RolloutEngineKit):
    component = InProcessHFEngine
    plugin_module = "rlhf_plugin_hf_generate"
    registered_name = "hf-inprocess"
