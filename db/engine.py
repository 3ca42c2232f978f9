"""The engine factory: the one place where SQLite and MySQL/MariaDB differ. SQLite: WAL, and
writers that take the write lock up front (BEGIN IMMEDIATE) instead of failing to upgrade
half-way. MySQL/MariaDB: mysql-connector-python with multi-statement queries, utf8mb4 with
binary collation, autocommit reads and READ COMMITTED write transactions.
"""
from __future__ import annotations

import logging
import os
import random
import sqlite3
import threading
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url

# How long a statement waits for a lock another transaction holds, on either database,
# before the call is answered BUSY: well inside the client's 30 s, so the answer arrives.
LOCK_WAIT_S = 15
_WAL_CHECK_EVERY_S = 0.5
SQLITE_SYNCHRONOUS = ("NORMAL", "FULL")
RECYCLE_S = 1800  # a MySQL connection older than this is replaced (the server's idle limit is far longer)
# A MySQL server that does not answer is reported after this long; the URL's ?connect_timeout=N
# (whole seconds, the driver's own option) sets another.
CONNECT_TIMEOUT_S = 5
log = logging.getLogger("market.db")
# Connection info, for code using a MySQL engine directly (not Database.run): False, a transaction
# it begins is not opened with START TRANSACTION (it opens its own). SQLite's is BEGIN IMMEDIATE.
WRITE_KEY = "market_write"
# Connection info: several statements may share one query. Not on a Galera node (wsrep_on):
# there a replicated write can abort the transaction between two statements of one query,
# and those after it would then run on their own in autocommit.
BATCHES_KEY = "market_batches"
_LIMITS_KEY = "market_sqlite_limits"  # connection info: the SqliteLimits of its engine


@dataclass(frozen=True)
class SqliteLimits:
    """SQLite's waits (tests shorten them): BEGIN IMMEDIATE polled for `poll_lock_s`, then its
    busy handler waits `busy_timeout_ms`; a log past `wal_checkpoint_bytes` is emptied, looked at
    again `wal_wait_after_busy_s` later if a reader kept it from that (WalKeeper)."""

    poll_lock_s: float = 5.0
    busy_timeout_ms: int = int((LOCK_WAIT_S - 5.0) * 1000)
    wal_checkpoint_bytes: int = 8 << 20
    wal_wait_after_busy_s: float = 5.0


def driver_url(url: str) -> URL:
    """The URL on the driver this project uses: mysql:// and mariadb:// mean mysql-connector."""
    parsed = make_url(url)
    if parsed.get_backend_name() in ("mysql", "mariadb"):
        return parsed.set(drivername="mysql+mysqlconnector")
    return parsed


def make_engine(url: str, pool_size: int = 16, sqlite_synchronous: str = "NORMAL",
                sqlite_limits: SqliteLimits = SqliteLimits()) -> Engine:
    """A pooled engine for an SQLAlchemy URL (mysql:// means mysql-connector). SQLite's
    `sqlite_synchronous`: NORMAL, a commit survives the process's crash; FULL, the machine's too."""
    parsed = driver_url(url)
    if parsed.get_backend_name() == "sqlite":
        if sqlite_synchronous not in SQLITE_SYNCHRONOUS:
            raise ValueError(f"sqlite_synchronous: one of {', '.join(SQLITE_SYNCHRONOUS)}")
        return _sqlite_engine(url, pool_size, sqlite_synchronous, sqlite_limits)
    if parsed.get_backend_name() in ("mysql", "mariadb"):
        return _mysql_engine(parsed, pool_size)
    raise ValueError(f"unsupported database URL {parsed.render_as_string(hide_password=True)}; "
                     "use sqlite:///FILE or mysql://USER:PASS@HOST:PORT/DB")


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


def connect_timeout_s(url: URL) -> int:
    """The seconds a MySQL server may take to answer a connect: the URL's (either of the
    driver's names), else CONNECT_TIMEOUT_S."""
    given = url.query.get("connect_timeout") or url.query.get("connection_timeout")
    return int(given) if isinstance(given, str) else CONNECT_TIMEOUT_S


def _sqlite_engine(url: str, pool_size: int, synchronous: str, limits: SqliteLimits) -> Engine:
    engine = create_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_timeout=30,
                           pool_reset_on_return=None,  # as MySQL's (_mysql_engine)
                           paramstyle="named",  # :name, as db.unit_of_work passes a dict of values
                           connect_args={"timeout": 30, "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, record: Any) -> None:
        dbapi_conn.isolation_level = None  # the unit of work sends BEGIN IMMEDIATE itself
        record.info[_LIMITS_KEY] = limits
        if not _polled(dbapi_conn, "PRAGMA journal_mode=WAL", limits.poll_lock_s):
            dbapi_conn.execute("PRAGMA journal_mode=WAL")  # another connection switching a new file
        for pragma in (f"synchronous={synchronous}", f"busy_timeout={limits.busy_timeout_ms}"):
            dbapi_conn.execute(f"PRAGMA {pragma}")

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        begin_immediate(conn.connection)

    return engine


def _polled(raw: sqlite3.Connection, sql: str, poll_s: float) -> bool:
    """`sql`, asked again every 0.1-1 ms for `poll_s` while SQLite says "locked" (its busy
    handler sleeps up to 25 ms between tries; switching a new file to WAL, another connection
    doing the same, it says so at once, without it): whether it ran. Another error ends the
    asking; the caller's own try meets it."""
    pause, deadline = 0.0001, time.monotonic() + poll_s
    while time.monotonic() < deadline:
        try:
            raw.execute(sql)
            return True
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc):
                return False
        time.sleep(pause * random.uniform(0.5, 1.5))
        pause = min(2 * pause, 0.001)
    return False


def begin_immediate(pooled: Any) -> None:
    """BEGIN IMMEDIATE on a pooled SQLite connection, polled while another writer holds the
    lock; then the busy handler's turn."""
    raw, limits = pooled.driver_connection, pooled.info[_LIMITS_KEY]
    raw.execute("PRAGMA busy_timeout=0")
    try:
        if _polled(raw, "BEGIN IMMEDIATE", limits.poll_lock_s):
            return
    finally:
        raw.execute(f"PRAGMA busy_timeout={limits.busy_timeout_ms}")
    raw.execute("BEGIN IMMEDIATE")


class WalKeeper:
    """Keeps an SQLite file's write-ahead log from growing without end (SQLite starts it again only
    when no reader uses it, which under steady reads never comes): a thread looks every 0.5 s and
    gives a log past its limit (SqliteLimits) a TRUNCATE checkpoint."""

    def __init__(self, database_path: str, limits: SqliteLimits = SqliteLimits()) -> None:
        self._path, self._wal, self._limits = database_path, database_path + "-wal", limits
        self._stop = threading.Event()
        self._conn: sqlite3.Connection | None = None  # the thread's own, opened when first needed
        self._thread = threading.Thread(target=self._keep, name="market-wal", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop looking (the thread's connection closes with it)."""
        self._stop.set()
        self._thread.join()

    def _keep(self) -> None:
        wait = _WAL_CHECK_EVERY_S
        try:
            while not self._stop.wait(wait):
                emptied = self._checkpoint_if_long()
                wait = _WAL_CHECK_EVERY_S if emptied else self._limits.wal_wait_after_busy_s
        finally:
            if self._conn is not None:
                self._conn.close()

    def _checkpoint_if_long(self) -> bool:
        """False if the log was long and could not be emptied (a reader held on). The checkpoint
        is asked again every 0.1-1 ms for up to 2 s while writers or readers are in its way."""
        try:
            if os.path.getsize(self._wal) < self._limits.wal_checkpoint_bytes:  # OSError: no log (yet)
                return True
            if self._conn is None:
                self._conn = sqlite3.connect(self._path, timeout=0, isolation_level=None)
            pause, deadline = 0.0001, time.monotonic() + 2.0
            while True:
                busy, frames, copied = self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                if not busy or time.monotonic() >= deadline:
                    break
                time.sleep(pause * random.uniform(0.5, 1.5))
                pause = min(2 * pause, 0.001)
        except (OSError, sqlite3.Error) as exc:  # no log yet, say: the next look will do
            log.debug("no checkpoint this time: %s", exc)
            return True
        log.debug("checkpoint: busy %d, %d frames in the log, %d copied", busy, frames, copied)
        return not busy


def _mysql_engine(url: Any, pool_size: int) -> Engine:
    from mysql.connector.constants import ClientFlag  # here: a SQLite server never loads the driver

    engine = create_engine(
        url,
        pool_size=pool_size, max_overflow=pool_size, pool_timeout=10, pool_recycle=RECYCLE_S,
        # No pre-ping (a round trip per call): a call whose first statement finds its
        # connection dead runs again on a fresh one (Database.run).
        pool_pre_ping=False,
        # every transaction ends in COMMIT or ROLLBACK: the pool's rollback would be a round trip
        pool_reset_on_return=None,
        # reads run in autocommit; the unit of work sends a write's START TRANSACTION
        isolation_level="AUTOCOMMIT",
        # MULTI_STATEMENTS: held writes go in the query of the statement that follows them.
        # Nothing puts a value into SQL text unquoted, so no injected "; DROP ..." can run
        # (test_engine.py checks). The flags given as a list replace SQLAlchemy's FOUND_ROWS:
        # an UPDATE's rowcount is the rows it changed.
        connect_args={"charset": "utf8mb4", "collation": "utf8mb4_bin", "connection_timeout":
                      connect_timeout_s(url), "client_flags": [ClientFlag.MULTI_STATEMENTS]},
    )
    event.listen(engine, "connect", _on_mysql_connect)
    event.listen(engine, "begin", _on_mysql_begin)
    return engine


def _on_mysql_connect(dbapi_conn: Any, record: Any) -> None:
    # the driver's trace context goes in query attributes, which MariaDB does not have: when
    # OpenTelemetry is installed, that costs every query a span lookup (about 5 % of a call)
    dbapi_conn.otel_context_propagation = False
    cursor = dbapi_conn.cursor()
    cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    # row locks (default 50 s) and metadata locks (default a year: an ALTER behind a long
    # transaction, and every query behind that ALTER)
    cursor.execute(f"SET SESSION innodb_lock_wait_timeout = {LOCK_WAIT_S}, "
                   f"lock_wait_timeout = {LOCK_WAIT_S}")
    cursor.execute("SHOW VARIABLES LIKE 'wsrep_on'")
    record.info[BATCHES_KEY] = not any(str(value).upper() == "ON" for _n, value in cursor.fetchall())
    cursor.close()


def _on_mysql_begin(conn: Any) -> None:
    if conn.info.get(WRITE_KEY, True):
        conn.exec_driver_sql("START TRANSACTION")
