"""Random access to one row of a file by its index, for each format, holding only what finding a row needs."""

from __future__ import annotations

import array
import json
from pathlib import Path
from typing import Any

from rlhf.errors import DataError


class JsonLines:
    """A JSONL file: an index of line starts (8 bytes a row), then one seek and one line per row read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.starts, offset = array.array("q"), 0  # 8 bytes a row, where a list would hold ~36
        with path.open("rb") as handle:
            for line in handle:
                if line.strip():
                    self.starts.append(offset)
                offset += len(line)

    def __len__(self) -> int:
        return len(self.starts)

    def row(self, index: int) -> dict[str, Any]:
        with self.path.open("rb") as handle:
            handle.seek(self.starts[index])
            line = handle.readline()
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{self.path} row {index}: not valid JSON ({exc.msg}); fix or remove it (--stream.path)") from None
        if not isinstance(value, dict):
            raise DataError(f"{self.path} row {index}: expected a JSON object per line, got {type(value).__name__}")
        return value


class ParquetRows:
    """A Parquet file: its row groups' sizes from the footer, and the last row group read kept for the next rows."""

    def __init__(self, path: Path) -> None:
        import numpy as np
        import pyarrow.parquet as pq

        self.file = pq.ParquetFile(path)
        sizes = [self.file.metadata.row_group(g).num_rows for g in range(self.file.num_row_groups)]
        self.ends = np.cumsum(sizes)
        self.cached: tuple[int, list[dict[str, Any]]] = (-1, [])

    def __len__(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    def row(self, index: int) -> dict[str, Any]:
        import numpy as np

        group = int(np.searchsorted(self.ends, index, side="right"))
        if self.cached[0] != group:
            self.cached = (group, self.file.read_row_group(group).to_pylist())
        first = int(self.ends[group - 1]) if group else 0
        return self.cached[1][index - first]


class SavedDataset:
    """A ``datasets`` ``save_to_disk`` folder: memory-mapped Arrow, read a row at a time."""

    def __init__(self, path: Path, split: str) -> None:
        import datasets

        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise DataError(f"--stream.path {path}: no split {split!r} (splits: {', '.join(loaded)})")
            loaded = loaded[split]
        self.dataset = loaded

    def __len__(self) -> int:
        return len(self.dataset)

    def row(self, index: int) -> dict[str, Any]:
        return dict(self.dataset[index])


def open_rows(path: str, split: str) -> Any:
    """The reader for ``path`` by its kind; anything else is a :class:`DataError` naming it."""
    found = Path(path).expanduser()
    if found.is_dir() and ((found / "dataset_info.json").exists() or (found / "dataset_dict.json").exists()):
        return SavedDataset(found, split)
    if not found.is_file():
        raise DataError(f"--stream.path {path}: no such file or saved dataset folder")
    if found.suffix.lower() == ".jsonl":
        return JsonLines(found)
    if found.suffix.lower() == ".parquet":
        return ParquetRows(found)
    raise DataError(f"--stream.path {path}: unsupported file type {found.suffix!r} (use .jsonl, .parquet or a "
                    "save_to_disk folder; a .json array cannot be read a row at a time)")
