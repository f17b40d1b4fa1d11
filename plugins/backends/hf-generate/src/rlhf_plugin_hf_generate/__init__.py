"""HF ``transformers`` ``generate`` as an rlhf rollout engine (``--rollout.engine hf``).

``auto`` picks it when ``--vllm.num_engines`` is 0 or unset: no vLLM needed, any model HF can load
(VLMs included), one batch per call, left-padded.
"""

import rlhf

rlhf_plugin_api = rlhf.PLUGIN_API_VERSION


@rlhf.hookimpl
def rlhf_register_rollout_engines(register):
    register("hf", "rlhf_plugin_hf_generate.engine:HFEngine", description="HF transformers generate() in its own Ray actor")
