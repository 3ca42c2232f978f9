"""Password hashing with Argon2id at OWASP's minimum (19 MiB, t=2, p=1).

Hashing is CPU-heavy (about 25 ms of a core), so a process runs at most one hash fewer
than it has cores at a time, and at least one: a burst of logins queues here and leaves a
core to every other request (docs/benchmarks.md, seventh round: with a hash per core
running, the short calls waited behind them and the tail grew).
"""
from __future__ import annotations

import os
import threading

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

_hasher = PasswordHasher(time_cost=2, memory_cost=19 * 1024, parallelism=1)


def hashing_slots(cores: int) -> int:
    """Hashes one process runs at once: one per core, keeping one core for the rest."""
    return max(1, cores - 1)


_slots = threading.BoundedSemaphore(hashing_slots(os.cpu_count() or 1))
# Verified when the username does not exist, so both failures take the same time.
_DUMMY_HASH = _hasher.hash("not a real password, only for timing")


def hash_password(password: str) -> str:
    """An Argon2id hash of the password."""
    with _slots:
        return _hasher.hash(password)


def verify_password(password_hash: str | None, password: str) -> bool:
    """True when the password matches; a missing hash costs the same time and fails."""
    with _slots:
        try:
            return _hasher.verify(password_hash or _DUMMY_HASH, password) and password_hash is not None
        except (VerificationError, InvalidHashError):
            return False
