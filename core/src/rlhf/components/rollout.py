"""How an RL step's samples are produced: agent executors and rollout schedulers.

Shapes and the build rules: :mod:`rlhf.components`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from rlhf.payloads import GenerationRequest, GenerationResult

if TYPE_CHECKING:
    from rlhf.config.run import RunConfig


@runtime_checkable
class AgentExecutor(Protocol):
    """Produces one trajectory per request, token-in-token-out (never re-tokenising text).

    Selected with ``--train.agent_executor NAME`` (default ``single_turn``; ``multi_turn`` when
    ``--train.agent_func_path`` is set). Runs in the controller, once per generated batch
    (``rollout.batch_size × n`` requests, more with dynamic-filtering refills, and once per eval).
    ``requests`` are dicts with ``prompt_ids`` (list[int]), ``prompt`` (text), ``label``,
    ``max_tokens`` and ``seed``; ``engines`` is :class:`rlhf.runtime.rollout.engines.RolloutEngines`
    (``generate(requests, temperature, top_p)``; :class:`rlhf_agents.executors.EngineClient`
    wraps it for ``await``-ing one turn at a time); ``sampling`` holds ``temperature`` and ``top_p``.
    Returns one dict per request with ``response_ids`` (list[int]), ``logprobs`` (list[float], one per
    response token) and ``finish_reason`` (``stop`` or ``length``), and optionally ``action_mask``
    (one 0/1 per response token; 0 marks environment tokens, which are never trained on),
    ``prompt_ids``/``prompt`` (the first observation when the environment replaced the prompt) and
    ``agent`` (``{"reward", "score", "extra_logs"}``, or ``{"error": text}`` for a failed episode).

    Optional trait the core reads: ``provides_rewards`` — the ``agent`` results are the reward term
    ``agent`` (``--reward.on_error`` applies to failed episodes), beside any other reward sources of
    the run (``--reward.functions agent:0.8,format:0.2`` weighs it; its scores drive filtering unless
    ``--reward.score_term`` names another term). A class attribute, or set on the instance (e.g. in
    ``from_config``, when only some configurations reward their own episodes); read once per run.

    Optional trait ``rlhf plan`` reads: ``one_generation_per_request`` (a class attribute) — each response is
    one generation of at most its request's ``max_tokens`` (so at most ``--rollout.max_new_tokens``): the plan
    bounds a sequence's action tokens by it, and otherwise (several turns) by ``--data.max_len`` only.
    """

    def run(self, requests: list[GenerationRequest], engines: Any, sampling: dict[str, float]) -> list[GenerationResult]: ...


@dataclass
class StepRollout:
    """One step's samples, generated and rewarded ahead of the step by a :class:`RolloutScheduler`."""

    prompts: list[dict[str, Any]]
    #: the samples, ``n`` adjacent per prompt, ``group`` numbered from 0 in this batch (see :meth:`RolloutLoop.rollout`)
    samples: list[Any]
    #: the reward stage's metrics of the batch (as :meth:`RolloutLoop.rollout` returned them)
    extra: dict[str, float]
    #: what the scheduler measured (``async/…``), logged with the step
    metrics: dict[str, float] = field(default_factory=dict)
    #: the prompt schedule's position just after this batch's last prompt: where a resume starts
    data_state: dict[str, int] | None = None
    #: weight syncs done when its generation started / ended
    version_start: int = 0
    version_end: int = 0
    #: the rewards are final, shaping rules applied already (replayed from a dump): the step does not shape them again
    shaped: bool = False


class RolloutLoop(Protocol):
    """What the RL controller offers a :class:`RolloutScheduler`; every member is used in the controller."""

    #: the run's config (``rlhf.config.ppo.PPOConfig``)
    config: RunConfig
    #: global steps trained so far (the checkpoint's step after a resume)
    step: int
    #: weight syncs into the rollout engines so far
    policy_version: int
    #: the prompt schedule: ``next_batch()`` (the next ``--rollout.batch_size`` prompt rows, None once the run's
    #: episodes are used up), ``take(count)`` (up to ``count`` rows), ``total_batches``, ``state()`` (its position)
    #: and ``observe(samples)`` (the rewarded samples, for a prompt source's curriculum; :meth:`rollout` calls it)
    schedule: Any
    #: the position a checkpoint records instead of ``schedule.state()``; set it when the batch being trained was
    #: drawn before batches generated ahead of it, so that a resume generates those again
    trained_data: dict[str, int] | None
    #: a context manager held by weight syncs and evaluation; a scheduler that generates while a step trains
    #: may replace it with a lock it holds while a batch generates, so that a sync never lands mid-batch
    engine_lock: Any

    def rollout(self, prompts: list[dict[str, Any]], metrics: dict[str, float],
                step: int | None = None) -> tuple[list[Any], dict[str, float]]:
        """Generate and reward ``prompts`` as step ``step`` (default: the next one) does: its seeds, dynamic
        filtering's refills from ``schedule``, timings added to ``metrics``. Returns the samples (objects with
        ``group``, ``prompt``, ``prompt_ids``, ``label`` and ``data_state``, the schedule's position after their
        prompt; ``n`` adjacent per prompt) and the reward stage's metrics."""
        ...


@runtime_checkable
class RolloutScheduler(Protocol):
    """When an RL step's samples are generated: by the step itself, in turn with training (``sync``, the
    core's), or ahead of training while earlier steps train (``async``, rlhf-plugin-async-rollout).

    Selected with ``--train.rollout_scheduler NAME``; ``auto`` (the default) is ``async`` with
    ``--train.async_enable``, else ``sync``. Built with :func:`rlhf.components.build` in the controller,
    once per run. Optional classmethod ``check_config(config) -> None``: in the CLI process before
    anything starts, raising :class:`rlhf.errors.ConfigError` for a run it cannot schedule.

    Optional checkpoint methods, for a scheduler whose batches generated ahead must survive a resume (so that
    the resumed run trains exactly what the uninterrupted one would have): ``save_state(directory) -> None``,
    called in the controller while every checkpoint is written (``directory``: its staging dir), once per
    checkpoint, after the step and while no batch is being trained; it may wait for a batch in flight.
    ``load_state(directory, loop) -> None``: on ``--ckpt.load_enable``, once, after the controller restored
    its own state and before :meth:`batches`; it may move ``loop.schedule`` and ``loop.policy_version``.

    Optional trait the core reads: ``needs_engines`` (default True) — False for a scheduler whose batches are never
    generated (``replay`` reads them from a dump, ``--rollout.replay_dir``): the run builds no rollout engine, plans
    and places none, and syncs no weights; ``loop.rollout`` must then not be called. A class attribute, read in the
    CLI process and in the actor's ranks.
    """

    def batches(self, loop: RolloutLoop) -> Iterator[tuple[list[dict[str, Any]], StepRollout | None]]:
        """One ``(prompts, rollout)`` per global step, from the step after ``loop.step`` on: the step's prompt
        rows, and their :class:`StepRollout` or None (the step then calls ``loop.rollout`` itself). Iterated
        once per run, in the controller; ends when no prompt is left, and is closed when the run ends early."""
        ...
