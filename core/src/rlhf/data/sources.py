"""Dataset sources shared by every trainer: local json/jsonl/parquet files, saved dataset
dirs or hub names, loaded with ``datasets``, mixed by probability and truncated."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlhf.config.base import ConfigError
from rlhf.config.checks import parse_probabilities
from rlhf.errors import DataError

__all__ = ["load_source", "load_mixed", "row_value", "text_value"]


def load_source(source: str, split: str, flag: str) -> Any:
    """One ``datasets.Dataset`` from a file, a ``save_to_disk`` dir (its ``split``) or a hub name.

    A missing or empty file, a line that is not JSON, and a dataset the hub cannot give are
    :class:`DataError` naming the file (and line) and ``flag``.
    """
    import datasets

    path = Path(source).expanduser()
    if path.is_dir() and ((path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists()):
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise DataError(f"{flag} {source}: no split {split!r} (splits: {', '.join(loaded)})")
            loaded = loaded[split]
        return _non_empty(loaded, source, flag)
    suffix = path.suffix.lower()
    if suffix in FILE_TYPES:
        if not path.is_file():
            raise DataError(f"{flag} {source}: no such file" + (" (it is a directory)" if path.is_dir() else ""))
        if path.stat().st_size == 0:
            raise DataError(f"{flag} {source}: the file is empty")
        verbosity = datasets.logging.get_verbosity()
        datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its own parse-error log would be a second, vaguer line
        try:
            loaded = datasets.load_dataset(FILE_TYPES[suffix], data_files=str(path), split="train")
        except Exception as exc:  # noqa: BLE001 - datasets wraps parse errors in several types; find the line ourselves
            raise _unreadable(path, suffix, flag, exc) from exc
        finally:
            datasets.logging.set_verbosity(verbosity)
        return _non_empty(loaded, source, flag)
    # anything else that exists or is spelled as a path is local; other names (``org/name.v1`` too) go to the hub
    if path.exists() or source.startswith((".", "/", "~")):
        problem = ("no such file or dataset dir" if not path.exists() else
                   "a directory without dataset_info.json" if path.is_dir() else f"unsupported file type {suffix!r}")
        raise DataError(f"{flag} {source}: {problem} (use .json, .jsonl, .parquet or a saved dataset dir)")
    try:
        return _non_empty(datasets.load_dataset(source, split=split), source, flag)
    except DataError:
        raise
    except Exception as exc:  # noqa: BLE001 - offline, unknown name, missing split: all say the same to the user
        raise DataError(f"{flag} {source}: not a local file and the hub dataset could not be loaded "
                        f"({type(exc).__name__}: {exc})") from exc


FILE_TYPES = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}


def _non_empty(dataset: Any, source: str, flag: str) -> Any:
    if len(dataset) == 0:
        raise DataError(f"{flag} {source}: the dataset has no rows")
    return dataset


def _unreadable(path: Path, suffix: str, flag: str, exc: Exception) -> DataError:
    """The first line of a JSON(L) file that does not parse, or else the loader's own reason."""
    if suffix in {".json", ".jsonl"}:
        text = path.read_text(encoding="utf-8", errors="replace")
        whole_document = suffix == ".json" and text.lstrip().startswith("[")
        chunks = [(1, text)] if whole_document else [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
        if not chunks:
            return DataError(f"{flag} {path}: the file has no rows (only blank lines)")
        for first_line, chunk in chunks:
            try:
                value = json.loads(chunk)
            except json.JSONDecodeError as error:
                return DataError(f"{path} line {first_line + error.lineno - 1}: not valid JSON ({error.msg}, column "
                                 f"{error.colno}); fix or remove it ({flag})")
            if not whole_document and not isinstance(value, dict):
                return DataError(f"{path} line {first_line}: expected a JSON object per line, got {type(value).__name__} ({flag})")
    reason = exc.__cause__ or exc
    return DataError(f"{flag} {path}: cannot be read as {suffix[1:]} ({type(reason).__name__}: {reason})")


def load_mixed(spec: str | None, probs: str | None, split: str, max_samples: int, seed: int,
               flag: str, probs_flag: str, source_column: str | None = None) -> list[dict[str, Any]]:
    """Rows of the comma-separated sources in ``spec``, interleaved by ``probs`` when there are several;
    with ``source_column`` and several sources, each row also holds the index of its source there."""
    import datasets

    if not spec:
        raise ConfigError(f"{flag} is required: a .json/.jsonl/.parquet file or a saved dataset dir")
    sources = [s.strip() for s in spec.split(",") if s.strip()]
    probabilities = parse_probabilities(probs, len(sources), probs_flag, flag)
    parts = [load_source(s, split, flag) for s in sources]
    if source_column and len(parts) > 1:
        parts = [part.add_column(source_column, [index] * len(part)) for index, part in enumerate(parts)]
    if len(parts) > 1:
        mixed = datasets.interleave_datasets(parts, probabilities=probabilities, seed=seed)
    else:
        mixed = parts[0]
    rows = mixed.select(range(min(len(mixed), max_samples)))
    return [dict(r) for r in rows]


def row_value(row: dict[str, Any], key: str, flag: str, source: str, index: int) -> Any:
    """``row[key]``; a missing key is an error naming the file, the row, the keys it has and the flag."""
    value = row.get(key)
    if value is None:
        present = [k for k, v in row.items() if v is not None]  # datasets fills keys missing in a row with None
        raise DataError(f"{source} row {index} has no key {key!r} (keys: {', '.join(present)}); set {flag}")
    return value


def text_value(row: dict[str, Any], key: str, flag: str, source: str, index: int) -> Any:
    """``row[key]`` where text is expected: a string or a chat-message list (``{"role", "content"}``
    dicts); anything else (a number, a list of strings…) is an error naming the row and ``flag``."""
    value = row_value(row, key, flag, source, index)
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(m, dict) and {"role", "content"} <= m.keys() for m in value):
        return value
    kind = type(value).__name__
    raise DataError(f"{source} row {index}: the value of {key!r} ({flag}) is {'an' if kind[0] in 'aeiou' else 'a'} {kind} "
                    f"({str(value)[:60]}); expected a string or a list of {{role, content}} chat messages")
