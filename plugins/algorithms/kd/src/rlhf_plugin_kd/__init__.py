"""``rlhf train kd``: knowledge distillation (OpenRLHF's ``train_kd``).

The student is trained on prompt + response data like SFT (``--data.input_key``/
``--data.output_key``), with the loss ``(1 − α)·NLL + α·KD`` over response tokens:
KD is the cross-entropy from a frozen teacher's full next-token distribution
(``--teacher.model_name_or_path``, ``--teacher.offload``) to the student's, and
α is ``--model.kd_coef``. One token mean per optimizer step across micro-batches and ranks.
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_trainers(register):
    register("kd", "rlhf_plugin_kd.trainer:KDTrainer", description="knowledge distillation from a teacher (OpenRLHF train_kd)")
