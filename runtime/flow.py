"""Flow control: the bytes of requests read and not yet answered, counted for the process, so
that connections holding too many stop being read until answers drain.
"""
from __future__ import annotations

import threading

PAUSE_AFTER = 64  # queued requests on one connection before we stop reading it
HOLDS_A_LOT = 65536  # bytes a connection holds that, past the process's limit, stop its reading


class QueuedBytes:
    """The bytes of requests read and not yet answered on all connections, complete frames
    (counted by the leader and the answering threads) and unfinished ones (the leader's)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.complete = 0
        self.partial = 0
        self._lock = threading.Lock()

    @property
    def total(self) -> int:
        return self.complete + self.partial

    def add(self, size: int) -> bool:
        """Count size more of complete frames (or less, if negative); whether paused
        connections may now be read again: down to half the limit, or no answer under way."""
        with self._lock:
            self.complete += size  # below, and in over(): the total inline (a property is a call)
            return self.complete + self.partial <= self.limit // 2 or not self.complete

    def add_partial(self, size: int) -> None:
        """Count size more of unfinished frames (the leader only)."""
        self.partial += size

    def answering(self) -> bool:
        """Some complete frames wait for, or get, their answer: memory will be freed."""
        return self.complete > 0

    def over(self) -> bool:
        return self.complete + self.partial > self.limit

    def low(self) -> bool:
        """Down to half the limit: paused connections may be read again."""
        return self.total <= self.limit // 2
