"""AdamW and the ``cosine_with_min_lr`` schedule with OpenRLHF's defaults.

``--actor.optim adam``: AdamW with ``--actor.adam.lr/betas/eps/weight_decay``
(defaults 1e-6, (0.9, 0.95), 1e-8, 0). ``--actor.lr_scheduler cosine_with_min_lr``:
linear warmup over ``ceil(lr_warmup_ratio · steps)`` steps, then cosine decay to
``min_lr_ratio · lr``.
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_optimizers(register):
    register("adam", "rlhf_plugin_adamw.optim:AdamW", description="AdamW (DeepSpeed or torch)")


@rlhf.hookimpl
def rlhf_register_schedulers(register):
    register("cosine_with_min_lr", "rlhf_plugin_adamw.optim:CosineWithMinLR", description="warmup + cosine to a floor")
