"""Password hashing with Argon2id at OWASP's minimum (19 MiB, t=2, p=1).

Hashing is CPU-heavy (about 25 ms of a core), so the machine runs at most one hash fewer
than it has cores at a time, and at least one: a burst of logins queues here and leaves a
core to every other request. The bound is the machine's, not the process's: the buyer and
seller servers (and their workers) take the same slots, lock files held with flock(2) in the
temporary folder, so two processes cannot take both cores of a two-core machine for their
hashes at once (docs/benchmarks.md, seventh round and the thirteenth machine). Where the
lock files cannot be used (no flock, or no temporary folder to write in), each process
keeps to the bound on its own.
"""
from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

try:
    import fcntl
except ImportError:  # not a POSIX system: the per-process bound only
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger("market.passwords")
_hasher = PasswordHasher(time_cost=2, memory_cost=19 * 1024, parallelism=1)


def hashing_slots(cores: int) -> int:
    """Hashes run at once: one per core, keeping one core for the rest."""
    return max(1, cores - 1)


_SLOT_COUNT = hashing_slots(os.cpu_count() or 1)
_slots = threading.BoundedSemaphore(_SLOT_COUNT)
lock_dir = Path(tempfile.gettempdir())  # where the machine's slots are (tests point it elsewhere)


def slot_paths() -> list[Path]:
    """The lock files of the machine's hashing slots."""
    return [lock_dir / f"market-hashing-{n}.lock" for n in range(_SLOT_COUNT)]


@contextlib.contextmanager
def _hashing_slot() -> Iterator[None]:
    """One of this process's slots, then one of the machine's."""
    with _slots:
        fd = _take_machine_slot()
        try:
            yield
        finally:
            if fd is not None:
                os.close(fd)  # closing the descriptor releases its lock


def _take_machine_slot() -> int | None:
    """A descriptor holding the lock of a free slot (waiting for one if all are taken)."""
    if fcntl is None:
        return None
    paths = slot_paths()
    for path in paths:  # each try opens its own descriptor: flock locks belong to one
        fd = _locked(path, wait=False)
        if fd is not None:
            return fd
    return _locked(paths[os.getpid() % len(paths)], wait=True)


_warned = False


def _locked(path: Path, wait: bool) -> int | None:
    """A descriptor of path holding its lock; None if it is taken (and not waited for) or unusable."""
    global _warned
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)
    except OSError as exc:
        problem: OSError | None = exc
    else:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError as exc:
            os.close(fd)
            problem = None if isinstance(exc, BlockingIOError) else exc
    if problem is not None and not _warned:
        _warned = True
        log.warning("hashing without the machine-wide slots: %s", problem)
    return None


# Verified when the username does not exist, so both failures take the same time.
_DUMMY_HASH = _hasher.hash("not a real password, only for timing")


def hash_password(password: str) -> str:
    """An Argon2id hash of the password."""
    with _hashing_slot():
        return _hasher.hash(password)


def verify_password(password_hash: str | None, password: str) -> bool:
    """True when the password matches; a missing hash costs the same time and fails."""
    with _hashing_slot():
        try:
            return _hasher.verify(password_hash or _DUMMY_HASH, password) and password_hash is not None
        except (VerificationError, InvalidHashError):
            return False
