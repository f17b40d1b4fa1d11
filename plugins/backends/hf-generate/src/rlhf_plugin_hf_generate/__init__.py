"""HF ``transformers`` ``generate`` as rlhf rollout engines.

``hf-inprocess`` generates inside each actor training rank with the trained model itself: no engine
process, no weight copy, no weight sync; under ZeRO-3 or FSDP2 it generates on the shards, every rank in
step. ``auto`` picks it when ``--vllm.num_engines`` is 0 or unset, unless AutoTP splits the actor's layers
(or shards meet ``--train.async_enable``); then it picks ``hf``, which loads its own copy in a Ray actor of its own. Either needs no vLLM, serves any
model HF can load (VLMs included), ``--rollout.micro_batch_size`` sequences per ``generate`` call, left-padded.
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_rollout_engines(register):
    register("hf", "rlhf_plugin_hf_generate.engine:HFEngine", description="HF transformers generate() in its own Ray actor")
    register("hf-inprocess", "rlhf_plugin_hf_generate.engine:InProcessHFEngine",
             description="HF transformers generate() inside each actor training rank, with the trained weights themselves")
