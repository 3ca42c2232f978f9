"""Whose turn it is: round robin over a ring of addresses, each with its connections that have
requests waiting, the lead (watching the sockets) one more entry. While clients of several
addresses are connected, one holds at most threads - 1 threads, so one is always free to lead.
"""
from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

from wire.observer import SUPERVISOR

from .connection import Connection

LEAD = "lead"  # the ring's entry for the turn of watching the sockets


class Scheduler:
    """The ring of turns (see the module docstring), shared by the request threads."""

    def __init__(self, threads: int, addresses: Callable[[], int]) -> None:
        self.threads = threads
        self._addresses = addresses  # how many client addresses are connected now
        self._ring: collections.OrderedDict[str, collections.deque[Any]] = collections.OrderedDict()
        self._busy: collections.Counter[str] = collections.Counter()
        self._changed = threading.Condition(threading.Lock())
        self._closed = False

    def put(self, conn: Connection) -> None:
        """A connection has requests to answer: it waits for its address's turn."""
        with self._changed:
            waiting = self._ring.get(conn.address)
            if waiting is None:
                waiting = self._ring[conn.address] = collections.deque()
                if conn.address == SUPERVISOR:
                    self._ring.move_to_end(SUPERVISOR, last=False)
            waiting.append(conn)
            self._changed.notify()

    def put_lead(self) -> None:
        """The lead waits at the back of the ring for a thread (at the start, and after each lead)."""
        with self._changed:
            self._ring[LEAD] = collections.deque()
            self._changed.notify()

    def waiting(self) -> bool:
        """Whether any turn waits for a thread (the lead's too)."""
        return bool(self._ring)

    def runnable(self) -> bool:
        """Whether a connection's turn waits that a thread could take now (the leader's, say)."""
        with self._changed:
            cap = self._cap()
            return any(key != LEAD and (key == SUPERVISOR or self._busy[key] < cap) for key in self._ring)

    def take(self) -> Any:
        """The next turn this thread may take (LEAD or a connection), waiting for one; None once closed."""
        with self._changed:
            while not self._closed:
                turn = self._next()
                if turn is not None:
                    return turn
                self._changed.wait()
            return None

    def done(self, conn: Connection) -> None:
        """A connection's turn ended: its address holds one thread fewer."""
        with self._changed:
            self._busy[conn.address] -= 1
            if not self._busy[conn.address]:
                del self._busy[conn.address]
            if self._ring:  # a turn held back by its address's cap may go now
                self._changed.notify()

    def close(self) -> None:
        """Hand out no more turns; threads waiting for one end."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def _cap(self) -> int:
        """Threads one address may hold: all but one while clients of others are connected."""
        return self.threads - 1 if self.threads > 1 and self._addresses() > 1 else self.threads

    def _next(self) -> Any:
        cap = self._cap()
        for key, waiting in self._ring.items():
            if key == LEAD:
                del self._ring[LEAD]
                return LEAD
            if key != SUPERVISOR and self._busy[key] >= cap:
                continue
            conn = waiting.popleft()
            if waiting:
                self._ring.move_to_end(key)
            else:
                del self._ring[key]
            self._busy[key] += 1
            return conn
        return None

