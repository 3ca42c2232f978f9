"""Who may connect: the limits on connections in all and per address, new connections per
second per address, and, when the table is full, the longest-idle connection giving way to
the newcomer (an idle client reconnects when it needs to; a new one would otherwise wait).
"""
from __future__ import annotations

import collections
import socket
import time
from collections.abc import Iterable
from typing import Any

from wire.envelope import error_response
from wire.errors import BusyError
from wire.framing import encode_frame
from wire.observer import SUPERVISOR

from .connection import Connection

EVICTABLE_AFTER_S = 1.0  # idle this long, a connection may give way to a new client
# why a connection is turned away (the observer's reason): what the client is told, with BUSY
REFUSALS = {
    "max_connections": "too many connections; try again later",
    "max_connections_per_address": "too many connections from your address; close some and try again",
    "new_connections_per_address": "too many new connections from your address; try again in a moment",
}


class Bucket:
    """A token bucket: `rate` takes a second on average, `burst` at once."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self.tokens = float(burst)
        self.updated = time.monotonic()

    def take(self) -> float:
        """Take a token: 0 if there was one, else the seconds until there is."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        if self.tokens < 1:
            return (1 - self.tokens) / self.rate
        self.tokens -= 1
        return 0.0

    def full(self) -> bool:
        """Refilled to the burst: nothing is remembered that a new bucket would not know."""
        return self.tokens + (time.monotonic() - self.updated) * self.rate >= self.burst


def forget_full(buckets: dict[Any, Bucket]) -> dict[Any, Bucket]:
    """The buckets not refilled yet: a full one is the same as a new one."""
    return {key: bucket for key, bucket in buckets.items() if not bucket.full()}


class Admission:
    """The connection counts of one server process and the rules for letting one more in."""

    def __init__(self, max_connections: int, per_address: int, new_per_s: float) -> None:
        self.max_connections, self.per_address_limit, self.new_per_s = max_connections, per_address, new_per_s
        self.per_address: collections.Counter[str] = collections.Counter()
        self._arrivals: dict[str, Bucket] = {}

    def addresses(self) -> int:
        """Client addresses connected now (the supervisor's health checks are no client's)."""
        return len(self.per_address) - (SUPERVISOR in self.per_address)

    def refusal(self, address: str, open_now: int) -> str:
        """Why a new connection from `address` is turned away, a key of REFUSALS ("" if it is not)."""
        if open_now >= self.max_connections:
            return "max_connections"
        if self.per_address[address] >= self.per_address_limit:
            return "max_connections_per_address"
        bucket = self._arrivals.get(address)
        if bucket is None:
            bucket = self._arrivals[address] = Bucket(self.new_per_s, self.per_address_limit)
        return "new_connections_per_address" if bucket.take() else ""

    def opened(self, address: str) -> None:
        self.per_address[address] += 1

    def closed(self, address: str) -> None:
        self.per_address[address] -= 1
        if not self.per_address[address]:
            del self.per_address[address]

    def forget_refilled_buckets(self) -> None:
        """Keep the new-connection counts only of addresses that connected lately."""
        self._arrivals = forget_full(self._arrivals)


def evictable(connections: Iterable[Connection]) -> Connection | None:
    """The connection idle longest, if it has been idle at least EVICTABLE_AFTER_S."""
    now = time.monotonic()
    idle = (conn for conn in connections if conn.idle() and conn.address != SUPERVISOR)
    oldest = min(idle, key=lambda conn: conn.last_activity, default=None)
    return oldest if oldest is not None and now - oldest.last_activity >= EVICTABLE_AFTER_S else None


def listen(host: str, port: int) -> socket.socket:
    """A listening, non-blocking TCP socket on host:port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def refuse_busy(sock: socket.socket, reason: str, plaintext: bool) -> None:
    """Tell a connection over a limit BUSY (unless it expects TLS) and close it, without blocking."""
    try:
        sock.setblocking(False)
        if plaintext:
            sock.send(encode_frame(error_response(None, BusyError(reason))))
    except OSError:
        pass
    finally:
        sock.close()
