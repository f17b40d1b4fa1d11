"""``rlhf.distributed``: the rendezvous port, the group variables a run joins with, and the process put back after a
run whose ranks lived in it."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys

import pytest
import torch

from rlhf.distributed import GROUP_VARIABLES, _ephemeral_low, free_port, restored_process
from rlhf.models.loading import seed_process


def test_the_port_is_free_and_below_the_range_outgoing_connections_draw_from() -> None:
    low = _ephemeral_low()
    for _ in range(20):
        port = free_port()
        assert 1024 <= port < low  # an outgoing connection's local port can never take it
        with socket.socket() as sock:
            sock.bind(("", port))  # and nothing holds it


def test_runs_seeded_alike_draw_different_ports() -> None:
    """A run seeds Python's ``random``; two runs with one seed on one machine must not rendezvous on one port."""
    ports = set()
    for _ in range(5):
        random.seed(0)
        ports.add(free_port())
    assert len(ports) > 1


# Each case in a new process: whether this one is in a group depends on the tests that ran in it before.
_CASES = r"""
import json, os, sys
import torch.distributed as dist
from rlhf.distributed import GROUP_VARIABLES, group_environment

def case(before, **kwargs):
    for name in GROUP_VARIABLES:
        os.environ.pop(name, None)
    os.environ.update(before)
    group_environment(**kwargs)
    return {name: os.environ.get(name) for name in GROUP_VARIABLES}

launcher = dict(RANK="3", WORLD_SIZE="4", LOCAL_RANK="1", MASTER_ADDR="10.0.0.2", MASTER_PORT="29500")
out = {
    "nothing set": case({}),
    "--local_rank 1": case({}, local_rank=1),
    "a launcher's": case(launcher),
    "a launcher's, not wanted": case(launcher, launcher=False),
    "a leftover RANK": case({"RANK": "0", "LOCAL_RANK": "0"}),
}
# an earlier run here joined a one-rank group and put its variables back; what it left is a RANK of its own
case({})
dist.init_process_group("gloo")
out["in a group"] = case({"RANK": "0"})
print(json.dumps(out))
"""


def test_a_run_joins_with_a_launchers_variables_its_own_one_rank_group_or_the_group_this_process_is_in() -> None:
    """The CI failure this covers: an in-process FSDP2 run left a group and a RANK without MASTER_ADDR, and the next
    in-process DeepSpeed run took that RANK for a launcher's; DeepSpeed found no MASTER_ADDR and looked for mpi4py."""
    env = {k: v for k, v in os.environ.items() if k not in GROUP_VARIABLES}
    result = subprocess.run([sys.executable, "-c", _CASES], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.splitlines()[-1])
    low = _ephemeral_low()
    for name in ("nothing set", "--local_rank 1", "a launcher's, not wanted", "a leftover RANK"):
        variables = out[name]
        assert (variables["RANK"], variables["WORLD_SIZE"], variables["MASTER_ADDR"]) == ("0", "1", "127.0.0.1"), name
        assert 1024 <= int(variables["MASTER_PORT"]) < low, name
    assert out["nothing set"]["LOCAL_RANK"] == out["a leftover RANK"]["LOCAL_RANK"] == "0"
    assert out["--local_rank 1"]["LOCAL_RANK"] == "1"
    assert out["a launcher's, not wanted"]["LOCAL_RANK"] == "0"  # the launcher's device went with its group
    assert out["a launcher's"] == dict(RANK="3", WORLD_SIZE="4", LOCAL_RANK="1", MASTER_ADDR="10.0.0.2",
                                       MASTER_PORT="29500")
    grouped = out["in a group"]
    assert (grouped["RANK"], grouped["WORLD_SIZE"], grouped["LOCAL_RANK"]) == ("0", "1", "0")
    # all five: DeepSpeed's init_distributed looks for MPI (and asks for mpi4py) when one is missing
    assert grouped["MASTER_ADDR"] and grouped["MASTER_PORT"]


@pytest.mark.parametrize("before", [False, True], ids=["off-before", "on-before"])
def test_the_environment_threads_and_determinism_are_restored(before: bool, monkeypatch) -> None:
    monkeypatch.setenv("RLHF_TEST_KEPT", "as before")
    torch.use_deterministic_algorithms(before)  # its first call sets torch inductor's cache variable
    environment, threads = dict(os.environ), torch.get_num_threads()  # an earlier in-process run may have left RANK
    try:
        with restored_process():
            seed_process(0, full_determinism=True)  # what --train.full_determinism_enable does on a rank
            os.environ.update(RANK="7", RLHF_TEST_ADDED="by the run", RLHF_TEST_KEPT="changed")
            torch.set_num_threads(1)
            assert torch.are_deterministic_algorithms_enabled()
        assert torch.are_deterministic_algorithms_enabled() is before
        assert dict(os.environ) == environment  # transformers.enable_full_determinism's variables too
        assert torch.get_num_threads() == threads
    finally:
        torch.use_deterministic_algorithms(False)


def test_transformers_zero3_switch_is_off_again() -> None:
    """A ZeRO-3 run with a frozen model leaves transformers loading every later model as empty partitions."""
    pytest.importorskip("deepspeed")
    from transformers.integrations.deepspeed import HfDeepSpeedConfig, is_deepspeed_zero3_enabled

    assert not is_deepspeed_zero3_enabled()
    with restored_process():
        switch = HfDeepSpeedConfig({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1})
        assert is_deepspeed_zero3_enabled()
    assert not is_deepspeed_zero3_enabled()
    del switch
