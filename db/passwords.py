"""Password hashing with Argon2id at OWASP's minimum (19 MiB, t=2, p=1), apart from the
request threads.

Hashing is CPU-heavy (about 25 ms of a core). A process hashes on its own threads, one
fewer than it has cores and at least one, so a core is left to every other request; each
server admits only so many hashes (running or waiting) at once, fewer than its request
threads, and answers BUSY at once past that: a flood of sign-ups or logins then holds at
most that many request threads, and the rest keep answering everything else. One client
address holds at most a share of those places (half, by default), so a flood from one
address leaves room for everyone else's sign-ups and logins.
"""
from __future__ import annotations

import collections
import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from wire.errors import BusyError

_hasher = PasswordHasher(time_cost=2, memory_cost=19 * 1024, parallelism=1)
HASHES_FULL = "too many sign-ups and logins at this moment; try again in a moment"
ADDRESS_HASHES_FULL = "too many sign-ups and logins from your address at this moment; try again in a moment"


def hashing_slots(cores: int) -> int:
    """Hashes one process runs at once: one per core, keeping one core for the rest."""
    return max(1, cores - 1)


def admitted_hashes(request_threads: int, setting: int = 0) -> int:
    """Hashes one server admits at once (`setting`, or 0: all request threads but one)."""
    return setting if setting > 0 else max(1, request_threads - 1)


def hashes_per_address(queue: int, setting: int = 0) -> int:
    """Places in a queue of `queue` one client address may hold (`setting`, or 0: half,
    and at least one): one address flooding it leaves the other half to all the others."""
    return min(queue, setting) if setting > 0 else max(1, queue // 2)


# argon2's C code runs without the GIL, so these threads hash while the others serve.
_executor = ThreadPoolExecutor(hashing_slots(os.cpu_count() or 1), thread_name_prefix="market-hash")
# Verified when the username does not exist, so both failures take the same time.
_DUMMY_HASH = _hasher.hash("not a real password, only for timing")


def hash_password(password: str) -> str:
    """An Argon2id hash of the password, on the calling thread (seeding, tools)."""
    return _hasher.hash(password)


def verify_password(password_hash: str | None, password: str) -> bool:
    """True when the password matches; a missing hash costs the same time and fails."""
    try:
        return _hasher.verify(password_hash or _DUMMY_HASH, password) and password_hash is not None
    except (VerificationError, InvalidHashError):
        return False


class HashingQueue:
    """One server's bounded share of the process's hashing threads, and each client
    address's share of it."""

    def __init__(self, size: int, per_address: int = 0) -> None:
        self.size = size
        self.per_address = hashes_per_address(size, per_address)
        self._lock = threading.Lock()
        self._held: collections.Counter[str | None] = collections.Counter()  # places, by address
        self._total = 0

    @classmethod
    def for_settings(cls, settings: Any) -> HashingQueue:
        """The queue a server's settings (runtime.config.Settings) ask for."""
        return cls(admitted_hashes(settings.threads, settings.hash_queue), settings.hash_queue_per_address)

    @contextlib.contextmanager
    def admitted(self, address: str | None = None,
                 on_full: Callable[[str], None] | None = None) -> Iterator[None]:
        """A place in the queue for the block's hashes, or BUSY at once when it is full or
        the address holds its share (on_full called first with the reason, "busy" or
        "address_busy": the caller counts the refusal)."""
        reason = self._take(address)
        if reason:
            if on_full is not None:
                on_full(reason)
            raise BusyError(HASHES_FULL if reason == "busy" else ADDRESS_HASHES_FULL)
        try:
            yield
        finally:
            self._give_back(address)

    def _take(self, address: str | None) -> str:
        """Take a place for the address; why not ("" when taken)."""
        with self._lock:
            if self._total >= self.size:
                return "busy"
            if self._held[address] >= self.per_address:
                return "address_busy"
            self._held[address] += 1
            self._total += 1
        return ""

    def _give_back(self, address: str | None) -> None:
        with self._lock:
            self._total -= 1
            self._held[address] -= 1
            if not self._held[address]:
                del self._held[address]

    def hash(self, password: str) -> str:
        """hash_password on a hashing thread (call inside `admitted`)."""
        return _executor.submit(hash_password, password).result()

    def verify(self, password_hash: str | None, password: str) -> bool:
        """verify_password on a hashing thread (call inside `admitted`)."""
        return _executor.submit(verify_password, password_hash, password).result()
