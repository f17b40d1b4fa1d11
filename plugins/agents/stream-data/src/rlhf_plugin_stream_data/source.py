"""The ``stream`` prompt source: one or more files read by position, in an order shuffled per episode."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rlhf.errors import DataError
from rlhf_plugin_stream_data.readers import open_rows


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field("", description="JSONL or Parquet files or save_to_disk folders, comma-separated: their rows in "
                                      "that order make one episode")
    split: str = Field("train", description="the split of a saved DatasetDict")
    shuffle: bool = Field(True, description="walk each episode in an order shuffled by the run's seed and the episode")


class StreamedRows:
    """A :class:`rlhf.components.PromptSource`: run-wide position p is row ``order(e)[p mod N]`` of episode
    ``e = p // N``, where N is the files' rows together."""

    def __init__(self, options: StreamOptions, seed: int) -> None:
        paths = [p.strip() for p in options.path.split(",") if p.strip()]
        if not paths:
            raise DataError("--data.prompt_source stream needs --stream.path: JSONL or Parquet files or saved datasets")
        self.readers = [open_rows(path, options.split) for path in paths]
        self.paths, self.options, self.seed = paths, options, seed
        self.ends = [0]
        for reader in self.readers:
            self.ends.append(self.ends[-1] + len(reader))
        self.size = self.ends[-1]
        if self.size == 0:
            raise DataError(f"--stream.path {options.path}: no rows")
        self.order: tuple[int, Any] = (-1, None)  # (episode, its permutation)

    @classmethod
    def from_config(cls, config: Any) -> StreamedRows:
        return cls(StreamOptions.model_validate(config.plugins.get("stream", {})), config.train.seed)

    def rows(self, start: int, count: int) -> list[dict[str, Any]]:
        return [self._row(position) for position in range(start, start + count)]

    def _row(self, position: int) -> dict[str, Any]:
        import bisect

        episode, index = divmod(position, self.size)
        if self.options.shuffle:
            index = int(self._order(episode)[index])
        file = bisect.bisect_right(self.ends, index) - 1
        return self.readers[file].row(index - self.ends[file])

    def _order(self, episode: int) -> Any:
        """Episode ``episode``'s permutation of the rows (4 bytes a row), made once per episode."""
        import numpy as np

        if self.order[0] != episode:
            self.order = (episode, np.random.default_rng([self.seed, episode]).permutation(self.size).astype(np.int32))
        return self.order[1]
