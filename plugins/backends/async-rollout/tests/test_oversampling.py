"""The async producer's oversampling buffer (--rollout.vllm_generate_batch_size > --rollout.batch_size), and the
batches generated ahead that a checkpoint keeps.

The real producer thread and :class:`PromptSchedule` run against a controller whose rollout
turns each prompt into ``n`` samples without engines, so every buffered group can be traced to its prompt.
"""

from __future__ import annotations

import contextlib
import time
from types import SimpleNamespace

import pytest
from rlhf_plugin_async_rollout.producer import AheadOfTraining

from rlhf.data.prompts import PromptSchedule
from rlhf.runtime.workers.batch import Sample, worker_payload

N = 2


class Controller:
    """What the producer reads of the PPO controller; ``rejected`` prompts' groups are filtered out."""

    def __init__(self, prompts: int, batch_size: int, per_round: int, rejected: frozenset[str] = frozenset()) -> None:
        self.config = SimpleNamespace(
            rollout=SimpleNamespace(batch_size=batch_size, n_samples_per_prompt=N, vllm_generate_batch_size=per_round),
            train=SimpleNamespace(async_enable=True, async_queue_size=1, partial_rollout_enable=False))
        rows = [{"prompt": f"p{i}", "prompt_ids": [i], "label": str(i)} for i in range(prompts)]
        self.schedule = PromptSchedule(rows, batch_size, num_episodes=1, seed=3)
        self.step, self.policy_version, self.trained_data = 0, 0, None
        self.engine_lock = contextlib.nullcontext()
        self.rounds: list[int] = []
        self.rejected = rejected

    def rollout(self, prompts, metrics, step=None):
        self.rounds.append(len(prompts))
        samples = [Sample(prompt_ids=p["prompt_ids"], response_ids=[7], rollout_logprobs=[-1.0], prompt=p["prompt"],
                          group=g, data_state=p["data_state"])
                   for g, p in enumerate(prompts) if p["prompt"] not in self.rejected for _ in range(N)]
        return samples, {"reward_extra": 1.0}


def train(controller: Controller, stop_after: int | None = None) -> list[tuple[list[str], dict]]:
    """Run the training side: each step takes a batch and syncs weights; ``(prompts, metrics)`` per step."""
    steps = []
    batches = AheadOfTraining().batches(controller)
    for _, rollout in batches:
        controller.step += 1
        groups = [rollout.samples[i:i + N] for i in range(0, len(rollout.samples), N)]
        assert all(len({s.prompt for s in g}) == 1 and [s.group for s in g] == [k] * N for k, g in enumerate(groups))
        steps.append(([g[0].prompt for g in groups], rollout.metrics))
        controller.policy_version += 1
        if controller.step == stop_after:
            batches.close()  # the run stops here: the producer thread is stopped, its buffer is lost
            break
    return steps


def schedule_order(controller: Controller) -> list[str]:
    return [p["prompt"] for p in PromptSchedule(controller.schedule.prompts, 1, 1, 3).take(len(controller.schedule.prompts))]


def test_rounds_of_six_prompts_feed_steps_of_four_in_order_and_nothing_is_left() -> None:
    controller = Controller(prompts=20, batch_size=4, per_round=6)
    steps = train(controller)
    trained = [p for prompts, _ in steps for p in prompts]
    assert trained == schedule_order(controller)  # every prompt once, in the order handed out
    assert [len(prompts) for prompts, _ in steps] == [4] * 5
    # 6 prompts per round while the remaining steps need them, then only what is still needed
    assert controller.rounds == [6, 6, 6, 2]
    assert [m["oversampling/buffered_groups"] for _, m in steps] == [2, 4, 0, 2, 0]
    assert all("oversampling/unused_groups" not in m for _, m in steps)


def test_a_buffered_group_is_up_to_two_syncs_stale() -> None:
    controller = Controller(prompts=20, batch_size=4, per_round=6)
    staleness = [m["async/staleness"] for _, m in train(controller)]
    # step 2 trains 2 groups of round 1 (made before any sync); queue size 1 adds one more sync at most
    assert max(staleness) <= 2 and staleness[0] == 0


@pytest.mark.parametrize("stop_after", [1, 2, 3])
def test_resume_regenerates_buffered_groups_none_lost_none_twice(stop_after: int) -> None:
    first = Controller(prompts=20, batch_size=4, per_round=6)
    before = train(first, stop_after)
    assert len(before) == stop_after
    checkpoint = first.trained_data  # what save_checkpoint writes as state["data"] in async mode
    resumed = Controller(prompts=20, batch_size=4, per_round=6)
    resumed.schedule.restore(checkpoint)
    resumed.step = stop_after
    after = train(resumed)
    trained = [p for prompts, _ in before + after for p in prompts]
    assert trained == schedule_order(first)
    assert len(before) + len(after) == first.schedule.total_batches


def test_filtered_groups_are_made_up_from_later_rounds() -> None:
    order = schedule_order(Controller(prompts=20, batch_size=4, per_round=6))
    rejected = frozenset(order[1:4])
    controller = Controller(prompts=20, batch_size=4, per_round=6, rejected=rejected)
    steps = train(controller)
    trained = [p for prompts, _ in steps for p in prompts]
    assert trained == [p for p in order if p not in rejected]
    # 17 groups for 5 steps of 4: the last step trains what is left once the prompts run out
    assert [len(prompts) for prompts, _ in steps] == [4, 4, 4, 4, 1]


def test_without_oversampling_each_step_is_one_round_of_the_batch_size() -> None:
    controller = Controller(prompts=12, batch_size=4, per_round=4)
    steps = train(controller)
    assert controller.rounds == [4, 4, 4]
    assert [p for prompts, _ in steps for p in prompts] == schedule_order(controller)


def test_a_round_whose_groups_are_all_filtered_trains_an_empty_step() -> None:
    order = schedule_order(Controller(prompts=16, batch_size=4, per_round=4))
    controller = Controller(prompts=16, batch_size=4, per_round=4, rejected=frozenset(order[8:12]))
    steps = train(controller)
    assert [prompts for prompts, _ in steps] == [order[:4], order[4:8], [], order[12:]]
    assert steps[2][1]["async/staleness"] <= 1.0  # measured from when it was made, as any batch (queue size 1)


def test_a_trainer_faster_than_the_producer_still_trains_batches_made_one_sync_earlier() -> None:
    """The sync after step k waits for batch k + 1 (queue size 1): with a producer slow to start each batch (a slow
    prompt schedule) and a trainer that syncs at once, the sync could otherwise come first and make batch k + 1 with
    step k's weights. Every batch is made by the same weights whichever thread is quicker."""
    controller = Controller(prompts=8, batch_size=2, per_round=2)
    next_batch = controller.schedule.next_batch

    def slow_next_batch():
        time.sleep(0.2)
        return next_batch()

    controller.schedule.next_batch = slow_next_batch
    staleness = []
    for _, rollout in AheadOfTraining().batches(controller):
        controller.step += 1
        staleness.append(rollout.metrics["async/staleness"])
        with controller.engine_lock:  # the weight sync, as the controller makes it
            controller.policy_version += 1
    assert staleness == [0.0, 1.0, 1.0, 1.0]


class RecordingController(Controller):
    """Its samples carry what a model extension recorded while the engine generated them (routing replay's experts)."""

    def rollout(self, prompts, metrics, step=None):
        import numpy as np

        samples, extra = super().rollout(prompts, metrics, step)
        rng = np.random.default_rng(len(self.rounds))
        for s in samples:
            s.token_records = {"routed_experts": rng.integers(0, 8, (3, 2, 2), dtype=np.uint8)}
        return samples, extra


def test_a_resume_trains_the_batch_generated_ahead_with_its_engine_records(tmp_path) -> None:
    """Routing replay (--actor.routing_replay rollout) routes a resumed run's first step by the experts the engine chose
    before the checkpoint: generating the batch again would not do (the records belong to the weights that sampled)."""
    import numpy as np

    run = RecordingController(prompts=12, batch_size=4, per_round=4)
    scheduler = AheadOfTraining()
    batches = scheduler.batches(run)
    next(batches)
    run.step = 1
    scheduler.save_state(tmp_path)  # step 2's batch is queued by now
    _, expected = next(batches)  # what the uninterrupted run trains at step 2
    batches.close()
    resumed = Controller(prompts=12, batch_size=4, per_round=4)  # generates samples without records
    resumed.step = 1
    again = AheadOfTraining()
    again.load_state(tmp_path, resumed)
    batches = again.batches(resumed)
    _, first = next(batches)
    batches.close()
    assert [s.prompt for s in first.samples] == [s.prompt for s in expected.samples]
    records = worker_payload(first.samples)["token_records"]
    assert len(records) == len(expected.samples) == 8
    for got, sample in zip(records, expected.samples):
        np.testing.assert_array_equal(got["routed_experts"], sample.token_records["routed_experts"])
