"""``--vllm.enable_sleep``: rollout engines asleep whenever they do not generate (OpenRLHF's order).

With ``--train.colocate_all`` (or a ``--train.colocate`` set holding ``engines``) the engines share the devices
with training. With the flag:

1. every engine is put to sleep right after it is created;
2. each generation batch (training rollouts, dynamic-filtering refills, evaluation) runs as
   ``wake_up()`` → generate → ``sleep()``;
3. each weight sync runs as ``wake_up(tags=["weights"])`` → sync → ``sleep()``, so the KV cache
   and the incoming weights are never allocated together.

What sleeping frees is the engine's business (:meth:`rlhf.components.RolloutEngine.sleep`): vLLM's
level-1 sleep where its platform has one, nothing elsewhere. The calls are made in this order either
way and recorded by :class:`rlhf.runtime.rollout.engines.EngineActor` (``sleep_history``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from rlhf.runtime.cluster.liveness import wait


class SleepSchedule:
    """The controller's side: puts the engines to sleep at creation and wakes them around each phase."""

    def __init__(self, engines: list[Any], enabled: bool, asleep_from_the_start: bool = False) -> None:
        """``asleep_from_the_start``: the engines put themselves to sleep as they are built (engines in the actor's
        ranks, built by the ranks' set-up), so no first sleep is sent."""
        self.engines, self.enabled = engines, enabled
        # queued behind each engine's constructor (an actor runs one caller's calls in order); waited on first wake
        self.pending = [e.sleep.remote() for e in engines] if enabled and not asleep_from_the_start else []

    @contextlib.contextmanager
    def awake(self, tags: list[str] | None = None) -> Iterator[None]:
        """The engines awake (only ``tags`` of their memory) for the body, asleep again after it."""

        if not self.enabled:
            yield
            return
        wait(self.pending + [e.wake_up.remote(tags) for e in self.engines])
        self.pending = []
        yield  # a failing body ends the run: the engines are left as they are
        wait([e.sleep.remote() for e in self.engines])
