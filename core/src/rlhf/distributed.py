"""A trainer's ranks in its own process: the port and the variables a training backend's ``init_distributed`` joins
its group with, and the process put back as it was once the run is over. Public (docs/plugin-api.md): the
supervised trainers, the training-backend kit and the RL controller's in-process ranks use it.

A process may run more than one training run (a test, a notebook, a sweep). torch.distributed's group outlives the
run that joined it (a training backend may keep a handle on it, as DeepSpeed does), while the run's variables are
put back: a later run then joins that group as it is, with its rank variables set again.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import sys
from collections.abc import Iterator

from rlhf.errors import WorkerError

__all__ = ["GROUP_VARIABLES", "free_port", "group_environment", "restored_process"]

#: What a launcher (torchrun, the deepspeed launcher, the RL controller) sets for each rank.
GROUP_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def free_port() -> int:
    """A TCP port that is free now, e.g. for a process group's rendezvous (rank 0 binds it moments later).

    Drawn at random below the kernel's ephemeral range rather than by binding port 0: port 0 gives a port from that
    range, which every outgoing connection on the machine also draws from, and under a Ray cluster's many
    connections one of them took the port before the group's store bound it (DeepSpeed's EADDRINUSE). The draw uses
    the system's randomness: a run seeds ``random``, and two runs on one machine would otherwise draw alike."""
    low = _ephemeral_low()
    if low <= 2048:  # no room below the range: the kernel's choice it is
        with socket.socket() as sock:
            sock.bind(("", 0))
            return sock.getsockname()[1]
    draw = random.SystemRandom()
    for _ in range(100):
        port = draw.randrange(max(1024, low - 12000), low)
        with socket.socket() as sock:
            try:
                sock.bind(("", port))
            except OSError:
                continue
            return port
    raise WorkerError("no free TCP port for the ranks' rendezvous: 100 ports below the ephemeral range were taken")


def _ephemeral_low() -> int:
    """The lowest local port the kernel gives outgoing connections (Linux; elsewhere its usual default)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as handle:
            return int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def group_environment(local_rank: int = -1, *, launcher: bool = True) -> None:
    """Set :data:`GROUP_VARIABLES` for the group this process is about to join through a training backend's
    ``init_distributed``. Called once per run, in each rank's process, before ``init_distributed``.

    - This process is already in a group (an earlier run here joined it; its variables were put back): that group's
      rank and size, and a rendezvous address where none is set. Nothing connects to it: the group is joined as it
      is. DeepSpeed still asks for all five variables, else it looks for MPI.
    - Else a launcher's variables, when ``launcher`` and all of ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
      ``MASTER_PORT`` are set.
    - Else a one-rank group on a :func:`free_port`; a part of a launcher's set (a variable left by something
      else) is replaced. ``launcher=False`` (a test kit that needs one rank) takes this case rather than a
      launcher's.

    ``LOCAL_RANK`` (the device on the node): the environment's wins where ``launcher``, then ``local_rank``
    (``--local_rank``, from launchers that do not export it) where it is not negative, then 0."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        os.environ.update(RANK=str(dist.get_rank()), WORLD_SIZE=str(dist.get_world_size()))
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    elif not (launcher and all(name in os.environ for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))):
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    if not launcher:
        os.environ.pop("LOCAL_RANK", None)
    os.environ.setdefault("LOCAL_RANK", str(max(local_rank, 0)))


@contextlib.contextmanager
def restored_process() -> Iterator[None]:
    """Around a run whose ranks live in this process: afterwards the environment (the group variables, what the
    backend set for its library, such as DeepSpeed's ``DS_ACCELERATOR``), torch's thread count, its
    deterministic-algorithms switch and transformers' ZeRO-3 switch are as before, so that a later run in the same
    process, or a child it starts, begins as a new process would. ``--train.full_determinism_enable`` turns the
    determinism switch on, and a later run left with it trained 2-3x slower on CPU; a ZeRO-3 run with a frozen model
    leaves that switch on, and a later ``from_pretrained`` would build empty, partitioned weights. The process group
    stays (see the module's docstring)."""
    import torch

    environment, threads = dict(os.environ), torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    cudnn = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    zero3 = _zero3_switch()
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        # before the environment: switching determinism on sets torch inductor's cache variable
        torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn
        for key in set(os.environ) - set(environment):
            del os.environ[key]
        os.environ.update(environment)
        if not zero3 and _zero3_switch():
            from transformers.integrations.deepspeed import unset_hf_deepspeed_config

            unset_hf_deepspeed_config()


def _zero3_switch() -> bool:
    """Whether transformers loads models as ZeRO-3 partitions now (never imports transformers itself)."""
    if "transformers.integrations.deepspeed" not in sys.modules:
        return False
    return bool(sys.modules["transformers.integrations.deepspeed"].is_deepspeed_zero3_enabled())
