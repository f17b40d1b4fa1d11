"""Prompt sources (``--data.prompt_source``): rows made on demand by position, refused rows counted and replaced,
rewards handed back for a curriculum, and a checkpointed position that makes a resumed run draw the same rows."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from rlhf.components import PromptOutcome, PromptSource
from rlhf.config.ppo import DataSection
from rlhf.data.sourced import SourcedSchedule
from rlhf.errors import DataError


class Counting:
    """Sums whose size grows with a level that rises each time a batch is answered well; every 5th row is empty."""

    size = 12

    def __init__(self, seed: int = 0) -> None:
        self.seed, self.level, self.seen = seed, 1, []

    def rows(self, start: int, count: int) -> list[dict[str, Any]]:
        rows = []
        for position in range(start, start + count):
            terms = [random.Random(f"{self.seed}:{position}").randint(1, 9) for _ in range(self.level + 1)]
            text = "" if position % 5 == 4 else " + ".join(map(str, terms)) + " ="
            rows.append({"input": text, "label": sum(terms), "position": position, "level": self.level})
        return rows

    def observe(self, outcomes: list[PromptOutcome]) -> None:
        self.seen.append(outcomes)
        if sum(r for o in outcomes for r in o.rewards) / sum(len(o.rewards) for o in outcomes) >= 0.5:
            self.level += 1

    def state(self) -> dict[str, Any]:
        return {"level": self.level}

    def restore(self, state: dict[str, Any]) -> None:
        self.level = state["level"]


@dataclass
class Rewarded:
    """What the controller hands ``observe``: samples with their score and the data_state of their prompt."""

    score: float
    data_state: dict[str, Any] = field(default_factory=dict)


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_tokenizer_path)


def schedule(tokenizer, source=None, batch_size=3, episodes=2, **data) -> SourcedSchedule:
    data_cfg = DataSection(label_key="label", max_len=64, **data)
    return SourcedSchedule(source or Counting(), "counting", data_cfg, tokenizer, batch_size, episodes)


def test_rows_follow_positions_and_refused_ones_are_counted_and_replaced(tokenizer, caplog) -> None:
    assert isinstance(Counting(), PromptSource)
    plan = schedule(tokenizer)
    assert plan.total_batches == 8  # 12 rows per episode, 3 per batch, 2 episodes
    with caplog.at_level(logging.WARNING, logger="rlhf.data"):
        first, second = plan.next_batch(), plan.next_batch()
    # position 4 makes an empty prompt: skipped, counted, and position 6 takes its place
    assert [p["fields"]["position"] for p in first + second] == [0, 1, 2, 3, 5, 6]
    assert [p["label"] for p in first] == [sum(map(int, p["prompt"].removesuffix(" =").split(" + "))) for p in first]
    assert "skipped 1 of the 4 rows made at positions 3-6: 1 empty" in caplog.text
    assert tokenizer.decode(first[0]["prompt_ids"]) == first[0]["prompt"]
    with pytest.raises(DataError, match=r"--data.prompt_source counting row 4: invalid prompt \(empty\)"):
        schedule(tokenizer, on_invalid_prompt="error").take(10)


def test_the_source_hears_each_rows_rewards_and_its_state_resumes_the_same_rows(tokenizer) -> None:
    source = Counting(seed=7)
    plan = schedule(tokenizer, source)
    batch = plan.next_batch()
    samples = [Rewarded(score, p["data_state"]) for p in batch for score in (1.0, 0.0, 1.0)]
    plan.observe(samples[::-1])
    (outcomes,) = source.seen
    assert [o.position for o in outcomes] == [0, 1, 2]  # in position order, whatever order the samples came in
    assert [o.rewards for o in outcomes] == [(1.0, 0.0, 1.0)] * 3 and outcomes[2].row["position"] == 2
    assert source.level == 2 and not plan.pending  # observed rows are let go

    checkpoint = plan.state()
    later = [plan.next_batch() for _ in range(3)]
    resumed = schedule(tokenizer, Counting(seed=7))
    resumed.restore(checkpoint)
    assert resumed.source.level == 2
    assert [resumed.next_batch() for _ in range(3)] == later
    # an async rollout checkpoints a prompt's data_state: resuming there continues right after it
    mid = schedule(tokenizer, Counting(seed=7))
    mid.restore(later[0][-1]["data_state"])
    assert mid.next_batch() == later[1]


def test_a_run_ends_after_its_episodes_and_refills_stop_with_it(tokenizer) -> None:
    plan = schedule(tokenizer, batch_size=5, episodes=1)  # 12 rows: 2 batches of 5
    assert plan.next_batch() and plan.next_batch() and plan.next_batch() is None
    assert len(plan.take(2)) == 2  # the last batch's refills
    with pytest.raises(DataError, match="6 rows per episode, fewer than --rollout.batch_size 8"):
        schedule(tokenizer, batch_size=8, max_samples=6)


def test_a_source_that_makes_the_wrong_number_of_rows_is_named(tokenizer) -> None:
    class Short(Counting):
        def rows(self, start: int, count: int) -> list[dict[str, Any]]:
            return super().rows(start, count)[:-1]

    with pytest.raises(DataError, match=r"rows\(0, 3\) made 2 rows; a source must make exactly the rows it is asked"):
        schedule(tokenizer, Short()).next_batch()
    with pytest.raises(DataError, match="written by a run that read --data.prompt_dataset files"):
        schedule(tokenizer).restore({"episode": 0, "position": 3})
