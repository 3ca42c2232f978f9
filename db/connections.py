"""The Connections a server process keeps open between calls: its own few, over the engine's pool.
"""
from __future__ import annotations

import queue
import time
from typing import Any

from sqlalchemy import Connection

from wire.errors import BusyError

from .engine import RECYCLE_S, is_sqlite

ALL_IN_USE = "every database connection is in use; try again"


class Held:
    """A Connection kept open between calls, and what every call reads of it (each read of a
    SQLAlchemy Connection's `info` or driver connection is a few Python calls)."""

    __slots__ = ("conn", "info", "driver", "opened")

    def __init__(self, conn: Connection) -> None:
        self.conn, self.info = conn, conn.info
        self.driver: Any = conn.connection.driver_connection
        self.opened = time.monotonic()


class Connections:
    """Open Connections kept between calls, at most `size`, each holding a pooled one.

    A slot is a Connection ready for use (with what each call reads of it: Held) or None
    (open a new one when taken). One that was invalidated (its database connection died) is
    closed when given back; one older than the engine's recycle time, or opened before
    retire_all, is replaced when taken, as the pool would.
    """

    def __init__(self, engine: Any, size: int, timeout_s: float = 10.0) -> None:
        self._engine, self._timeout_s = engine, timeout_s
        self._recycle_s = RECYCLE_S if not is_sqlite(engine) else float("inf")
        self._retired_before = 0.0
        self._slots: queue.SimpleQueue[Held | None] = queue.SimpleQueue()
        for _ in range(size):
            self._slots.put(None)

    def take(self) -> Held:
        """A Connection for one call; BUSY if none is free within the timeout."""
        try:
            held = self._slots.get(timeout=self._timeout_s)
        except queue.Empty:
            raise BusyError(ALL_IN_USE) from None
        if held is not None:
            if held.opened > self._retired_before and time.monotonic() - held.opened < self._recycle_s:
                return held
            held.conn.close()
        try:
            return Held(self._engine.connect())
        except BaseException:
            self._slots.put(None)
            raise

    def give(self, held: Held) -> None:
        """Return a Connection taken for a call that has ended (committed or rolled back)."""
        conn = held.conn
        if conn.invalidated or conn.in_transaction() or left_open(held.driver):
            conn.close()
            self._slots.put(None)
        else:
            self._slots.put(held)

    def retire_all(self) -> None:
        """Replace every Connection open now at its next use (one found its connection dead)."""
        self._retired_before = time.monotonic()

    def close(self) -> None:
        """Close the Connections that are not in use (their slots stay, to open anew)."""
        drained = 0
        while True:
            try:
                held = self._slots.get_nowait()
            except queue.Empty:
                break
            drained += 1
            if held is not None:
                held.conn.close()
        for _ in range(drained):
            self._slots.put(None)


def left_open(driver: Any) -> bool:
    """A server transaction still open after the call (a failed COMMIT whose ROLLBACK failed
    too, say): the connection would keep its locks, SQLite's write lock among them."""
    return bool(getattr(driver, "in_transaction", False))
