"""TensorBoard through the lifecycle hooks: every logged step once, a resume's steps replacing a crashed run's."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from rlhf.host.plugin_host import PluginHost
from rlhf.host.selection import PluginSelection
from rlhf.testing.cli import assert_user_error, run_rlhf
from rlhf.testing.conformance import LifecycleObserverKit, ppo_config


class TestTrackersHooks(LifecycleObserverKit):
    plugin_module = "rlhf_plugin_trackers"


def scalars(directory: Path, key: str) -> dict[int, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory))
    events.Reload()
    return {event.step: event.value for event in events.Scalars(key)}


def run(host: PluginHost, config, run_dir: Path, steps: range, values: dict[int, float], crash: bool = False) -> None:
    host.train_start(config, run_dir)
    for step in steps:
        host.step_end(step, {"reward": values[step]})
    if not crash:
        host.train_end(config, run_dir, "completed")


def test_logged_steps_follow_logging_steps_and_a_resume_replaces_what_a_crash_left(tmp_path: Path) -> None:
    host = PluginHost.load(PluginSelection.parse("trackers", strict=True))
    board = tmp_path / "tb"
    config = ppo_config(logger={"tensorboard_dir": str(board), "logging_steps": 2})
    first = {step: random.random() for step in range(1, 9)}
    run(host, config, tmp_path, range(1, 9), first, crash=True)  # no train_end: the writer is never closed
    host.train_end(config, tmp_path, "failed")
    assert scalars(board, "reward") == pytest.approx({s: first[s] for s in (2, 4, 6, 8)})

    resumed = {step: 10 + random.random() for step in range(5, 11)}  # the checkpoint was at step 4
    run(PluginHost.load(PluginSelection.parse("trackers", strict=True)), config, tmp_path, range(5, 11), resumed)
    assert scalars(board, "reward") == pytest.approx({2: first[2], 4: first[4], 6: resumed[6], 8: resumed[8], 10: resumed[10]})


def test_a_tracker_flag_without_the_plugin_names_what_to_install() -> None:
    result = run_rlhf("train", "ppo", "--plugins", "no:trackers", "--actor.model_name_or_path", "m",
                      "--logger.tensorboard_dir", "tb")
    assert_user_error(result, "--logger.tensorboard_dir", "pip install rlhf-plugin-trackers")


def test_a_logged_steps_samples_are_tensorboard_text_and_a_wandb_table(tmp_path: Path, monkeypatch) -> None:
    """``--logger.samples 2``: two samples of each logged step (every other one here) and of each evaluation, one per
    prompt, with each reward term and each plugin column: TensorBoard's Text tab, and a wandb Table (offline)."""
    import json

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from rlhf.testing.conformance import kit_rollout_samples

    monkeypatch.setenv("WANDB_MODE", "offline")  # wandb is a test dependency (the root's dev extra): never skipped
    monkeypatch.setenv("WANDB_SILENT", "true")
    host = PluginHost.load(PluginSelection.parse("trackers", strict=True))
    board = tmp_path / "tb"
    config = ppo_config(logger={"tensorboard_dir": str(board), "logging_steps": 2, "samples": 2})
    host.train_start(config, tmp_path)
    for step in (1, 2):
        host.rollout_samples(step, "train", kit_rollout_samples(step, trained=True))
        host.step_end(step, {"reward": 0.5})
    host.rollout_samples(2, "eval", kit_rollout_samples(2, trained=False))
    host.train_end(config, tmp_path, "completed")

    events = EventAccumulator(str(board), size_guidance={"tensors": 0})
    events.Reload()
    texts = {tag: [(e.step, e.tensor_proto.string_val[0].decode()) for e in events.Tensors(tag)]
             for tag in events.Tags()["tensors"]}
    [(step, text)] = texts["samples/train/text_summary"]
    assert step == 2 and "| group | prompt | response |" in text and "reward/kit_term" in text
    assert "answer 0" in text and "answer 2" in text and "answer 1" not in text and "output 2" in text
    assert [s for s, _ in texts["samples/eval/text_summary"]] == [2]

    # one train Table: step 1 is not logged
    [table_file] = (tmp_path / "wandb").glob("offline-run-*/files/media/table/samples/train_*.table.json")
    table = json.loads(table_file.read_text())
    assert table["columns"][:3] == ["group", "prompt", "response"] and "extra/kit_term/output" in table["columns"]
    assert [row[2] for row in table["data"]] == ["answer 0", "answer 2"]
    assert list((tmp_path / "wandb").glob("offline-run-*/files/media/table/samples/eval_*.table.json"))
