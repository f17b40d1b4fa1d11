"""How the ``rlhf`` command ends when it is stopped: Ctrl-C (SIGINT) or SIGTERM (``kill``, SLURM's
``scancel``, Kubernetes) both unwind the run as an exception would (hooks see ``interrupted``, nothing
half-written is kept, the run's own Ray goes down) and end with one line::

    rlhf: interrupted (SIGTERM); the last checkpoint is step 2 (…/global_step2): resume with the same command and --ckpt.load_enable

and exit status 128 + the signal's number (130, 143), as a shell reports a process a signal ended.
"""

from __future__ import annotations

import signal
import sys
from typing import Any

from rlhf.errors import RunInterrupted, exception_chain

#: the stopping signals received so far (only the first one counts)
_received: list[int] = []


def handle_sigterm() -> None:
    """Make SIGTERM interrupt the command as Ctrl-C does (Ray's driver handler would ``sys.exit(15)``, or
    its C++ one abort); :func:`rlhf.runtime.cluster.ray_start.start_ray` keeps this handler over Ray's. Only the
    main thread can set it (``main`` called from another thread leaves SIGTERM as it was)."""
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)


def _interrupt(signum: int, frame: Any) -> None:
    if _received:  # a second SIGTERM while the run unwinds: let it finish its cleanup
        return
    _received.append(signum)
    raise KeyboardInterrupt(signal.Signals(signum).name)


def report_interrupt(exc: KeyboardInterrupt) -> int:
    """Print the one ``rlhf: interrupted`` line for ``exc`` and return the exit status."""
    signum = _received[0] if _received else signal.SIGINT
    advice = next((str(e) for e in exception_chain(exc) if isinstance(e, RunInterrupted)), "")
    print(f"rlhf: interrupted ({signal.Signals(signum).name}){'; ' + advice if advice else ''}", file=sys.stderr)
    return 128 + signum
