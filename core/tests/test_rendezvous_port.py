"""The port a run's ranks rendezvous on (``rlhf.runtime.cluster.liveness.free_port``)."""

from __future__ import annotations

import random
import socket

from rlhf.runtime.cluster.liveness import _ephemeral_low, free_port


def test_the_port_is_free_and_below_the_range_outgoing_connections_draw_from() -> None:
    low = _ephemeral_low()
    for _ in range(20):
        port = free_port()
        assert 1024 <= port < low  # an outgoing connection's local port can never take it
        with socket.socket() as sock:
            sock.bind(("", port))  # and nothing holds it


def test_runs_seeded_alike_draw_different_ports() -> None:
    """A run seeds Python's ``random``; two runs with one seed on one machine must not rendezvous on one port."""
    ports = set()
    for _ in range(5):
        random.seed(0)
        ports.add(free_port())
    assert len(ports) > 1
