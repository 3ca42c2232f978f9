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
from contextlib import closing
from typing import Any

import mysql.connector
import pytest
from mysql.connector.connection_cext import CMySQLConnection
from sqlalchemy import (
    Column,
    ForeignKey,
    Integer,
    MetaData,
    Table,
    TypeDecorator,
    bindparam,
    insert,
    literal_column,
    select,
    text,
    update,
)
from sqlalchemy.exc import IntegrityError
from support import BUMP, FAILURE_OF, LOGIN_FAILURE, fresh_mysql_database

from db import Database, DatabaseUnusable
from db.engine import LOCK_WAIT_S, SqliteLimits, connect_timeout_s, driver_url
from db.migrations import make_current
from db.schema import login_failures
from wire.errors import BusyError, UnavailableError


def test_mysql_runs_on_the_c_extension(database: Database) -> None:
    if database.is_sqlite:
        assert database.run(lambda tx: tx.execute(text("PRAGMA journal_mode")).scalar()) == "wal"
        return
    assert mysql.connector.HAVE_CEXT
    with database.engine.connect() as conn:
        assert isinstance(conn.connection.driver_connection, CMySQLConnection)  # the C extension's
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


_ONE = (select(login_failures.c.failures).where(login_failures.c.username == bindparam("username")))


def _in_transaction_after_a_statement(tx: Any) -> bool:
    tx.execute(_ONE, {"username": "nobody"}).all()
    return bool(tx.conn.driver.in_transaction)


def test_reads_run_outside_a_transaction_and_writes_inside_one(database: Database) -> None:
    # both drivers report whether the database has a transaction open on the connection
    assert database.run(_in_transaction_after_a_statement, write=False) is False
    assert database.run(_in_transaction_after_a_statement, write=True) is True
    # through SQLAlchemy's own execution path too
    assert database.run(lambda tx: tx.execute(text("SELECT 1")).scalar() == 1 and
                        tx.conn.driver.in_transaction, write=True) is True


@pytest.fixture
def mariadb_url(mysql_server: str) -> Iterator[str]:
    yield from fresh_mysql_database(mysql_server)


# -- Statements the unit of work runs on the driver itself -----------------------------------

AWKWARD = ["it's", 'say "hi"', "back\\slash", "semi; DROP TABLE users; --", "%(role)s %s %%", "naïve 🛒",
           "\x00nul", "line\nbreak", "' OR '1'='1"]


@pytest.mark.parametrize("value", AWKWARD)
def test_values_travel_exactly_as_given_never_as_sql(database: Database, value: str) -> None:
    database.run(lambda tx: tx.execute(LOGIN_FAILURE, {"role": "buyer", "username": value, "n": 7}))
    row = database.run(lambda tx: tx.execute(FAILURE_OF, {"role": "buyer", "username": value}).first(),
                       write=False)
    assert row is not None and (row.username, row.failures) == (value, 7)
    assert database.run(lambda tx: tx.execute(FAILURE_OF, {"role": "buyer", "username": value + "x"}).all(),
                        write=False) == []


def test_percent_signs_in_sql_mean_what_sqlalchemy_wrote(database: Database) -> None:
    """A LIKE pattern's '%' and a modulo's '%' as SQLAlchemy wrote them, the values filled around them."""
    for name, n in (("pct-a", 7), ("pct-b", 9), ("other", 8)):
        row = {"role": "buyer", "username": name, "n": n}
        database.run(lambda tx, row=row: tx.execute(LOGIN_FAILURE, row))
    by_prefix = (select(login_failures.c.username).where(login_failures.c.username.startswith(bindparam("p")),
                                                         login_failures.c.failures % 2 == 1)
                 .order_by(login_failures.c.username))
    held = database.run(lambda tx: [tx.execute(BUMP, {"username": "other"}),  # two statements in a query
                                    tx.execute(by_prefix, {"p": "pct-"}).scalars()][1])
    assert held == ["pct-a", "pct-b"]


def test_driver_errors_arrive_as_sqlalchemy_errors(database: Database) -> None:
    database.run(lambda tx: tx.execute(LOGIN_FAILURE, {"role": "buyer", "username": "dup", "n": 1}))
    with pytest.raises(IntegrityError):
        database.run(lambda tx: tx.execute(LOGIN_FAILURE, {"role": "buyer", "username": "dup", "n": 1}))
    with pytest.raises(IntegrityError):  # NOT NULL
        database.run(lambda tx: tx.execute(LOGIN_FAILURE, {"role": "buyer", "username": "nul", "n": None}))


def test_row_counts_and_new_ids_come_back(database: Database) -> None:
    added = database.run(lambda tx: tx.execute(LOGIN_FAILURE, {"role": "seller", "username": "c", "n": 1}))
    assert added.rowcount == 1
    bump = (update(login_failures).where(login_failures.c.role == bindparam("role"))
                    .values(failures=login_failures.c.failures + 1))
    assert database.run(lambda tx: tx.execute(bump, {"role": "seller"})).rowcount == 1
    assert database.run(lambda tx: tx.execute(bump, {"role": "nobody"})).rowcount == 0


# -- Connections come from the pool per call (db.connections) --------------------------

def _driver(tx: Any) -> Any:
    return tx.conn.driver


def test_calls_reuse_pooled_connections(db_url: str) -> None:
    database = Database(db_url, pool_size=2)
    try:
        # the objects themselves, held: an id() alone may be reused once an object is freed
        # (it was, once, on Python 3.13, for the connection opened after close())
        seen = [database.run(_driver, write=n % 2 == 0) for n in range(20)]
        assert len({id(driver) for driver in seen}) == 1  # one call at a time: one connection, reused
        database.close()
        fresh = database.run(_driver, write=False)  # close() leaves the database usable
        assert all(fresh is not driver for driver in seen)
    finally:
        database.close()


def test_a_pooled_connection_the_server_killed_is_replaced_and_the_call_made(mariadb_url: str) -> None:
    """The server ended the connection (KILL, its idle timeout, a restart): the next call finds
    it gone at its first statement, before anything ran, and is made on a fresh one."""
    database = Database(mariadb_url, pool_size=1)

    def server_connection_id(tx: Any) -> int:
        return int(tx.execute(text("SELECT CONNECTION_ID()")).scalar())

    try:
        for write in (False, True):
            killed = database.run(server_connection_id, write=write)
            with closing(Database(mariadb_url, pool_size=1)) as admin:
                admin.run(lambda tx, killed=killed: tx.execute(text(f"KILL {killed}")), write=False)
            assert database.run(server_connection_id, write=write) != killed
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
        return int(tx.execute(text("SELECT CONNECTION_ID()")).scalar())

    def refused(tx: Any) -> None:
        tx.execute(text(f"SIGNAL SQLSTATE '08S01' SET MYSQL_ERRNO = {errno}, MESSAGE_TEXT = '{message}'"))

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


def test_many_rows_insert_every_row_exactly_in_chunks(database: Database) -> None:
    rows = [{"role": "seller", "username": f"{AWKWARD[n % len(AWKWARD)]}#{n}", "failures": n,
             "last_failure_ms": 10 * n} for n in range(45)]  # 20 + 20 + 5 rows
    database.run(lambda tx: tx.execute(insert(login_failures), rows))
    stored = database.run(lambda tx: tx.execute(
        select(login_failures.c.username, login_failures.c.failures, login_failures.c.last_failure_ms)
        .where(login_failures.c.role == "seller")).all(), write=False)
    expected = [(row["username"], row["failures"], row["last_failure_ms"]) for row in rows]
    assert sorted(map(tuple, stored)) == sorted(expected)


# -- Writes held by the unit of work until something needs them sent ---------------------------

def _failures_of(database: Database, username: str) -> int | None:
    row = database.run(lambda tx: tx.execute(FAILURE_OF, {"role": "buyer", "username": username}).first(),
                       write=False)
    return None if row is None else int(row.failures)


def test_a_deferred_write_is_seen_by_the_statements_after_it(database: Database) -> None:
    def work(tx: Any) -> tuple[int, int]:
        tx.execute(LOGIN_FAILURE, {"role": "buyer", "username": "later", "n": 1})
        tx.execute(BUMP, {"username": "later"})
        seen = tx.execute(FAILURE_OF, {"role": "buyer", "username": "later"}).first()
        tx.execute(BUMP, {"username": "later"})  # with the COMMIT
        return int(seen.failures), len(tx.execute(FAILURE_OF, {"role": "buyer", "username": "none"}).all())

    assert database.run(work) == (2, 0)
    assert _failures_of(database, "later") == 3


@pytest.mark.parametrize("failing", ["with a later statement", "with the commit"])
def test_a_deferred_write_that_fails_rolls_back_its_whole_transaction(db_url: str, failing: str) -> None:
    database = Database(db_url, pool_size=1)  # one connection: the call after the failure reuses it
    make_current(database)
    database.run(lambda tx: tx.execute(LOGIN_FAILURE, {"role": "buyer", "username": "taken", "n": 1}))

    def work(tx: Any) -> None:
        tx.execute(LOGIN_FAILURE, {"role": "buyer", "username": "first", "n": 1})  # sent now
        tx.execute(BUMP, {"username": "taken"})
        tx.execute(LOGIN_FAILURE, {"role": "buyer", "username": "taken", "n": 1})  # a duplicate key
        tx.execute(BUMP, {"username": "taken"})
        if failing == "with a later statement":
            tx.execute(FAILURE_OF, {"role": "buyer", "username": "first"}).all()

    try:
        with pytest.raises(IntegrityError):
            database.run(work)
        assert _failures_of(database, "first") is None  # the statement sent before it: rolled back
        assert _failures_of(database, "taken") == 1  # the deferred bump before it too
        assert database.run(_in_transaction_after_a_statement, write=False) is False  # nothing left open
        database.run(lambda tx: tx.execute(BUMP, {"username": "taken"}))  # the connection works on
        assert _failures_of(database, "taken") == 2
    finally:
        database.close()


@pytest.fixture
def mariadb_database(mysql_server: str, request: pytest.FixtureRequest) -> Iterator[Database]:
    for url in fresh_mysql_database(mysql_server):
        if "round_trips" in request.fixturenames:
            url = request.getfixturevalue("round_trips").through(url)
        database = Database(url, pool_size=1)  # one connection: every call below uses it
        make_current(database)
        yield database
        database.close()


class _NoNegatives(TypeDecorator[int]):
    impl, cache_ok = Integer, True

    def process_bind_param(self, value: int | None, dialect: Any) -> int | None:
        if value is not None and value < 0:
            raise ValueError("no negative values")
        return value


def test_a_value_refused_before_sending_leaves_the_transaction_whole(database: Database) -> None:
    """A bind processor's error, caught by the transaction function at its first statement:
    the statements after it are still in the transaction, and its rollback undoes them."""
    refused = select(literal_column("1").label("one")).where(bindparam("n", type_=_NoNegatives()) >= 0)

    def work(tx: Any) -> None:
        with pytest.raises(ValueError):
            tx.execute(refused, {"n": -1}).all()
        assert tx.execute(LOGIN_FAILURE, {"role": "buyer", "username": "undone", "n": 1}).rowcount == 1
        raise RuntimeError("roll back")

    with pytest.raises(RuntimeError):
        database.run(work)
    assert database.run(lambda tx: tx.execute(FAILURE_OF, {"role": "buyer", "username": "undone"}).all(),
                        write=False) == []


def test_held_writes_travel_with_the_next_statement_and_the_commit(mariadb_database: Database,
                                                                   round_trips: list[int]) -> None:
    database = mariadb_database
    database.run(lambda tx: tx.execute(LOGIN_FAILURE, {"role": "buyer", "username": "q", "n": 0}))

    def queries(work: Any, write: bool = True) -> list[int]:
        round_trips.clear()
        database.run(work, write=write)
        return list(round_trips)

    bump = {"username": "q"}
    # START TRANSACTION, the commit token, three held writes and the COMMIT: one query
    assert queries(lambda tx: [tx.execute(BUMP, bump) for _ in range(3)]) == [6]
    # held writes go with the read that follows them; the COMMIT alone after it
    assert queries(lambda tx: (tx.execute(BUMP, bump),
                               tx.execute(FAILURE_OF, {"role": "buyer", "username": "q"}).all())) == [4, 1]
    # a held write's result read: it is sent then, with what was held before it
    assert queries(lambda tx: [tx.execute(BUMP, bump), tx.execute(BUMP, bump).rowcount]) == [4, 1]
    assert queries(lambda tx: None) == []  # nothing sent, nothing to end
    assert queries(lambda tx: tx.execute(BUMP, bump), write=False) == [1]  # a read holds nothing
    assert _failures_of(database, "q") == 7


def test_an_answer_read_last_travels_with_the_commit(mariadb_database: Database,
                                                     round_trips: list[int]) -> None:
    database = mariadb_database
    database.run(lambda tx: tx.execute(LOGIN_FAILURE, {"role": "buyer", "username": "a", "n": 0}))
    who, bump = {"role": "buyer", "username": "a"}, {"username": "a"}

    def bumped(tx: Any) -> Any:
        tx.execute(BUMP, bump)
        return tx.answer(FAILURE_OF, who, lambda rows: [row.failures for row in rows])

    round_trips.clear()
    assert database.run(bumped) == [1]  # the answer sees the write before it
    assert round_trips == [5]  # START TRANSACTION, the token, the write, the answer, the COMMIT
    inside = select(literal_column("@@in_transaction").label("open"))

    def still_open(tx: Any) -> Any:
        tx.execute(BUMP, bump)
        return tx.answer(inside, {}, lambda rows: rows[0].open)

    assert database.run(still_open) == 1  # read before the COMMIT, in the transaction
    round_trips.clear()
    assert database.run(lambda tx: tx.answer(FAILURE_OF, who, len), write=False) == 1
    assert round_trips == [1]  # a read transaction: the read alone, no COMMIT


def test_nothing_runs_after_a_transactions_answer(database: Database) -> None:
    database.run(lambda tx: tx.execute(LOGIN_FAILURE, {"role": "buyer", "username": "b", "n": 0}))
    who = {"role": "buyer", "username": "b"}

    def late_write(tx: Any) -> Any:
        answer = tx.answer(FAILURE_OF, who, len)
        tx.execute(BUMP, {"username": "b"})
        return answer

    with pytest.raises(RuntimeError, match="after its answer"):
        database.run(late_write)
    assert _failures_of(database, "b") == 0  # rolled back


def test_an_answer_whose_commit_failed_is_never_handed_back(tmp_path: Any) -> None:
    """On SQLite the answer is read before the COMMIT, which then fails here (a foreign key
    checked at COMMIT): the rows read are thrown away, never shaped, never handed back."""
    database = Database(f"sqlite:///{tmp_path / 'answer.db'}", pool_size=1)
    tables = MetaData()
    Table("parents", tables, Column("id", Integer, primary_key=True))
    deferred = ForeignKey("parents.id", deferrable=True, initially="DEFERRED")
    children = Table("children", tables, Column("id", Integer, primary_key=True),
                     Column("parent", Integer, deferred))
    tables.create_all(database.engine)
    # one connection, pooled: the pragma holds for every call below (it is off by default)
    database.run(lambda tx: tx.execute(text("PRAGMA foreign_keys = ON")), write=False)
    shaped: list[Any] = []

    def orphan(tx: Any) -> Any:
        tx.execute(insert(children).values(id=1, parent=99))  # checked only at the COMMIT
        return tx.answer(select(children.c.id), {}, shaped.append)

    try:
        with pytest.raises(IntegrityError, match="FOREIGN KEY"):
            database.run(orphan)
        assert shaped == []
        assert database.run(lambda tx: tx.execute(select(children.c.id)).all(), write=False) == []
    finally:
        database.close()


def test_a_held_writes_error_arrives_where_the_code_expects_it(database: Database) -> None:
    """Plain Core code catching a write's IntegrityError keeps working though the write was held."""
    database.run(lambda tx: tx.execute(LOGIN_FAILURE, {"role": "buyer", "username": "taken", "n": 1}))

    def claim(tx: Any) -> str:
        tx.execute(BUMP, {"username": "taken"})
        try:
            tx.execute(LOGIN_FAILURE, {"role": "buyer", "username": "taken", "n": 1})
        except IntegrityError:
            return "caught"
        tx.execute(FAILURE_OF, {"role": "buyer", "username": "taken"}).all()  # would send it
        return "missed"

    assert database.run(claim) == "caught"
    assert _failures_of(database, "taken") == 2  # the bump before it committed, once


@pytest.mark.parametrize("poll_s", [5.0, 0.05])  # the lock freed while polling, or after: SQLite's wait
def test_a_sqlite_writer_waits_for_the_write_lock_then_writes(tmp_path: Any, poll_s: float) -> None:
    limits = SqliteLimits(poll_lock_s=poll_s)
    path = tmp_path / "locked.db"
    database = Database(f"sqlite:///{path}", pool_size=2, sqlite_limits=limits)
    make_current(database)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process's writer, holding the lock
    wrote: list[Any] = []
    writer = threading.Thread(target=lambda: wrote.append(database.run(
        lambda tx: tx.execute(LOGIN_FAILURE, {"role": "buyer", "username": "waited", "n": 1}).rowcount)))
    try:
        writer.start()
        writer.join(0.3)
        assert writer.is_alive() and wrote == []  # waiting for the lock, not failed
        holder.execute("COMMIT")
        writer.join(10)
        assert wrote == [1] and _failures_of(database, "waited") == 1
        # the busy timeout is back for everything else
        assert database.run(lambda tx: tx.execute(text("PRAGMA busy_timeout")).scalar()) == \
            limits.busy_timeout_ms
    finally:
        holder.close()
        database.close()


def test_outside_a_write_transaction_deferring_runs_at_once(database: Database) -> None:
    def read(tx: Any) -> int:  # a read: statement by statement, nothing held back for a COMMIT
        tx.execute(text("SELECT 1"))  # SQLAlchemy's own path, which opens its transaction
        tx.execute(LOGIN_FAILURE, {"role": "buyer", "username": "at once", "n": 5})
        seen = len(tx.execute(FAILURE_OF, {"role": "buyer", "username": "at once"}).all())
        tx.execute(BUMP, {"username": "at once"})  # the call's last statement
        return seen

    assert database.run(read, write=False) == 1  # sent before the SELECT that sees it
    # a read's statements run in autocommit on both databases, so both stayed (none waited
    # for a COMMIT that a read never sends)
    assert _failures_of(database, "at once") == 6


def test_a_sqlite_writer_that_waited_its_whole_lock_wait_answers_busy_once(tmp_path: Any) -> None:
    # before: 'database is locked' was retried, 8 waits of 5 s + 30 s in all: the client's
    # 30 s ran out long before, and the call might still commit after it had given up
    path = tmp_path / "held.db"
    database = Database(f"sqlite:///{path}", pool_size=1,
                        sqlite_limits=SqliteLimits(poll_lock_s=0.05, busy_timeout_ms=200))
    make_current(database)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # a writer that does not let go
    attempts = [0]

    def write(tx: Any) -> None:
        attempts[0] += 1
        tx.execute(LOGIN_FAILURE, {"role": "buyer", "username": "never", "n": 1})

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
    waits = database.run(lambda tx: tx.execute(text(
        "SELECT @@innodb_lock_wait_timeout, @@lock_wait_timeout")).one(), write=False)
    assert tuple(waits) == (LOCK_WAIT_S,) * 2  # not the server's 50 s and a year
    one = Database(database.url, pool_size=1)
    one.run(lambda tx: tx.execute(text("SET SESSION innodb_lock_wait_timeout = 1")), write=False)
    database.run(lambda tx: tx.execute(LOGIN_FAILURE, {"role": "buyer", "username": "held", "n": 1}))
    attempts = [0]

    def bump(tx: Any) -> None:
        attempts[0] += 1
        tx.execute(BUMP, {"username": "held"})

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


def test_a_connection_given_back_inside_a_transaction_is_closed(tmp_path: Any) -> None:
    """Were a transaction left open (a failed COMMIT whose ROLLBACK failed too, say), the
    pooled connection would keep SQLite's write lock from every other process."""
    path = tmp_path / "left.db"
    database = Database(f"sqlite:///{path}", pool_size=1)
    make_current(database)
    other = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        database.run(lambda tx: tx.conn.driver.execute("BEGIN IMMEDIATE"), write=False)
        other.execute("BEGIN IMMEDIATE")  # before: 'database is locked'
        other.execute("ROLLBACK")
        assert database.run(lambda tx: tx.execute(text("SELECT 1")).scalar(), write=False) == 1
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
            make_current(read_only)
        if database.is_sqlite:  # a write, should one be tried (a full disk too): not INTERNAL
            with pytest.raises(UnavailableError):
                read_only.run(lambda tx: tx.execute(LOGIN_FAILURE, {"role": "buyer", "username": "x",
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
        make_current(database)
        assert database.run(lambda tx: tx.execute(text("PRAGMA synchronous")).scalar()) == pragma
    finally:
        database.close()
    with pytest.raises(ValueError, match="one of NORMAL, FULL"):
        Database(f"sqlite:///{tmp_path / 'durable.db'}", sqlite_synchronous="OFF")


def test_a_server_passes_its_sqlite_setting_to_its_database(monkeypatch: Any) -> None:
    from runtime.config import server_settings

    monkeypatch.setenv("MARKET_SQLITE_SYNCHRONOUS", "full")
    assert server_settings("buyer", []).sqlite_synchronous == "FULL"
    assert server_settings("buyer", ["--sqlite-synchronous", "normal"]).sqlite_synchronous == "NORMAL"


# The server's own connections, read when it is ready: PRAGMA synchronous is per connection.
SYNCHRONOUS_WHEN_READY = """
import os, signal, sys
from sqlalchemy import text
from runtime import runner

announce = runner.announce

def ready(server):
    pragma = server.app.gate.db.run(lambda tx: tx.execute(text("PRAGMA synchronous")).scalar())
    print("synchronous", pragma, flush=True)
    announce(server)
    os.kill(os.getpid(), signal.SIGTERM)

runner.announce = ready
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


def test_a_grown_sqlite_log_is_emptied_once_its_readers_move_on(tmp_path: Any) -> None:
    """Under steady reads SQLite never found a moment to start its log again: it grew to
    144 MB over one 100 + 100 run on a 2.3 MB database."""
    path = tmp_path / "grown.db"
    wal = tmp_path / "grown.db-wal"
    database = Database(f"sqlite:///{path}", pool_size=1,
                        sqlite_limits=SqliteLimits(wal_checkpoint_bytes=256 << 10, wal_wait_after_busy_s=0.5))
    make_current(database)
    reader = sqlite3.connect(path, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM login_failures").fetchone()  # a snapshot held open
    try:
        for n in range(600):
            database.run(lambda tx, n=n: tx.execute(
                LOGIN_FAILURE, {"role": "buyer", "username": f"u{n}" * 50, "n": n}))
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


def test_a_mysql_urls_connect_timeout_is_the_drivers_else_five_seconds() -> None:
    from sqlalchemy.engine import make_url

    assert connect_timeout_s(make_url("mysql://root@db/market")) == 5
    assert connect_timeout_s(make_url("mysql://root@db/market?connect_timeout=2")) == 2
    assert connect_timeout_s(make_url("mysql://root@db/market?connection_timeout=30")) == 30
