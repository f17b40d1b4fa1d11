"""How the ``rlhf`` command ends when it is stopped.

Ctrl-C (SIGINT), and SIGTERM outside a training run, unwind the command as an exception would (hooks see
``interrupted``, nothing half-written is kept, the run's own Ray goes down) and end with one line::

    rlhf: interrupted (SIGTERM); the last checkpoint is step 2 (…/global_step2): resume with the same command and --ckpt.load_enable

and exit status 128 + the signal's number (130, 143), as a shell reports a process a signal ended.

In ``rlhf train`` the signals of ``--ckpt.preemption_signals`` (SIGTERM and SIGUSR1 by default) mean
"checkpoint, then stop" instead (:mod:`rlhf.records.preemption`): one ``rlhf: preempted`` line naming the
checkpoint, exit status 75 (:data:`rlhf.errors.PREEMPTED_EXIT`).
"""

from __future__ import annotations

import signal
import sys
from typing import Any

from rlhf.errors import PREEMPTED_EXIT, Preempted, RunInterrupted, exception_chain
from rlhf.records import preemption

#: the stopping signals received so far by the handler below (only the first one counts)
_received: list[int] = []


def handle_sigterm() -> None:
    """Make SIGTERM interrupt the command as Ctrl-C does (Ray's driver handler would ``sys.exit(15)``, or
    its C++ one abort); :func:`rlhf.runtime.cluster.ray_start.start_ray` keeps this handler over Ray's. Only the
    main thread can set it (``main`` called from another thread leaves SIGTERM as it was). ``rlhf train``
    then hands the preemption signals to :func:`rlhf.records.preemption.watch`."""
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)


def _interrupt(signum: int, frame: Any) -> None:
    if _received:  # a second SIGTERM while the run unwinds: let it finish its cleanup
        return
    _received.append(signum)
    raise KeyboardInterrupt(signal.Signals(signum).name)


def report_interrupt(exc: KeyboardInterrupt) -> int:
    """Print the one ``rlhf: preempted`` or ``rlhf: interrupted`` line for ``exc`` and return the exit status."""
    chain = list(exception_chain(exc))
    if done := next((e for e in chain if isinstance(e, Preempted)), None):
        print(f"rlhf: preempted {done}", file=sys.stderr)
        return PREEMPTED_EXIT
    signum = _received[0] if _received else preemption.first_signal() or signal.SIGINT
    advice = next((str(e) for e in chain if isinstance(e, RunInterrupted)), "")
    because = preemption.stopped_because()
    parts = [f"rlhf: interrupted ({signal.Signals(signum).name}){' ' + because if because else ''}", advice]
    print("; ".join(p for p in parts if p), file=sys.stderr)
    return 128 + signum
