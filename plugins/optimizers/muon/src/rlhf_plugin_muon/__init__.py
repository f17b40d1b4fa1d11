"""Muon: ``--actor.optim muon`` (and ``--critic.optim``, ``--train.optim``).

Every 2-D weight whose name holds neither ``embed`` nor ``lm_head`` takes Muon steps
(momentum, then Newton-Schulz orthogonalisation) with ``--actor.muon.lr`` and
``--actor.muon.momentum``; embeddings, the output head, norms and biases take AdamW steps with
``--actor.adam.*``. Under DeepSpeed (``deepspeed_config``) DeepSpeed decides which parameter goes where
and runs the update inside ZeRO-1/2/3; ZeRO-3 gets ``reduce_scatter: false`` (DeepSpeed refuses Muon with
reduce-scatter). A backend that builds its own optimizer (``build``: FSDP2) gets the same split as one plain torch
optimizer (``rlhf_plugin_muon.torch_muon``), without DeepSpeed.
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_optimizers(register):
    register("muon", "rlhf_plugin_muon.optim:Muon",
             description="Muon for hidden matrices + AdamW for the rest (DeepSpeed's under ZeRO, else plain torch)")
