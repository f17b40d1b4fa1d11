"""Muon for the hidden matrices and AdamW for the rest, as one plain torch optimizer (no DeepSpeed).

What a backend that builds its own optimizer (``build``: FSDP2, third-party backends) gets for ``--actor.optim muon``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

#: Names of the 2-D weights that stay with AdamW: the token embeddings and the output head (Keller Jordan's recipe,
#: and DeepSpeed's ``set_optimizer_flags``, which decides the same split under ZeRO).
ADAMW_MATRICES = ("embed", "lm_head")


def takes_muon(name: str, param: torch.Tensor) -> bool:
    """Whether ``param`` is a hidden matrix. ``torch.optim.Muon`` takes matrices only, so a parameter of more than two
    dimensions (a convolution's filters) stays with AdamW, where DeepSpeed's batched iteration would take it."""
    return param.ndim == 2 and not any(key in name.lower() for key in ADAMW_MATRICES)


class MuonWithAdamW(torch.optim.Optimizer):
    """One optimizer over both kinds of parameter group, so that a scheduler, ``state_dict`` and torch distributed
    checkpoints see every group and state in torch's usual layout. A group with ``use_muon`` steps with
    ``torch.optim.Muon`` (momentum, Newton-Schulz orthogonalisation, the shape's learning-rate scale), the others
    with ``torch.optim.AdamW``; both step over this optimizer's own groups and ``state``, rebound at each step
    because ``load_state_dict`` replaces them."""

    def __init__(self, muon_groups: list[dict[str, Any]], adam_groups: list[dict[str, Any]]) -> None:
        # the two inner optimizers complete their groups with their own defaults (nesterov, amsgrad, foreach...)
        self._inner: list[tuple[bool, torch.optim.Optimizer]] = []
        groups = []
        for use_muon, kind, own in ((True, torch.optim.Muon, muon_groups), (False, torch.optim.AdamW, adam_groups)):
            if own:
                inner = kind(own)
                self._inner.append((use_muon, inner))
                groups += [{**group, "use_muon": use_muon} for group in inner.param_groups]
        super().__init__(groups, {})

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for use_muon, inner in self._inner:
            inner.param_groups = [group for group in self.param_groups if group["use_muon"] is use_muon]
            inner.state = self.state
            inner.step()
        return loss


def muon_with_adamw(params: Any, section: Any) -> MuonWithAdamW:
    """``params``: the trainable parameters, or ``(name, parameter)`` pairs (without names the embeddings and the
    head cannot be told from hidden matrices, and every matrix takes Muon). ``section``: ``muon.*`` and ``adam.*``."""
    named = [item if isinstance(item, tuple) else ("", item) for item in params]
    trainable = [(name, p) for name, p in named if p.requires_grad]
    muon, adam = section.muon, section.adam
    matrices = [p for name, p in trainable if takes_muon(name, p)]
    rest = [p for name, p in trainable if not takes_muon(name, p)]
    muon_groups = [{"params": matrices, "lr": muon.lr, "momentum": muon.momentum, "nesterov": muon.nesterov,
                    "ns_steps": muon.ns_steps, "weight_decay": adam.weight_decay}] if matrices else []
    adam_groups = [{"params": rest, "lr": adam.lr, "betas": tuple(adam.betas), "eps": adam.eps,
                    "weight_decay": adam.weight_decay}] if rest else []
    return MuonWithAdamW(muon_groups, adam_groups)
