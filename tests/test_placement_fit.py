"""Few GPUs never hang: a run is set beside the Ray cluster's GPUs before anything waits for a placement.

The cluster (``engine_checks/declared_gpu_cluster.py``) declares one GPU on this CPU machine: placement reads
Ray's resources, not ``torch.cuda``, so the runs below ask for GPUs exactly as on a one-GPU node. The issue's
case: on one H100, ZeRO-3 and FSDP2 put the HF engine in a process of its own; the actor's placement group
took the GPU and the engine waited for another, silently, until killed.

The runs are a user's ``rlhf`` commands with RAY_ADDRESS set, in one process of their own that stays up for the
module (:class:`RlhfCommands`): each reports its exit status, all of its stderr and its seconds, as a child would.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from rlhf_test_support import base_flags, end_stdin_server

from rlhf.records.metrics import read_metrics
from rlhf.runtime.cluster.capacity import Request, shortfall
from rlhf.testing.cli import assert_user_error, child_env

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
        end_stdin_server(self.process, timeout=60)


@pytest.fixture(scope="module")
def one_gpu_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DeclaredGpuCluster]:
    import shutil
    import tempfile

    ray_tmpdir = tempfile.mkdtemp(prefix="rlhf-ray-", dir="/tmp")  # Ray's socket paths must stay short
    cluster = DeclaredGpuCluster(ray_tmpdir, gpus=1)
    yield cluster
    cluster.close()
    shutil.rmtree(ray_tmpdir, ignore_errors=True)


#: the process of :class:`RlhfCommands`: a JSON request per stdin line, a JSON reply per line on its first stdout
RLHF_COMMANDS = """
import contextlib, io, json, os, sys, tempfile, time, traceback
from rlhf.cli.main import main
from rlhf.distributed import restored_process

replies = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)  # whatever else writes to stdout (a library, Ray's log lines) stays out of the replies
for line in sys.stdin:
    request = json.loads(line)
    with restored_process():  # each command leaves the process as a child of its own would
        os.environ.update(request["env"])
        shown = io.StringIO()
        with tempfile.TemporaryFile("w+") as said:
            sys.stderr.flush()
            console = os.dup(2)
            os.dup2(said.fileno(), 2)  # all of the command's stderr, as a child's would be captured
            started = time.monotonic()
            try:
                with contextlib.redirect_stdout(shown):
                    code = main(request["argv"])
            except BaseException:  # a reply all the same: the test shows it
                traceback.print_exc()
                code = -1
            seconds = time.monotonic() - started
            sys.stderr.flush()
            os.dup2(console, 2)
            os.close(console)
            said.seek(0)
            stderr = said.read()
    replies.write(json.dumps({"exit": code, "stdout": shown.getvalue(), "stderr": stderr, "seconds": seconds}) + "\\n")
    replies.flush()
"""


class RlhfCommands:
    """A user's ``rlhf`` commands against the cluster, one after another, each as ``main`` runs it, in one process
    that stays up: each Python start with torch, DeepSpeed and Ray's driver costs more than a refused run or a plan.
    Each command's exit status and stderr are all of it, as a child of its own would report them."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log = log.open("w")  # the driver's own stderr, outside any command (read when it dies)
        self.process = subprocess.Popen([sys.executable, "-c", RLHF_COMMANDS], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self.log, text=True,
                                        env=child_env(RLHF_NO_PROGRESS="1", HF_HUB_OFFLINE="1", **env))
        self.log_path = log

    def __call__(self, *argv: str, env: dict[str, str] | None = None,
                 timeout: float = 600) -> tuple[subprocess.CompletedProcess[str], float]:
        """``rlhf ARGV`` with ``env`` set for it: what it reported, and the seconds it took."""
        import select

        self.process.stdin.write(json.dumps({"argv": list(argv), "env": env or {}}) + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        if not ready:  # its late reply would answer the next command
            self.process.kill()
        line = self.process.stdout.readline() if ready else ""
        assert line, f"no reply within {timeout:.0f} s: {self.log_path.read_text()[-4000:]}"
        reply = json.loads(line)
        assert reply["exit"] != -1, reply["stderr"][-4000:]
        return subprocess.CompletedProcess(list(argv), reply["exit"], reply["stdout"], reply["stderr"]), reply["seconds"]

    def close(self) -> None:
        end_stdin_server(self.process, timeout=60)
        self.log.close()


@pytest.fixture(scope="module")
def rlhf_on_one_gpu(one_gpu_cluster: DeclaredGpuCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RlhfCommands]:
    """``rlhf`` commands of a user whose RAY_ADDRESS is the one-GPU cluster."""
    commands = RlhfCommands(one_gpu_cluster.env, tmp_path_factory.mktemp("rlhf-commands") / "driver.log")
    yield commands
    commands.close()


def _grpo(tiny_causal_lm_path: Path, task_files: dict[str, Path], tmp_path: Path) -> list[str]:
    """The demo's GRPO shape, one step, one actor rank; the engine is the run's choice (``auto``)."""
    return [*base_flags(tiny_causal_lm_path, task_files["prompts"], tmp_path, "hf", steps=1),
            "--reward.remote_url", str(task_files["reward"]), "--algo.advantage.estimator", "group_norm",
            "--rollout.n_samples_per_prompt", "2", "--train.batch_size", "8", "--algo.kl.init_coef", "0"]


@pytest.mark.slow
@pytest.mark.parametrize("flags", [["--ds.zero_stage", "3"], ["--train.backend", "fsdp2"]], ids=["zero3", "fsdp2"])
def test_a_run_with_an_engine_process_that_needs_two_gpus_on_one_ends_at_once_naming_the_flag_that_fits(
        flags, one_gpu_cluster, rlhf_on_one_gpu, task_files, tiny_causal_lm_path, tmp_path) -> None:
    result, seconds = rlhf_on_one_gpu("train", "ppo", *_grpo(tiny_causal_lm_path, task_files, tmp_path), *flags,
                                      "--rollout.engine", "hf", timeout=120)  # auto would generate in the actor's rank
    assert_user_error(result, "needs 2 GPUs", "has 1 (1 node with 1 GPU)", "actor 1 = --actor.num_nodes 1 x "
                      "--actor.num_gpus_per_node 1", "rollout engines 1 = --vllm.num_engines 0", "add --train.colocate_all")
    assert seconds < 30, f"the refusal took {seconds:.0f} s"
    assert one_gpu_cluster.ask("release") == 1  # the run left nothing placed
    # without the engine process (auto: HF generate in the actor's rank, on its shards) the run needs the one GPU
    planned, _ = rlhf_on_one_gpu("plan", "train", "ppo", *_grpo(tiny_causal_lm_path, task_files, tmp_path), *flags,
                                 "--plan.gpu_memory", "80GiB", "--json")
    assert planned.returncode == 0, planned.stderr[-4000:]
    assert [gpu["holds"] for gpu in json.loads(planned.stdout)["gpus"]] == [["actor rank 0", "engine in actor rank 0"]]


@pytest.mark.slow
def test_rlhf_plan_names_the_colocation_and_the_named_flags_colocate_the_engine_on_the_one_gpu_and_train(
        rlhf_on_one_gpu, task_files, tiny_causal_lm_path, tmp_path) -> None:
    """`rlhf plan` reads the nodes of the cluster at RAY_ADDRESS (one declared GPU): actor and engine need two, and
    the first change that fits is the hybrid engine, which puts both on the one GPU.

    Then the hybrid engine (what the refusal above says) and the finer --train.colocate actor+engines on ZeRO-3:
    the engine shares the actor's one GPU, as `rlhf plan` places it, and each run trains."""
    def plan(*argv: str) -> tuple[int, dict]:
        result, _ = rlhf_on_one_gpu("plan", *argv, "--plan.gpu_memory", "80GiB", "--json")
        return result.returncode, json.loads(result.stdout)

    flags = ["train", "ppo", "--actor.model_name_or_path", str(tiny_causal_lm_path), "--actor.num_gpus_per_node", "1",
             "--vllm.num_engines", "1", "--algo.kl.init_coef", "0", "--algo.advantage.estimator", "reinforce"]
    needs_two, fixed = plan(*flags), plan(*flags, "--train.colocate_all")
    assert needs_two[0] == 1
    assert needs_two[1]["cluster"]["nodes"] == [1.0] and "needs 2 GPUs" in needs_two[1]["placement_problem"]
    assert needs_two[1]["fix"] == "--train.colocate_all"
    assert fixed[0] == 0
    assert fixed[1]["fits"] is True and fixed[1]["gpus"][0]["holds"] == ["actor rank 0", "engine 0"]
    for name, colocation in {"colocate_all": ["--train.colocate_all"], "finer": ["--train.colocate", "actor+engines"]}.items():
        run = [*_grpo(tiny_causal_lm_path, task_files, tmp_path / name), "--ds.zero_stage", "3", "--rollout.engine", "hf",
               *colocation]
        _, planned = plan("train", "ppo", *run)
        assert [gpu["holds"] for gpu in planned["gpus"]] == [["actor rank 0", "engine 0"]], name
        trained, _ = rlhf_on_one_gpu("train", "ppo", *run)
        assert trained.returncode == 0, (name, trained.stderr[-4000:])
        assert [m["step"] for m in read_metrics(tmp_path / name / "out")] == [1], name


@pytest.mark.slow
def test_a_placement_group_not_placed_in_time_ends_with_one_line_naming_it(one_gpu_cluster, rlhf_on_one_gpu, task_files,
                                                                           tiny_causal_lm_path, tmp_path) -> None:
    """The run fits the cluster (one rank, the engine in it), but another job holds the GPU."""
    assert one_gpu_cluster.ask("hold 1") == 0
    try:
        result, seconds = rlhf_on_one_gpu("train", "ppo", *_grpo(tiny_causal_lm_path, task_files, tmp_path),
                                          env={"RLHF_PLACEMENT_TIMEOUT_S": "2"}, timeout=120)
    finally:
        one_gpu_cluster.ask("release")
    assert_user_error(result, "did not place actor: 1 bundle(s) of {GPU: 1}, PACK (--actor.num_nodes 1 x "
                      "--actor.num_gpus_per_node 1) within 2 s", "RLHF_PLACEMENT_TIMEOUT_S", "GPU 1, 0 free",
                      "1 node with 1 GPU", "ray status")
    assert seconds < 30, f"the run took {seconds:.0f} s to give up"


@pytest.mark.slow
@pytest.mark.parametrize("flags", [["--vllm.sync_backend", "nccl"], ["--ds.load_in_4bit", "--ds.lora.rank", "4"]],
                         ids=["nccl", "4-bit"])
def test_a_driver_without_cuda_leaves_the_gpu_choices_to_the_cluster_it_joins(flags, rlhf_on_one_gpu, task_files,
                                                                              tiny_causal_lm_path, tmp_path) -> None:
    """This process has no CUDA and the cluster it joins has a GPU (a head node without GPUs): NCCL and 4-bit
    loading are the cluster's to run, so the run goes on to the placement, which a vLLM engine process beside the
    actor cannot fit, instead of refusing them for want of CUDA here."""
    result, _ = rlhf_on_one_gpu("train", "ppo", *_grpo(tiny_causal_lm_path, task_files, tmp_path), "--vllm.num_engines",
                                "1", *flags, timeout=120)
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
