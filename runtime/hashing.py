"""Password hashing apart from the request threads, its places shared fairly between addresses.

A process hashes on cores - 1 threads; each server admits fewer hashes than it has request
threads and answers BUSY past that, so a flood of sign-ups or logins never holds them all.
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from db.passwords import hash_password, verify_password
from wire.errors import BusyError

HASHES_FULL = "too many sign-ups and logins at this moment; try again in a moment"
ADDRESS_HASHES_FULL = "too many sign-ups and logins from your address at this moment; try again in a moment"
MAX_WAITING = 1000  # addresses kept in line; past it, one refused is not


def hashing_slots(cores: int) -> int:
    """Hashes one process runs at once: one per core, keeping one core for the rest."""
    return max(1, cores - 1)


class FairShare:
    """The places of a bounded queue, by address, and the line of addresses refused (no I/O:
    the time is passed in). An address that took a place in the last `window_s` gives way
    to those in line, in the order they were first refused; one in line whose client has not
    come back for `window_s` has left it. An address new to the window never waits behind
    the line: addresses that ask once and never come back keep no place from anyone."""

    def __init__(self, size: int, per_address: int = 0, window_s: float = 1.0) -> None:
        self.size, self.window_s = size, window_s
        self.per_address = min(size, per_address) if per_address > 0 else max(1, size // 2)
        self.held: Counter[str | None] = Counter()
        self.line: dict[str | None, float] = {}  # address: last refused, in the order first refused
        self.served: Counter[str | None] = Counter()  # places taken in this window
        self.window_start = 0.0

    def take(self, address: str | None, now: float) -> str:
        """A place for the address (""), or why not: "address_busy" or "busy"."""
        if self.held[address] >= self.per_address:
            return "address_busy"
        if now - self.window_start > self.window_s:
            self.served.clear()
            self.window_start = now
            self.line = {a: at for a, at in self.line.items() if at > now - self.window_s}
        free = self.size - sum(self.held.values())
        ahead = next((n for n, a in enumerate(self.line) if a == address), len(self.line)) \
            if self.served[address] else 0
        if ahead >= free:
            if address in self.line or len(self.line) < MAX_WAITING:
                self.line[address] = now
            return "busy"
        self.line.pop(address, None)
        self.held[address] += 1
        self.served[address] += 1
        return ""

    def give_back(self, address: str | None) -> None:
        self.held[address] -= 1
        if not self.held[address]:
            del self.held[address]


# argon2's C code runs without the GIL, so these threads hash while the others serve.
_executor = ThreadPoolExecutor(hashing_slots(os.cpu_count() or 1), thread_name_prefix="market-hash")


class HashingQueue:
    """One server's bounded share of the process's hashing threads."""

    def __init__(self, size: int, per_address: int = 0) -> None:
        self._share = FairShare(size, per_address)
        self._lock = threading.Lock()

    @classmethod
    def for_settings(cls, settings: Any) -> HashingQueue:
        """MARKET_HASH_QUEUE places, or as many as the request threads but one."""
        size = settings.hash_queue if settings.hash_queue > 0 else max(1, settings.threads - 1)
        return cls(size, settings.hash_queue_per_address)

    @contextlib.contextmanager
    def admitted(self, address: str | None = None,
                 on_full: Callable[[str], None] | None = None) -> Iterator[None]:
        """A place for the block's hashes, or BUSY at once (on_full called first with the
        reason, "busy" or "address_busy": the caller counts the refusal)."""
        with self._lock:
            reason = self._share.take(address, time.monotonic())
        if reason:
            if on_full is not None:
                on_full(reason)
            raise BusyError(HASHES_FULL if reason == "busy" else ADDRESS_HASHES_FULL)
        try:
            yield
        finally:
            with self._lock:
                self._share.give_back(address)

    def hash(self, password: str) -> str:
        """hash_password on a hashing thread (call inside `admitted`)."""
        return _executor.submit(hash_password, password).result()

    def verify(self, password_hash: str | None, password: str) -> bool:
        """verify_password on a hashing thread (call inside `admitted`)."""
        return _executor.submit(verify_password, password_hash, password).result()
