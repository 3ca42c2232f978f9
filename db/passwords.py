"""Password hashes: Argon2id at OWASP's minimum (19 MiB, t=2, p=1). CPU-heavy (about 25 ms of
a core): servers run them on the hashing threads of runtime.hashing."""
from __future__ import annotations

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

_hasher = PasswordHasher(time_cost=2, memory_cost=19 * 1024, parallelism=1)
# Verified when the username does not exist, so both failures take the same time.
_DUMMY_HASH = _hasher.hash("not a real password, only for timing")


def hash_password(password: str) -> str:
    """An Argon2id hash of the password."""
    return _hasher.hash(password)


def verify_password(password_hash: str | None, password: str) -> bool:
    """True when the password matches; a missing hash costs the same time and fails."""
    try:
        return _hasher.verify(password_hash or _DUMMY_HASH, password) and password_hash is not None
    except (VerificationError, InvalidHashError):
        return False
