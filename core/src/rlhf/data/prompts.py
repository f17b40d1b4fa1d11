"""Prompt datasets for RL: local json/jsonl/parquet files or saved dataset dirs, via ``datasets``.

Each row becomes ``{"prompt": str, "prompt_ids": list[int], "label": Any}``. The
order is a seeded shuffle per episode, so a resumed run continues with exactly
the batches an uninterrupted run would have seen.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from rlhf.config.base import ConfigError


def _load_one(source: str, split: str) -> Any:
    import datasets

    path = Path(source)
    if path.is_dir() and ((path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists()):
        loaded = datasets.load_from_disk(str(path))
        return loaded[split] if isinstance(loaded, datasets.DatasetDict) else loaded
    suffix = path.suffix.lower()
    if suffix in {".json", ".jsonl"}:
        return datasets.load_dataset("json", data_files=str(path), split="train")
    if suffix == ".parquet":
        return datasets.load_dataset("parquet", data_files=str(path), split="train")
    if path.exists():
        raise ConfigError(f"--data.prompt_dataset {source}: unsupported file type {suffix!r} (use .json, .jsonl, .parquet or a saved dataset dir)")
    return datasets.load_dataset(source, split=split)


def load_prompt_rows(data_cfg: Any, seed: int) -> list[dict[str, Any]]:
    """Load, mix (``--data.prompt_probs``) and truncate (``--data.max_samples``) the prompt datasets."""
    import datasets

    if not data_cfg.prompt_dataset:
        raise ConfigError("--data.prompt_dataset is required: a .json/.jsonl/.parquet file or a saved dataset dir")
    sources = [s.strip() for s in data_cfg.prompt_dataset.split(",") if s.strip()]
    parts = [_load_one(s, data_cfg.prompt_split) for s in sources]
    if len(parts) > 1:
        probs = [float(p) for p in (data_cfg.prompt_probs or ",".join(["1"] * len(parts))).split(",")]
        if len(probs) != len(parts):
            raise ConfigError(f"--data.prompt_probs has {len(probs)} values for {len(parts)} datasets in --data.prompt_dataset")
        total = sum(probs)
        mixed = datasets.interleave_datasets(parts, probabilities=[p / total for p in probs], seed=seed)
    else:
        mixed = parts[0]
    rows = mixed.select(range(min(len(mixed), data_cfg.max_samples)))
    return [dict(r) for r in rows]


def build_prompts(rows: list[dict[str, Any]], data_cfg: Any, tokenizer: Any, source: str) -> list[dict[str, Any]]:
    """Apply the chat template / input template and tokenize each row."""
    prompts = []
    for index, row in enumerate(rows):
        present = [k for k, v in row.items() if v is not None]  # datasets fills keys missing in a row with None
        if row.get(data_cfg.input_key) is None:
            raise ConfigError(
                f"{source} row {index} has no key {data_cfg.input_key!r} (keys: {', '.join(present)}); set --data.input_key"
            )
        if data_cfg.label_key and row.get(data_cfg.label_key) is None:
            raise ConfigError(f"{source} row {index} has no key {data_cfg.label_key!r} (keys: {', '.join(present)}); set --data.label_key")
        value = row[data_cfg.input_key]
        if data_cfg.apply_chat_template:
            messages = [{"role": "user", "content": value}] if isinstance(value, str) else value
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            text = data_cfg.input_template.format(value) if data_cfg.input_template else str(value)
            ids = tokenizer(text)["input_ids"]
        label = row.get(data_cfg.label_key) if data_cfg.label_key else None
        prompts.append({"prompt": text, "prompt_ids": ids, "label": label})
    return prompts


class PromptSchedule:
    """Prompts in a seeded shuffle per episode; the position is checkpointable.

    :meth:`next_batch` hands out ``--rollout.batch_size`` prompts (an episode's last partial
    batch is dropped); :meth:`take` hands out single replacements (dynamic filtering refills),
    crossing into the next episode when one ends.
    """

    def __init__(self, prompts: list[dict[str, Any]], batch_size: int, num_episodes: int, seed: int) -> None:
        if len(prompts) < batch_size:
            raise ConfigError(f"the prompt dataset has {len(prompts)} rows, fewer than --rollout.batch_size {batch_size}")
        self.prompts, self.batch_size, self.num_episodes, self.seed = prompts, batch_size, num_episodes, seed
        self.batches_per_episode = len(prompts) // batch_size
        self.episode, self.position = 0, 0

    @property
    def total_batches(self) -> int:
        return self.batches_per_episode * self.num_episodes

    def state(self) -> dict[str, int]:
        return {"episode": self.episode, "position": self.position}

    def restore(self, state: dict[str, int]) -> None:
        self.episode, self.position = state["episode"], state["position"]

    def _order(self) -> list[int]:
        order = list(range(len(self.prompts)))
        random.Random(self.seed * 1000 + self.episode).shuffle(order)
        return order

    def next_batch(self) -> list[dict[str, Any]] | None:
        if self.position + self.batch_size > len(self.prompts):
            self.episode, self.position = self.episode + 1, 0
        if self.episode >= self.num_episodes:
            return None
        chosen = self._order()[self.position : self.position + self.batch_size]
        self.position += self.batch_size
        return [self.prompts[i] for i in chosen]

    def take(self, count: int) -> list[dict[str, Any]]:
        """Up to ``count`` more prompts; fewer (or none) once the last episode is used up."""
        out: list[dict[str, Any]] = []
        while len(out) < count and self.episode < self.num_episodes:
            if self.position >= len(self.prompts):
                self.episode, self.position = self.episode + 1, 0
                continue
            order = self._order()
            chosen = order[self.position : self.position + count - len(out)]
            self.position += len(chosen)
            out += [self.prompts[i] for i in chosen]
        return out
