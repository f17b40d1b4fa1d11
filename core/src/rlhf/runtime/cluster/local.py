"""Model ranks in the controller's own process (``--train.in_process``): for a run that fits one process there
is no Ray cluster to start, no worker process that imports torch a second time, and no object-store copy of
each payload (TRL and DeepSpeed-Chat train this way).

A :class:`LocalHandle` stands where a Ray actor handle would: ``handle.method.remote(*args)`` runs the call at
once, one call at a time as a Ray actor does, and returns a :class:`Ready` that
:func:`rlhf.runtime.cluster.liveness.wait` opens, raising what the call raised as ``ray.get`` would.

The ranks may also share the controller's process with rollout engines in Ray actors of their own, where the
Ray cluster has no GPU (a GPU rank needs the device Ray gives its worker, so there the ranks stay in Ray
workers): the run then keeps one process with torch instead of two, and the ranks' calls and payloads skip
Ray. With Ray running in this process a call returns a finished Ray ``ObjectRef`` instead of a
:class:`Ready`, so that a weight-sync transport can ``ray.get`` it and hand it to the engines as it would a
Ray actor's result.
Runs in the controller.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from rlhf.console import library_output_to_run_log
from rlhf.distributed import restored_process
from rlhf.errors import ConfigError
from rlhf.runtime.cluster.host_memory import give_back_memory
from rlhf.runtime.cluster.placement import ranks_of

if TYPE_CHECKING:
    from rlhf.config.ppo import PPOConfig


class Ready:
    """The finished result (or exception) of a call to a :class:`LocalHandle`."""

    __slots__ = ("value", "error")

    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self.value, self.error = value, error

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


class LocalHandle:
    """A worker object in this process, called through the Ray handle's ``method.remote(...)`` shape.
    ``ray_refs``: its calls return finished Ray ``ObjectRef`` s, which Ray actors beside it (rollout engines)
    can be handed; else a :class:`Ready`, with no serialisation."""

    def __init__(self, worker: Any, group: str, ray_refs: bool = False) -> None:
        self.worker, self.group, self.ray_refs = worker, group, ray_refs
        self.lock = threading.Lock()  # one call at a time, as a Ray actor runs them (the async producer calls too)

    def __getattr__(self, method: str) -> _LocalMethod:
        return _LocalMethod(self, method)

    def whereabouts(self) -> dict[str, Any]:
        """What ``workers.json`` says of this rank: the controller's process."""
        return {"group": self.group, "rank": 0, "node_ip": "127.0.0.1", "pid": os.getpid(), "in_process": True,
                "log": "the controller's own (rlhf.log in the run directory)"}


class _LocalMethod:
    def __init__(self, handle: LocalHandle, name: str) -> None:
        self.handle, self.name = handle, name

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        """The call's :class:`Ready`; with ``ray_refs`` a finished ``ObjectRef`` of its result (the call's
        exception is then raised here: Ray offers no reference that raises when read)."""
        with self.handle.lock:
            if self.handle.ray_refs:  # a run without Ray never imports it
                import ray
            else:
                ray = None
            try:
                with library_output_to_run_log():  # the libraries' prints and bars, where a Ray worker's output would go
                    value = getattr(self.handle.worker, self.name)(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - raised where the caller waits, as ray.get raises it
                if ray is not None:
                    raise
                return Ready(error=exc)
            return ray.put(value) if ray is not None else Ready(value)


def ranks_in_process(config: PPOConfig, engine_in_rank: bool, *, critic: bool, reward_models: bool,
                     beside_engines: bool = False) -> bool:
    """``--train.in_process``: whether the run's model ranks live in this process. ``auto`` where the run fits one
    process; ``on`` where it does not is a :class:`ConfigError` that says why. ``beside_engines``: rollout engines
    in processes of their own do not keep the ranks out (the Ray cluster has no GPU and the weight-sync transport
    serves ranks in this process)."""
    if config.train.in_process == "off":
        return False
    why = [f"{role} has {ranks} ranks" for role, section in _model_groups(config, critic, int(reward_models > 0))
           if (ranks := ranks_of(section)) > 1]
    if not engine_in_rank and not beside_engines:
        why.insert(0, "the rollout engine runs in a process of its own (--rollout.engine, --vllm.num_engines) on a "
                      "Ray cluster with GPUs, or with a --vllm.sync_backend that needs the ranks in Ray workers")
    if address := os.environ.get("RAY_ADDRESS"):
        why.insert(0, f"RAY_ADDRESS={address} joins a Ray cluster")
    if why and config.train.in_process == "on":
        raise ConfigError(f"--train.in_process on: this run needs Ray workers: {'; '.join(why)}")
    return not why


def ray_actor_count(config: PPOConfig, in_process: bool, engine_in_rank: bool, critic: bool, reward_models: int) -> int:
    """How many Ray actors a run creates: its engine processes, and its ranks unless they live in this process."""
    engines = 0 if engine_in_rank else max(1, config.vllm.num_engines or 0)
    if in_process:
        return engines
    return engines + sum(ranks_of(section) for _, section in _model_groups(config, critic, reward_models))


def _model_groups(config: PPOConfig, critic: bool, reward_models: int) -> list[tuple[str, Any]]:
    """(role, config section) of every model group a run creates: the reference with a KL coefficient, the critic
    where the estimator needs one, one reward group per reward model."""
    groups = [("actor", config.actor)]
    if config.algo.kl.init_coef > 0:
        groups.append(("ref", config.ref))
    if critic:
        groups.append(("critic", config.critic))
    return groups + [("reward", config.reward)] * reward_models


@contextlib.contextmanager
def in_process_ranks() -> Iterator[None]:
    """Around a run whose ranks live in this process: the process as before afterwards
    (:func:`rlhf.distributed.restored_process`), and the heap's free part given back to the system."""
    try:
        with restored_process():
            yield
    finally:
        give_back_memory()
