"""``--ds.enable_sleep``: a trained model's DeepSpeed states leave the device between its fits.

OpenRLHF's order: the states are offloaded once after ``deepspeed.initialize``, then every fit
runs as reload → fit → offload (``DeepSpeedEngine.offload_states`` / ``reload_states``), so the
colocated rollout engines have the device while the trained models wait. Offloaded: Adam's
moments, the fp32 master weights, the low-precision gradient partitions and the contiguous
gradient bucket. The compute weights stay, so log-prob and value forwards and weight syncs run
while asleep; checkpoint saves and loads wake the states first.

What moves where is DeepSpeed's: on a GPU the states go to (pinned) host memory. On a CPU
machine the "device" is host memory already: the states are copied into host buffers of the
same size (nothing is freed but the contiguous gradient bucket, which DeepSpeed drops and
reallocates at the next backward), and ZeRO-3 moves Adam's moments and the master weights only
for DeepSpeed's FusedAdam (a CUDA op; CPU runs use torch's Adam), so there only the gradient
states are moved. docs/scale.md has the measured memory.

Runs where the trained model lives (the actor's and critic's Ray workers).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("rlhf.deepspeed")


def offloaded_states(engine: Any) -> list[Any]:
    """The :class:`OffloadStateTypeEnum` members DeepSpeed will move for ``engine`` (OpenRLHF's set,
    less what this ZeRO stage and optimizer cannot move)."""
    from deepspeed.runtime.zero.offload_config import OffloadStateTypeEnum as State

    wanted = [State.optim_states, State.contiguous_grad_buffer, State.hp_params, State.lp_grads]
    if engine.zero_optimization_stage() == 3 and not _fused_adam(engine.optimizer.optimizer):
        wanted = [s for s in wanted if s not in (State.optim_states, State.hp_params)]
    return wanted


def _fused_adam(optimizer: Any) -> bool:
    from deepspeed.ops.adam import FusedAdam

    return type(optimizer) is FusedAdam


class SleepingStates:
    """The sleep/wake of one DeepSpeed training engine; every method is a no-op when ``enabled`` is False.

    ``enabled``: ``--ds.enable_sleep`` and not ``--ds.adam_offload`` (ZeRO-Offload already keeps the
    optimizer on the host; OpenRLHF makes it a no-op too).
    """

    def __init__(self, engine: Any, enabled: bool) -> None:
        self.engine, self.enabled, self.asleep = engine, enabled, False
        #: with sleep on, what happened in order: ("reload" | <phase> | "offload", wall-clock time.time());
        #: the wall clock lets the actor's and the critic's logs be merged into one order (same machine)
        self.history: list[tuple[str, float]] = []
        self.states = offloaded_states(engine) if enabled else []
        if enabled:
            log.info("--ds.enable_sleep: offloading %s between fits", ", ".join(s.value for s in self.states))

    def sleep(self) -> None:
        """Offload the states (after set-up and after each fit); a second call does nothing."""
        from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum

        from rlhf_plugin_deepspeed.config import on_gpu

        if not self.enabled or self.asleep:
            return
        self.engine.offload_states(include=self.states, device=OffloadDeviceEnum.cpu, pin_memory=on_gpu(),
                                   non_blocking=False)
        self.asleep = True
        self.history.append(("offload", time.time()))

    def wake(self) -> None:
        """Reload the states onto the engine's device."""
        if not self.enabled or not self.asleep:
            return
        from rlhf_plugin_deepspeed.config import on_gpu

        self.engine.reload_states(non_blocking=False)
        if on_gpu():
            import torch

            torch.cuda.synchronize()
        self.asleep = False
        self.history.append(("reload", time.time()))

    @contextlib.contextmanager
    def awake(self, phase: str) -> Iterator[None]:
        """The states on the device for the body (``phase``: a fit, a checkpoint), asleep again after, as
        they were before; with sleep on, ``phase`` is recorded in :attr:`history` when the body returns."""
        was_asleep = self.asleep
        self.wake()
        try:
            yield
            if self.enabled:
                self.history.append((phase, time.time()))
        finally:
            if was_asleep:
                self.sleep()
