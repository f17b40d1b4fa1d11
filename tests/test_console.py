"""What a run prints: rlhf's own lines and its progress on the console, library noise in the run's rlhf.log.

(``--verbose`` putting the library lines back on the console is asserted by tests/test_demo.py's run.)
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from rlhf_test_support import base_flags, wait_until_none_left

from rlhf.testing.cli import assert_ok, child_env

GRPO = ["--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt", "2", "--train.batch_size", "8",
        "--algo.kl.init_coef", "0"]
BAR = "import sys; from rlhf.records.metrics import progress_bar\n" \
      "bar = progress_bar(40, 0, 'rl steps')\n" \
      "for i in range(40):\n    bar.set_postfix({'reward': i}, refresh=False); bar.update(1)\nbar.close()\n"


def _bar_to_pipe(interval: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", BAR], capture_output=True, text=True, timeout=60,
                          env=child_env(RLHF_PROGRESS_INTERVAL_S=interval))
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr  # no redraws in a pipe
    return done.stderr.splitlines()


def test_progress_into_a_pipe_is_plain_lines_at_the_interval() -> None:
    every_step = _bar_to_pipe("0")
    assert every_step[0].startswith("rl steps: 0/40 (0 %)")
    assert [int(re.match(r"rl steps: (\d+)/40", line).group(1)) for line in every_step] == list(range(41))
    assert every_step[-1].endswith("reward=39]")
    # an interval longer than the run: the first line and the last, nothing between
    assert [line.split(" [")[0] for line in _bar_to_pipe("3600")] == ["rl steps: 0/40 (0 %)", "rl steps: 40/40 (100 %)"]


#: what rlhf itself writes to stderr: its progress, its log records, its error lines
RLHF_LINE = re.compile(r"^(rl steps: \d+/\d+ |(DEBUG|INFO|WARNING|ERROR|CRITICAL) rlhf[.:]|rlhf: )")


@pytest.mark.slow
def test_a_run_prints_only_its_own_lines_and_logs_the_libraries(tiny_causal_lm_path, task_files, tmp_path,
                                                                ray_tmpdir) -> None:
    """A completed ``rlhf train ppo`` with a vLLM engine: only rlhf's lines on the console, the libraries' in
    rlhf.log. The same run is tests/test_multi_node.py's completed run: it started its own Ray (no RAY_ADDRESS), and no
    raylet, GCS or worker of it (nor the engine's processes) is left behind."""
    flags = base_flags(tiny_causal_lm_path, task_files["prompts"], tmp_path, "vllm", 2)
    done = subprocess.run([sys.executable, "-m", "rlhf", "train", "ppo", *flags, "--reward.remote_url",
                           str(task_files["reward"]), *GRPO], capture_output=True, text=True, timeout=600,
                          env=child_env(HF_HUB_OFFLINE="1", RLHF_PROGRESS_INTERVAL_S="0", RAY_TMPDIR=ray_tmpdir))
    assert_ok(done)
    assert "\r" not in done.stderr
    foreign = [line for line in done.stderr.splitlines() if not RLHF_LINE.match(line)]
    assert not foreign, "\n".join(foreign)
    assert re.search(r"^rl steps: 2/2 \(100 %\)", done.stderr, re.MULTILINE), done.stderr
    log = (tmp_path / "out" / "rlhf.log").read_text()
    for noise in ("Setting accelerator to CPU",  # DeepSpeed, in the driver and the policy worker
                  "Started a local Ray instance",  # Ray's driver logger
                  "FutureWarning: `torch.distributed.reduce_op`",  # a Python warning in the vLLM engine's worker
                  "NUMA binding",  # torch's C++ warning in that worker
                  "vllm.config"):  # vLLM's own log records
        assert noise in log, noise
    sessions = list(Path(ray_tmpdir, "ray").glob("session_2*"))
    assert len(sessions) == 1  # the run's own Ray started there, so its processes name that folder
    assert wait_until_none_left(ray_tmpdir) == []


@pytest.mark.slow
def test_library_prints_of_ranks_in_the_controllers_process_stay_in_the_run_log(tiny_causal_lm_path, task_files,
                                                                                 tmp_path) -> None:
    """The ranks in the CLI's own process (--train.in_process on, no Ray worker to hold their stdout): DeepSpeed's
    bf16 wrapper of the reference model prints its memory report with print(); it lands in rlhf.log, not on the
    console."""
    flags = base_flags(tiny_causal_lm_path, task_files["prompts"], tmp_path, "hf", 1)
    done = subprocess.run([sys.executable, "-m", "rlhf", "train", "ppo", *flags, "--reward.remote_url",
                           str(task_files["reward"]), *GRPO[:-2], "--algo.kl.init_coef", "0.01", "--train.in_process", "on",
                           "--ds.param_dtype", "bf16"],
                          capture_output=True, text=True, timeout=600, env=child_env(RLHF_PROGRESS_INTERVAL_S="0"))
    assert_ok(done)
    foreign = [line for line in (done.stdout + done.stderr).splitlines() if not RLHF_LINE.match(line)]
    assert not foreign, "\n".join(foreign)
    log = (tmp_path / "out" / "rlhf.log").read_text()
    assert "begin bf16_optimizer" in log and "CPU Virtual Memory" in log  # DeepSpeed's print()s, kept
