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
        if section.muon.ns_steps != DEEPSPEED_NS_STEPS:
            raise ConfigError(f"{flag('muon.ns_steps')} {section.muon.ns_steps}: DeepSpeed's Muon always runs "
                              f"{DEEPSPEED_NS_STEPS} Newton-Schulz steps; leave the flag at {DEEPSPEED_NS_STEPS}")
        if not section.muon.nesterov:
            raise ConfigError(f"{flag('muon.no_nesterov')}: DeepSpeed's Muon always uses Nesterov momentum; drop the flag")
        if not 0.0 <= section.muon.momentum < 1.0:
            raise ConfigError(f"{flag('muon.momentum')} must be in [0, 1) (got {section.muon.momentum})")
        if section.max_norm != 0:
            log.warning("%s %s with %s muon: Muon's orthogonalised updates have a fixed scale, and clipping the "
                        "gradient norm first only changes the AdamW part; set %s 0 (OpenRLHF's advice)",
                        flag("max_norm"), section.max_norm, flag("optim"), flag("max_norm"))

    def zero_config(self, stage: int) -> dict[str, Any]:
        return {"reduce_scatter": False} if stage == 3 else {}

    def deepspeed_config(self, section: Any) -> dict[str, Any]:
        _eager_on_cpu()
        muon, adam = section.muon, section.adam
        return {
            "type": "Muon",
            "params": {"muon_lr": muon.lr, "momentum": muon.momentum, "adam_lr": adam.lr, "betas": list(adam.betas),
                       "eps": adam.eps, "weight_decay": adam.weight_decay},
        }

    def build(self, params: Any, section: Any) -> Any:
        """The same optimizer without DeepSpeed; ``params`` may be ``(name, parameter)`` pairs (as
        ``model.named_parameters()`` gives) so embeddings and the head go to AdamW, or bare
        parameters, split by shape alone."""
        import torch
        from deepspeed.runtime.zero.muon.muon_optimizer import MuonWithAuxAdam

        _eager_on_cpu()
        named = [item if isinstance(item, tuple) else ("", item) for item in params]
        trainable = [(name, p) for name, p in named if p.requires_grad]

        def takes_muon(name: str, p: Any) -> bool:
            return p.ndim >= 2 and not any(key in name.lower() for key in ("embed", "lm_head"))

        muon, adam = section.muon, section.adam
        groups = [
            {"params": [p for n, p in trainable if takes_muon(n, p)], "use_muon": True, "lr": muon.lr,
             "momentum": muon.momentum, "weight_decay": adam.weight_decay},
            {"params": [p for n, p in trainable if not takes_muon(n, p)], "use_muon": False, "lr": adam.lr,
             "betas": tuple(adam.betas), "eps": adam.eps, "weight_decay": adam.weight_decay},
        ]
        return MuonWithAuxAdam([g for g in groups if g["params"]], adam_optimizer=torch.optim.AdamW)
