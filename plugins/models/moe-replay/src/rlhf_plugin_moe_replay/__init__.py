"""``--actor.routing_replay``: MoE routing replay from the rollout engine to the trainer, and MoE metrics.

With ``rollout`` the engine records the experts each token was routed to in every MoE layer, and the actor's
and the reference's forwards route each token by them, with the router's weights still the trainer's own
(arXiv 2510.23027); ``record`` only records and logs how often the trainer's routing differs. Both log the
expert load, its entropy and the balancing loss per step (``moe/…`` in metrics.jsonl).
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_model_loaders(register):
    register("moe-replay", "rlhf_plugin_moe_replay.extension:RoutingReplay",
             description="MoE routing replay from the rollout engine to the trainer (--actor.routing_replay)")
