"""Whose turn it is: round robin over a ring of addresses, each with its connections that have
requests waiting. The lead (watching the sockets) comes once the connection turns queued before
it were taken, or when none can be: once a round, not once a request. While clients of several
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
        self._busy: dict[str, int] = {}
        self._queued = 0  # connection turns in the ring
        self._lead_waits = False
        self._owed = 0  # connection turns to take before the lead's
        self._changed = threading.Condition(threading.Lock())
        self._closed = False

    def put(self, *conns: Connection, lead: bool = False) -> None:
        """Connections have requests to answer: each waits for its address's turn. With `lead`,
        the leader ends its turn: the lead waits after these, and the leader takes a turn itself,
        so one thread fewer is woken (a wake-up costs more CPU than a short request)."""
        with self._changed:
            for conn in conns:
                self._queue(conn)
            if lead:
                self._lead_waits, self._owed = True, self._queued
            self._changed.notify(max(len(conns), lead))

    def _queue(self, conn: Connection) -> None:
        waiting = self._ring.get(conn.address)
        if waiting is None:
            waiting = self._ring[conn.address] = collections.deque()
            if conn.address == SUPERVISOR:
                self._ring.move_to_end(SUPERVISOR, last=False)
        waiting.append(conn)
        self._queued += 1

    def waiting(self) -> bool:
        """Whether any turn waits for a thread (the lead's too)."""
        return self._lead_waits or bool(self._ring)

    def runnable(self) -> bool:
        """Whether a connection's turn waits that a thread could take now (the leader's, say)."""
        with self._changed:
            cap = self._cap()
            return any(key == SUPERVISOR or self._busy.get(key, 0) < cap for key in self._ring)

    def take(self, finished: Connection | None = None, again: bool = False) -> Any:
        """The next turn this thread may take (LEAD or a connection), waiting for one; None once
        closed. `finished`: the connection whose turn this thread just ended (its address holds
        one thread fewer), queued `again` if it has more to answer."""
        with self._changed:
            if finished is not None:
                busy = self._busy.pop(finished.address) - 1
                if busy:
                    self._busy[finished.address] = busy
                if again:
                    self._queue(finished)
            while not self._closed:
                turn = self._next()
                if turn is not None:
                    if self._ring:  # a turn the address cap held back may go now on another thread
                        self._changed.notify()
                    return turn
                self._changed.wait()
            return None

    def close(self) -> None:
        """Hand out no more turns; threads waiting for one end."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def _cap(self) -> int:
        """Threads one address may hold: all but one while clients of others are connected."""
        return self.threads - 1 if self.threads > 1 and self._addresses() > 1 else self.threads

    def _next(self) -> Any:
        if self._lead_waits and self._owed <= 0:
            self._lead_waits = False
            return LEAD
        cap = self._cap()
        for key, waiting in self._ring.items():
            busy = self._busy.get(key, 0)
            if busy >= cap and key != SUPERVISOR:
                continue
            conn = waiting.popleft()
            if waiting:
                self._ring.move_to_end(key)
            else:
                del self._ring[key]
            self._busy[key] = busy + 1
            self._queued -= 1
            self._owed -= 1
            return conn
        if self._lead_waits:  # nothing else may go now
            self._lead_waits = False
            return LEAD
        return None
