"""Sessions end when their client closes them or stops heartbeating, and say why afterwards."""

from __future__ import annotations

import time

import pytest
from rlhf_plugin_tinker_server.sessions import SessionEnded, Sessions, SessionUnknown


def test_a_session_without_heartbeats_ends_once_and_says_why() -> None:
    ended: list[str] = []
    sessions = Sessions(timeout_s=0.2, on_end=ended.append)
    try:
        quiet, talking = sessions.open(), sessions.open()
        deadline = time.time() + 10
        while quiet not in ended:
            sessions.require(talking, heard=True)
            assert time.time() < deadline, "the quiet session did not end"
            time.sleep(0.02)
        sessions.require(talking)  # its heartbeats kept it open
        with pytest.raises(SessionEnded, match="the session ended \\(no heartbeat for 0.2 s\\)"):
            sessions.require(quiet)
        sessions.end(talking, "its client closed it")
        sessions.end(talking, "its client closed it")  # a second finish changes nothing
        assert ended == [quiet, talking]
        with pytest.raises(SessionEnded, match="its client closed it"):
            sessions.require(talking, heard=True)
        with pytest.raises(SessionUnknown, match="no session of that id"):
            sessions.require("session-never")
    finally:
        sessions.close()
