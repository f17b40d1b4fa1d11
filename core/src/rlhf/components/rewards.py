"""Reward sources, reward managers and shaping rules.

Shapes and the build rules: :mod:`rlhf.components`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from rlhf.config.run import RunConfig
    from rlhf.reward_output import RewardOutput


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


@dataclass
class RewardBatch:
    """One generated batch as a reward manager sees it: ``B`` samples, the ``n`` of one prompt adjacent.

    ``columns`` are per-sample keyword columns for the reward functions: ``prompt_ids``, ``response_ids``,
    ``finish_reasons`` and ``fields`` (each prompt row's fields beside its input and label, a dict) always; ``agents`` (each episode's :class:`rlhf.payloads.AgentOutcome` fields)
    when the agent executor rewards its own episodes.
    """

    queries: list[str]  # prompt + response text
    prompts: list[str]
    labels: list[Any]
    columns: dict[str, list[Any]] = field(default_factory=dict)


@dataclass
class RewardResult:
    """A reward manager's answer for a :class:`RewardBatch`: ``rewards`` ``(B,)`` are what is trained on (before
    shaping); ``scores`` ``(B,)`` are what sample filters and eval's pass rates read; ``skipped`` holds the indices
    of samples whose whole prompt group is left out of this step (the runtime counts the groups in
    ``reward_skipped_groups``); ``logs`` are metrics of this batch, logged as they are. Optional, for the
    sample table and ``--rollout.dump_dir`` (docs/rewards.md#your-own-columns): ``terms`` holds each term's
    per-sample value ``(B,)`` by term name; ``columns`` per-sample values ``(B,)`` of any column a source added
    (text, numbers), by a name such as ``code_tests/output``."""

    rewards: list[float]
    scores: list[float]
    skipped: set[int] = field(default_factory=set)
    logs: dict[str, float] = field(default_factory=dict)
    terms: dict[str, list[float]] = field(default_factory=dict)
    columns: dict[str, list[Any]] = field(default_factory=dict)


#: A reward source the runtime hands a manager, called as a batched reward function; its answer is a
#: :class:`rlhf.reward_output.RewardOutput` (rewards and scores ``(B,)``, per-sample ``extra_logs``).
RewardSource = Callable[..., "RewardOutput"]


@dataclass
class RewardSources:
    """What the runtime offers a reward manager when it builds one (once per run, in the controller).

    ``function(name, flag)`` builds the reward function registered as ``name`` (an unknown name is one
    error line naming ``flag``) and returns it as a :data:`RewardSource`, every function shape adapted by
    :func:`rlhf.reward_terms.call_reward`; ``agent`` is the agent executor's own rewards when it gives
    them (else None); ``reward_models`` has one source per ``--reward.model_name_or_path`` path, each scoring
    on its reward-model worker group (their workers start after the manager is built, before the first call).
    """

    config: RunConfig
    function: Callable[[str, str], RewardSource]
    agent: RewardSource | None = None
    reward_models: list[RewardSource] = field(default_factory=list)


@runtime_checkable
class RewardManager(Protocol):
    """Turns each generated batch into one reward and one score per sample, from the run's reward sources
    (verl's reward managers). Selected by ``--reward.manager NAME``; the runtime builds it as ``cls(sources)``
    with :class:`RewardSources`.

    Called in the controller, once per generated batch: each training step's batch, each refill of a
    sample filter, each eval batch. It may raise :class:`rlhf.errors.RewardSourceError` to stop the run
    with one line; it must never return a non-finite reward or score.
    """

    def __call__(self, batch: RewardBatch) -> RewardResult: ...
