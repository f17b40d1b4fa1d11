"""A process or node of the run lost without warning ends it with one line naming what died, where, and the checkpoint
to resume from, never "internal error" (docs/preemption.md, docs/errors.md). The actor rank's Ray worker killed
mid-run: tests/test_user_errors.py (test_a_dead_ray_worker_is_named_by_group_and_rank, and inside a weight sync)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rlhf_test_support import TwoNodeCluster, base_flags, pause_plugin, processes_mentioning, wait_until_none_left

from rlhf.testing.cli import child_env

pytestmark = pytest.mark.slow

# In the controller's process (where the actor's rank lives beside the engine process), the second weight
# sync's broadcast says so and pauses before it sends, so that the test kills the engine process in the middle
# of the sync: the rank's gloo broadcast then fails with "Connection closed by peer" before Ray knows the engine died.
PAUSES_IN_SYNC = """
import pathlib, time
import rlhf
rlhf_plugin_api = rlhf.PLUGIN_API_VERSION
MARK = pathlib.Path(__file__).with_suffix(".syncing")

@rlhf.hookimpl
def rlhf_train_start(config, run_dir):
    from rlhf_plugin_torch_sync.broadcast import BroadcastGroup

    send, calls = BroadcastGroup.broadcast, []

    def paused(self, tensor):
        calls.append(1)
        if len(calls) == 2:
            MARK.touch()
            time.sleep(3)
        return send(self, tensor)

    BroadcastGroup.broadcast = paused
"""


def test_a_vllm_engine_killed_during_a_weight_sync_is_named_with_the_checkpoint(tiny_causal_lm_path: Path, task_files,
                                                                              tmp_path: Path, ray_tmpdir: str) -> None:
    plugin = tmp_path / "pauses_in_sync.py"
    plugin.write_text(PAUSES_IN_SYNC)
    flags = [*base_flags(tiny_causal_lm_path, task_files["prompts"], tmp_path, "hf", 3), "--vllm.num_engines", "1",
             "--vllm.sync_backend", "gloo", "--reward.remote_url", str(task_files["reward"]),
             "--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt", "2", "--train.batch_size", "8",
             "--algo.kl.init_coef", "0", "--ckpt.save_steps", "1"]
    driver = subprocess.Popen([sys.executable, "-m", "rlhf", "--plugins", str(plugin), "train", "ppo", *flags],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              env=child_env(RLHF_NO_PROGRESS="1", HF_HUB_OFFLINE="1", RAY_TMPDIR=ray_tmpdir))
    try:
        deadline = time.monotonic() + 600
        while not plugin.with_suffix(".syncing").exists() and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        engines = [int(p.split(":")[0]) for p in processes_mentioning(ray_tmpdir) if "EngineActor" in p]
        assert driver.poll() is None and len(engines) == 1, (engines, driver.poll())
        import os

        os.kill(engines[0], signal.SIGKILL)
        killed = time.monotonic()
        _, stderr = driver.communicate(timeout=300)
        took = time.monotonic() - killed
    finally:
        if driver.poll() is None:
            driver.kill()
    lines = [line for line in stderr.splitlines() if line.startswith("rlhf: ")]
    assert driver.returncode == 2 and len(lines) == 1, stderr[-4000:]
    line = lines[0]
    assert line.startswith(f"rlhf: error: Ray worker 'rollout engine' rank 0 (pid {engines[0]}) on node "), line
    assert line.endswith(f"resume from step 1 ({tmp_path / 'ckpt' / 'global_step1'}) with the same command and "
                         "--ckpt.load_enable"), line
    assert "internal error" not in stderr and took < 60, (took, stderr[-4000:])
    assert wait_until_none_left(ray_tmpdir) == []




def test_a_lost_node_is_named_with_the_checkpoint(tiny_causal_lm_path: Path, task_files, tmp_path: Path,
                                                  ray_tmpdir: str) -> None:
    """A two-node cluster, the actor's two ranks spread over both; after step 1 the second node's raylet and every
    process of it are killed (a machine lost without warning). The run ends with one line naming the dead rank,
    its node and the checkpoint to resume from, well within the time Ray takes to declare the node dead."""
    cluster = TwoNodeCluster(ray_tmpdir)
    try:
        plugin = pause_plugin(tmp_path, 1, 3)
        flags = [*base_flags(tiny_causal_lm_path, task_files["prompts"], tmp_path, "hf", 3),
                 "--reward.remote_url", str(task_files["reward"]), "--algo.advantage.estimator", "group_norm",
                 "--rollout.n_samples_per_prompt", "2", "--train.batch_size", "8", "--algo.kl.init_coef", "0",
                 "--ckpt.save_steps", "1", "--actor.num_gpus_per_node", "2", "--train.micro_batch_size", "4",
                 "--rollout.micro_batch_size", "4", "--train.placement_strategy", "SPREAD"]
        driver = subprocess.Popen([sys.executable, "-m", "rlhf", "--plugins", str(plugin), "train", "ppo", *flags],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  env=child_env(RLHF_NO_PROGRESS="1", HF_HUB_OFFLINE="1", RAY_TMPDIR=ray_tmpdir,
                                                RAY_ADDRESS=cluster.address))
        try:
            deadline = time.monotonic() + 600
            while not plugin.with_suffix(".step1").exists() and driver.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            (head,) = cluster.ask("head")
            workers = json.loads((tmp_path / "out" / "workers.json").read_text())
            lost = next(w for w in workers if w["group"] == "actor" and w["node_id"] != head)
            cluster.ask(f"kill {lost['node_id']}")
            killed = time.monotonic()
            _, stderr = driver.communicate(timeout=300)
            took = time.monotonic() - killed
        finally:
            if driver.poll() is None:
                driver.kill()
    finally:
        cluster.close()
    lines = [line for line in stderr.splitlines() if line.startswith("rlhf: ")]
    assert driver.returncode == 2 and len(lines) == 1, stderr[-4000:]
    line = lines[0]
    assert line.startswith(f"rlhf: error: Ray worker 'actor' rank {lost['rank']} "), line
    assert f"({lost['node_id'][:12]}) is lost with its node: the node's raylet is gone" in line, line
    assert "internal error" not in stderr, stderr[-4000:]
    assert line.endswith(f"resume from step 1 ({tmp_path / 'ckpt' / 'global_step1'}) with the same command and "
                         "--ckpt.load_enable"), line
    assert took < 90, took
