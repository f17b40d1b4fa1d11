"""The PRM loss as a pure tensor function (OpenRLHF's ``PRMLoss``).

Every tensor is *per placeholder position*: the logits of the causal LM at each placeholder
token's own position (no shift: they predict the token after the placeholder) and that
placeholder's label. Run inside :meth:`PRMTrainer.compute` on the trainer's device, once
per micro-batch; importable on its own so tests can check the formula.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: ``label_ids`` value of a position whose label is soft (its probability is in ``probs``).
SOFT = -1
#: ``label_ids`` value of a position that is not a placeholder (batches only; never passed to the loss).
IGNORE = -100


def prm_loss(logits: torch.Tensor, label_ids: torch.Tensor, probs: torch.Tensor,
             reward_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(losses (P,), correct (P,))``: cross-entropy and argmax match at P placeholder positions.

    ``logits``: ``(P, V)``. ``label_ids``: ``(P,)`` long, the token id of a hard label, or
    :data:`SOFT`. ``probs``: ``(P,)`` float, for soft positions the target probability p of
    ``reward_ids[0]`` (1 − p goes to ``reward_ids[1]``); ignored elsewhere. ``reward_ids``:
    ``(K,)`` long or None. With it the logits are restricted to those K tokens and a hard label
    is the index of its token among them (every hard label must be one of them); without it a
    hard label is a class of the full vocabulary. Soft labels need exactly two reward tokens.
    Correct: the argmax equals the hard label, or the argmax of ``[p, 1 − p]`` (index 0 on ties).
    """
    import torch

    logits = logits.float()
    soft = label_ids == SOFT
    if reward_ids is None or reward_ids.numel() != 2:
        if bool(soft.any()):
            raise ValueError("soft (float) PRM labels need exactly two reward tokens (--model.reward_tokens)")
    if reward_ids is not None:
        logits = logits[:, reward_ids]
        target = (label_ids.unsqueeze(-1) == reward_ids).long().argmax(-1)  # token id -> index among reward_ids
    else:
        target = label_ids.clamp(min=0)
    logp = torch.log_softmax(logits, dim=-1)
    losses = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    if reward_ids is not None and reward_ids.numel() == 2:
        p = probs.float()
        soft_losses = -(p * logp[:, 0] + (1 - p) * logp[:, 1])
        losses = torch.where(soft, soft_losses, losses)
        target = torch.where(soft, (p < 0.5).long(), target)
    correct = (logits.argmax(-1) == target).float()
    return losses, correct
