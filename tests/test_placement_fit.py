"""Few GPUs never hang: a run is set beside the Ray cluster's GPUs before anything waits for a placement.

The cluster (``engine_checks/declared_gpu_cluster.py``) declares one GPU on this CPU machine: placement reads
Ray's resources, not ``torch.cuda``, so the runs below ask for GPUs exactly as on a one-GPU node. The issue's
case: on one H100, ZeRO-3 and FSDP2 put the HF engine in a process of its own; the actor's placement group
took the GPU and the engine waited for another, silently, until killed.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rlhf_test_support import base_flags

from rlhf.records.metrics import read_metrics
from rlhf.runtime.cluster.capacity import Request, shortfall
from rlhf.testing.cli import assert_user_error, child_env, run_rlhf

CHECKS = Path(__file__).parent / "engine_checks"


class DeclaredGpuCluster:
    """The helper process that runs the cluster; :meth:`ask` sends it one command."""

    def __init__(self, ray_tmpdir: str, gpus: int) -> None:
        self.process = subprocess.Popen([sys.executable, str(CHECKS / "declared_gpu_cluster.py"), str(gpus)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                        env=child_env(RAY_TMPDIR=ray_tmpdir))
        self.address = self.process.stdout.readline().strip()
        assert self.address, "the cluster did not start"
        self.env = {"RAY_ADDRESS": self.address, "RAY_TMPDIR": ray_tmpdir}

    def ask(self, command: str) -> float:
        """Send ``command`` (``hold N``, ``release``); the cluster's free GPUs after it."""
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return float(self.process.stdout.readline())

    def close(self) -> None:
        self.process.stdin.close()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()


@pytest.fixture(scope="module")
def one_gpu_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DeclaredGpuCluster]:
    import shutil
    import tempfile

    ray_tmpdir = tempfile.mkdtemp(prefix="rlhf-ray-", dir="/tmp")  # Ray's socket paths must stay short
    cluster = DeclaredGpuCluster(ray_tmpdir, gpus=1)
    yield cluster
    cluster.close()
    shutil.rmtree(ray_tmpdir, ignore_errors=True)


def _grpo(tiny_causal_lm_path: Path, task_files: dict[str, Path], tmp_path: Path) -> list[str]:
    """The demo's GRPO shape, one step, one actor rank; the engine is the run's choice (``auto``)."""
    return [*base_flags(tiny_causal_lm_path, task_files["prompts"], tmp_path, "hf", steps=1),
            "--reward.remote_url", str(task_files["reward"]), "--algo.advantage.estimator", "group_norm",
            "--rollout.n_samples_per_prompt", "2", "--train.batch_size", "8", "--algo.kl.init_coef", "0"]


@pytest.mark.slow
@pytest.mark.parametrize("flags", [["--ds.zero_stage", "3"], ["--train.backend", "fsdp2"]], ids=["zero3", "fsdp2"])
def test_a_run_that_needs_two_gpus_on_one_ends_at_once_naming_the_flag_that_fits(
        flags, one_gpu_cluster, task_files, tiny_causal_lm_path, tmp_path) -> None:
    started = time.monotonic()
    result = run_rlhf("train", "ppo", *_grpo(tiny_causal_lm_path, task_files, tmp_path), *flags, env=one_gpu_cluster.env,
                      timeout=120)
    elapsed = time.monotonic() - started
    assert_user_error(result, "needs 2 GPUs", "has 1 (1 node with 1 GPU)", "actor 1 = --actor.num_nodes 1 x "
                      "--actor.num_gpus_per_node 1", "rollout engines 1 = --vllm.num_engines 0", "add --train.colocate_all")
    assert elapsed < 30, f"the refusal took {elapsed:.0f} s"
    assert one_gpu_cluster.ask("release") == 1  # the run left nothing placed


PLANS_AND_RUNS = """
import contextlib, io, json, sys
from rlhf.cli.main import main

results = []
for kind, argv in json.loads(sys.argv[2]):
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        code = main(argv)
    results.append({"kind": kind, "exit": code, "json": json.loads(shown.getvalue()) if kind == "plan" else None})
with open(sys.argv[1], "w") as out:
    json.dump(results, out)
"""


def plans_and_runs(commands: list[tuple[str, list[str]]], env: dict[str, str], result: Path) -> list[dict]:
    """``rlhf plan`` (its JSON read back) and ``rlhf train`` commands, in order, in one process: each Python start
    with torch, DeepSpeed and Ray's driver costs more than a plan."""
    completed = subprocess.run([sys.executable, "-c", PLANS_AND_RUNS, str(result), json.dumps(commands)],
                               capture_output=True, text=True, env=child_env(RLHF_NO_PROGRESS="1", HF_HUB_OFFLINE="1",
                                                                            **env), timeout=600)
    assert completed.returncode == 0, completed.stderr[-4000:]
    return json.loads(result.read_text())


@pytest.mark.slow
def test_rlhf_plan_names_the_colocation_and_the_named_flags_colocate_the_engine_on_the_one_gpu_and_train(
        one_gpu_cluster, task_files, tiny_causal_lm_path, tmp_path) -> None:
    """`rlhf plan` reads the nodes of the cluster at RAY_ADDRESS (one declared GPU): actor and engine need two, and
    the first change that fits is the hybrid engine, which puts both on the one GPU.

    Then the hybrid engine (what the refusal above says) and the finer --train.colocate actor+engines on ZeRO-3:
    the engine shares the actor's one GPU, as `rlhf plan` places it, and each run trains. The plans and runs share
    one process (a user's `rlhf` commands, each as `main` runs it)."""
    plan = ["plan", "train", "ppo", "--actor.model_name_or_path", str(tiny_causal_lm_path), "--actor.num_gpus_per_node",
            "1", "--vllm.num_engines", "1", "--algo.kl.init_coef", "0", "--algo.advantage.estimator", "reinforce",
            "--plan.gpu_memory", "80GiB", "--json"]
    commands = [("plan", plan), ("plan", [*plan, "--train.colocate_all"])]
    colocations = {"colocate_all": ["--train.colocate_all"], "finer": ["--train.colocate", "actor+engines"]}
    for name, colocation in colocations.items():
        flags = [*_grpo(tiny_causal_lm_path, task_files, tmp_path / name), "--ds.zero_stage", "3", *colocation]
        commands += [("plan", ["plan", "train", "ppo", *flags, "--plan.gpu_memory", "80GiB", "--json"]),
                     ("train", ["train", "ppo", *flags])]
    needs_two, fixed, *colocated = plans_and_runs(commands, one_gpu_cluster.env, tmp_path / "results.json")

    assert needs_two["exit"] == 1
    assert needs_two["json"]["cluster"]["nodes"] == [1.0] and "needs 2 GPUs" in needs_two["json"]["placement_problem"]
    assert needs_two["json"]["fix"] == "--train.colocate_all"
    assert fixed["exit"] == 0
    assert fixed["json"]["fits"] is True and fixed["json"]["gpus"][0]["holds"] == ["actor rank 0", "engine 0"]
    for name, (planned, trained) in zip(colocations, zip(colocated[::2], colocated[1::2])):
        assert [gpu["holds"] for gpu in planned["json"]["gpus"]] == [["actor rank 0", "engine 0"]], name
        assert trained["exit"] == 0, name
        assert [m["step"] for m in read_metrics(tmp_path / name / "out")] == [1], name


@pytest.mark.slow
def test_a_placement_group_not_placed_in_time_ends_with_one_line_naming_it(one_gpu_cluster, task_files,
                                                                           tiny_causal_lm_path, tmp_path) -> None:
    """The run fits the cluster (one rank, the engine in it), but another job holds the GPU."""
    assert one_gpu_cluster.ask("hold 1") == 0
    try:
        started = time.monotonic()
        result = run_rlhf("train", "ppo", *_grpo(tiny_causal_lm_path, task_files, tmp_path),
                          env={**one_gpu_cluster.env, "RLHF_PLACEMENT_TIMEOUT_S": "2"}, timeout=120)
        elapsed = time.monotonic() - started
    finally:
        one_gpu_cluster.ask("release")
    assert_user_error(result, "did not place actor: 1 bundle(s) of {GPU: 1}, PACK (--actor.num_nodes 1 x "
                      "--actor.num_gpus_per_node 1) within 2 s", "RLHF_PLACEMENT_TIMEOUT_S", "GPU 1, 0 free",
                      "1 node with 1 GPU", "ray status")
    assert elapsed < 30, f"the run took {elapsed:.0f} s to give up"


@pytest.mark.slow
@pytest.mark.parametrize("flags", [["--vllm.sync_backend", "nccl"], ["--ds.load_in_4bit", "--ds.lora.rank", "4"]],
                         ids=["nccl", "4-bit"])
def test_a_driver_without_cuda_leaves_the_gpu_choices_to_the_cluster_it_joins(flags, one_gpu_cluster, task_files,
                                                                              tiny_causal_lm_path, tmp_path) -> None:
    """This process has no CUDA and the cluster it joins has a GPU (a head node without GPUs): NCCL and 4-bit
    loading are the cluster's to run, so the run goes on to the placement, which a vLLM engine process beside the
    actor cannot fit, instead of refusing them for want of CUDA here."""
    result = run_rlhf("train", "ppo", *_grpo(tiny_causal_lm_path, task_files, tmp_path), "--vllm.num_engines", "1",
                      *flags, env=one_gpu_cluster.env, timeout=120)
    assert_user_error(result, "needs 2 GPUs", "has 1 (1 node with 1 GPU)", "rollout engines 1 = --vllm.num_engines 1")
    assert "CUDA" not in result.stderr


def _gpus(what: str, bundles: int, gpus: float, strategy: str = "PACK") -> Request:
    return Request(what, f"--{what}.flags", bundles, {"GPU": gpus}, strategy)


@pytest.mark.parametrize("requests,nodes,named", [
    ([_gpus("actor", 4, 1), _gpus("engines", 4, 1)], [4, 4], None),
    ([_gpus("actor", 4, 1), _gpus("engines", 1, 1)], [4], "needs 5 GPUs and the Ray cluster has 4"),
    ([_gpus("engines", 1, 2)], [1, 1], "2 GPUs on one node per bundle, and the largest node of the Ray cluster has 1"),
    ([_gpus("actor", 2, 1, "STRICT_PACK")], [1, 1], "STRICT_PACK: 2 GPUs on one node"),
    ([_gpus("actor", 2, 1, "PACK")], [1, 1], None),
    ([_gpus("actor", 3, 1, "STRICT_SPREAD")], [2, 2], "STRICT_SPREAD: 3 nodes with 1 GPU(s) each, and the Ray cluster has 2"),
    ([Request("actor", "--actor.flags", 8, {"CPU": 0.01}, "PACK")], [0], None),
], ids=["fits", "short", "tp-per-node", "strict-pack", "pack-over-nodes", "strict-spread", "cpu-bundles"])
def test_only_what_can_never_fit_is_refused(requests, nodes, named) -> None:
    problem = shortfall(requests, nodes)
    assert (problem is None) if named is None else (named in (problem or "")), problem


@pytest.mark.parametrize("ranks,engines_in_rank,nodes,named", [
    ({"actor": 1, "ref": 1}, True, [1], "add --train.colocate_actor_ref so that those groups share GPUs"),
    ({"actor": 1, "critic": 1, "reward": 1}, True, [2], "add --train.colocate_critic_reward"),
    ({"actor": 1, "ref": 1, "critic": 1, "reward": 1}, True, [2],
     "add --train.colocate_actor_ref --train.colocate_critic_reward"),
    ({"actor": 1}, False, [1], "add --train.colocate_all, OpenRLHF's hybrid engine"),
    ({"actor": 2, "ref": 1}, True, [2], "ask for fewer GPUs"),  # groups of unequal ranks cannot share bundles
    ({"actor": 8}, False, [1], "this run needs 9 GPUs"),  # the default --actor.num_gpus_per_node 8 on one GPU
], ids=["actor-ref", "critic-reward", "both", "hybrid-engine", "unequal", "default-ranks"])
def test_the_refusal_names_the_first_colocation_that_fits(ranks, engines_in_rank, nodes, named) -> None:
    from rlhf.config.ppo import PPOConfig
    from rlhf.errors import ConfigError
    from rlhf.runtime.cluster.placement import check_fits, colocated_sets, run_requests

    config = PPOConfig()
    requests = run_requests(config, config.train, ranks, colocated_sets(config.train, ranks), engines_in_rank, gpu=True)
    with pytest.raises(ConfigError, match=re.escape(named)):
        check_fits(config, ranks, engines_in_rank, nodes, requests)
