"""The prompt source: reasoning-gym's generators, one row per run-wide position, levelled by its curricula."""

from __future__ import annotations

import random
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rlhf.components import PromptOutcome
from rlhf.errors import ConfigError

#: the row field that carries reasoning-gym's entry (question, answer, metadata) to the reward
ENTRY_FIELD = "reasoning_gym"


class ReasoningGymOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tasks: str = Field("basic_arithmetic", description="reasoning-gym dataset names, comma-separated; each row "
                                                       "picks one, seeded by its position")
    size: int | None = Field(None, ge=1, description="rows per episode (default: --data.max_samples)")
    curriculum: bool = Field(False, description="walk each task's reasoning-gym curriculum by the scores it earns")
    raise_at: float = Field(0.8, description="a batch's mean score of a task at or above which its level rises")
    lower_at: float = Field(0.2, description="a batch's mean score of a task at or below which its level falls")
    instruction: str = Field("\nGive the final answer inside <answer></answer>.",
                             description="text appended to every question (the reward reads the answer tag)")

    @field_validator("tasks")
    @classmethod
    def _names(cls, value: str) -> str:
        if not [name for name in value.split(",") if name.strip()]:
            raise ValueError("name at least one reasoning-gym dataset")
        return value


class ReasoningGymTasks:
    """A :class:`rlhf.components.PromptSource` over reasoning-gym's registered datasets."""

    def __init__(self, options: ReasoningGymOptions, seed: int, input_key: str, label_key: str | None) -> None:
        from reasoning_gym import factory

        self.options, self.seed, self.input_key, self.label_key = options, seed, input_key, label_key
        self.tasks = [name.strip() for name in options.tasks.split(",") if name.strip()]
        unknown = [name for name in self.tasks if name not in factory.DATASETS]
        if unknown:
            raise ConfigError(f"--reasoning_gym.tasks: reasoning-gym has no dataset {', '.join(map(repr, unknown))} "
                              f"(it has {len(factory.DATASETS)}, e.g. {', '.join(sorted(factory.DATASETS)[:5])})")
        if options.curriculum:
            missing = [name for name in self.tasks if not factory.has_curriculum(name)]
            if missing:
                raise ConfigError(f"--reasoning_gym.curriculum: reasoning-gym has no curriculum for "
                                  f"{', '.join(missing)}; drop the flag or those tasks")
        self.curricula = {name: factory.create_curriculum(name) for name in self.tasks} if options.curriculum else {}
        self.levels = dict.fromkeys(self.curricula, 0)
        self.size = options.size

    @classmethod
    def from_config(cls, config: Any) -> ReasoningGymTasks:
        options = ReasoningGymOptions.model_validate(config.plugins.get("reasoning_gym", {}))
        return cls(options, config.train.seed, config.data.input_key, config.data.label_key)

    def rows(self, start: int, count: int) -> list[dict[str, Any]]:
        return [self._row(position) for position in range(start, start + count)]

    def _row(self, position: int) -> dict[str, Any]:
        from reasoning_gym import factory

        seed = random.Random(f"{self.seed}:{position}").getrandbits(31)  # one generator state per row
        task = self.tasks[seed % len(self.tasks)]
        dataset_class, config_class = factory.DATASETS[task]
        if task in self.curricula:
            curriculum = self.curricula[task]
            curriculum.set_global_level(self.levels[task])
            config = curriculum.generate_configuration({"seed": seed, "size": 1})
        else:
            config = config_class(seed=seed, size=1)
        entry = dataset_class(config=config)[0]
        row = {self.input_key: entry["question"] + self.options.instruction, ENTRY_FIELD: entry}
        if self.label_key:
            row[self.label_key] = entry["answer"]
        return row

    def observe(self, outcomes: list[PromptOutcome]) -> None:
        """Each task's mean score over this batch moves its curriculum level by one, within the curriculum's range."""
        by_task: dict[str, list[float]] = {}
        for outcome in outcomes:
            by_task.setdefault(outcome.row[ENTRY_FIELD]["metadata"]["source_dataset"], []).extend(outcome.rewards)
        for task, scores in by_task.items():
            if task not in self.curricula or not scores:
                continue
            mean, level = sum(scores) / len(scores), self.levels[task]
            if mean >= self.options.raise_at and level < _top_level(self.curricula[task]):
                self.levels[task] = level + 1
            elif mean <= self.options.lower_at and level > 0:
                self.levels[task] = level - 1

    def state(self) -> dict[str, Any]:
        return {"levels": dict(self.levels)}

    def restore(self, state: dict[str, Any]) -> None:
        self.levels.update({task: level for task, level in state.get("levels", {}).items() if task in self.levels})


def _top_level(curriculum: Any) -> int:
    """The curriculum's last global level: where its attribute with the most levels reaches its last one."""
    return max(len(attribute.levels) for attribute in curriculum.attributes.values()) - 1
