"""Reward sources and shaping rules.

Shapes and the build rules: :mod:`rlhf.components`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch


@runtime_checkable
class RewardFunction(Protocol):
    """A batched reward: OpenRLHF's ``reward_func(queries, prompts, labels, **kwargs)`` contract.

    Runs in the reward process (controller or a reward worker), once per rollout batch.
    Returns a tensor/list of ``B`` rewards, or a dict with ``rewards`` ``(B,)``, optional
    ``scores`` ``(B,)`` (used for filtering) and ``extra_logs`` (name -> ``(B,)``).
    """

    def __call__(self, queries: Sequence[str], prompts: Sequence[str], labels: Sequence[Any], **kwargs: Any) -> Any: ...


@runtime_checkable
class RewardShaper(Protocol):
    """A shaping rule on scalar rewards, in the controller, once per rollout batch, after
    filtering and before the estimator's group step: ``(B,)`` -> ``(B,)``.

    Every registered shaper is built for the run; those with ``active`` true (usually set
    from their own flags) run in ascending ``order``. ``info`` holds ``response_lengths``
    ``(B,)`` and ``truncated`` ``(B,)`` (finish reason ``length``).
    """

    active: bool
    order: ClassVar[int]

    def apply(self, rewards: torch.Tensor, info: dict[str, Any]) -> torch.Tensor: ...
