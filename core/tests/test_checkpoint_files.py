"""Checkpoint dirs, state.json, staged saves and metrics.jsonl on resume, without engines (fast)."""

from __future__ import annotations

import errno
import json
import logging
from pathlib import Path

import pytest

from rlhf.config.ppo import PPOConfig
from rlhf.errors import CheckpointError, StorageError
from rlhf.records import checkpoints as checkpoint
from rlhf.records.metrics import MetricsTracker, read_metrics


def _checkpoint(root: Path, step: int) -> Path:
    return checkpoint.save(root, step, {"step": step}, lambda staging: (staging / "weights").write_text(str(step)), 3)


def _never_loaded(directory: Path, state: dict) -> None:
    raise AssertionError(f"{directory} must not be loaded")


def test_a_staging_leftover_is_not_a_checkpoint_and_resume_says_it_starts_fresh(tmp_path, caplog) -> None:
    (tmp_path / ".staging-global_step3").mkdir()
    with caplog.at_level(logging.WARNING, logger="rlhf.checkpoint"):
        assert checkpoint.resume(tmp_path, _never_loaded) is None
    assert f"no checkpoint under {tmp_path}; starting from step 0" in caplog.text


def test_resume_loads_the_latest_and_says_so(tmp_path, caplog) -> None:
    _checkpoint(tmp_path, 2)
    _checkpoint(tmp_path, 4)
    loaded = []
    with caplog.at_level(logging.WARNING, logger="rlhf.checkpoint"):
        state = checkpoint.resume(tmp_path, lambda directory, state: loaded.append((directory.name, state["step"])))
    assert state == {"step": 4} and loaded == [("global_step4", 4)]
    assert f"resumed from {tmp_path / 'global_step4'} (step 4)" in caplog.text


@pytest.mark.parametrize(("damage", "named"), [
    (lambda d: (d / "state.json").unlink(), "has no state.json"),
    (lambda d: (d / "state.json").write_text('{"step": 4, "data": '), "state.json is unreadable"),
    (lambda d: (d / "state.json").write_text('{"data": {}}'), "no integer 'step'"),
    (lambda d: (d / "state.json").write_bytes(b"\xff\xfe\x00"), "state.json is unreadable"),
])
def test_a_damaged_latest_checkpoint_is_an_error_not_a_fresh_start(tmp_path, damage, named) -> None:
    _checkpoint(tmp_path, 2)
    latest = _checkpoint(tmp_path, 4)
    damage(latest)
    with pytest.raises(CheckpointError, match="drop --ckpt.load_enable") as caught:
        checkpoint.resume(tmp_path, _never_loaded)
    assert str(latest) in str(caught.value) and named in str(caught.value)


def test_a_state_without_a_key_the_trainer_needs_is_an_error(tmp_path) -> None:
    _checkpoint(tmp_path, 2)
    with pytest.raises(CheckpointError, match="no data, kl_coef"):
        checkpoint.resume(tmp_path, _never_loaded, keys=("data", "kl_coef"))


def test_a_failed_save_keeps_nothing_and_the_previous_checkpoints_intact(tmp_path) -> None:
    _checkpoint(tmp_path, 2)

    def write(staging: Path) -> None:
        (staging / "weights").write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(StorageError, match="No space left on device; free some disk space") as caught:
        checkpoint.save(tmp_path, 4, {"step": 4}, write, 1)
    assert str(tmp_path / "global_step4") in str(caught.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step2"]  # max_num 1 did not rotate it out
    assert (tmp_path / "global_step2" / "weights").read_text() == "2"


def test_saves_rotate_to_max_num(tmp_path) -> None:
    for step in (1, 2, 3, 4):
        _checkpoint(tmp_path, step)
    assert [p.name for _, p in checkpoint.checkpoints(tmp_path)] == ["global_step2", "global_step3", "global_step4"]


def test_saves_rotate_to_max_mem_but_keep_the_newest(tmp_path, caplog) -> None:
    """--ckpt.max_mem (GiB): the oldest go until the rest fit; sizes differ, so the count kept varies."""
    sizes_kib = {1: 300, 2: 300, 3: 500, 4: 200, 5: 1200}

    def save(step: int) -> None:
        checkpoint.save(tmp_path, step, {"step": step},
                        lambda staging: (staging / "weights").write_bytes(b"\0" * (sizes_kib[step] << 10)),
                        max_num=10, max_gb=1000 / 2**20)  # 1000 KiB
    kept = []
    for step in sizes_kib:
        with caplog.at_level(logging.WARNING):
            save(step)
        kept.append([s for s, _ in checkpoint.checkpoints(tmp_path)])
    assert kept == [[1], [1, 2], [2, 3], [3, 4], [5]]  # 300+300+500 > 1000: step 1 goes; 1200 alone stays
    assert "alone takes" in caplog.text and "--ckpt.max_mem" in caplog.text


def test_a_published_model_replaces_files_only_when_complete(tmp_path) -> None:
    out = tmp_path / "out"
    with checkpoint.published(out, "model") as staging:
        (staging / "config.json").write_text("new")
    assert sorted(p.name for p in out.iterdir()) == ["config.json"]
    with pytest.raises(RuntimeError, match="crashed"), checkpoint.published(out, "model") as staging:
        (staging / "config.json").write_text("half")
        raise RuntimeError("crashed mid-save")
    assert sorted(p.name for p in out.iterdir()) == ["config.json"] and (out / "config.json").read_text() == "new"


def test_a_run_starting_at_step_s_drops_later_records_and_torn_lines(tmp_path, caplog) -> None:
    records = [json.dumps({"step": s, "reward": s / 10}) for s in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(records) + '\n{"step": 4, "rew')
    with caplog.at_level(logging.WARNING, logger="rlhf.tracking"):
        tracker = MetricsTracker(PPOConfig(), tmp_path, total_steps=4, initial_step=2)
    tracker.log(3, {"reward": 0.9})
    tracker.close()
    assert [(m["step"], m["reward"]) for m in read_metrics(tmp_path)] == [(1, 0.1), (2, 0.2), (3, 0.9)]
    assert "dropped 2 record(s) after step 2, where this run starts" in caplog.text
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]  # the rewrite left no temporary file
