"""``--ckpt.best_metric_key``: the best evaluation's checkpoint, asked for through the steering hook, written apart
from the rotation by the controller's checkpoint writer, and its value carried across a resume."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import rlhf_plugin_best_checkpoint as best

from rlhf.errors import ConfigError
from rlhf.records import checkpoints as checkpoint
from rlhf.steering import Steering, SteeringView
from rlhf.testing.conformance import ppo_config

VIEW = SteeringView(prompt_datasets=("p",), prompt_weights=(1.0,), coefficients={})


def config(key: str = "", save_steps: int = 1, eval_dataset: str = "eval.jsonl") -> object:
    best.rlhf_train_end()  # each test is a run of its own
    return ppo_config(ckpt={"best_metric_key": key, "save_steps": save_steps},
                      eval={"dataset": eval_dataset, "steps": 1})


def run_evals(root: Path, evals: list[dict[str, float]], max_num: int = 2) -> list[int]:
    """As the controller does: steer, checkpoint every step (rotating), then what the plugin asked for apart."""
    saved_best = []
    for step, metrics in enumerate(evals, start=1):
        handle = Steering("best-checkpoint", VIEW)
        best.rlhf_steer(step, metrics, handle)

        def save(target: Path, keep: int, step: int = step) -> Path:
            state: dict = {}
            best.rlhf_checkpoint_save(state)
            return checkpoint.save(target, step, {"step": step, "plugins": state},
                                   lambda d: (d / "weights").write_text(str(step)), keep)

        save(root, max_num)
        if handle.checkpoint_reason is not None:
            assert handle.checkpoint_under == best.BEST_DIR and handle.checkpoint_keep == 1
            save(root / handle.checkpoint_under, handle.checkpoint_keep)
            saved_best.append(step)
    return saved_best


def test_the_best_eval_is_kept_whatever_the_rotation_removes(tmp_path: Path) -> None:
    best.rlhf_train_start(config())  # '' = the first pass@ metric
    passes = [0.25, 0.5, 0.4, 0.5, 0.75, 0.1, 0.7]
    evals = [{"eval/reward": 1.0 - p, "eval/pass4": 1.0, "eval/pass1": p} for p in passes]
    assert run_evals(tmp_path, evals) == [1, 2, 5]  # ties and drops keep the earlier best
    assert [p.name for p in (tmp_path / "best").iterdir()] == ["global_step5"]
    assert (tmp_path / "best" / "global_step5" / "weights").read_text() == "5"
    state = json.loads((tmp_path / "best" / "global_step5" / "state.json").read_text())
    assert state["plugins"]["best-checkpoint"]["value"] == 0.75
    assert [step for step, _ in checkpoint.checkpoints(tmp_path)] == [6, 7]  # rotation and resume never see best/


def test_an_explicit_key_and_a_resumed_best(tmp_path: Path) -> None:
    best.rlhf_train_start(config("eval/reward"))
    best.rlhf_checkpoint_load({"best-checkpoint": {"value": 0.6}})  # what the resumed checkpoint stored
    rewards = [random.uniform(0.0, 0.59), 0.6, 0.9, 0.8]
    assert run_evals(tmp_path, [{"eval/reward": r, "eval/pass1": 0.0} for r in rewards]) == [3]


def test_steps_without_an_evaluation_are_not_ranked(tmp_path: Path) -> None:
    best.rlhf_train_start(config())
    assert run_evals(tmp_path, [{"reward": 1.0}, {"eval/pass1": 0.2}, {"reward": 2.0}]) == [2]


def test_an_unknown_key_names_the_metrics_there_are() -> None:
    best.rlhf_train_start(config("eval_default_pass1"))
    with pytest.raises(ConfigError, match="--ckpt.best_metric_key 'eval_default_pass1'.*reports eval/pass1, eval/pass4"):
        best.rlhf_steer(1, {"eval/pass1": 0.5, "eval/pass4": 0.5, "reward": 1.0}, Steering("best-checkpoint", VIEW))


@pytest.mark.parametrize(("settings", "on"), [({"save_steps": 0}, False), ({"eval_dataset": ""}, False),
                                              ({"save_steps": 0, "key": "eval/pass1"}, True), ({}, True)])
def test_on_only_with_evaluations_and_checkpoints_or_a_key(settings: dict, on: bool) -> None:
    best.rlhf_train_start(config(**settings))
    handle = Steering("best-checkpoint", VIEW)
    best.rlhf_steer(1, {"eval/pass1": 1.0}, handle)
    assert (handle.checkpoint_reason is not None) == on


def test_steering_refuses_a_path_for_a_checkpoint_apart() -> None:
    for under in ("", "a/b", "..", "global_step3"):
        with pytest.raises(ValueError, match="one folder name"):
            Steering("p", VIEW).save_checkpoint("r", under=under)
