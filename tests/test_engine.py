"""The engine factory: the MySQL driver is the C extension, and the dialect settings hold."""
from __future__ import annotations

import mysql.connector
from sqlalchemy import text

from db import Database
from db.engine import _QuietConnection


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
