"""Ray draining a node of the run is a preemption warning (docs/preemption.md).

The autoscaler (KubeRay's included) drains a node before it takes it away, and ``ray drain-node`` does it by hand:
Ray's GCS then lists the node as draining, with the deadline after which it will be killed. A thread in the
controller polls that list (every ``RLHF_DRAIN_POLL_S`` seconds, default 2) for the nodes the run's ranks,
engines and controller live on; the first one it finds is handed to :func:`rlhf.records.preemption.warn`, with
the time left to the deadline as the budget: the step in flight finishes, its checkpoint is written, the run ends
with the ``rlhf: preempted`` line naming the node. Ray offers the list only through its private state API
(Ray Train's preemption watcher reads the same); where that API is missing, nothing is watched.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from rlhf.records import preemption

log = logging.getLogger("rlhf.runtime")

POLL_S = float(os.environ.get("RLHF_DRAIN_POLL_S", "2"))


def draining_nodes() -> dict[str, int]:
    """Ray's draining nodes: node id (hex) -> deadline in ms since the epoch (0: none)."""
    import ray

    return dict(ray._private.state.state.get_draining_nodes())


class DrainWatch:
    """Polls Ray for the draining of ``nodes`` (node id -> what of the run lives there) until :meth:`stop`."""

    def __init__(self, nodes: dict[str, str]) -> None:
        self.nodes = nodes
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="rlhf-drain-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _poll(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                draining = draining_nodes()
            except Exception as exc:  # noqa: BLE001 - a Ray without the API, or a GCS gone with the run: stop watching
                log.debug("not watching Ray's node draining: %s", exc)
                return
            ours = sorted((deadline or float("inf"), node) for node, deadline in draining.items() if node in self.nodes)
            if ours:
                deadline, node = ours[0]
                left = None if deadline == float("inf") else deadline / 1000 - time.time()
                when = "no deadline" if left is None else f"deadline in {max(left, 0):.0f} s"
                preemption.warn(f"Ray is draining node {node[:12]} ({self.nodes[node]}; {when})", left)
                return


def run_nodes(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Node id -> what of the run lives there, from ``workers.json``'s rows and the controller's own node."""
    import ray

    nodes: dict[str, list[str]] = {ray.get_runtime_context().get_node_id(): ["the controller"]}
    for row in rows:
        node = row.get("node_id") or ray.get_runtime_context().get_node_id()  # a rank in the controller's process
        nodes.setdefault(node, []).append(f"{row['group']} rank {row['rank']}")
    return {node: ", ".join(what) for node, what in nodes.items()}
