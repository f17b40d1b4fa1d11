"""Kits for the components around an RL step: reward managers, rollout corrections and rollout schedulers.

The reward-manager kit builds the manager with stand-in reward sources (:data:`KIT_REWARD_FUNCTIONS`, offered by
name as the run offers registered reward functions) and checks its answer on grouped batches. The correction kit
calls the correction on random right-padded log-probs. The scheduler kit iterates the scheduler over a stand-in
controller (:class:`KitRolloutLoop`) with the real prompt schedule, whose rollouts give ``n`` samples per prompt
without engines, so every batch can be traced to its prompts.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

from rlhf.components import RewardBatch, RewardSources
from rlhf.data.prompts import PromptSchedule
from rlhf.errors import ConfigError
from rlhf.registry import ComponentKind
from rlhf.reward_terms import call_reward
from rlhf.runtime.workers.batch import Sample
from rlhf.testing.conformance import tensors as tt
from rlhf.testing.conformance._core import (
    ComponentKit,
    ContractProperties,
    fail,
    first_failure,
    not_collected,
    ppo_config,
    show,
)

MANAGER = ComponentKind.REWARD_MANAGER.label
CORRECTION = ComponentKind.ROLLOUT_CORRECTION.label
SCHEDULER = ComponentKind.ROLLOUT_SCHEDULER.label


# ------------------------------------------------------------------ reward managers


def _length_reward(queries: list[str], prompts: list[str], labels: list[Any], **columns: Any) -> list[float]:
    return [(len(q) - len(p)) / 10 for q, p in zip(queries, prompts)]


def _label_reward(queries: list[str], prompts: list[str], labels: list[Any], **columns: Any) -> list[float]:
    return [float(str(label) in q[len(p):]) for q, p, label in zip(queries, prompts, labels)]


#: The reward functions the kit's ``sources.function(name, flag)`` offers: a manager under test names these
KIT_REWARD_FUNCTIONS = {"kit_length": _length_reward, "kit_label": _label_reward}


def kit_reward_sources(config: Any) -> Any:
    """:class:`rlhf.components.RewardSources` as the run builds them, its reward functions those of
    :data:`KIT_REWARD_FUNCTIONS` (another name is one error line naming the flag, as in a run)."""

    def function(name: str, flag: str) -> Any:
        if name not in KIT_REWARD_FUNCTIONS:
            raise ConfigError(f"{flag} {name!r}: the reward manager kit offers the reward functions "
                              f"{', '.join(KIT_REWARD_FUNCTIONS)}")
        return lambda queries, prompts, labels, **columns: call_reward(
            KIT_REWARD_FUNCTIONS[name], queries, prompts, labels, source=name, **columns)

    return RewardSources(config=config, function=function)


def _reward_batch(prompts: int, n: int, seed: int) -> Any:

    responses = [" 42", "", " the answer is 7", " 7 7", " no", " seven"]
    rows = [(f"question {p}?", responses[(seed + p * n + i) % len(responses)], str(7 * (p % 2)))
            for p in range(prompts) for i in range(n)]
    return RewardBatch(queries=[p + r for p, r, _ in rows], prompts=[p for p, _, _ in rows], labels=[x for _, _, x in rows],
                       columns={"prompt_ids": [[1, 2, 3]] * len(rows), "response_ids": [list(range(len(r))) for _, r, _ in rows],
                                "finish_reasons": ["stop"] * len(rows)})


def check_reward_manager(manager: Any) -> None:
    """One finite reward and score per sample; skipped samples are whole prompt groups of the batch; logs are
    finite numbers; the same batch gives the same answer."""
    sizes = [(1, 2), (2, 2), (3, 4)]

    def answered(prompts: int, n: int) -> Any:
        batch = _reward_batch(prompts, n, seed=prompts)
        return batch, manager(batch)

    def rewards_case(prompts: int, n: int) -> Any:
        def check() -> str | None:
            batch, result = answered(prompts, n)
            size = len(batch.queries)
            for field in ("rewards", "scores"):
                values = getattr(result, field, None)
                if not isinstance(values, list) or len(values) != size:
                    return f"{field} is {show(values)}, expected a list of {size} floats"
                if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
                    return f"{field} {show(values)} holds a value that is not a finite number"
            return None

        return f"{prompts} prompt(s) x {n} samples", check

    def skipped_case(prompts: int, n: int) -> Any:
        def check() -> str | None:
            batch, result = answered(prompts, n)
            skipped = set(getattr(result, "skipped", set()))
            if not skipped <= set(range(len(batch.queries))):
                return f"skipped {sorted(skipped)} is not a set of sample indices of a batch of {len(batch.queries)}"
            partial = [i for i in skipped if not set(range(i // n * n, i // n * n + n)) <= skipped]
            return f"sample {partial[0]} is skipped without the rest of its group" if partial else None

        return f"{prompts} prompt(s) x {n} samples", check

    def logs_case() -> str | None:
        _, result = answered(2, 2)
        bad = {k: v for k, v in getattr(result, "logs", {}).items()
               if not (isinstance(k, str) and isinstance(v, (int, float)) and math.isfinite(v))}
        return f"logs {show(bad)}: names must be strings, values finite numbers" if bad else None

    def deterministic() -> str | None:
        first, second = (manager(_reward_batch(2, 2, seed=5)) for _ in range(2))
        return None if (first.rewards, first.scores) == (second.rewards, second.scores) else \
            f"the same batch gave rewards {show(first.rewards)} then {show(second.rewards)}"

    first_failure(MANAGER, "one finite reward and score per sample", [rewards_case(p, n) for p, n in sizes])
    first_failure(MANAGER, "skips whole groups", [skipped_case(p, n) for p, n in sizes])
    first_failure(MANAGER, "logs are numbers", [("2 prompts x 2 samples", logs_case)])
    first_failure(MANAGER, "deterministic", [("the same batch twice", deterministic)])


class RewardManagerKit(ContractProperties, ComponentKit):
    """``component``: the manager class, built as the run builds it, ``cls(sources)``, with the kit's reward sources
    (:func:`kit_reward_sources`: name ``kit_length`` and ``kit_label`` where a run names registered reward functions;
    set them with :meth:`run_config`)."""

    kind = ComponentKind.REWARD_MANAGER
    contract_properties = ("one finite reward and score per sample", "skips whole groups", "logs are numbers",
                           "deterministic")
    test_picklable = None  # built and called in the controller only; Ray never ships it

    def make_component(self) -> Any:
        if self.component is None:
            raise fail(MANAGER, "kit set-up", f"set {type(self).__name__}.component or override make_component()")
        return self.component(kit_reward_sources(self.run_config()))

    @not_collected
    def test_contract(self) -> None:
        check_reward_manager(self.make_component())


# ------------------------------------------------------------------ rollout corrections


def check_rollout_correction(correction: Any) -> None:
    """``active`` is a bool; ``correction(old_log_probs, rollout_log_probs, action_mask)`` gives a finite fp32
    ``(B, T)`` coefficient, 0 on padding, and scalar-tensor metrics, without touching its inputs; deterministic."""
    import torch

    if not isinstance(getattr(correction, "active", None), bool):
        raise fail(CORRECTION, "declares its traits", f"active must be a bool, got {getattr(correction, 'active', None)!r}")

    def case(batch: int, width: int, seed: int) -> Any:
        mask = tt.right_padded_mask(tt.random_lengths(batch, width, seed, with_empty=batch > 1), width)
        old = tt.randn(batch, width, seed=seed, scale=0.5) - 1.0
        rollout = old + tt.randn(batch, width, seed=seed + 1, scale=0.2)

        def check() -> str | None:
            inputs = (old.clone(), rollout.clone(), mask.clone())
            coefficient, metrics = correction(*inputs)
            if any(not torch.equal(a, b) for a, b in zip(inputs, (old, rollout, mask))):
                return "modified its inputs in place"
            if tuple(coefficient.shape) != (batch, width) or coefficient.dtype != torch.float32:
                return f"coefficient {tuple(coefficient.shape)} {coefficient.dtype}, expected {(batch, width)} torch.float32"
            if not torch.isfinite(coefficient).all():
                return f"coefficient {show(coefficient)} is not finite"
            if (coefficient * (1 - mask)).abs().max() > 0:
                return f"coefficient {show(coefficient)} is not 0 on padding"
            bad = [k for k, v in metrics.items() if not (isinstance(v, torch.Tensor) and v.dim() == 0)]
            if bad:
                return f"metric {bad[0]!r} is {show(metrics[bad[0]])}, expected a scalar tensor"
            again, _ = correction(old.clone(), rollout.clone(), mask.clone())
            return None if torch.equal(again, coefficient) else "two calls on the same inputs differ (not deterministic)"

        return tt.describe(old_log_probs=old, rollout_log_probs=rollout, action_mask=mask), check

    first_failure(CORRECTION, "coefficient shape/dtype/finite/padding",
                  [case(p * n, width, p + width) for p, n, width in tt.SIZES])


class RolloutCorrectionKit(ContractProperties, ComponentKit):
    """``component``: the correction class, built as the run builds it (``from_config``; set its flags with
    :meth:`run_config`, so that the kit checks it active)."""

    kind = ComponentKind.ROLLOUT_CORRECTION
    contract_properties = ("declares its traits", "coefficient shape/dtype/finite/padding")

    @not_collected
    def test_contract(self) -> None:
        check_rollout_correction(self.make_component())


# ------------------------------------------------------------------ rollout schedulers


class KitRolloutLoop:
    """The :class:`rlhf.components.RolloutLoop` the scheduler kit drives: the real prompt schedule, and rollouts of
    ``n`` samples per prompt without engines (each sample's ``prompt`` is its prompt's). Its ``config`` is the one
    given, with ``--rollout.batch_size`` and ``--rollout.n_samples_per_prompt`` set to ``batch_size`` and ``n``."""

    def __init__(self, config: Any, prompts: int = 10, batch_size: int = 3, n: int = 2) -> None:

        self.config, self.n = config.model_copy(deep=True), n
        self.config.rollout.batch_size, self.config.rollout.n_samples_per_prompt = batch_size, n
        rows = [{"prompt": f"p{i}", "prompt_ids": [i + 1], "label": str(i)} for i in range(prompts)]
        self.schedule = PromptSchedule(rows, batch_size, num_episodes=1, seed=3)
        self.step, self.policy_version, self.trained_data = 0, 0, None
        self.engine_lock = contextlib.nullcontext()

    def rollout(self, prompts: list[dict[str, Any]], metrics: dict[str, float],
                step: int | None = None) -> tuple[list[Any], dict[str, float]]:

        samples = [Sample(prompt_ids=p["prompt_ids"], response_ids=[7], rollout_logprobs=[-1.0], prompt=p["prompt"],
                          label=p["label"], group=g, data_state=p.get("data_state"))
                   for g, p in enumerate(prompts) for _ in range(self.n)]
        return samples, {"reward": 0.0}

    def expected_batches(self) -> list[list[str]]:
        """The prompts of every batch, in the order a fresh schedule hands them out."""

        fresh = PromptSchedule(self.schedule.prompts, self.schedule.batch_size, 1, 3)
        return [[row["prompt"] for row in batch] for batch in iter(fresh.next_batch, None)]


def check_rollout_scheduler(scheduler: Any, config: Any = None) -> None:
    """``batches(loop)`` yields one ``(prompts, rollout)`` per batch of the schedule, in its order, and ends; a
    rollout it brings holds ``n`` adjacent samples of each of those prompts; closing it after one step returns."""
    config = config if config is not None else ppo_config()
    ahead = getattr(scheduler, "generates_ahead", False)
    if not isinstance(ahead, bool):
        raise fail(SCHEDULER, "declares its traits", f"generates_ahead must be a bool, got {ahead!r}")

    def run(loop: KitRolloutLoop, stop_after: int | None = None) -> list[tuple[list[str], Any]]:
        steps = []
        batches = scheduler.batches(loop)
        for prompts, rollout in batches:
            loop.step += 1  # the controller trains the step, then syncs the weights
            steps.append(([row["prompt"] for row in prompts], rollout))
            loop.policy_version += 1
            if loop.step == stop_after:
                batches.close()
                break
        return steps

    def in_order() -> str | None:
        loop = KitRolloutLoop(config)
        got, want = [prompts for prompts, _ in run(loop)], loop.expected_batches()
        return None if got == want else f"yielded the prompts {got}, expected every batch once, in order: {want}"

    def rollouts_match() -> str | None:
        loop = KitRolloutLoop(config)
        for prompts, rollout in run(loop):
            if rollout is None:
                continue
            got = [sample.prompt for sample in rollout.samples]
            if got != [p for p in prompts for _ in range(loop.n)]:
                return f"the rollout of prompts {prompts} holds samples of {got}, expected {loop.n} adjacent per prompt"
        return None

    def closes() -> str | None:
        steps = run(KitRolloutLoop(config), stop_after=1)
        return None if len(steps) == 1 else f"{len(steps)} steps after the run stopped at step 1"

    first_failure(SCHEDULER, "one item per batch, in order", [("10 prompts in batches of 3", in_order)])
    first_failure(SCHEDULER, "rollouts match their prompts", [("10 prompts in batches of 3, n 2", rollouts_match)])
    first_failure(SCHEDULER, "closes when the run stops early", [("closed after step 1", closes)])


class RolloutSchedulerKit(ContractProperties, ComponentKit):
    """``component``: the scheduler class, built as the run builds it (``from_config``)."""

    kind = ComponentKind.ROLLOUT_SCHEDULER
    contract_properties = ("declares its traits", "one item per batch, in order", "rollouts match their prompts",
                           "closes when the run stops early")
    test_picklable = None  # built and iterated in the controller only

    @not_collected
    def test_contract(self) -> None:
        check_rollout_scheduler(self.make_component(), self.run_config())
