"""AdamW optimizer and cosine-with-floor scheduler factories (see the package docstring)."""

from __future__ import annotations

import math
from typing import Any


class AdamW:
    """``section`` is the trained model's config section (``config.actor`` or ``config.critic``)."""

    @classmethod
    def plan_state_bytes(cls, shape: Any, trainable: int) -> int:
        """For ``rlhf plan``: two fp32 moments per trained parameter."""
        return 8 * trainable

    def deepspeed_config(self, section: Any) -> dict[str, Any]:
        adam = section.adam
        return {
            "type": "AdamW",
            "params": {"lr": adam.lr, "betas": list(adam.betas), "eps": adam.eps, "weight_decay": adam.weight_decay},
        }

    def build(self, params: Any, section: Any) -> Any:
        import torch

        adam = section.adam
        return torch.optim.AdamW(params, lr=adam.lr, betas=tuple(adam.betas), eps=adam.eps, weight_decay=adam.weight_decay)


class CosineWithMinLR:
    def build(self, optimizer: Any, num_training_steps: int, section: Any) -> Any:
        from transformers import get_scheduler

        return get_scheduler(
            "cosine_with_min_lr",
            optimizer,
            num_warmup_steps=math.ceil(num_training_steps * section.lr_warmup_ratio),
            num_training_steps=num_training_steps,
            # a ratio, not adam.lr x ratio: every param group (Muon's and AdamW's lrs) decays to its own floor
            scheduler_specific_kwargs={"min_lr_rate": section.min_lr_ratio},
        )
