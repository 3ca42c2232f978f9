"""The engine factory: the one place where SQLite and MySQL/MariaDB differ.

SQLite: WAL, a busy timeout, and transactions begun by us so that writers take the
write lock up front (BEGIN IMMEDIATE) instead of failing to upgrade half-way, asking
for it again every 0.1-1 ms while another writer holds it (_begin_immediate).
MySQL/MariaDB: mysql-connector-python's C extension, utf8mb4 with binary collation
(text comes back exactly as sent), autocommit reads and READ COMMITTED write
transactions, a pool the size of the worker pool (Database keeps that many open
between calls; the overflow serves anything else using the engine), and recycling;
a restarted database is survived by retrying a call whose first statement found its
pooled connection dead (Database.run).
"""
from __future__ import annotations

import logging
import os
import random
import re
import sqlite3
import threading
import time
from collections.abc import Sequence
from itertools import chain
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError

try:  # the C extension of mysql-connector-python (pinned to a version whose extension loads)
    from _mysql_connector import MySQLInterfaceError
    from mysql.connector.connection_cext import CMySQLConnection
    from mysql.connector.constants import ClientFlag
    from mysql.connector.errors import OperationalError, get_mysql_exception
except ImportError:  # pragma: no cover - then MySQL URLs fail at connect with a clear error
    CMySQLConnection = object  # type: ignore[misc,assignment]

# How long a statement waits for a lock another transaction holds, on either database,
# before the call is answered BUSY: well inside the client's 30 s, so the answer arrives.
LOCK_WAIT_S = 15
_POLL_LOCK_S = 5.0  # SQLite: BEGIN IMMEDIATE polled this long, then its busy handler waits the rest
SQLITE_BUSY_TIMEOUT_MS = int((LOCK_WAIT_S - _POLL_LOCK_S) * 1000)
SQLITE_SYNCHRONOUS = ("NORMAL", "FULL")
WAL_CHECKPOINT_BYTES = 8 << 20  # a WAL grown past this is copied back and emptied (WalKeeper)
log = logging.getLogger("market.db")
WRITE_KEY = "market_write"  # connection info: the current call writes
PROGRESS_KEY = "market_progress"  # connection info: [statements run] in the current call
_MYSQL_DRIVER = "mysql+mysqlconnector"
_WAL_CHECK_EVERY_S, _WAL_WAIT_AFTER_BUSY_S = 0.5, 5.0


def driver_url(url: str) -> URL:
    """The URL on the driver this project uses: mysql:// and mariadb:// mean mysql-connector."""
    parsed = make_url(url)
    if parsed.get_backend_name() in ("mysql", "mariadb"):
        return parsed.set(drivername=_MYSQL_DRIVER)
    return parsed


def make_engine(url: str, pool_size: int = 16, sqlite_synchronous: str = "NORMAL") -> Engine:
    """A pooled engine for an SQLAlchemy URL (mysql:// means mysql-connector).

    `sqlite_synchronous` (SQLite only): NORMAL, a commit survives the process's crash but
    the last ones may be lost to a power cut or the machine's crash; FULL, it survives both
    (a flush to disk per commit: about 0.6x the calls at 100 + 100, docs/benchmarks.md)."""
    parsed = driver_url(url)
    if parsed.get_backend_name() == "sqlite":
        if sqlite_synchronous not in SQLITE_SYNCHRONOUS:
            raise ValueError(f"sqlite_synchronous: one of {', '.join(SQLITE_SYNCHRONOUS)}")
        return _count_statements(_sqlite_engine(url, pool_size, sqlite_synchronous))
    if parsed.get_backend_name() in ("mysql", "mariadb"):
        return _count_statements(_mysql_engine(parsed, pool_size))
    raise ValueError(f"unsupported database URL {parsed.render_as_string(hide_password=True)}; "
                     "use sqlite:///FILE or mysql://USER:PASS@HOST:PORT/DB")


def _count_statements(engine: Engine) -> Engine:
    """Count statements that reached the database (see Database.run's retry rule)."""
    @event.listens_for(engine, "after_cursor_execute")
    def _counted(conn: Any, *_args: Any) -> None:
        count_statement(conn.info)

    return engine


def count_statement(info: dict[str, Any]) -> None:
    """One more statement ran in the current call."""
    progress = info.get(PROGRESS_KEY)
    if progress is not None:
        progress[0] += 1


def is_sqlite(engine: Engine) -> bool:
    """True for the embedded SQLite database."""
    return engine.dialect.name == "sqlite"


def _sqlite_engine(url: str, pool_size: int, synchronous: str) -> Engine:
    engine = create_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_timeout=30,
                           connect_args={"timeout": 30, "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we emit BEGIN ourselves, below
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA synchronous={synchronous}")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        if conn.info.get(WRITE_KEY, True):
            _begin_immediate(conn)
        else:
            conn.exec_driver_sql("BEGIN")

    return engine


class WalKeeper:
    """Keeps an SQLite file's write-ahead log from growing without end.

    SQLite's own checkpoints copy the log into the database, but start it again from the
    top only at a moment when no reader is using it, which under steady reads never comes:
    over one 100 + 100 run the log of a 2.3 MB database grew to 144 MB. A thread of its
    own looks every 0.5 s and gives a log past WAL_CHECKPOINT_BYTES a TRUNCATE checkpoint,
    which waits (up to 2 s) for the write lock and the readers of that moment, then empties
    it; no request waits for it. Should a reader hold its snapshot longer (a backup, say),
    the next look is 5 s later.
    """

    def __init__(self, database_path: str) -> None:
        self._path, self._wal = database_path, database_path + "-wal"
        self._stop = threading.Event()
        self._conn: sqlite3.Connection | None = None  # the thread's own, opened when first needed
        self._thread = threading.Thread(target=self._keep, name="market-wal", daemon=True)
        self._thread.start()

    @classmethod
    def for_engine(cls, engine: Engine) -> WalKeeper | None:
        """A keeper for an SQLite file named by its plain path (not ':memory:' or a URI)."""
        path = engine.url.database
        if not is_sqlite(engine) or not path or path == ":memory:" or path.startswith("file:"):
            return None
        return cls(path)

    def close(self) -> None:
        """Stop looking (the thread's connection closes with it)."""
        self._stop.set()
        self._thread.join()

    def _keep(self) -> None:
        wait = _WAL_CHECK_EVERY_S
        try:
            while not self._stop.wait(wait):
                wait = _WAL_CHECK_EVERY_S if self._checkpoint_if_long() else _WAL_WAIT_AFTER_BUSY_S
        finally:
            if self._conn is not None:
                self._conn.close()

    def _checkpoint_if_long(self) -> bool:
        """False if the log was long and could not be emptied (a reader held on)."""
        try:
            if os.path.getsize(self._wal) < WAL_CHECKPOINT_BYTES:  # OSError: no log (yet)
                return True
            if self._conn is None:
                self._conn = sqlite3.connect(self._path, timeout=0, isolation_level=None)
            busy, frames, copied = _truncate_checkpoint(self._conn)
        except (OSError, sqlite3.Error) as exc:  # no log yet, say: the next look will do
            log.debug("no checkpoint this time: %s", exc)
            return True
        log.debug("checkpoint: busy %d, %d frames in the log, %d copied", busy, frames, copied)
        return not busy


def _truncate_checkpoint(conn: sqlite3.Connection) -> tuple[int, int, int]:
    """wal_checkpoint(TRUNCATE), asked again every 0.1-1 ms for up to 2 s while writers or
    readers are in its way: SQLite's busy handler, sleeping ever longer, lost the write
    lock to the writers that ask this often (_begin_immediate) in half the tries."""
    pause, deadline = 0.0001, time.monotonic() + 2.0
    while True:
        busy, frames, copied = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if not busy or time.monotonic() >= deadline:
            return busy, frames, copied
        time.sleep(pause * random.uniform(0.5, 1.5))
        pause = min(2 * pause, 0.001)


def _begin_immediate(conn: Any) -> None:
    """BEGIN IMMEDIATE, asking again every 0.1-1 ms while another writer holds the lock.

    SQLite's busy handler sleeps 1, 2, 5, 10, 15, 20, 25 ... ms between its tries, so a
    writer that found the lock taken went on sleeping long after it came free: at 10 + 10
    that was most of the p99 (docs/benchmarks.md, ninth round). Past _POLL_LOCK_S the
    busy handler takes over, and its errors arrive as SQLAlchemy's.
    """
    raw = conn.connection.dbapi_connection
    raw.execute("PRAGMA busy_timeout=0")
    try:
        pause, deadline = 0.0001, time.monotonic() + _POLL_LOCK_S
        while time.monotonic() < deadline:
            try:
                raw.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc):
                    break
            time.sleep(pause * random.uniform(0.5, 1.5))
            pause = min(2 * pause, 0.001)
    finally:
        raw.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def _mysql_engine(url: Any, pool_size: int) -> Engine:
    engine = create_engine(
        url,
        pool_size=pool_size, max_overflow=pool_size, pool_timeout=10, pool_recycle=1800,
        # No pre-ping: a ping is a round trip per call. A connection found dead by a call's
        # first statement (nothing has run yet) is retried once on a fresh one instead.
        pool_pre_ping=False,
        # every transaction ends in COMMIT or ROLLBACK (Database.run), so the pool's own
        # rollback on return would only be one more round trip
        pool_reset_on_return=None,
        # Reads run statement by statement in autocommit mode (no COMMIT round trip);
        # writes open a READ COMMITTED transaction with START TRANSACTION (below).
        isolation_level="AUTOCOMMIT",
        connect_args={"charset": "utf8mb4", "collation": "utf8mb4_bin", "use_pure": False,
                      "connection_timeout": 5},
    )

    @event.listens_for(engine, "do_connect")
    def _connect(_dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
        # START TRANSACTION travels with a write's first statement (_QuietConnection)
        cparams["client_flags"] = cparams.get("client_flags", ClientFlag.get_default()) | \
            ClientFlag.MULTI_STATEMENTS
        conn = _QuietConnection(*cargs, **cparams)
        conn.cmd_query("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        # row locks (default 50 s) and metadata locks (default a year: an ALTER behind a long
        # transaction, and every query behind that ALTER)
        conn.cmd_query(f"SET SESSION innodb_lock_wait_timeout = {LOCK_WAIT_S}, "
                       f"lock_wait_timeout = {LOCK_WAIT_S}")
        conn.batches = not _on_galera_node(conn)
        return conn

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        if conn.info.get(WRITE_KEY, True):
            # sent with the transaction's first statement, not on its own round trip
            conn.connection.driver_connection.begin_with_next_statement()  # type: ignore[union-attr]

    return engine


def _on_galera_node(conn: Any) -> bool:
    """True on a Galera cluster's node (wsrep_on), where _QuietConnection must not batch."""
    conn.cmd_query("SHOW VARIABLES LIKE 'wsrep_on'")
    rows, _eof = conn.get_rows()
    return any(str(value).upper() == "ON" for _name, value in rows)


class StatementResult:
    """What a statement run without a cursor returned: its rows, or its row count and new id."""

    def __init__(self, rows: list[Any], rowcount: int, lastrowid: int) -> None:
        self.rows, self.rowcount, self.lastrowid = rows, rowcount, lastrowid

    def fetchall(self) -> list[Any]:
        return self.rows

    def fetchone(self) -> Any | None:
        return self.rows[0] if self.rows else None


_TEMPLATES: dict[str, tuple[list[bytes], list[str]]] = {}  # SQL -> (text around placeholders, names)
_PLACEHOLDER = re.compile(r"%\((\w+)\)s")


def _template(sql: str) -> tuple[list[bytes], list[str]]:
    """The pieces of text between a statement's %(name)s placeholders, and their names."""
    pieces = _PLACEHOLDER.split(sql)
    texts, names = pieces[0::2], pieces[1::2]
    if any("%" in text for text in texts):
        raise ValueError(f"a % outside a placeholder needs the cursor's escaping rules: {sql!r}")
    return [text.encode() for text in texts], names


class _QuietConnection(CMySQLConnection):
    """mysql-connector's C connection, minus two costs measured here.

    - The stock is_connected() pings the server each time a cursor is made: one extra
      round trip per statement. A dead connection still shows at the next query.
    - The C extension's commit() and rollback() wait for the server while holding the
      GIL (a py-spy --gil profile of a loaded server showed 60-70% of all GIL time in
      commit), which stops every other thread of the process for a round trip. The
      same statements sent with cmd_query() release the GIL while they wait, and are
      not sent at all when the server says no transaction is open (autocommit reads).
    - cmd_query() itself costs about 13 µs of Python per call over the C query it
      makes (a tracing wrapper, query attributes, a status dict nobody reads): the
      statements that return no rows and are sent on every write (START TRANSACTION,
      COMMIT, ROLLBACK) go to the C extension directly (run_plain).
    - START TRANSACTION waits for the transaction's first statement and goes in the
      same query ("START TRANSACTION;SELECT ..."): one round trip fewer per write,
      13 % of the statements MariaDB saw in the default mix. That needs the
      connection's multi-statement flag, which would let an injected "; DROP ..."
      run: nothing here puts a value into SQL text unquoted (run_statement quotes
      with the C extension, SQLAlchemy binds), and tests/test_engine.py sends such
      values and checks that they come back as data.
    - A write whose result nobody reads waits too (defer_statement) and goes in the
      query of the next statement, or of COMMIT; several statements whose results
      are read can share one query (run_statements), COMMIT too when they are the
      transaction's last. MariaDB runs a query's statements in order and stops at the
      first error, so a failed one leaves the COMMIT after it unrun, and the
      transaction is rolled back (commit). Not on a Galera node (`batches` False):
      there a transaction can be aborted from outside, by a replicated write, between
      two statements of one query, and the statements after it would then run on
      their own in autocommit (scale-out tests saw an oversold item and a purchase
      half written); every statement goes in its own query there, as before.
    """

    _begin_pending = False  # START TRANSACTION waits for the next statement
    _deferred: list[bytes] | None = None  # statements waiting for the next query (defer_statement)
    _committed = False  # COMMIT went with the transaction's last statements (run_statements)
    batches = True  # deferred writes and statements run together share queries (not on Galera)

    def is_connected(self) -> bool:
        return bool(self._cmysql and self._cmysql.connected())

    def run_statement(self, sql: str, values: dict[str, Any]) -> StatementResult:
        """Run one statement with %(name)s placeholders, without a cursor.

        What a cursor's execute() does (values quoted and escaped by the C extension,
        the same conversion of results), minus about 30 µs of Python per statement
        spent on the cursor object and the result's column descriptions.
        """
        cmysql = self.run_plain(self._render(sql, values))
        try:
            return _result_of(cmysql)
        except MySQLInterfaceError as exc:
            raise _mysql_error(exc) from exc

    def run_statements(self, statements: Sequence[tuple[str, dict[str, Any]]],
                       commit: bool = False) -> list[StatementResult]:
        """Run statements in one query (one round trip), each one's result in order; with
        `commit`, COMMIT goes in the query too, and the transaction is over."""
        rendered = [self._render(sql, values) for sql, values in statements]
        cmysql = self.run_plain(b";".join(rendered + [b"COMMIT"] if commit else rendered))
        results = []
        try:
            for n in range(len(statements)):
                if n:
                    cmysql.next_result()
                results.append(_result_of(cmysql))
            if commit:
                cmysql.next_result()  # COMMIT's own answer: an error if it failed
                self._committed = True
        except MySQLInterfaceError as exc:
            raise _mysql_error(exc) from exc
        return results

    def defer_statement(self, sql: str, values: dict[str, Any]) -> None:
        """Send a write with the next statement or COMMIT of this transaction; its result is not read."""
        if self._deferred is None:
            self._deferred = []
        self._deferred.append(self._render(sql, values))

    def _render(self, sql: str, values: dict[str, Any]) -> bytes:
        """The statement's text with its values quoted and escaped by the C extension."""
        texts, names = _TEMPLATES.get(sql) or _TEMPLATES.setdefault(sql, _template(sql))
        quoted = self._live().convert_to_mysql(*[values[name] for name in names]) if names else ()
        return b"".join(chain.from_iterable(zip(texts, quoted, strict=False))) + texts[-1]

    def run_plain(self, statement: bytes) -> Any:
        """Send a complete statement (nothing left to quote) without cmd_query's costs.

        A pending START TRANSACTION and deferred statements go first, in the same query.
        Returns the C connection, its (first) result, if any, not yet read."""
        if self._committed:
            raise RuntimeError("a statement after the transaction's COMMIT (run_statements(commit=True))")
        if self._begin_pending or self._deferred:
            return self._send([*self._take_pending(), statement])
        return self._send([statement])

    def _send(self, statements: list[bytes]) -> Any:
        """One query of the statements; past the OKs of all but the last to its result."""
        cmysql = self._live()
        self.handle_unread_result()
        try:
            cmysql.query(b";".join(statements) if len(statements) > 1 else statements[0])
            for _ in statements[1:]:
                cmysql.next_result()
        except MySQLInterfaceError as exc:
            raise _mysql_error(exc) from exc
        return cmysql

    def _take_pending(self) -> list[bytes]:
        """The statements waiting for the next query: START TRANSACTION, then deferred writes."""
        pending = [b"START TRANSACTION"] if self._begin_pending else []
        if self._deferred:
            pending += self._deferred
        self._begin_pending, self._deferred = False, None
        return pending

    def begin_with_next_statement(self) -> None:
        """Open a transaction with the next statement sent (see the class notes)."""
        self._begin_pending = True

    def cmd_query(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        """The driver's query path (SQLAlchemy's cursors): what is pending goes first, on its own."""
        pending = self._take_pending()
        if pending:
            self._send(pending)
        return super().cmd_query(query, *args, **kwargs)

    def _live(self) -> Any:
        """The C connection, or the driver's error for a closed one."""
        if self._cmysql is None:
            raise OperationalError(errno=2055, msg="Connection not available.")
        return self._cmysql

    def commit(self) -> None:
        self._committed = False  # committed already, if it was set: then nothing is open
        if not self._deferred:
            self._begin_pending = False  # a transaction that sent nothing has nothing to end
        if self._cmysql:
            self.handle_unread_result()
            if self._deferred:  # COMMIT rides with them, after START TRANSACTION if pending
                try:
                    self.run_plain(b"COMMIT")
                except BaseException:
                    self.rollback()  # one of them failed: COMMIT never ran
                    raise
            elif self.in_transaction:  # the server's status flag: nothing to end otherwise
                self.run_plain(b"COMMIT")

    def rollback(self) -> None:
        self._begin_pending, self._deferred, self._committed = False, None, False
        if self._cmysql:
            self._cmysql.consume_result()
            if self.in_transaction:
                self.run_plain(b"ROLLBACK")


def _mysql_error(exc: Any) -> Exception:
    """The C extension's error as the driver's own exception class (IntegrityError, ...)."""
    return get_mysql_exception(exc.errno, msg=exc.msg, sqlstate=exc.sqlstate)


def _result_of(cmysql: Any) -> StatementResult:
    """The current result of the C connection: its rows, or its row count and new id."""
    if not cmysql.have_result_set:
        return StatementResult([], cmysql.affected_rows(), cmysql.insert_id())
    rows = []
    while (row := cmysql.fetch_row()) is not None:
        rows.append(row)
    cmysql.free_result()
    return StatementResult(rows, len(rows), 0)


def driver_error(tx: Connection, sql: str, values: Any, exc: Exception, cursor: Any) -> DBAPIError:
    """A driver error as SQLAlchemy would raise it (IntegrityError, OperationalError, ...).

    For statements sent to the driver directly (db.prepared), so that Database.run sees
    the same errors as for statements SQLAlchemy executed.
    """
    dialect = tx.dialect
    disconnect = dialect.is_disconnect(exc, tx.connection.dbapi_connection, cursor)  # type: ignore[arg-type]
    if disconnect:  # as SQLAlchemy does: retire every connection of this generation
        tx.engine.pool._invalidate(tx.connection, exc)  # type: ignore[arg-type]
        tx.invalidate(exc)
    error = DBAPIError.instance(sql, values, exc, dialect.loaded_dbapi.Error,
                                connection_invalidated=disconnect, dialect=dialect)
    assert isinstance(error, DBAPIError)
    return error
