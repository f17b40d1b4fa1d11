"""The stream source against real files: rows by position in every format, a shuffled walk per episode, and a
100,000-row taskset read without holding it."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest
from rlhf_plugin_stream_data.source import StreamedRows, StreamOptions

from rlhf.errors import DataError
from rlhf.testing.conformance import PromptSourceKit, ppo_config


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def task(i: int) -> dict:
    return {"input": f"{i} + {i} = ?", "label": str(2 * i), "id": i}


def stream(path: str, shuffle: bool = True, seed: int = 3) -> StreamedRows:
    return StreamedRows(StreamOptions(path=path, shuffle=shuffle), seed)


def test_jsonl_parquet_and_saved_datasets_are_one_taskset_read_by_position(tmp_path: Path) -> None:
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    first = write_jsonl(tmp_path / "a.jsonl", [task(i) for i in range(5)])
    pq.write_table(pa.Table.from_pylist([task(i) for i in range(5, 12)]), tmp_path / "b.parquet", row_group_size=3)
    datasets.Dataset.from_list([task(i) for i in range(12, 15)]).save_to_disk(str(tmp_path / "c"))
    source = stream(f"{first},{tmp_path / 'b.parquet'},{tmp_path / 'c'}", shuffle=False)
    assert source.size == 15
    assert [row["id"] for row in source.rows(0, 15)] == list(range(15))
    assert [row["id"] for row in source.rows(13, 4)] == [13, 14, 0, 1]  # the next episode starts over
    assert source.rows(7, 2) == [task(7), task(8)]

    shuffled = stream(f"{first},{tmp_path / 'b.parquet'},{tmp_path / 'c'}")
    episode_0 = [row["id"] for row in shuffled.rows(0, 15)]
    episode_1 = [row["id"] for row in shuffled.rows(15, 15)]
    assert sorted(episode_0) == sorted(episode_1) == list(range(15)) and episode_0 != episode_1
    assert [row["id"] for row in shuffled.rows(16, 3)] == episode_1[1:4]  # the same rows, whatever the call


def test_a_hundred_thousand_rows_stream_without_being_loaded(tmp_path: Path) -> None:
    """The file is 100,000 rows and ~25 MB; building the source and reading 2,000 rows from it holds a few MB: the
    offsets index (8 bytes a row) and an episode's order (4 bytes a row), never the rows."""
    padding = "x" * 200
    big = write_jsonl(tmp_path / "big.jsonl", [{**task(i), "context": padding} for i in range(100_000)])
    assert big.stat().st_size > 24_000_000
    tracemalloc.start()
    source = stream(str(big))
    rows = source.rows(50_000, 2_000)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert source.size == 100_000 and len({row["id"] for row in rows}) == 2_000
    assert peak < 3_000_000, f"{peak / 1e6:.1f} MB held to read 2,000 rows"


def test_files_it_cannot_read_by_row_are_named(tmp_path: Path) -> None:
    (tmp_path / "whole.json").write_text(json.dumps([task(0)]))
    with pytest.raises(DataError, match=r"whole.json: unsupported file type '.json' \(use .jsonl, .parquet"):
        stream(str(tmp_path / "whole.json"))
    with pytest.raises(DataError, match="--stream.path .*missing.jsonl: no such file"):
        stream(str(tmp_path / "missing.jsonl"))
    with pytest.raises(DataError, match="needs --stream.path"):
        stream("")
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(task(0)) + "\n{not json\n")
    with pytest.raises(DataError, match=r"broken.jsonl row 1: not valid JSON"):
        stream(str(broken), shuffle=False).rows(0, 2)




class TestStreamKit(PromptSourceKit):
    component = StreamedRows
    plugin_module, registered_name = "rlhf_plugin_stream_data", "stream"

    @pytest.fixture(autouse=True)
    def _taskset(self, tmp_path: Path) -> None:
        self.path = write_jsonl(tmp_path / "taskset.jsonl", [task(i) for i in range(40)])

    def run_config(self):
        config = ppo_config()
        config.data.label_key = "label"
        config.plugins["stream"] = {"path": str(self.path)}
        return config
