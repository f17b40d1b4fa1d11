"""``rlhf train prm``: process reward model training (OpenRLHF's ``train_prm``, removed upstream).

A causal LM learns to predict a reward token (``--model.reward_tokens``, e.g. ``+``/``-``)
at every step-boundary placeholder (``--model.placeholder_token``) of ``--data.input_key``;
``--data.label_key`` holds one label per placeholder, hard (a reward token string) or
soft (a float p of the first reward token). Cross-entropy at placeholders only, one mean
over placeholders per optimizer step; accuracy is logged.
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_trainers(register):
    register("prm", "rlhf_plugin_prm.trainer:PRMTrainer", description="process reward model (OpenRLHF train_prm)")
