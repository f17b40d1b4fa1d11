"""Starting the controller's Ray cluster, and overlapping its slow imports with Ray's start-up."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from pathlib import Path
from typing import Any

from rlhf.console import WORKER_ENV, WORKER_SETUP_HOOK, hand_back_library_loggers
from rlhf.errors import WorkerError
from rlhf.records.preemption import watched_signals
from rlhf.runtime.cluster.watchdog import Watchdog

#: how long the reachability check waits for the cluster's port to accept a connection
REACH_TIMEOUT_S = float(os.environ.get("RLHF_RAY_CONNECT_TIMEOUT_S", "5"))

#: the :class:`~rlhf.runtime.cluster.watchdog.Watchdog` of the local cluster this process started, if any
_watchdog: Any = None

log = logging.getLogger("rlhf.runtime")


def start_ray(import_meanwhile: tuple[str, ...] = (), actors: int | None = None) -> bool:
    """Join ``RAY_ADDRESS`` if set (multi-node: ``ray start`` first), else start a local cluster of the run's
    own, whatever cluster an earlier ``ray start`` recorded; logs one line saying which. True when this call
    started or joined it. ``import_meanwhile``: modules imported on a thread while Ray starts, done when this
    returns (see :func:`import_in_background`). ``actors``: how many Ray actors the run will create (see
    :func:`local_cpus`)."""
    if address := os.environ.get("RAY_ADDRESS"):
        # before the imports start: a refused run would wait for them (seconds). A good run loses no overlap:
        # importing ray here or beside torch costs the same (imports hold the GIL), ray.init's wait is what overlaps
        check_reachable(address)
    importing = import_in_background(*import_meanwhile)
    kept = dict.fromkeys((signal.SIGTERM, *watched_signals()))
    before = {signum: signal.getsignal(signum) for signum in kept}
    try:
        return _start_ray(local_cpus(actors))
    finally:
        _own_signals(before)
        importing.join()


def _own_signals(before: dict[int, Any]) -> None:
    """``ray.init`` sets a Python SIGTERM handler in the driver (``sys.exit(15)``), and then Ray's C++ core
    worker a crash handler over it that prints "*** SIGTERM received … PC: @" lines and can abort the
    process (status 134). The handlers from ``before`` ray.init stay (the CLI's: one line, status 143, and
    the preemption signals' of ``rlhf train``); without one, Ray's Python handler stays, without the C++ one."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum, handler in before.items():
        handler = handler if callable(handler) else signal.getsignal(signum)
        if callable(handler):
            signal.signal(signum, handler)


def stop_ray() -> None:
    """Shut down the Ray this process started with :func:`start_ray`: its local cluster, if it started
    one, is gone when this returns (the watchdog ends what Ray's own shutdown leaves)."""
    import ray

    global _watchdog
    ray.shutdown()
    if _watchdog is not None:
        _watchdog.stop()
        _watchdog = None


def local_cpus(actors: int | None) -> int:
    """The CPUs a local cluster declares: one per Ray actor the run will create, within the machine's cores.

    Ray prestarts one idle worker process per declared CPU as the driver connects, and an actor takes one of
    them instead of waiting for a process to start (about 1 s here); an idle one left over holds ~80 MiB and
    its start-up CPU for nothing. rlhf's actors ask for no whole CPU (their bundles take 0.01; the ranks
    share the cores by threads, :func:`rlhf.runtime.cluster.liveness.use_cpu_share`), so the declared
    count decides nothing else."""
    cores = os.cpu_count() or 1
    return cores if actors is None else max(1, min(cores, actors))


def _start_ray(cpus: int) -> bool:
    import ray
    from ray._private import ray_constants

    hand_back_library_loggers()  # Ray's own console handler, installed as `ray` imported
    if ray.is_initialized():
        return False
    env = {"TOKENIZERS_PARALLELISM": "false", "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1"}
    # each worker routes its output as it starts (rlhf.console); Ray turns a module-path hook into this
    # variable, which local workers inherit without the per-worker cost of a job runtime_env
    env[ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR] = WORKER_SETUP_HOOK
    env.update({key: os.environ[key] for key in WORKER_ENV if key in os.environ})  # the run log, --verbose
    if address := os.environ.get("RAY_ADDRESS"):  # reachable: start_ray checked
        # the cluster's own authentication applies: `ray start` clusters want a token, which a client sends
        # only with RAY_AUTH_MODE=token (from ~/.ray/auth_token or RAY_AUTH_TOKEN)
        try:
            ray.init(address=address, runtime_env={"env_vars": env})
        except ConnectionError as exc:
            raise WorkerError(f"cannot join the Ray cluster at RAY_ADDRESS={address}: {exc}; check `ray status` on its head "
                              "node, and for a `ray start` cluster (token authentication) set RAY_AUTH_MODE=token with the "
                              "cluster's token in ~/.ray/auth_token or RAY_AUTH_TOKEN") from exc
        log.info("joined the Ray cluster at RAY_ADDRESS=%s", address)
    else:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private local cluster: no token to hand around
        # Ray starts workers at niceness 15, behind every other process; here the workers are the computation: with
        # one busy nice-0 process beside them, the HF engine's generate took 2.3-3.5x the same call at niceness 0
        # (docs/runtime.md). Normal priority unless the user set RAY_worker_niceness; the raylet reads it as it starts.
        os.environ.setdefault("RAY_worker_niceness", "0")
        os.environ.update(env)  # local workers inherit it; a runtime_env would cost ~0.5 s per worker start
        # "local": a cluster of the run's own. With no address, ray.init() joins the cluster named in Ray's
        # ray_current_cluster file (left by any earlier `ray start` here, its cluster live or long gone), and
        # then refuses num_cpus ("When connecting to an existing cluster, num_cpus and num_gpus must not be provided")
        ray.init(address="local", num_cpus=cpus, include_dashboard=False,
                 object_store_memory=int(os.environ.get("RLHF_RAY_OBJECT_STORE_BYTES", str(1 << 30))))
        _say_local_start(cpus)

        global _watchdog
        _watchdog = Watchdog(ray._private.worker._global_node.get_session_dir_path())
    return True


def _say_local_start(cpus: int | None) -> None:
    """The one line on the local cluster: on the console when an earlier ``ray start`` recorded a cluster that a
    user may have meant this run to use, else in the run's log only."""
    from ray._common.utils import get_ray_address_file

    record = Path(get_ray_address_file(None))  # where Ray looks: $RAY_TMPDIR, else $TMPDIR, else /tmp; then ray/
    try:
        recorded = record.read_text().strip()
    except OSError:
        recorded = ""
    if recorded:
        log.warning("started a Ray cluster of its own, not the one an earlier `ray start` recorded in %s (%s, live or "
                    "not): RAY_ADDRESS=auto (or its address) runs on that one", record, recorded)
    else:
        log.info("started a Ray cluster of its own (%s CPUs declared: one per Ray actor), stopped when the run ends; RAY_ADDRESS runs on an "
                 "existing one", cpus)


def check_reachable(address: str, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """Fail in seconds when nothing listens at ``RAY_ADDRESS``: ``ray.init`` would retry for minutes.

    Ray 2.60 retries a GCS address ``RAY_gcs_server_port_wait_time_s`` (20) times, each attempt
    waiting ``RAY_py_gcs_connect_timeout_s`` (30 s), and a ``ray://`` client address 30 s. Those
    settings are read once, when ``ray`` is first imported, and would also shorten every later
    connect of this driver, so instead the address is resolved as ``ray.init`` resolves it
    (``auto``: the cluster recorded in RAY_TMPDIR by the last ``ray start``; ``host:port``: the GCS;
    ``ray://host:port``: the Ray client server) and one TCP connect is tried. ``local`` starts a
    cluster and other schemes are Ray's to refuse, so they are not checked.
    """

    what = f"RAY_ADDRESS={address}"
    scheme, _, rest = address.rpartition("://")
    if address == "local" or scheme not in ("", "ray"):
        return
    if scheme:
        target = rest
    else:
        from ray._private.services import canonicalize_bootstrap_address

        try:
            target = canonicalize_bootstrap_address(address)
        except (ConnectionError, ValueError) as exc:  # "auto" with no cluster found, or not host:port
            raise WorkerError(f"cannot join a Ray cluster: {what}: {str(exc).rstrip('.')}; start one with `ray start --head` "
                              "or unset RAY_ADDRESS to let rlhf start its own") from exc
    host, _, port = target.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except (OSError, ValueError) as exc:
        reason = (exc.strerror or str(exc)) if isinstance(exc, OSError) else f"{port!r} is not a port"
        raise WorkerError(f"cannot join the Ray cluster at {what}: nothing answers at {target} ({reason}, waited "
                          f"up to {timeout_s:g} s); start the cluster there with `ray start --head` (its GCS port, "
                          "6379 by default; ray:// addresses use the client port, 10001) or unset RAY_ADDRESS "
                          "to let rlhf start its own") from exc


def import_in_background(*modules: str) -> threading.Thread:
    """Start importing ``modules`` on a daemon thread. ``ray.init`` mostly waits for the processes
    it spawns, so the controller's torch/transformers import (seconds) fits into that wait; a
    failure is left for the real import in the main thread to report.

    The caller must ``join()`` the returned thread before it imports any of these modules itself:
    two threads importing transformers' lazy modules at once can hand one of them a half-initialised
    module (``ImportError: cannot import name 'AutoTokenizer'``). :func:`start_ray` joins it, also
    when Ray is already running and there was nothing to wait for."""
    import importlib

    def load() -> None:
        for module in modules:
            try:
                importlib.import_module(module)
            except Exception:  # noqa: BLE001 - reported where the module is really imported
                return

    thread = threading.Thread(target=load, name="rlhf-import", daemon=True)
    thread.start()
    return thread
