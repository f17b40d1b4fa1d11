"""``scripts/slurm/train_ppo_ray.sbatch`` under a real SLURM: a one-node cluster (Debian's slurm-wlm: slurmctld,
slurmd and munge, each started here with a private config, socket and ports). The job is preempted as SLURM's
``--signal=B:USR1@N`` does (``scancel --batch --signal USR1``: the batch script alone gets it); the script forwards
the signal to the driver under ``ray job submit``, the run checkpoints and exits 75, the script requeues the job,
and the requeued job resumes and finishes where an uninterrupted run does (docs/preemption.md). The node offers two
GPUs to SLURM (device files that are not GPUs: only the count matters to SLURM here; Ray is told of none), the job
trains on as many actor ranks as SLURM gave it GPUs, and the requeued job gets one GPU instead of two."""

from __future__ import annotations

import math
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rlhf_test_support import base_flags, pause_plugin

from rlhf.distributed import free_port
from rlhf.records.metrics import read_metrics
from rlhf.testing.cli import assert_ok, child_env, run_rlhf

# scripts/install.sh installs slurm-wlm and munge where apt is available, so CI drives a real slurmctld
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not all(shutil.which(p) for p in ("slurmctld", "slurmd", "munged", "sbatch")),
                                 reason="needs Debian's slurm-wlm and munge (apt-get install slurm-wlm munge)")]

SCRIPT = Path(__file__).parents[1] / "scripts" / "slurm" / "train_ppo_ray.sbatch"

SLURM_CONF = """ClusterName=rlhf{port}
SlurmctldHost={host}
AuthType=auth/munge
AuthInfo=socket={root}/munge/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
SlurmctldPort={port}
SlurmdPort={slurmd_port}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobRequeue=1
GresTypes=gpu
NodeName={host} CPUs={cpus} Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


def _stop(pid_file: Path) -> None:
    if pid_file.exists():
        try:
            os.kill(int(pid_file.read_text().split()[0]), signal.SIGTERM)
        except (ProcessLookupError, ValueError):
            pass


@pytest.fixture
def slurm() -> Iterator[dict[str, str]]:
    """A one-node SLURM cluster of this test's own; yields the environment its commands need."""
    root = Path(tempfile.mkdtemp(prefix="slurm-", dir="/tmp"))
    for folder in ("munge", "state", "spool"):
        (root / folder).mkdir(mode=0o700)
    (root / "munge.key").write_bytes(os.urandom(1024))
    (root / "munge.key").chmod(0o400)
    conf = root / "slurm.conf"
    host = socket.gethostname().split(".")[0]
    conf.write_text(SLURM_CONF.format(root=root, host=host, port=free_port(), slurmd_port=free_port(),
                                      cpus=os.cpu_count()))
    # two "GPUs" for SLURM to count and hand out; slurmd wants character devices (a file-less GPU is dropped)
    (root / "gres.conf").write_text(f"NodeName={host} Name=gpu File=/dev/null,/dev/zero\n")
    env = child_env(SLURM_CONF=str(conf))
    try:
        subprocess.run(["munged", "--force", f"--socket={root}/munge/munge.sock", f"--key-file={root}/munge.key",
                        f"--pid-file={root}/munged.pid", f"--log-file={root}/munged.log",
                        f"--seed-file={root}/munged.seed"], check=True, env=env, timeout=60)
        subprocess.run(["slurmctld", "-f", str(conf)], check=True, env=env, timeout=60)
        subprocess.run(["slurmd", "-f", str(conf)], check=True, env=env, timeout=60)
        deadline = time.monotonic() + 60
        while "idle" not in subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True,
                                           env=env).stdout:
            assert time.monotonic() < deadline, (root / "slurmctld.log").read_text()[-3000:]
            time.sleep(0.5)
        yield env
    finally:
        for daemon in ("slurmd", "slurmctld", "munged"):
            _stop(root / f"{daemon}.pid")
        time.sleep(1)
        shutil.rmtree(root, ignore_errors=True)


def job_state(job: str, env: dict[str, str]) -> dict[str, str]:
    shown = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, env=env).stdout
    return dict(re.findall(r"(\w+)=(\S+)", shown))




def test_a_preempted_slurm_job_is_requeued_onto_fewer_gpus_and_finishes_as_an_uninterrupted_run(
        slurm, tiny_causal_lm_path, task_files, tmp_path: Path) -> None:
    def flags(run: Path, actor_ranks: str) -> list[str]:
        return [*base_flags(tiny_causal_lm_path, task_files["prompts"], run, "hf", 3),
                "--reward.remote_url", str(task_files["reward"]), "--algo.advantage.estimator", "group_norm",
                "--rollout.n_samples_per_prompt", "2", "--train.batch_size", "8", "--algo.kl.init_coef", "0",
                "--ds.zero_stage", "3", "--actor.num_gpus_per_node", actor_ranks, "--train.micro_batch_size", "4",
                "--rollout.micro_batch_size", "4", "--train.in_process", "off"]

    reference = tmp_path / "uninterrupted"
    ray_tmp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    try:
        assert_ok(run_rlhf("train", "ppo", *flags(reference, "2"), env={"RAY_TMPDIR": str(ray_tmp)}, timeout=600))
        plugin = pause_plugin(tmp_path, 2, 10)
        run = tmp_path / "slurm"
        env = {**slurm, "RLHF_VENV": str(Path(sys_prefix())), "RLHF_GPUS_PER_NODE": "0", "RAY_PORT": str(free_port()),
               "RAY_DASHBOARD_PORT": str(free_port()), "RAY_DASHBOARD_AGENT_PORT": str(free_port()), "RAY_AUTH_MODE": "disabled", "RAY_TMPDIR": str(ray_tmp),
               "RLHF_NODE_WAIT_S": "120", "HF_HUB_OFFLINE": "1", "RLHF_NO_PROGRESS": "1"}
        # as many actor ranks as SLURM gives the job GPUs: 2, and 1 after the requeue (the script's --exclusive would
        # hand the job every GPU of its node, and this cluster has one node: here the job shares it)
        job = subprocess.run(["sbatch", "--parsable", "--nodes=1", "--oversubscribe", "--gpus-per-node=2", str(SCRIPT),
                              "--plugins", str(plugin), *flags(run, "{gpus_per_node}")],
                             capture_output=True, text=True, env=env, cwd=tmp_path, check=True).stdout.strip()
        log = tmp_path / f"rlhf-ppo-{job}.log"
        deadline = time.monotonic() + 600
        while not plugin.with_suffix(".step2").exists():
            assert time.monotonic() < deadline and job_state(job, env).get("JobState") in ("PENDING", "RUNNING"), \
                log.read_text()[-4000:] if log.exists() else job_state(job, env)
            time.sleep(0.2)
        subprocess.run(["scancel", "--batch", "--signal", "USR1", job], check=True, env=env)  # as --signal=B:USR1@N
        while (state := job_state(job, env)).get("JobState") != "COMPLETED":
            assert time.monotonic() < deadline and state.get("JobState") in ("PENDING", "RUNNING", "REQUEUED",
                                                                               "COMPLETING"), log.read_text()[-4000:]
            if state.get("Reason") == "BeginTime":  # a requeued job waits a while before it may start
                # ... and here gets one GPU instead of two; then no more waiting
                subprocess.run(["scontrol", "update", f"JobId={job}", "TresPerNode=gres:gpu:1"], env=env, check=True)
                subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], env=env, capture_output=True)
            time.sleep(1)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    text = log.read_text()
    assert state.get("Restarts") == "1", state
    assert f"rlhf: preempted (SIGUSR1) at step 2: checkpoint {run / 'ckpt' / 'global_step2'} written in " in text, \
        text[-4000:]
    assert "rlhf sbatch: requeueing job" in text
    assert f"rlhf sbatch: allocation of job {job} (restart 0): 1 node(s) x 2 GPU(s)" in text
    assert f"rlhf sbatch: allocation of job {job} (restart 1): 1 node(s) x 1 GPU(s)" in text
    checkpoint = run / "ckpt" / "global_step2"
    assert f"{checkpoint} was written by another allocation (actor: 2 ranks -> 1)" in text, text[-4000:]
    assert (f"checkpoint {checkpoint / 'actor'} (written by 2 data-parallel ranks, loaded by 1): converted to "
            "DeepSpeed's universal form") in text
    assert f"--ckpt.load_enable: resumed from {checkpoint} (step 2)" in text, text[-4000:]
    expected, resumed = read_metrics(reference / "out"), read_metrics(run / "out")
    assert [m["step"] for m in resumed] == [1, 2, 3]
    for before, after in zip(expected[2:], resumed[2:]):
        for key in ("reward", "response_length", "policy_loss", "actor_lr", "group_reward_std"):  # as test_resume_anywhere
            assert math.isclose(after[key], before[key], rel_tol=1e-5, abs_tol=1e-6), (after["step"], key)


def sys_prefix() -> str:
    import sys

    return sys.prefix
