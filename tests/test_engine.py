"""The engine factory: the MySQL driver is the C extension, and the dialect settings hold."""
from __future__ import annotations

import os
import secrets
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import mysql.connector
import pytest
from conftest import fresh_mysql_database
from sqlalchemy import bindparam, insert, select, text, update
from sqlalchemy.exc import IntegrityError

import db.engine as engine_module
from db import Database, DatabaseUnusable
from db.engine import _QuietConnection, _template, driver_url
from db.prepared import Prepared, PreparedRows, run_together
from db.schema import login_failures
from wire.errors import BusyError, UnavailableError


def test_mysql_runs_on_the_c_extension(database: Database) -> None:
    if database.is_sqlite:
        assert database.run(lambda tx: tx.execute(text("PRAGMA journal_mode")).scalar()) == "wal"
        return
    assert mysql.connector.HAVE_CEXT
    with database.engine.connect() as conn:
        raw = conn.connection.driver_connection
        assert isinstance(raw, _QuietConnection)  # a subclass of the C extension's connection
        isolation = conn.exec_driver_sql("SELECT @@session.tx_isolation").scalar()
        assert isolation == "READ-COMMITTED"
        assert conn.exec_driver_sql("SELECT @@character_set_connection").scalar() == "utf8mb4"


@pytest.mark.parametrize(("url", "expected"), [
    ("mysql://root@127.0.0.1:3306/test", "mysql+mysqlconnector://root@127.0.0.1:3306/test"),
    ("mariadb://u:p@db:3307/shop", "mysql+mysqlconnector://u:p@db:3307/shop"),
    ("mysql+mysqlconnector://root@h/t", "mysql+mysqlconnector://root@h/t"),
    ("sqlite:///market.db", "sqlite:///market.db"),
])
def test_mysql_urls_of_any_spelling_use_mysql_connector(url: str, expected: str) -> None:
    assert driver_url(url).render_as_string(hide_password=False) == expected


_ONE = Prepared(select(login_failures.c.failures).where(login_failures.c.username == bindparam("username")))


def _in_transaction_after_a_statement(tx: Any) -> bool:
    _ONE.all(tx, {"username": "nobody"})
    return bool(tx.connection.driver_connection.in_transaction)


def test_reads_run_outside_a_transaction_and_writes_inside_one(database: Database) -> None:
    # both drivers report whether the database has a transaction open on the connection
    assert database.run(_in_transaction_after_a_statement, write=False) is False
    assert database.run(_in_transaction_after_a_statement, write=True) is True
    # through SQLAlchemy's own execution path too
    assert database.run(lambda tx: tx.execute(text("SELECT 1")).scalar() == 1 and
                        tx.connection.driver_connection.in_transaction, write=True) is True


class _QueriesSent:
    """The C connection, passed through, with the text of every query sent on it."""

    def __init__(self, cmysql: Any) -> None:
        self.cmysql, self.sent, self.texts = cmysql, [], []

    def query(self, statement: bytes, *args: Any, **kwargs: Any) -> Any:
        self.sent.append(bytes(statement).split(b" ", 2)[:2])
        self.texts.append(bytes(statement))
        return self.cmysql.query(statement, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cmysql, name)


@pytest.fixture
def mariadb_url(mysql_server: str) -> Iterator[str]:
    yield from fresh_mysql_database(mysql_server)


def test_a_write_opens_its_transaction_with_its_first_statement(mariadb_url: str) -> None:
    # MySQL only: SQLite's BEGIN costs no round trip
    database = Database(mariadb_url, pool_size=1)  # one connection: every call below uses it
    database.create_schema()
    driver = database.run(lambda tx: tx.connection.driver_connection, write=False)
    recorder = driver._cmysql = _QueriesSent(driver._cmysql)
    try:
        database.run(lambda tx: _ONE.all(tx, {"username": "nobody"}), write=True)
        assert recorder.sent == [[b"START", b"TRANSACTION;SELECT"], [b"COMMIT"]]
        recorder.sent.clear()
        database.run(lambda tx: tx.execute(text("SELECT 1")).scalar(), write=True)  # SQLAlchemy's path
        assert recorder.sent == [[b"START", b"TRANSACTION"], [b"SELECT", b"1"], [b"COMMIT"]]
        recorder.sent.clear()
        database.run(lambda tx: None, write=True)  # nothing sent, nothing to end
        database.run(lambda tx: _ONE.all(tx, {"username": "nobody"}), write=False)
        assert recorder.sent == [[b"SELECT", b"login_failures.failures"]]
    finally:
        driver._cmysql = recorder.cmysql
        database.close()


# -- Prepared statements run on the driver (on MySQL without a cursor: engine.run_statement) ---

_LOGIN_FAILURE = Prepared(insert(login_failures).values(
    role=bindparam("role"), username=bindparam("username"), failures=bindparam("n"), last_failure_ms=0))
_FAILURE_OF = Prepared(select(login_failures.c.username, login_failures.c.failures)
                       .where(login_failures.c.role == bindparam("role"),
                              login_failures.c.username == bindparam("username")))
AWKWARD = ["it's", 'say "hi"', "back\\slash", "semi; DROP TABLE users; --", "%(role)s %s %%", "naïve 🛒",
           "\x00nul", "line\nbreak", "' OR '1'='1"]


@pytest.mark.parametrize("value", AWKWARD)
def test_values_travel_exactly_as_given_never_as_sql(database: Database, value: str) -> None:
    database.run(lambda tx: _LOGIN_FAILURE.execute(tx, {"role": "buyer", "username": value, "n": 7}))
    row = database.run(lambda tx: _FAILURE_OF.first(tx, {"role": "buyer", "username": value}), write=False)
    assert row is not None and (row.username, row.failures) == (value, 7)
    assert database.run(lambda tx: _FAILURE_OF.all(tx, {"role": "buyer", "username": value + "x"}),
                        write=False) == []


def test_driver_errors_arrive_as_sqlalchemy_errors(database: Database) -> None:
    database.run(lambda tx: _LOGIN_FAILURE.execute(tx, {"role": "buyer", "username": "dup", "n": 1}))
    with pytest.raises(IntegrityError):
        database.run(lambda tx: _LOGIN_FAILURE.execute(tx, {"role": "buyer", "username": "dup", "n": 1}))
    with pytest.raises(IntegrityError):  # NOT NULL
        database.run(lambda tx: _LOGIN_FAILURE.execute(tx, {"role": "buyer", "username": "nul", "n": None}))


def test_row_counts_and_new_ids_come_back(database: Database) -> None:
    added = database.run(lambda tx: _LOGIN_FAILURE.execute(tx, {"role": "seller", "username": "c", "n": 1}))
    assert added.rowcount == 1
    bump = Prepared(update(login_failures).where(login_failures.c.role == bindparam("role"))
                    .values(failures=login_failures.c.failures + 1))
    assert database.run(lambda tx: bump.execute(tx, {"role": "seller"})).rowcount == 1
    assert database.run(lambda tx: bump.execute(tx, {"role": "nobody"})).rowcount == 0


def test_a_literal_percent_sign_is_refused_rather_than_guessed() -> None:
    with pytest.raises(ValueError, match="outside a placeholder"):
        _template("SELECT 1 FROM t WHERE name LIKE 'a%%'")


# -- Connections stay open between calls (Database's _Connections) -----------------------------

def _driver(tx: Any) -> Any:
    return tx.connection.driver_connection


def test_calls_reuse_open_connections_up_to_the_pool_size(db_url: str) -> None:
    database = Database(db_url, pool_size=2)
    try:
        # the objects themselves, held: an id() alone may be reused once an object is freed
        # (it was, once, on Python 3.13, for the connection opened after close())
        seen = [database.run(_driver, write=n % 2 == 0) for n in range(20)]
        assert len({id(driver) for driver in seen}) == 2  # two slots, each opened once, reads and writes
        database.close()
        fresh = database.run(_driver, write=False)  # close() keeps the slots usable
        assert all(fresh is not driver for driver in seen)
    finally:
        database.close()


def test_a_dead_connection_retires_every_open_one(db_url: str) -> None:
    database = Database(db_url, pool_size=2)

    def opened(tx: Any) -> float:  # when the Connection the call ran on was opened
        return float(tx.info["market_opened"])

    try:
        before = {database.run(opened) for _ in range(4)}
        database._connections.retire_all()  # what Database.run does when one is found dead
        after = {database.run(opened) for _ in range(4)}
        assert len(before) == len(after) == 2 and min(after) > max(before)
    finally:
        database.close()


@pytest.mark.parametrize("errno, message", [
    (1047, "WSREP has not yet prepared node for application use"),
    (1180, "Error while appending streaming replication fragment"),
])
def test_a_node_out_of_its_cluster_is_unavailable_and_its_connection_replaced(
        mariadb_url: str, errno: int, message: str) -> None:
    """The errors a Galera node gives outside its primary component, raised by the real server."""
    database = Database(mariadb_url, pool_size=1)

    def server_connection_id(tx: Any) -> int:
        return int(tx.exec_driver_sql("SELECT CONNECTION_ID()").scalar())

    def refused(tx: Any) -> None:
        tx.exec_driver_sql(f"SIGNAL SQLSTATE '08S01' SET MYSQL_ERRNO = {errno}, MESSAGE_TEXT = '{message}'")

    try:
        before = database.run(server_connection_id)
        assert database.run(server_connection_id) == before  # kept open while it works
        for write in (True, False):
            with pytest.raises(UnavailableError):
                database.run(refused, write=write)
            after = database.run(server_connection_id)
            assert after != before  # the next call connects anew (through a balancer: another node)
            before = after
    finally:
        database.close()


def test_a_call_waits_for_a_free_connection_then_says_busy(db_url: str) -> None:
    database = Database(db_url, pool_size=1)
    database._connections = type(database._connections)(database.engine, 1, timeout_s=0.2)
    held = threading.Event()
    release = threading.Event()

    def hold(tx: Any) -> None:
        held.set()
        release.wait(5)

    holder = threading.Thread(target=database.run, args=(hold,), kwargs={"write": False})
    holder.start()
    try:
        assert held.wait(5)
        with pytest.raises(BusyError):
            database.run(lambda tx: None, write=False)
    finally:
        release.set()
        holder.join()
    assert database.run(lambda tx: 1, write=False) == 1  # the slot came back
    database.close()


def test_prepared_rows_insert_every_row_exactly_in_chunks(database: Database) -> None:
    rows = [{"role": "seller", "username": f"{AWKWARD[n % len(AWKWARD)]}#{n}", "failures": n,
             "last_failure_ms": 10 * n} for n in range(45)]  # 20 + 20 + 5 rows
    inserter = PreparedRows(login_failures, ("role", "username", "failures", "last_failure_ms"), chunk=20)
    database.run(lambda tx: inserter.execute(tx, rows))
    stored = database.run(lambda tx: tx.execute(
        select(login_failures.c.username, login_failures.c.failures, login_failures.c.last_failure_ms)
        .where(login_failures.c.role == "seller")).all(), write=False)
    expected = [(row["username"], row["failures"], row["last_failure_ms"]) for row in rows]
    assert sorted(map(tuple, stored)) == sorted(expected)
    assert sorted(inserter._by_count) == [5, 20]  # two statement shapes for three statements


# -- Deferred writes and statements run together (db.prepared: defer, run_together) -------------

_BUMP = Prepared(update(login_failures).where(login_failures.c.username == bindparam("username"))
                 .values(failures=login_failures.c.failures + 1))


def _failures_of(database: Database, username: str) -> int | None:
    row = database.run(lambda tx: _FAILURE_OF.first(tx, {"role": "buyer", "username": username}), write=False)
    return None if row is None else int(row.failures)


def test_a_deferred_write_is_seen_by_the_statements_after_it(database: Database) -> None:
    def work(tx: Any) -> tuple[int, int]:
        _LOGIN_FAILURE.defer(tx, {"role": "buyer", "username": "later", "n": 1})
        _BUMP.defer(tx, {"username": "later"})
        seen = _FAILURE_OF.first(tx, {"role": "buyer", "username": "later"})
        _BUMP.defer(tx, {"username": "later"})  # with the COMMIT
        return int(seen.failures), len(_FAILURE_OF.all(tx, {"role": "buyer", "username": "none"}))

    assert database.run(work) == (2, 0)
    assert _failures_of(database, "later") == 3


@pytest.mark.parametrize("failing", ["with a later statement", "with the commit"])
def test_a_deferred_write_that_fails_rolls_back_its_whole_transaction(db_url: str, failing: str) -> None:
    database = Database(db_url, pool_size=1)  # one connection: the call after the failure reuses it
    database.create_schema()
    database.run(lambda tx: _LOGIN_FAILURE.execute(tx, {"role": "buyer", "username": "taken", "n": 1}))

    def work(tx: Any) -> None:
        _LOGIN_FAILURE.execute(tx, {"role": "buyer", "username": "first", "n": 1})  # sent now
        _BUMP.defer(tx, {"username": "taken"})
        _LOGIN_FAILURE.defer(tx, {"role": "buyer", "username": "taken", "n": 1})  # a duplicate key
        _BUMP.defer(tx, {"username": "taken"})
        if failing == "with a later statement":
            _FAILURE_OF.all(tx, {"role": "buyer", "username": "first"})

    try:
        with pytest.raises(IntegrityError):
            database.run(work)
        assert _failures_of(database, "first") is None  # the statement sent before it: rolled back
        assert _failures_of(database, "taken") == 1  # the deferred bump before it too
        assert database.run(_in_transaction_after_a_statement, write=False) is False  # nothing left open
        database.run(lambda tx: _BUMP.defer(tx, {"username": "taken"}))  # the connection works on
        assert _failures_of(database, "taken") == 2
    finally:
        database.close()


def test_statements_run_together_each_give_their_result(database: Database) -> None:
    database.run(lambda tx: _LOGIN_FAILURE.execute(tx, {"role": "buyer", "username": "both", "n": 1}))
    bumped, missed, row = database.run(lambda tx: run_together(tx, [
        (_BUMP, {"username": "both"}), (_BUMP, {"username": "nobody"}),
        (_FAILURE_OF, {"role": "buyer", "username": "both"})]))
    assert (bumped.rowcount, missed.rowcount) == (1, 0)
    assert tuple(row.fetchall()[0]) == ("both", 2)


def test_deferred_writes_and_statements_run_together_share_queries(mariadb_url: str) -> None:
    database = Database(mariadb_url, pool_size=1)
    database.create_schema()
    driver = database.run(lambda tx: tx.connection.driver_connection, write=False)
    recorder = driver._cmysql = _QueriesSent(driver._cmysql)

    def queries(work: Any) -> list[list[bytes]]:
        recorder.texts.clear()
        database.run(work)
        return [[part.split(b" ")[0] for part in text.split(b";")] for text in recorder.texts]

    try:
        database.run(lambda tx: _LOGIN_FAILURE.execute(tx, {"role": "buyer", "username": "q", "n": 1}))
        # deferred only: START TRANSACTION, the writes and COMMIT in one query
        assert queries(lambda tx: [_BUMP.defer(tx, {"username": "q"}) for _ in range(3)]) == [
            [b"START", b"UPDATE", b"UPDATE", b"UPDATE", b"COMMIT"]]
        assert queries(lambda tx: (_BUMP.defer(tx, {"username": "q"}),
                                   _FAILURE_OF.all(tx, {"role": "buyer", "username": "q"}))) == [
            [b"START", b"UPDATE", b"SELECT"], [b"COMMIT"]]
        assert queries(lambda tx: run_together(tx, [(_BUMP, {"username": "q"})] * 2 + [
            (_FAILURE_OF, {"role": "buyer", "username": "q"})])) == [
            [b"START", b"UPDATE", b"UPDATE", b"SELECT"], [b"COMMIT"]]
        assert _failures_of(database, "q") == 7
        # through SQLAlchemy's own path, what is pending goes first
        assert queries(lambda tx: (_BUMP.defer(tx, {"username": "q"}), tx.execute(text("SELECT 1")))) == [
            [b"START", b"UPDATE"], [b"SELECT"], [b"COMMIT"]]
    finally:
        driver._cmysql = recorder.cmysql
        database.close()


def test_the_last_statement_can_carry_the_commit(db_url: str) -> None:
    database = Database(db_url, pool_size=1)
    database.create_schema()

    def last(tx: Any) -> Any:
        _LOGIN_FAILURE.defer(tx, {"role": "buyer", "username": "end", "n": 4})
        return _FAILURE_OF.all_then_commit(tx, {"role": "buyer", "username": "end"})

    try:
        assert [tuple(row) for row in database.run(last)] == [("end", 4)]
        assert _failures_of(database, "end") == 4
        assert database.run(_in_transaction_after_a_statement, write=False) is False
        if not database.is_sqlite:  # committed already: another statement would run outside it
            with pytest.raises(RuntimeError, match="after the transaction's COMMIT"):
                database.run(lambda tx: (_FAILURE_OF.all_then_commit(tx, {"role": "buyer", "username": "x"}),
                                         _BUMP.execute(tx, {"username": "end"})))
            assert _failures_of(database, "end") == 4
        with pytest.raises(IntegrityError):  # a failing statement: the COMMIT behind it never runs
            database.run(lambda tx: (_BUMP.execute(tx, {"username": "end"}), last(tx)))  # "end" again
        assert _failures_of(database, "end") == 4
    finally:
        database.close()


@pytest.mark.parametrize("poll_s", [5.0, 0.05])  # the lock freed while polling, or after: SQLite's wait
def test_a_sqlite_writer_waits_for_the_write_lock_then_writes(tmp_path: Any, monkeypatch: Any,
                                                              poll_s: float) -> None:
    monkeypatch.setattr(engine_module, "_POLL_LOCK_S", poll_s)
    path = tmp_path / "locked.db"
    database = Database(f"sqlite:///{path}", pool_size=2)
    database.create_schema()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process's writer, holding the lock
    wrote: list[Any] = []
    writer = threading.Thread(target=lambda: wrote.append(database.run(
        lambda tx: _LOGIN_FAILURE.execute(tx, {"role": "buyer", "username": "waited", "n": 1}).rowcount)))
    try:
        writer.start()
        writer.join(0.3)
        assert writer.is_alive() and wrote == []  # waiting for the lock, not failed
        holder.execute("COMMIT")
        writer.join(10)
        assert wrote == [1] and _failures_of(database, "waited") == 1
        # the busy timeout is back for everything else
        assert database.run(lambda tx: tx.exec_driver_sql("PRAGMA busy_timeout").scalar()) == \
            engine_module.SQLITE_BUSY_TIMEOUT_MS
    finally:
        holder.close()
        database.close()


def test_outside_a_write_transaction_deferring_runs_at_once(database: Database) -> None:
    def read(tx: Any) -> int:  # a read: statement by statement, nothing held back for a COMMIT
        tx.execute(text("SELECT 1"))  # SQLAlchemy's own path, which opens its transaction
        _LOGIN_FAILURE.defer(tx, {"role": "buyer", "username": "at once", "n": 5})
        seen = len(_FAILURE_OF.all_then_commit(tx, {"role": "buyer", "username": "at once"}))
        _BUMP.defer(tx, {"username": "at once"})  # the call's last statement
        return seen

    assert database.run(read, write=False) == 1  # sent before the SELECT that sees it
    # MySQL runs a read's statements in autocommit, so both stayed (none waited for a COMMIT
    # that a read never sends); SQLite's read transaction is rolled back, with any write in it
    assert _failures_of(database, "at once") == (None if database.is_sqlite else 6)


def test_a_sqlite_writer_that_waited_its_whole_lock_wait_answers_busy_once(tmp_path: Any,
                                                                          monkeypatch: Any) -> None:
    # before: 'database is locked' was retried, 8 waits of 5 s + 30 s in all: the client's
    # 30 s ran out long before, and the call might still commit after it had given up
    monkeypatch.setattr(engine_module, "_POLL_LOCK_S", 0.05)
    monkeypatch.setattr(engine_module, "SQLITE_BUSY_TIMEOUT_MS", 200)
    path = tmp_path / "held.db"
    database = Database(f"sqlite:///{path}", pool_size=1)
    database.create_schema()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # a writer that does not let go
    attempts = [0]

    def write(tx: Any) -> None:
        attempts[0] += 1
        _LOGIN_FAILURE.execute(tx, {"role": "buyer", "username": "never", "n": 1})

    try:
        with pytest.raises(BusyError, match=r"waited \d+ s for a lock another request held; nothing was"):
            database.run(write)
        assert attempts == [0]  # the BEGIN waited, once; the work never ran
        holder.execute("ROLLBACK")
        database.run(write)  # and the connection serves the next call
        assert _failures_of(database, "never") == 1
    finally:
        holder.close()
        database.close()


@pytest.mark.parametrize("db_url", ["mariadb"], indirect=True)
def test_a_mariadb_lock_wait_timeout_answers_busy_once(database: Database) -> None:
    waits = database.run(lambda tx: tx.exec_driver_sql(
        "SELECT @@innodb_lock_wait_timeout, @@lock_wait_timeout").one(), write=False)
    assert tuple(waits) == (engine_module.LOCK_WAIT_S,) * 2  # not the server's 50 s and a year
    one = Database(database.url, pool_size=1)
    one.run(lambda tx: tx.exec_driver_sql("SET SESSION innodb_lock_wait_timeout = 1"), write=False)
    database.run(lambda tx: _LOGIN_FAILURE.execute(tx, {"role": "buyer", "username": "held", "n": 1}))
    attempts = [0]

    def bump(tx: Any) -> None:
        attempts[0] += 1
        _BUMP.execute(tx, {"username": "held"})

    try:
        with database.engine.connect() as holder, holder.begin():
            holder.execute(select(login_failures).where(login_failures.c.username == "held")
                           .with_for_update())
            with pytest.raises(BusyError, match="waited"):  # before: retried 8 times, then BUSY
                one.run(bump)
        assert attempts == [1]
        one.run(bump)
        assert _failures_of(database, "held") == 2
    finally:
        one.close()


def test_a_connection_given_back_inside_a_transaction_sqlalchemy_missed_is_closed(tmp_path: Any) -> None:
    """After a failed COMMIT SQLAlchemy sends no ROLLBACK; were the transaction left open,
    the pooled connection would keep SQLite's write lock from every other process."""
    path = tmp_path / "left.db"
    database = Database(f"sqlite:///{path}", pool_size=1)
    database.create_schema()
    other = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        database.run(lambda tx: tx.connection.dbapi_connection.execute("BEGIN IMMEDIATE"), write=False)
        other.execute("BEGIN IMMEDIATE")  # before: 'database is locked'
        other.execute("ROLLBACK")
        assert database.run(lambda tx: tx.exec_driver_sql("SELECT 1").scalar(), write=False) == 1
    finally:
        other.close()
        database.close()


def test_a_database_the_server_may_only_read_is_refused_at_start(database: Database) -> None:
    """Before, a server started on it and answered every write INTERNAL."""
    if database.is_sqlite:
        path = database.engine.url.database
        read_only = Database(f"sqlite:///file:{path}?mode=ro&uri=true", pool_size=1)
        reason = "attempt to write a readonly database"
    else:
        user = f"ro_{secrets.token_hex(4)}"
        name = database.engine.url.database
        with database.engine.connect() as admin:
            for host in ("%", "localhost"):
                admin.exec_driver_sql(f"CREATE USER '{user}'@'{host}' IDENTIFIED BY 'pw'")
                admin.exec_driver_sql(f"GRANT SELECT ON {name}.* TO '{user}'@'{host}'")
        url = driver_url(database.url).set(username=user, password="pw")
        read_only = Database(url.render_as_string(hide_password=False), pool_size=1)
        reason = "UPDATE command denied"
    try:
        with pytest.raises(DatabaseUnusable, match=reason):
            read_only.create_schema()
        if database.is_sqlite:  # a write, should one be tried (a full disk too): not INTERNAL
            with pytest.raises(UnavailableError):
                read_only.run(lambda tx: _LOGIN_FAILURE.execute(tx, {"role": "buyer", "username": "x",
                                                                     "n": 1}))
        assert read_only.run(lambda tx: tx.execute(select(login_failures)).all(), write=False) == []
    finally:
        read_only.close()
        if not database.is_sqlite:
            with database.engine.connect() as admin:
                for host in ("%", "localhost"):
                    admin.exec_driver_sql(f"DROP USER '{user}'@'{host}'")


@pytest.mark.parametrize(("asked", "pragma"), [("NORMAL", 1), ("FULL", 2)])
def test_sqlite_commits_are_flushed_to_disk_as_asked(tmp_path: Any, asked: str, pragma: int) -> None:
    database = Database(f"sqlite:///{tmp_path / 'durable.db'}", pool_size=2, sqlite_synchronous=asked)
    try:
        database.create_schema()
        assert database.run(lambda tx: tx.exec_driver_sql("PRAGMA synchronous").scalar()) == pragma
    finally:
        database.close()
    with pytest.raises(ValueError, match="one of NORMAL, FULL"):
        Database(f"sqlite:///{tmp_path / 'durable.db'}", sqlite_synchronous="OFF")


def test_a_server_passes_its_sqlite_setting_to_its_database(monkeypatch: Any) -> None:
    from wire.config import server_settings

    monkeypatch.setenv("MARKET_SQLITE_SYNCHRONOUS", "full")
    assert server_settings("buyer", []).sqlite_synchronous == "FULL"
    assert server_settings("buyer", ["--sqlite-synchronous", "normal"]).sqlite_synchronous == "NORMAL"


# The server's own connections, read when it is ready: PRAGMA synchronous is per connection.
SYNCHRONOUS_WHEN_READY = """
import os, signal, sys
from wire import runner

announce = runner._announce

def ready(server):
    pragma = server.app.gate.db.run(lambda tx: tx.exec_driver_sql("PRAGMA synchronous").scalar())
    print("synchronous", pragma, flush=True)
    announce(server)
    os.kill(os.getpid(), signal.SIGTERM)

runner._announce = ready
sys.exit(runner.main("buyer", argv=sys.argv[1:]))
"""


@pytest.mark.parametrize(("asked", "pragma"), [("NORMAL", 1), ("FULL", 2)])
def test_a_server_opens_its_sqlite_database_as_the_environment_asks(tmp_path: Any, asked: str,
                                                                    pragma: int) -> None:
    # before: nothing checked that the setting reached the serving process's connections
    done = subprocess.run([sys.executable, "-c", SYNCHRONOUS_WHEN_READY, "--port", "0",
                           "--db-url", f"sqlite:///{tmp_path / 'market.db'}"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "MARKET_SQLITE_SYNCHRONOUS": asked})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[0] == f"synchronous {pragma}"


def test_a_grown_sqlite_log_is_emptied_once_its_readers_move_on(tmp_path: Any, monkeypatch: Any) -> None:
    """Under steady reads SQLite never found a moment to start its log again: it grew to
    144 MB over one 100 + 100 run on a 2.3 MB database."""
    monkeypatch.setattr(engine_module, "WAL_CHECKPOINT_BYTES", 256 << 10)
    monkeypatch.setattr(engine_module, "_WAL_WAIT_AFTER_BUSY_S", 0.5)
    path = tmp_path / "grown.db"
    wal = tmp_path / "grown.db-wal"
    database = Database(f"sqlite:///{path}", pool_size=1)
    database.create_schema()
    reader = sqlite3.connect(path, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM login_failures").fetchone()  # a snapshot held open
    try:
        for n in range(600):
            database.run(lambda tx, n=n: _LOGIN_FAILURE.execute(
                tx, {"role": "buyer", "username": f"u{n}" * 50, "n": n}))
        time.sleep(1.0)  # the keeper has looked, and found the reader in its way
        assert wal.stat().st_size > 256 << 10
        reader.execute("COMMIT")  # the reader moves on, as every short read does
        deadline = time.monotonic() + 10
        while wal.stat().st_size > 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert wal.stat().st_size == 0  # before: it stayed as long as it had grown
        assert _failures_of(database, "u599" * 50) == 599  # every write is in the database
    finally:
        reader.close()
        database.close()
