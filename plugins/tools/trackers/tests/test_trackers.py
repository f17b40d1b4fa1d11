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
