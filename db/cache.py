"""A read cache for the catalogue reads (get_item, search_items, display_items, get_seller_rating).

Each server process keeps its own answers (an LRU bounded in bytes); what keeps them fresh
is a small file of generation counters in shared memory that every server process of the
host maps. A catalogue write bumps the counters of what it changed after its commit and
before its answer; a read notes the counters before it reads the database and keeps its
answer tagged with them, and an answer is served again only while they are unchanged. So a
read sent after a write was answered, to any process of the host, never sees older data.
Sessions checked for these reads are kept the same way: logout bumps its token's counter.
The store is here; the App that tells it of each write is `runtime.cached_app`'s.
"""
from __future__ import annotations

import fcntl
import mmap
import os
import tempfile
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson
from cachetools import LRUCache

from wire.errors import ProtocolError

from .accounts import Session, token_hash

MODES = ("off", "one-host")
EPOCH = 0  # every entry depends on it: bumped by a write whose changes are not known
LISTINGS = 1  # search pages, sellers' listings and ratings: any catalogue write changes them
ITEM_SLOTS = 4096  # get_item entries depend on their item's slot (item_id modulo this)
SESSION_SLOTS = 4096  # a kept session depends on its token's slot (the token hash modulo this)
SESSIONS_KEPT = 100_000  # sessions each process keeps (a few hundred bytes each)
_FIRST_ITEM_SLOT = 2
_FIRST_SESSION_SLOT = _FIRST_ITEM_SLOT + ITEM_SLOTS
_COUNTERS = _FIRST_SESSION_SLOT + SESSION_SLOTS
_ENTRY_OVERHEAD = 200  # bytes of key, tags and bookkeeping counted for each entry
# A failed write normally rolled back; these codes (and any non-protocol error) may hide a commit.
_OUTCOME_UNKNOWN = frozenset({"UNAVAILABLE", "INTERNAL", "BUSY"})

Handler = Callable[..., dict[str, Any]]


def default_counter_file() -> str:
    """/dev/shm/market-cache (shared memory), or the temporary folder where there is no /dev/shm."""
    folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    return os.path.join(folder, "market-cache")


def item_slot(item_id: int) -> int:
    """The counter an item's get_item entries depend on."""
    return _FIRST_ITEM_SLOT + item_id % ITEM_SLOTS


def session_slot(hashed_token: str) -> int:
    """The counter a kept session depends on: logout bumps it."""
    return _FIRST_SESSION_SLOT + int(hashed_token[:8], 16) % SESSION_SLOTS


class Generations:
    """The host's shared counters: a file of 64-bit integers mapped by every server process.

    Readers read a counter without a lock (an aligned 8-byte load is atomic); writers
    increment under a POSIX record lock (between processes) and a thread lock (within one).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        with self._locked():
            if os.fstat(self._fd).st_size < _COUNTERS * 8:
                os.ftruncate(self._fd, _COUNTERS * 8)
        self._map = mmap.mmap(self._fd, _COUNTERS * 8)
        self._counters = memoryview(self._map).cast("Q")

    def read(self, slots: Iterable[int]) -> tuple[int, ...]:
        """The counters' values now."""
        return tuple(self._counters[slot] for slot in slots)

    def bump(self, slots: Iterable[int]) -> None:
        """Add one to each counter, atomically for every process of the host."""
        with self._locked():
            for slot in set(slots):
                self._counters[slot] += 1

    def _locked(self) -> Any:
        return _FileLock(self._lock, self._fd)


class _FileLock:
    def __init__(self, lock: threading.Lock, fd: int) -> None:
        self._thread_lock, self._fd = lock, fd

    def __enter__(self) -> None:
        self._thread_lock.acquire()
        fcntl.lockf(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        fcntl.lockf(self._fd, fcntl.LOCK_UN)
        self._thread_lock.release()


@dataclass(frozen=True)
class _Read:
    """What a cached read's answer depends on: the counters, and whether it is the caller's own."""

    slots: Callable[[dict[str, Any]], tuple[int, ...]]
    callers_own: Callable[[dict[str, Any]], bool]


_LISTED = _Read(lambda args: (EPOCH, LISTINGS), lambda args: False)
CACHED_READS = {
    "get_item": _Read(lambda args: (EPOCH, item_slot(args["item_id"])), lambda args: False),
    "search_items": _LISTED,
    "display_items": _Read(_LISTED.slots, lambda args: True),
    # without a seller_id (the seller server's op), the rating is the caller's own
    "get_seller_rating": _Read(_LISTED.slots, lambda args: args.get("seller_id") is None),
}


def _changed_by_write(op: str, args: dict[str, Any], result: dict[str, Any]) -> tuple[int, ...] | None:
    """The counters a successful write bumps (None: the op changes no catalogue read)."""
    if op == "put_item":
        return (LISTINGS,)
    if op in ("change_price", "remove_item", "provide_feedback"):
        return (LISTINGS, item_slot(args["item_id"]))
    if op == "make_purchase":
        return (LISTINGS, *(item_slot(line["item_id"]) for line in result["lines"]))
    return None


CATALOGUE_WRITES = frozenset({"put_item", "change_price", "remove_item", "provide_feedback", "make_purchase"})


class ReadCache:
    """One process's cached answers, kept fresh by the host's Generations."""

    def __init__(self, generations: Generations, max_bytes: int) -> None:
        self.generations = generations
        self._entries: LRUCache[Any, tuple[tuple[int, ...], bytes]] = LRUCache(
            maxsize=max_bytes, getsizeof=lambda entry: len(entry[1]) + _ENTRY_OVERHEAD)
        self._lock = threading.Lock()
        self._sessions: LRUCache[str, tuple[tuple[int, ...], Any]] = LRUCache(maxsize=SESSIONS_KEPT)
        self.hits = self.misses = 0  # reads answered from the cache, and not (approximate: no lock)

    @property
    def size_bytes(self) -> int:
        """Bytes of answers held (as counted against the bound)."""
        return int(self._entries.currsize)

    def lookup(self, key: Any, slots: tuple[int, ...]) -> tuple[tuple[int, ...], dict[str, Any] | None]:
        """The counters now, and the answer kept under them (None: a miss)."""
        tags = self.generations.read(slots)
        with self._lock:
            entry = self._entries.get(key)
        if entry is None or entry[0] != tags:
            self.misses += 1
            return tags, None
        self.hits += 1
        return tags, orjson.loads(entry[1])

    def keep(self, key: Any, tags: tuple[int, ...], answer: dict[str, Any]) -> None:
        """Keep an answer read after the counters were `tags` (one larger than the bound is not kept)."""
        encoded = orjson.dumps(answer)
        if len(encoded) + _ENTRY_OVERHEAD > self._entries.maxsize:
            return
        with self._lock:
            self._entries[key] = (tags, encoded)

    def cached(self, op: str, handler: Handler) -> Handler:
        """`handler` (a private read) answering from the cache while its counters are unchanged."""
        read = CACHED_READS[op]

        def cached_read(tx: Any, session: Session, **args: Any) -> dict[str, Any]:
            self.check_session(session)
            owner = session.user_id if read.callers_own(args) else None
            key = (op, owner, orjson.dumps(args, option=orjson.OPT_SORT_KEYS))
            tags, answer = self.lookup(key, read.slots(args))
            if answer is not None:
                return answer
            answer = handler(tx, session, **args)
            self.keep(key, tags, answer)
            return answer
        return cached_read

    def check_session(self, session: Session) -> None:
        """The caller's token checked: from a kept row while its logout counter is unchanged and
        the row says the session is live, else with the database (the row then kept)."""
        hashed = session.check_params["token_hash"]
        tags = self.generations.read((EPOCH, session_slot(hashed)))
        with self._lock:
            kept = self._sessions.get(hashed)
        if kept is not None and kept[0] == tags and session.accept_kept(kept[1]):
            return
        row = session.check_now()
        with self._lock:
            self._sessions[hashed] = (tags, row)

    def after_logout(self, token: Any) -> None:
        """Every process drops what it kept of the session (whatever the logout's outcome)."""
        if isinstance(token, str):
            self.generations.bump((session_slot(token_hash(token)),))

    def with_cached_reads(self, handlers: dict[str, Any]) -> dict[str, Any]:
        """The handler table with its catalogue reads answered through the cache."""
        return {op: self.cached(op, h) if op in CACHED_READS else h for op, h in handlers.items()}

    def after_write(self, op: str, args: dict[str, Any], outcome: dict[str, Any] | BaseException) -> None:
        """Bump what a catalogue write changed (everything, when a failure leaves it unknown)."""
        if op not in CATALOGUE_WRITES:
            return
        if isinstance(outcome, BaseException):
            if not isinstance(outcome, ProtocolError) or outcome.code in _OUTCOME_UNKNOWN:
                self.generations.bump((EPOCH,))
            return
        changed = _changed_by_write(op, args, outcome["result"])
        if changed:
            self.generations.bump(changed)


class CacheUnusable(RuntimeError):
    """The read cache cannot start (its counters file): one line for the operator."""


def from_settings(settings: Any) -> ReadCache | None:
    """The process's cache, or None when MARKET_CACHE is off."""
    if settings.cache == "off":
        return None
    path = settings.cache_file or default_counter_file()
    try:
        generations = Generations(path)
    except OSError as exc:  # one line, as for a database the server cannot use, and no start
        raise CacheUnusable(f"cannot use the read cache's counters file {path}: "
                            f"{exc.strerror or exc}") from None
    return ReadCache(generations, settings.cache_mb * 1024 * 1024)
