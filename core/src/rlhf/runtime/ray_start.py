"""Starting the controller's Ray cluster, and overlapping its slow imports with Ray's start-up."""

from __future__ import annotations

import os
import threading


def start_ray(import_meanwhile: tuple[str, ...] = ()) -> bool:
    """Join ``RAY_ADDRESS`` if set (multi-node: ``ray start`` first), else start a local cluster; True when
    this call started or joined it. ``import_meanwhile``: modules imported on a thread while Ray starts,
    done when this returns (see :func:`import_in_background`)."""
    importing = import_in_background(*import_meanwhile)
    try:
        return _start_ray()
    finally:
        importing.join()


def _start_ray() -> bool:
    import ray

    from rlhf.errors import WorkerError

    if ray.is_initialized():
        return False
    env = {"TOKENIZERS_PARALLELISM": "false", "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1"}
    if address := os.environ.get("RAY_ADDRESS"):
        # the cluster's own authentication applies: `ray start` clusters want a token, which a client sends
        # only with RAY_AUTH_MODE=token (from ~/.ray/auth_token or RAY_AUTH_TOKEN)
        try:
            ray.init(address=address, runtime_env={"env_vars": env})
        except ConnectionError as exc:
            raise WorkerError(f"cannot join the Ray cluster at RAY_ADDRESS={address}: {exc}; check `ray status` on its head "
                              "node, and for a `ray start` cluster (token authentication) set RAY_AUTH_MODE=token with the "
                              "cluster's token in ~/.ray/auth_token or RAY_AUTH_TOKEN") from exc
    else:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private local cluster: no token to hand around
        os.environ.update(env)  # local workers inherit it; a runtime_env would cost ~0.5 s per worker start
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False,
                 object_store_memory=int(os.environ.get("RLHF_RAY_OBJECT_STORE_BYTES", str(1 << 30))))
    return True


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
