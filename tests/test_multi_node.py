"""Multi-node on a real Ray cluster, and nothing left behind after a run.

A two-node cluster on this machine (``engine_checks/two_node_cluster.py``: two raylets, each with
its own node id and 1 CPU); ``rlhf train ppo`` joins it through ``RAY_ADDRESS``, exactly as on a
real cluster after ``ray start``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rlhf_test_support import TwoNodeCluster, base_flags, crash_plugin, processes_mentioning, wait_until_none_left

from rlhf.records.metrics import read_metrics
from rlhf.testing.cli import assert_ok, child_env, run_rlhf

pytestmark = pytest.mark.slow


def _grpo(task_files: dict[str, Path]) -> list[str]:
    return ["--reward.remote_url", str(task_files["reward"]), "--algo.advantage.estimator", "group_norm",
            "--rollout.n_samples_per_prompt", "2", "--train.batch_size", "8", "--algo.kl.init_coef", "0"]


def test_actor_ranks_spread_over_two_nodes_train(task_files, tiny_causal_lm_path: Path, tmp_path: Path,
                                                 ray_tmpdir: str) -> None:
    cluster = TwoNodeCluster(ray_tmpdir)
    try:
        nodes = cluster.ask("nodes")
        assert len(set(nodes)) == 2
        flags = base_flags(tiny_causal_lm_path, task_files["prompts"], tmp_path, "hf", steps=2)
        flags += [*_grpo(task_files), "--actor.num_gpus_per_node", "2", "--train.micro_batch_size", "4", "--rollout.micro_batch_size", "4",
                  "--train.placement_strategy", "SPREAD"]
        assert_ok(run_rlhf("train", "ppo", *flags, env={"RAY_ADDRESS": cluster.address, "RAY_TMPDIR": ray_tmpdir},
                           timeout=900))
        assert [m["step"] for m in read_metrics(tmp_path / "out")] == [1, 2]
        workers = json.loads((tmp_path / "out" / "workers.json").read_text())
        actor = {w["rank"]: w["node_id"] for w in workers if w["group"] == "actor"}
        assert sorted(actor) == [0, 1] and actor[0] != actor[1]  # one rank on each node
        assert set(actor.values()) == set(nodes)
        # the HF engine generates in the actor's ranks: there is no engine process whose node to check
        assert not [w for w in workers if w["group"] == "rollout engine"]
        # the cluster stays up; the run's placement groups went with its job
        states = cluster.ask("placement_groups")
        assert states and set(states) == {"REMOVED"}
    finally:
        cluster.close()


def test_no_ray_process_of_a_failed_run_survives_its_exit(task_files, tiny_causal_lm_path: Path, tmp_path: Path,
                                                          ray_tmpdir: str) -> None:
    """A run that starts its own Ray (no RAY_ADDRESS) and fails mid-run (after step 1 of 2) leaves no raylet, GCS or
    worker behind. (A run that completes leaves none either: tests/test_console.py's run, which is such a run, with
    a vLLM engine besides, asserts it.)"""
    flags = ["--plugins", str(crash_plugin(tmp_path, 1)),
             *base_flags(tiny_causal_lm_path, task_files["prompts"], tmp_path, "hf", steps=2), *_grpo(task_files),
             "--train.in_process", "off"]  # Ray workers, whose processes are the subject
    result = run_rlhf("train", "ppo", *flags, env={"RAY_TMPDIR": ray_tmpdir}, timeout=900)
    assert result.returncode == 2 and "simulated crash after step 1" in result.stderr, result.stderr[-4000:]
    sessions = list(Path(ray_tmpdir, "ray").glob("session_2*"))
    assert len(sessions) == 1  # the run's own Ray started there, so its processes name that folder
    assert wait_until_none_left(ray_tmpdir) == []


def _niceness(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_no_ray_process_of_a_killed_run_survives(signum, task_files, tiny_causal_lm_path: Path, tmp_path: Path,
                                                 ray_tmpdir: str) -> None:
    """The driver of a running ``rlhf train ppo`` (its own local Ray) stopped mid-training: Ctrl-C (SIGINT)
    or SIGKILL (out of memory). No raylet, GCS, agent or worker of that run outlives it. SIGINT ends the run
    at once: one ``rlhf: interrupted (SIGINT)`` line naming the checkpoint to resume from, status 130. (SIGTERM
    is a preemption warning: tests/test_preemption.py.) After SIGKILL, Ray's DashboardAgent and RuntimeEnvAgent lived
    60-80 s (reporting the raylet's death to a GCS that is gone too); the run's watchdog ends them at once.
    The run's Ray workers run at normal priority (niceness 0; no RAY_worker_niceness given), where Ray's own default
    would start them at niceness 15, behind every other process on the machine."""
    out = tmp_path / "out"
    # Records the status the run ended with; after step 1 it says so and holds the driver inside its training loop,
    # so the signal lands mid-run however fast the steps are (a short run could otherwise finish before it lands).
    observer = tmp_path / "end_observer.py"
    observer.write_text("import pathlib, time\nimport rlhf\nrlhf_plugin_api = rlhf.PLUGIN_API_VERSION\n\n"
                        "@rlhf.hookimpl\ndef rlhf_step_end(step, metrics):\n"
                        "    pathlib.Path(__file__).with_suffix('.running').touch()\n    time.sleep(600)\n\n"
                        "@rlhf.hookimpl\ndef rlhf_train_end(config, run_dir, status):\n"
                        "    pathlib.Path(__file__).with_suffix('.status').write_text(status)\n")
    flags = ["--plugins", str(observer), "--ckpt.save_steps", "1",
             *base_flags(tiny_causal_lm_path, task_files["prompts"], tmp_path, "hf", steps=3), *_grpo(task_files),
             "--train.in_process", "off"]
    # faulthandler: a driver that does not end in time is stopped with SIGABRT, which prints every thread's stack
    env = child_env(HF_HUB_OFFLINE="1", RAY_TMPDIR=ray_tmpdir, PYTHONFAULTHANDLER="1")
    env.pop("RAY_worker_niceness", None)  # an in-process run in this worker may have set it: the default is the subject
    with (tmp_path / "driver.err").open("w") as err:  # with its progress bar, which must not be left half-drawn
        # Ctrl-C's default for the driver, as a terminal gives it: a suite started as a background job (`nohup … &`)
        # hands SIGINT down ignored, and Python then leaves it ignored (the run slept on through the signal)
        driver = subprocess.Popen([sys.executable, "-m", "rlhf", "train", "ppo", *flags], stdout=subprocess.DEVNULL,
                                  stderr=err, env=env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            deadline = time.monotonic() + 600
            while not observer.with_suffix(".running").exists() and driver.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)  # until step 1 is done: Ray, every worker and the engine are up and training
            assert driver.poll() is None, (tmp_path / "driver.err").read_text()[-4000:]
            running = processes_mentioning(ray_tmpdir)  # the run's raylet, GCS and workers, found by their folder
            assert any("DashboardAgent" in p for p in running), running
            workers = [int(p.split(":")[0]) for p in running if "ray::PolicyWorker" in p]
            assert workers and all(_niceness(pid) == 0 for pid in workers), running
            driver.send_signal(signum)
            try:
                returncode = driver.wait(timeout=300)
            except subprocess.TimeoutExpired:
                driver.send_signal(signal.SIGABRT)
                driver.wait(timeout=60)
                pytest.fail(f"the driver did not end within 300 s of {signum.name}; its stacks and log:\n"
                            + (tmp_path / "driver.err").read_text()[-12000:])
        finally:
            if driver.poll() is None:
                driver.kill()
    status, stderr = observer.with_suffix(".status"), (tmp_path / "driver.err").read_text()
    if signum == signal.SIGINT:  # the run unwinds, and says what there is to resume from
        assert (returncode, status.read_text()) == (128 + signum, "interrupted"), stderr[-4000:]
        assert not list(out.glob(".staging-*")) and not (out / "model.safetensors").exists()  # nothing half-written
        checkpoint = tmp_path / "ckpt" / "global_step1"
        assert stderr.count("rlhf: interrupted") == 1 and "SIGINT received" not in stderr, stderr[-4000:]
        assert stderr.rstrip("\n").split("\n")[-1] == (  # the last line, not after a half-drawn progress bar
            f"rlhf: interrupted (SIGINT); the last checkpoint is step 1 ({checkpoint}): resume with the same "
            "command and --ckpt.load_enable"), stderr[-4000:]
    else:  # nothing of the driver runs any more: Ray's head processes go with it (fate sharing), the rest with
        assert returncode == -signum and not status.exists()  # the run's watchdog
    left = wait_until_none_left(ray_tmpdir, 30)  # Ray's agents lived 60-80 s after a SIGKILL without the watchdog
    assert left == []
