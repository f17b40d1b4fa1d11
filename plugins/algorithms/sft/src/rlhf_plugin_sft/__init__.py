"""``rlhf train sft``: supervised fine-tuning (OpenRLHF's ``train_sft``).

Masked NLL on response tokens (``--data.input_key``/``--data.output_key``), on every
assistant turn (``--data.multiturn``) or on all tokens (``--model.pretrain_mode_enable``),
one token mean per optimizer step across micro-batches and ranks.
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_trainers(register):
    register("sft", "rlhf_plugin_sft.trainer:SFTTrainer", description="supervised fine-tuning (OpenRLHF train_sft)")
