"""Running transactions: retries on deadlocks and lock timeouts, and database
errors turned into the protocol's UNAVAILABLE / BUSY in one place.

A transaction is a plain function of a unit of work (db.unit_of_work: it executes Core
statements like a SQLAlchemy Connection); `Database.run` calls it inside BEGIN ... COMMIT
(a read runs statement by statement, without one) and calls it again (a bounded number of
times) when the database asks for a retry, so the function must do all its work through `tx`.

The Connections themselves stay open between calls (`_Connections`): opening one per
call (a pool checkout, its events and a return) cost about 100 Python function calls,
more than the rest of a write's transaction handling.
"""
from __future__ import annotations

import json
import logging
import queue
import random
import sqlite3
import time
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import VARBINARY, Connection, CursorResult, delete, insert, inspect, select, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from wire.errors import BusyError, UnavailableError

from . import upgrade_v4
from .engine import LOCK_WAIT_S, PROGRESS_KEY, RECYCLE_S, UNIT_KEY, WalKeeper, is_sqlite, make_engine
from .schema import (
    SCHEMA_VERSION,
    item_keyword_pairs,
    item_keywords,
    items,
    keyword_pair_rows,
    metadata,
    orders,
    schema_info,
)
from .unit_of_work import ReplayUnheld, UnitOfWork

T = TypeVar("T")
log = logging.getLogger("market.db")
MAX_ATTEMPTS = 8
_DEADLOCK_ERRNOS = {1213}  # retried (Galera's certification failures arrive as these too)
_LOCK_WAIT_ERRNOS = {1205}  # waited LOCK_WAIT_S already: BUSY, not another wait
# Cannot connect or lost the connection; two from a Galera node outside its cluster's
# primary component: 1047 (not ready for clients) and 1180 (a commit it could not replicate,
# rolled back); and a server in read-only mode (1290: a replica, say, during a failover).
_UNAVAILABLE_ERRNOS = {1040, 1047, 1053, 1180, 1290, 2002, 2003, 2005, 2006, 2013, 2055}
# At start: no server at that address, no such host, access denied, no such database,
# no right to write (1142), a read-only server (1290)
_UNUSABLE_ERRNOS = {1044, 1045, 1049, 1142, 1290, 1698, 2002, 2003, 2005}
# SQLite: the disk is full, the file cannot be read, written or opened (SQLite has rolled
# the transaction back: nothing was changed)
_SQLITE_UNAVAILABLE = {sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_READONLY,
                       sqlite3.SQLITE_CANTOPEN}
_ALL_IN_USE = "every database connection is in use; try again"
_LOCK_WAITED = f"waited {LOCK_WAIT_S} s for a lock another request held; nothing was changed; try again"
# How long a starting server waits for another's creation or upgrade of the schema (a
# million items took 66 s to upgrade to version 3 here)
SCHEMA_WAIT_S = 600.0
_OPENED_KEY = "market_opened"  # connection info: when its Connection was opened (monotonic)


class RetryTransaction(Exception):
    """Raised inside a transaction to roll it back and run it again."""


class DatabaseUnusable(RuntimeError):
    """The database cannot be used at all (found at start): the message says why, in one line."""


class _NewerSchema(RuntimeError):
    """The database was made by a newer version of the marketplace."""


def inserted_id(result: CursorResult[Any]) -> int:
    """The id the database chose for the row an INSERT just made."""
    key = result.inserted_primary_key
    assert key is not None
    return int(key[0])


def now_ms() -> int:
    """Current time as integer epoch milliseconds."""
    return int(time.time() * 1000)


class Database:
    """An engine plus the transaction runner every data function goes through."""

    def __init__(self, url: str, pool_size: int = 16, sqlite_synchronous: str = "NORMAL") -> None:
        self.url = url
        self.engine = make_engine(url, pool_size, sqlite_synchronous)
        self._wal = WalKeeper.for_engine(self.engine)
        self._connections = _Connections(self.engine, pool_size)

    def close(self) -> None:
        """Close every pooled connection."""
        if self._wal is not None:
            self._wal.close()
        self._connections.close()
        self.engine.dispose()

    def run(self, work: Callable[[Any], T], *, write: bool = True) -> T:
        """Run `work(tx)` in one transaction, retrying what the database says to retry.

        `tx` is a UnitOfWork; a function typed for a SQLAlchemy Connection works too (Any)."""
        hold = True  # the unit of work holds writes back, until one fails (ReplayUnheld)
        for attempt in range(MAX_ATTEMPTS):
            progress = [0]  # statements that reached the database in this attempt
            try:
                return self._run_once(work, write, progress, hold)
            except ReplayUnheld:
                hold = False
                continue
            except RetryTransaction:
                pass
            except IntegrityError:
                raise
            except PoolTimeoutError:
                raise BusyError(_ALL_IN_USE) from None
            except DBAPIError as exc:
                if exc.connection_invalidated:  # the database restarted, most likely: all died
                    self._connections.retire_all()
                    if progress[0] == 0 and attempt == 0:
                        continue  # nothing ran yet: run it on a fresh connection
                if _is_unavailable(exc):
                    log.warning("database unavailable: %s", exc.orig)
                    raise UnavailableError("the database cannot be reached; nothing was changed") from None
                if _is_lock_wait_timeout(exc):
                    log.warning("waited %d s for a lock: %s", LOCK_WAIT_S, exc.orig)
                    raise BusyError(_LOCK_WAITED) from None
                if not _is_deadlock(exc):
                    raise
            time.sleep(random.uniform(0, 0.002 * 2**attempt))
        raise BusyError("the database is too busy to finish this; nothing was changed")

    def _run_once(self, work: Callable[[Any], T], write: bool, progress: list[int], hold: bool = True) -> T:
        conn = self._connections.take()
        try:
            conn.info[PROGRESS_KEY] = progress
            conn.info[UNIT_KEY] = True
            tx = UnitOfWork(conn, write, hold)
            try:
                tx.begin()
                result = work(tx)
                tx.commit()
                return result
            except BaseException:
                _quietly_roll_back(tx)
                raise
        except DBAPIError as exc:
            if _is_unavailable(exc) and not conn.invalidated:
                conn.invalidate()  # say, a node out of its cluster: the next call connects anew
            raise
        finally:
            if not conn.invalidated:
                conn.info.pop(UNIT_KEY, None)
            self._connections.give(conn)

    def create_schema(self, wait_s: float = SCHEMA_WAIT_S) -> None:
        """Create missing tables; safe when several servers start at once.

        A server that finds another creating or upgrading the schema (its lock held past
        LOCK_WAIT_S) goes on waiting, for up to `wait_s`: an upgrade of a large catalogue
        takes minutes. DatabaseUnusable when the database cannot be reached, opened or
        entered at all, or the schema stays locked past `wait_s`."""
        deadline, attempt = time.monotonic() + wait_s, 0
        while True:
            try:
                self._run_once(_create_or_upgrade, True, [0])
                return
            except _NewerSchema as exc:
                raise DatabaseUnusable(f"cannot use the database {self._where}: {exc}") from None
            except DBAPIError as exc:  # OperationalError and IntegrityError among them
                if _is_unusable(exc):
                    raise DatabaseUnusable(self._unusable_message(exc)) from None
                if _is_lock_wait_timeout(exc):
                    self._wait_again_or_give_up(deadline, wait_s)
                    continue
                attempt += 1
                if attempt == 5:
                    raise
                time.sleep(0.2 * attempt)  # another process is creating it right now

    def _wait_again_or_give_up(self, deadline: float, wait_s: float) -> None:
        """Past a lock wait on the schema: log and go on, or DatabaseUnusable past the deadline."""
        if time.monotonic() >= deadline:
            raise DatabaseUnusable(
                f"cannot use the database {self._where}: its schema stayed locked for over "
                f"{wait_s:g} s (another server creating or upgrading it?); nothing was changed")
        log.warning("the schema is locked, most likely by another server creating or upgrading "
                    "it: still waiting (up to %g s in all)", wait_s)

    @property
    def _where(self) -> str:
        """The database's URL as the user wrote it, without its password."""
        return make_url(self.url).render_as_string(hide_password=True)

    def _unusable_message(self, exc: DBAPIError) -> str:
        reason = " ".join(str(exc.orig).split())
        if _errno(exc) == 1049:
            reason += (f"; create it first: CREATE DATABASE {self.engine.url.database} "
                       "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        return f"cannot use the database {self._where}: {reason}"

    @property
    def is_sqlite(self) -> bool:
        """True for the embedded SQLite database."""
        return is_sqlite(self.engine)


def _quietly_roll_back(tx: UnitOfWork) -> None:
    """Roll back after a failure; a connection that died meanwhile is the first error's story."""
    try:
        tx.rollback()
    except DBAPIError as exc:
        log.debug("rollback failed: %s", exc.orig)


def _create_or_upgrade(tx: UnitOfWork) -> None:
    tx.flush()
    conn = tx.core
    metadata.create_all(conn, checkfirst=True)
    version = _locked_version(conn)
    if version is None:
        conn.execute(insert(schema_info).values(version=SCHEMA_VERSION))
    elif version != SCHEMA_VERSION:
        _upgrade(conn, version)
    else:  # a write changing nothing: a database this server may not write is found now
        conn.execute(update(schema_info).values(version=schema_info.c.version))


def _locked_version(conn: Connection) -> int | None:
    """The schema's version, locked until the transaction ends, so that of two servers
    starting at once the second waits for the first's upgrade and then finds it done."""
    version = conn.execute(select(schema_info.c.version).with_for_update()).scalar()
    return None if version is None else int(version)


class _Connections:
    """Open Connections kept between calls, at most `size`, each holding a pooled one.

    A slot is a Connection ready for use or None (open a new one when taken). One that
    was invalidated (its database connection died) is closed when given back; one
    older than the engine's recycle time, or opened before retire_all, is replaced
    when taken, as the pool would.
    """

    def __init__(self, engine: Any, size: int, timeout_s: float = 10.0) -> None:
        self._engine, self._timeout_s = engine, timeout_s
        self._recycle_s = RECYCLE_S if not is_sqlite(engine) else float("inf")
        self._retired_before = 0.0
        self._slots: queue.SimpleQueue[Connection | None] = queue.SimpleQueue()
        for _ in range(size):
            self._slots.put(None)

    def take(self) -> Connection:
        """A Connection for one call; BUSY if none is free within the timeout."""
        try:
            conn = self._slots.get(timeout=self._timeout_s)
        except queue.Empty:
            raise BusyError(_ALL_IN_USE) from None
        if conn is not None:
            opened = conn.info[_OPENED_KEY]
            if opened > self._retired_before and time.monotonic() - opened < self._recycle_s:
                return conn
            conn.close()
        try:
            conn = self._engine.connect()
        except BaseException:
            self._slots.put(None)
            raise
        conn.info[_OPENED_KEY] = time.monotonic()
        return conn

    def give(self, conn: Connection) -> None:
        """Return a Connection taken for a call that has ended (committed or rolled back)."""
        if conn.invalidated or conn.in_transaction() or _left_open(conn):
            conn.close()
            self._slots.put(None)
        else:
            self._slots.put(conn)

    def retire_all(self) -> None:
        """Replace every Connection open now at its next use (one found its connection dead)."""
        self._retired_before = time.monotonic()

    def close(self) -> None:
        """Close the Connections that are not in use (their slots stay, to open anew)."""
        drained = 0
        while True:
            try:
                conn = self._slots.get_nowait()
            except queue.Empty:
                break
            drained += 1
            if conn is not None:
                conn.close()
        for _ in range(drained):
            self._slots.put(None)


def _upgrade(conn: Connection, version: int) -> None:
    """Bring a database made by an earlier version of the schema up to this one.

    Changes of tables come first and may run twice: on MySQL each ends the transaction,
    and with it the lock on schema_info, which is then taken again for the changes of rows.
    """
    if version > SCHEMA_VERSION:
        raise _NewerSchema(f"it has schema version {version}, newer than this code's "
                           f"{SCHEMA_VERSION}: run a newer version of the marketplace")
    _index_keywords_by_item(conn)  # version 3
    _compare_exactly(conn)  # version 3
    upgrade_v4.upgrade(conn)  # version 4
    locked = _locked_version(conn)
    if locked == SCHEMA_VERSION:
        return  # another server finished the upgrade meanwhile
    if version < 2:  # version 2: the search index holds items on sale only
        conn.execute(delete(item_keywords).where(
            item_keywords.c.item_id.in_(select(items.c.item_id).where(items.c.quantity == 0))))
    if version < 3:  # version 3: item_keyword_pairs, for the items already on sale
        _fill_keyword_pairs(conn)
    conn.execute(update(schema_info).values(version=SCHEMA_VERSION))
    log.info("schema upgraded from version %d to %d", version, SCHEMA_VERSION)


def _fill_keyword_pairs(conn: Connection, chunk: int = 10_000) -> None:
    """Index the keyword pairs of every item on sale, a chunk of items at a time; pairs are
    made in Python (keyword_pair_rows), exactly as put_item makes them."""
    after, filled = 0, 0
    while True:
        page = conn.execute(select(items.c.item_id, items.c.keywords)
                            .where(items.c.item_id > after, items.c.quantity > 0)
                            .order_by(items.c.item_id).limit(chunk)).all()
        if not page:
            break
        rows = [pair for item in page for pair in keyword_pair_rows(item.item_id, json.loads(item.keywords))]
        if rows:
            conn.execute(insert(item_keyword_pairs), rows)
        after, filled = page[-1].item_id, filled + len(rows)
    log.info("indexed %d keyword pairs of the items on sale", filled)


def _index_keywords_by_item(conn: Connection) -> None:
    """An index for unlisting an item's keywords, unless one leads with item_id already (MySQL
    made one for the foreign key; SQLite had none and read the whole table per sold-out item)."""
    existing = inspect(conn).get_indexes(item_keywords.name)
    if not any(index["column_names"][:1] == ["item_id"] for index in existing):
        next(ix for ix in item_keywords.indexes if ix.name == "ix_item_keywords_item").create(conn)


def _compare_exactly(conn: Connection) -> None:
    """Keywords and idempotency keys to schema.ExactText's type (SQLite's compare exactly already)."""
    if is_sqlite(conn.engine):
        return
    for column in (item_keywords.c.keyword, orders.c.idempotency_key):
        current = {c["name"]: c["type"] for c in inspect(conn).get_columns(column.table.name)}[column.name]
        if isinstance(current, VARBINARY):
            continue  # done already (by this version's create_all, or by another server)
        null = "NULL" if column.nullable else "NOT NULL"
        conn.execute(text(f"ALTER TABLE {column.table.name} MODIFY {column.name} "
                          f"{column.type.compile(dialect=conn.dialect)} {null}"))


def _left_open(conn: Connection) -> bool:
    """A server transaction still open after the call (a failed COMMIT whose ROLLBACK failed
    too, say): the connection would keep its locks, SQLite's write lock among them."""
    raw = conn.connection.dbapi_connection if not conn.invalidated else None
    return bool(getattr(raw, "in_transaction", False))


def _errno(exc: DBAPIError) -> int | None:
    return getattr(exc.orig, "errno", None)


def _is_deadlock(exc: DBAPIError) -> bool:
    return _errno(exc) in _DEADLOCK_ERRNOS or "deadlock" in str(exc.orig).lower()


def _is_lock_wait_timeout(exc: DBAPIError) -> bool:
    """MySQL's lock wait timeout, or SQLite's 'database is locked' once its busy timeout ran out."""
    return _errno(exc) in _LOCK_WAIT_ERRNOS or "database is locked" in str(exc.orig)


def _sqlite_error(exc: DBAPIError) -> int | None:
    """SQLite's primary result code (SQLITE_IOERR for all its extended ones), if SQLite's."""
    code = getattr(exc.orig, "sqlite_errorcode", None)
    return None if code is None else code & 0xFF


def _is_unusable(exc: DBAPIError) -> bool:
    return _errno(exc) in _UNUSABLE_ERRNOS or _sqlite_error(exc) in _SQLITE_UNAVAILABLE


def _is_unavailable(exc: DBAPIError) -> bool:
    return exc.connection_invalidated or _errno(exc) in _UNAVAILABLE_ERRNOS or \
        _sqlite_error(exc) in _SQLITE_UNAVAILABLE
