"""``rlhf lora merge``: fold a LoRA adapter (``--ds.lora.rank`` > 0 saves one) into its base model.

Takes OpenRLHF ``lora_combiner``'s flags as they are (``--model_path --lora_path --output_path
--is_rm --bf16``). This module runs at plugin load and only registers the command lazily.
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_commands(register):
    register("lora", "rlhf_plugin_lora_merge.command:LoraCommand",
             description="LoRA adapter tools: rlhf lora merge (OpenRLHF lora_combiner)")
