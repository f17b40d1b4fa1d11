"""Preemption: a signal that means "checkpoint, then stop" (docs/preemption.md).

SLURM (``#SBATCH --signal=B:USR1@N``, forwarded by the batch script), Kubernetes (SIGTERM, then SIGKILL
after ``terminationGracePeriodSeconds``) and spot VMs warn a job before they take its node. The CLI of
``rlhf train`` calls :func:`watch` with ``--ckpt.preemption_signals`` (default SIGTERM and SIGUSR1) and
``--ckpt.preemption_budget`` (seconds). When one of those signals arrives:

* after the run finished at least one step: the step in flight finishes, a checkpoint of it is written
  in the format of a periodic one under ``--ckpt.path`` (whatever ``--ckpt.save_steps`` says), and the
  run ends with one ``rlhf: preempted`` line naming it and status :data:`~rlhf.errors.PREEMPTED_EXIT`;
* before the first step of this run finished: the run stops at once and writes nothing (one
  ``rlhf: interrupted`` line says so);
* a second signal, or the budget running out, stops at once: the checkpoint being written is removed
  before it gets its final name, and the ``rlhf: interrupted`` line names the previous one.

Why the step in flight is finished rather than abandoned: a step boundary is the only point where every
part of the run (optimizer states, data position, KL controller, plugin states, the engines' weights)
is consistent, so a checkpoint there resumes exactly as a periodic one does. Abandoning would need a
second copy of the last finished step's states (ZeRO shards, optimizer moments) or an undone optimizer step.

A trainer takes part by calling :func:`step_done` after each step; one that does not is stopped at
once by the signal, as before. Signals reach the main thread only, so the handlers run there; a warning
that is no signal (Ray draining a node of the run, :mod:`rlhf.runtime.cluster.draining`) comes from
another thread through :func:`warn`.
"""

from __future__ import annotations

import _thread
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhf.errors import ConfigError, Preempted
from rlhf.records.checkpoints import how_to_resume

__all__ = ["Notice", "first_signal", "parse_signals", "pending", "step_done", "stopped_because", "warn", "watch",
           "watched_signals"]

log = logging.getLogger("rlhf.preemption")


@dataclass(frozen=True)
class Notice:
    """A preemption signal received after a finished step: the run checkpoints at the end of the step in flight."""

    signal: str  # e.g. "SIGUSR1", or what else warned ("Ray is draining node …")
    received: float  # time.monotonic() when it arrived
    budget: float  # seconds the run has, from then, to write its checkpoint


@dataclass
class _Watch:
    signals: tuple[int, ...]
    budget: float
    steps: int = 0  # steps this process finished
    notice: Notice | None = None
    first_signal: int | None = None
    stopped_because: str = ""  # why a signal stopped the run at once (for the interrupted line)
    other_alarm: Any = None  # the SIGALRM handler before watch(): an alarm armed by someone else goes to it


_watch: _Watch | None = None


def parse_signals(text: str, flag: str = "--ckpt.preemption_signals") -> tuple[int, ...]:
    """``"SIGTERM,USR1,12"`` -> signal numbers; a name or number that is no catchable signal is a ConfigError."""
    found: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name = part.upper() if part.upper().startswith("SIG") else f"SIG{part.upper()}"
        try:
            number = int(part) if part.isdigit() else int(signal.Signals[name])
            signal.Signals(number)
        except (KeyError, ValueError):
            raise ConfigError(f"{flag}: {part!r} is not a signal (give names such as SIGTERM,SIGUSR1)") from None
        if number in (signal.SIGKILL, signal.SIGSTOP, signal.SIGALRM):
            raise ConfigError(f"{flag}: {signal.Signals(number).name} cannot be used (SIGKILL and SIGSTOP cannot be "
                              "caught; SIGALRM measures the budget)")
        found.append(number)
    return tuple(dict.fromkeys(found))


def watch(signals: str, budget: float) -> None:
    """Make ``signals`` (``--ckpt.preemption_signals``) preemption warnings for this process, with ``budget``
    seconds (``--ckpt.preemption_budget``) to write the checkpoint. Only the main thread can set handlers:
    called from another thread, it changes nothing."""
    global _watch
    if budget <= 0:
        raise ConfigError(f"--ckpt.preemption_budget must be a positive number of seconds, got {budget:g}")
    numbers = parse_signals(signals)
    if threading.current_thread() is not threading.main_thread():
        return
    _watch = _Watch(numbers, float(budget))
    for number in numbers:
        signal.signal(number, _on_signal)
    _watch.other_alarm = signal.signal(signal.SIGALRM, _budget_ran_out)  # armed by the first notice (from any thread: warn())


def watched_signals() -> tuple[int, ...]:
    """The signals :func:`watch` handles (their handlers must outlive ``ray.init``)."""
    return _watch.signals if _watch is not None else ()


def pending() -> Notice | None:
    """The preemption notice this run received, or None."""
    return _watch.notice if _watch is not None else None


def first_signal() -> int | None:
    """The first watched signal that arrived, or None."""
    return _watch.first_signal if _watch is not None else None


def stopped_because() -> str:
    """Why a watched signal stopped the run at once ("" when none did): for the ``rlhf: interrupted`` line."""
    return _watch.stopped_because if _watch is not None else ""


def step_done(step: int, save: Callable[[], Path], agree: Callable[[bool], bool] | None = None) -> None:
    """Call after each finished step (and its periodic checkpoint, if any). When a preemption signal arrived,
    ``save()`` writes (or returns, when this step was saved already) the checkpoint of ``step``, and
    :class:`~rlhf.errors.Preempted` ends the run. ``agree(asked) -> bool``: with several ranks, whether any rank
    was asked (e.g. an all-reduce), so that every rank saves and stops at the same step; every rank calls it."""
    if _watch is not None:
        _watch.steps += 1
    notice = pending()
    asked = agree(notice is not None) if agree is not None else notice is not None
    if not asked:
        return
    started = time.monotonic()
    path = save()
    signal.setitimer(signal.ITIMER_REAL, 0)  # the budget is kept: no alarm may interrupt what follows
    name = notice.signal if notice is not None else "a preemption signal on another rank"
    raise Preempted(f"({name}) at step {step}: checkpoint {path} written in {time.monotonic() - started:.1f} s; "
                    f"{how_to_resume(path)}", checkpoint=path, step=step)


def warn(reason: str, seconds_left: float | None = None) -> None:
    """A preemption warning that is not a signal (e.g. Ray draining a node of the run, with its deadline): taken
    as the first watched signal would be, with a budget of ``seconds_left`` (at most ``--ckpt.preemption_budget``).
    Callable from any thread; before the first step it stops the run at once (a KeyboardInterrupt in the main
    thread). Nothing happens without :func:`watch`, or after an earlier notice."""
    watch_ = _watch
    if watch_ is None or watch_.first_signal is not None:
        return
    watch_.first_signal = signal.SIGTERM  # the status of an interrupted run: as for a scheduler's SIGTERM
    if watch_.steps == 0:
        watch_.stopped_because = f"before the first step finished ({reason}), so nothing was written"
        _thread.interrupt_main()
        return
    budget = watch_.budget if seconds_left is None else max(1.0, min(watch_.budget, seconds_left))
    _take_notice(watch_, reason, budget)


def _take_notice(watch_: _Watch, name: str, budget: float) -> None:
    watch_.notice = Notice(name, time.monotonic(), budget)
    signal.setitimer(signal.ITIMER_REAL, budget)
    log.warning("%s: finishing the step in flight, then writing a checkpoint (within %g s); a second signal stops "
                "at once", name, budget)


def _on_signal(signum: int, frame: Any) -> None:
    watch_ = _watch
    if watch_ is None:
        return
    name = signal.Signals(signum).name
    if watch_.first_signal is None:
        watch_.first_signal = signum
        if watch_.steps > 0:
            _take_notice(watch_, name, watch_.budget)
            return
        watch_.stopped_because = "before the first step finished, so nothing was written"
        raise KeyboardInterrupt(name)
    if watch_.stopped_because:  # already unwinding: let it finish its cleanup
        return
    watch_.stopped_because = f"a second signal ({name}) stopped the checkpoint, which was not kept"
    raise KeyboardInterrupt(name)


def _budget_ran_out(signum: int, frame: Any) -> None:
    if _watch is None or _watch.stopped_because:
        return
    if _watch.notice is None:  # not our budget (armed by a notice): e.g. a test runner's timeout
        if callable(_watch.other_alarm):
            _watch.other_alarm(signum, frame)
            return
        _watch.stopped_because = "SIGALRM arrived with no preemption notice pending"
        raise KeyboardInterrupt("SIGALRM")
    budget = _watch.notice.budget
    _watch.stopped_because = (f"the preemption budget of {budget:g} s ran out before the checkpoint was "
                              "written, so it was not kept")
    raise KeyboardInterrupt("SIGALRM")
