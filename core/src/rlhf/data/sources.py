"""Dataset sources shared by every trainer: local json/jsonl/parquet files, saved dataset
dirs or hub names, loaded with ``datasets``, mixed by probability and truncated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlhf.config.base import ConfigError


def load_source(source: str, split: str, flag: str) -> Any:
    """One ``datasets.Dataset`` from a file, a ``save_to_disk`` dir (its ``split``) or a hub name."""
    import datasets

    path = Path(source)
    if path.is_dir() and ((path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists()):
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise ConfigError(f"{flag} {source}: no split {split!r} (splits: {', '.join(loaded)})")
            return loaded[split]
        return loaded
    suffix = path.suffix.lower()
    if suffix in {".json", ".jsonl"}:
        return datasets.load_dataset("json", data_files=str(path), split="train")
    if suffix == ".parquet":
        return datasets.load_dataset("parquet", data_files=str(path), split="train")
    if path.exists():
        raise ConfigError(f"{flag} {source}: unsupported file type {suffix!r} (use .json, .jsonl, .parquet or a saved dataset dir)")
    return datasets.load_dataset(source, split=split)


def load_mixed(spec: str | None, probs: str | None, split: str, max_samples: int, seed: int,
               flag: str, probs_flag: str) -> list[dict[str, Any]]:
    """Rows of the comma-separated sources in ``spec``, interleaved by ``probs`` when there are several."""
    import datasets

    if not spec:
        raise ConfigError(f"{flag} is required: a .json/.jsonl/.parquet file or a saved dataset dir")
    sources = [s.strip() for s in spec.split(",") if s.strip()]
    parts = [load_source(s, split, flag) for s in sources]
    if len(parts) > 1:
        weights = [float(p) for p in (probs or ",".join(["1"] * len(parts))).split(",")]
        if len(weights) != len(parts):
            raise ConfigError(f"{probs_flag} has {len(weights)} values for {len(parts)} datasets in {flag}")
        total = sum(weights)
        mixed = datasets.interleave_datasets(parts, probabilities=[w / total for w in weights], seed=seed)
    else:
        mixed = parts[0]
    rows = mixed.select(range(min(len(mixed), max_samples)))
    return [dict(r) for r in rows]


def row_value(row: dict[str, Any], key: str, flag: str, source: str, index: int) -> Any:
    """``row[key]``; a missing key is an error naming the file, the row, the keys it has and the flag."""
    value = row.get(key)
    if value is None:
        present = [k for k, v in row.items() if v is not None]  # datasets fills keys missing in a row with None
        raise ConfigError(f"{source} row {index} has no key {key!r} (keys: {', '.join(present)}); set {flag}")
    return value
