"""Password hashes: Argon2id at OWASP's minimum (19 MiB, t=2, p=1). CPU-heavy (about 25 ms of
a core): servers run them on the hashing threads of runtime.hashing.

MARKET_TEST_FAST_HASHES=1 makes new hashes cheap (64 KiB, t=1), for the test suite only: a
hash says its own parameters, so either kind verifies whatever the setting."""
from __future__ import annotations

import os

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

_HASHER = PasswordHasher(time_cost=2, memory_cost=19 * 1024, parallelism=1)
_FAST = PasswordHasher(time_cost=1, memory_cost=64, parallelism=1)
# Verified when the username does not exist, so both failures take the same time.
_DUMMY_HASHES = {hasher: hasher.hash("not a real password, only for timing") for hasher in (_HASHER, _FAST)}


def _hasher() -> PasswordHasher:
    return _FAST if os.environ.get("MARKET_TEST_FAST_HASHES") == "1" else _HASHER


def hash_password(password: str) -> str:
    return _hasher().hash(password)


def verify_password(password_hash: str | None, password: str) -> bool:
    """True when the password matches; a missing hash costs the same time and fails."""
    dummy = _DUMMY_HASHES[_hasher()]
    try:
        return _HASHER.verify(password_hash or dummy, password) and password_hash is not None
    except (VerificationError, InvalidHashError):
        return False
