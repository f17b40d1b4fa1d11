"""``rlhf train kto``: Kahneman-Tversky optimisation (OpenRLHF's ``train_kto``, removed upstream in 2026-03).

Unpaired data: each row is a prompt (``--data.input_key``), a completion
(``--data.output_key``) and a desirability label (``--data.label_key``, bool or 0/1).
The policy is pushed above (desirable) or below (undesirable) a frozen reference
(``--ref.*``) relative to a KL reference point estimated on mismatched prompt/completion
pairs of the same micro-batch; one sample mean per optimizer step.
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_trainers(register):
    register("kto", "rlhf_plugin_kto.trainer:KTOTrainer", description="KTO on unpaired desirable/undesirable data (OpenRLHF train_kto)")
