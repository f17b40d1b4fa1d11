"""The Muon optimizer factory (see the package docstring)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from rlhf.errors import ConfigError

log = logging.getLogger("rlhf.muon")

#: What DeepSpeed's Muon runs, whatever its config says: its ZeRO paths call ``muon_update`` with
#: the default step count and Nesterov momentum.
DEEPSPEED_NS_STEPS = 5


def _eager_on_cpu() -> None:
    """DeepSpeed wraps ``muon_update`` in ``torch.compile``; on a CPU machine inductor then builds C++
    for every new matrix shape (about 24 s each on 2 cores, longer than a tiny run), so CPU runs stay eager."""
    import torch

    if not torch.cuda.is_available():
        import torch._dynamo

        torch._dynamo.config.disable = True


def _flags(field: str) -> str:
    """``muon.<field>`` as each command spells it: ``deepspeed_config`` sees a section, not which one it is."""
    return f"muon.{field} (--actor.muon.{field}, --critic.muon.{field} or --train.muon.{field})"


class Muon:
    """``section`` is the trained model's config section (``config.actor``, ``config.critic`` or the
    supervised optimizer view), with ``muon.lr/momentum/ns_steps/nesterov`` and ``adam.*``."""

    @classmethod
    def plan_state_bytes(cls, shape: Any, trainable: int) -> int:
        """For ``rlhf plan``: one fp32 momentum per parameter of the layers' 2-D weights, AdamW's two moments for the
        rest (embeddings, head, norms); LoRA's trained matrices are all 2-D."""
        if trainable != shape.parameters:
            return 4 * trainable
        return 4 * shape.matrix_parameters + 8 * (shape.parameters - shape.matrix_parameters)

    def check_config(self, section: Any, flag: Callable[[str], str]) -> None:
        if not 0.0 <= section.muon.momentum < 1.0:
            raise ConfigError(f"{flag('muon.momentum')} must be in [0, 1) (got {section.muon.momentum})")
        if section.max_norm != 0:
            log.warning("%s %s with %s muon: Muon's orthogonalised updates have a fixed scale, and clipping the "
                        "gradient norm first only changes the AdamW part; set %s 0 (OpenRLHF's advice)",
                        flag("max_norm"), section.max_norm, flag("optim"), flag("max_norm"))

    def zero_config(self, stage: int) -> dict[str, Any]:
        return {"reduce_scatter": False} if stage == 3 else {}

    def deepspeed_config(self, section: Any) -> dict[str, Any]:
        """Asked only by a backend that builds the optimizer inside DeepSpeed (ZeRO partitions the parameters, and
        DeepSpeed's ``MuonWithAuxAdam`` steps the partitions); it runs 5 Newton-Schulz steps with Nesterov momentum
        whatever its config says, so other settings are refused here, where DeepSpeed is known to build it."""
        muon, adam = section.muon, section.adam
        if muon.ns_steps != DEEPSPEED_NS_STEPS:
            raise ConfigError(f"{_flags('ns_steps')} is {muon.ns_steps}: DeepSpeed's Muon (--train.backend deepspeed) "
                              f"always runs {DEEPSPEED_NS_STEPS} Newton-Schulz steps; leave the flag at "
                              f"{DEEPSPEED_NS_STEPS}, or train with a backend that builds the optimizer in torch "
                              "(--train.backend fsdp2)")
        if not muon.nesterov:
            raise ConfigError(f"{_flags('no_nesterov')} is set: DeepSpeed's Muon (--train.backend deepspeed) always uses Nesterov "
                              "momentum; drop the flag, or train with a backend that builds the optimizer in torch "
                              "(--train.backend fsdp2)")
        _eager_on_cpu()
        return {
            "type": "Muon",
            "params": {"muon_lr": muon.lr, "momentum": muon.momentum, "adam_lr": adam.lr, "betas": list(adam.betas),
                       "eps": adam.eps, "weight_decay": adam.weight_decay},
        }

    def build(self, params: Any, section: Any) -> Any:
        """The optimizer in plain torch (:mod:`rlhf_plugin_muon.torch_muon`), for a backend that builds its own; it
        honours every ``muon.*`` flag. ``params`` may be ``(name, parameter)`` pairs (as ``model.named_parameters()``
        gives) so that embeddings and the head go to AdamW, or bare parameters, split by shape alone."""
        from rlhf_plugin_muon.torch_muon import muon_with_adamw

        return muon_with_adamw(params, section)
