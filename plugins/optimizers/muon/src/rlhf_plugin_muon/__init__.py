"""Muon through DeepSpeed: ``--actor.optim muon`` (and ``--critic.optim``, ``--train.optim``).

Every 2-D weight whose name holds neither ``embed`` nor ``lm_head`` takes Muon steps
(momentum, then Newton-Schulz orthogonalisation) with ``--actor.muon.lr`` and
``--actor.muon.momentum``; embeddings, the output head, norms and biases take AdamW steps with
``--actor.adam.*``. DeepSpeed decides which parameter goes where and runs the update inside
ZeRO-1/2/3; ZeRO-3 gets ``reduce_scatter: false`` (DeepSpeed refuses Muon with reduce-scatter).
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_optimizers(register):
    register("muon", "rlhf_plugin_muon.optim:Muon", description="Muon for hidden matrices + AdamW for the rest (DeepSpeed)")
