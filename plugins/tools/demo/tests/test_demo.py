"""`rlhf demo` runs end to end (short) and reports what it promises: a table, a curve, models, metrics."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from rlhf_plugin_demo import task

from rlhf.testing.cli import child_env


def test_demo_task_tokenizer_and_split(tmp_path: Path) -> None:
    tokenizer = task.build_tokenizer(tmp_path / "tok")
    ids = tokenizer("47+85=")["input_ids"]
    assert ids[0] == tokenizer.bos_token_id and len(ids) == 7
    assert tokenizer.decode(ids, skip_special_tokens=True) == "47+85="
    train, held_out = task.split_problems(seed=3)
    assert len(held_out) == 200 and len(train) == 7900 and not set(train) & set(held_out)
    (tmp_path / "reward.py").write_text(task.REWARD_FILE)
    namespace: dict = {}
    exec((tmp_path / "reward.py").read_text(), namespace)
    out = namespace["reward_func"](["47+85=132</s>", "47+85=133</s>", "1+1= 2", "47+85=1321"], ["47+85=", "47+85=", "1+1=", "47+85="],
                                   ["132", "132", "2", "132"])
    assert out["rewards"] == [1.0, 0.0, 1.0, 0.0]


@pytest.mark.slow
def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    """The whole command, as short as it goes: SFT to its first accuracy probe (25 steps; target 0 is met there, where
    0.1 took up to its 120 s limit on a loaded machine), then 2 GRPO steps."""
    from rlhf.console import QUIET_LIBRARY_ENV

    env = child_env(RLHF_NO_PROGRESS="1")
    # as a user's shell has it: in-process runs of this test process set these (DeepSpeed's DS_ACCELERATOR
    # silences the warning checked below), and a child would inherit them
    for leaked in ("DS_ACCELERATOR", *QUIET_LIBRARY_ENV):
        env.pop(leaked, None)
    result = subprocess.run(
        [sys.executable, "-m", "rlhf", "demo", "--rl-steps", "2", "--run-dir", str(tmp_path), "--sft-target", "0",
         "--engine", "hf", "--rewards", "math+format", "--verbose"],
        capture_output=True, text=True, timeout=900, env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # --verbose: library warnings on the console too (tests/test_console.py: without it, only in rlhf.log)
    assert "WARNING DeepSpeed: Setting accelerator to CPU" in result.stderr, result.stderr[-3000:]
    assert "INFO ray" not in result.stderr and "Setting accelerator to CPU" in (tmp_path / "seed0" / "rlhf.log").read_text()
    assert "after SFT" in result.stdout and "after GRPO" in result.stdout
    run = tmp_path / "seed0"
    assert (run / "reward_curve.png").stat().st_size > 10_000
    assert (run / "rl" / "model.safetensors").is_file() and (run / "sft" / "model.safetensors").is_file()
    rows = [json.loads(line) for line in (run / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    assert all("reward/math_answer" in r and "reward/format" in r for r in rows)  # the packs composed
    # its samples: a table of 4 each step (of 2), each term a column; every rollout on disk, read back by the viewer
    assert "step 2 samples (4 of 256)" in result.stdout and "math_answer" in result.stdout
    shown = subprocess.run([sys.executable, "-m", "rlhf", "rollouts", "show", str(run / "rl" / "rollouts"),
                            "--sort", "reward", "--limit", "3"], capture_output=True, text=True, timeout=300, env=env)
    assert shown.returncode == 0 and "step 2, 3 of 256 samples" in shown.stdout, shown.stderr[-3000:]
