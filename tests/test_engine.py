"""The engine factory: the MySQL driver is the C extension, and the dialect settings hold."""
from __future__ import annotations

import mysql.connector
import pytest
from sqlalchemy import bindparam, insert, select, text, update
from sqlalchemy.exc import IntegrityError

from db import Database
from db.engine import _QuietConnection, _template
from db.prepared import Prepared
from db.schema import login_failures


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


def test_reads_run_outside_a_transaction_and_writes_inside_one(database: Database) -> None:
    # both drivers report whether the database has a transaction open on the connection
    assert database.run(lambda tx: tx.connection.driver_connection.in_transaction, write=False) is False
    assert database.run(lambda tx: tx.connection.driver_connection.in_transaction, write=True) is True


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
