"""``--ckpt.best_metric_key``: the best evaluation's checkpoint, kept apart from the rotation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhf.errors import ConfigError
from rlhf.records import checkpoints as checkpoint
from rlhf.records.best_checkpoint import BestCheckpoint


def run_evals(root: Path, best: BestCheckpoint, evals: list[dict[str, float]], max_num: int = 2) -> list[int]:
    """Checkpoint every step (rotating) and offer each eval, as the controller does; the steps that became the best."""
    saved_best = []
    for step, metrics in enumerate(evals, start=1):
        def save(target: Path, keep: int, step: int = step) -> Path:
            state = {"step": step, "best_metric": best.value}
            return checkpoint.save(target, step, state, lambda d: (d / "weights").write_text(str(step)), keep)

        checkpoint.save(root, step, {"step": step}, lambda d, step=step: (d / "weights").write_text(str(step)), max_num)
        if best.offer(step, metrics, save) is not None:
            saved_best.append(step)
    return saved_best


def test_the_best_eval_is_kept_whatever_the_rotation_removes(tmp_path: Path) -> None:
    best = BestCheckpoint("", tmp_path, enabled=True)  # '' = the first pass@ metric
    passes = [0.25, 0.5, 0.4, 0.5, 0.75, 0.1, 0.7]
    evals = [{"eval/reward": 1.0 - p, "eval/pass4": 1.0, "eval/pass1": p} for p in passes]
    assert run_evals(tmp_path, best, evals) == [1, 2, 5]  # ties and drops keep the earlier best
    assert [p.name for p in (tmp_path / "best").iterdir()] == ["global_step5"]
    assert (tmp_path / "best" / "global_step5" / "weights").read_text() == "5"
    assert json.loads((tmp_path / "best" / "global_step5" / "state.json").read_text())["best_metric"] == 0.75
    assert [step for step, _ in checkpoint.checkpoints(tmp_path)] == [6, 7]  # rotation and resume never see best/


def test_an_explicit_key_and_a_resumed_best(tmp_path: Path) -> None:
    best = BestCheckpoint("eval/reward", tmp_path, enabled=True)
    best.value = 0.6  # restored from the resumed checkpoint's state.json
    evals = [{"eval/reward": r, "eval/pass1": 0.0} for r in (0.5, 0.6, 0.9, 0.8)]
    assert run_evals(tmp_path, best, evals) == [3]


def test_an_unknown_key_names_the_metrics_there_are(tmp_path: Path) -> None:
    best = BestCheckpoint("eval_default_pass1", tmp_path, enabled=True)
    with pytest.raises(ConfigError, match="--ckpt.best_metric_key 'eval_default_pass1'.*reports eval/pass1, eval/pass4"):
        best.offer(1, {"eval/pass1": 0.5, "eval/pass4": 0.5, "reward": 1.0}, lambda root, keep: root)


def test_off_without_evaluations_or_checkpoints(tmp_path: Path) -> None:
    from rlhf.config.ppo import PPOConfig

    config = PPOConfig()
    assert not BestCheckpoint.from_config(config).enabled
    config.eval.dataset, config.eval.steps = "eval.jsonl", 2
    assert not BestCheckpoint.from_config(config).enabled  # evaluations, but no checkpoints asked for
    config.ckpt.save_steps = 10
    assert BestCheckpoint.from_config(config).enabled
    assert BestCheckpoint("", tmp_path, enabled=False).offer(1, {"eval/pass1": 1.0}, lambda root, keep: root) is None
