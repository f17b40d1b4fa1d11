"""Client sessions: the SDK opens one per ``ServiceClient``, heartbeats it every 10 s, and finishes it on ``close()``.

A session ends when its client finishes it or when no heartbeat came for ``timeout_s`` seconds (a client that
crashed or lost its network). Ending a session frees what its training runs hold on the shared model (``on_end``),
so one tenant's disconnect costs the others nothing. An ended session's heartbeat is answered 410, which the SDK
reads as "this session has finished" and stops heartbeating.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable


class SessionUnknown(LookupError):
    """A session id this server never opened (404)."""


class SessionEnded(LookupError):
    """A session that ended, and why (410)."""


class Sessions:
    """The open sessions, the last time each was heard from, and why each ended one ended."""

    def __init__(self, timeout_s: float, on_end: Callable[[str], None]) -> None:
        self.timeout_s = timeout_s
        self._on_end = on_end
        self._last_seen: dict[str, float] = {}
        self._ended: dict[str, str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sweeper = threading.Thread(target=self._sweep, name="tinker-sessions", daemon=True)
        self._sweeper.start()

    def open(self) -> str:
        session_id = f"session-{uuid.uuid4().hex[:12]}"
        with self._lock:
            self._last_seen[session_id] = time.monotonic()
        return session_id

    def require(self, session_id: str, *, heard: bool = False) -> None:
        """Refuse a session that is not open; ``heard``: it just spoke (a heartbeat), so it counts as alive."""
        with self._lock:
            if session_id in self._ended:
                raise SessionEnded(f"session_id {session_id!r}: the session ended ({self._ended[session_id]})")
            if session_id not in self._last_seen:
                raise SessionUnknown(f"session_id {session_id!r}: no session of that id on this server")
            if heard:
                self._last_seen[session_id] = time.monotonic()

    def end(self, session_id: str, reason: str) -> None:
        with self._lock:
            if self._last_seen.pop(session_id, None) is None:
                return
            self._ended[session_id] = reason
        self._on_end(session_id)

    def close(self) -> None:
        self._stop.set()

    def _sweep(self) -> None:
        while not self._stop.wait(min(self.timeout_s / 4, 30.0)):
            now = time.monotonic()
            with self._lock:
                idle = [session for session, seen in self._last_seen.items() if now - seen > self.timeout_s]
            for session_id in idle:
                self.end(session_id, f"no heartbeat for {self.timeout_s:g} s")
