"""db.mysql_dbapi, the DB-API module over the driver's C API: values travel as data, errors
arrive as the driver's, many rows go in few queries, and SQLAlchemy runs on it unchanged."""
from __future__ import annotations

import datetime
import decimal
import time
from collections.abc import Iterator
from typing import Any

import mysql.connector
import pytest
from mysql.connector import errors
from mysql.connector.constants import ClientFlag
from sqlalchemy import (
    Column,
    DateTime,
    Integer,
    LargeBinary,
    MetaData,
    Numeric,
    String,
    Table,
    insert,
    select,
    text,
)
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.engine import make_url
from support import fresh_mysql_database

from db import mysql_dbapi
from db.engine import driver_url, make_engine

AWKWARD = ["it's", 'say "hi"', "back\\slash", "nul\x00byte", "%s", "%(name)s", "100%", "é ü 中 🙂",
           "'; DROP TABLE t; --"]


@pytest.fixture
def url(mysql_server: str) -> Iterator[str]:
    yield from fresh_mysql_database(mysql_server)


@pytest.fixture
def conn(url: str) -> Iterator[mysql_dbapi.Connection]:
    parsed = make_url(url)
    connection = mysql_dbapi.connect(host=parsed.host, port=parsed.port or 3306, user=parsed.username,
                                     password=parsed.password or "", database=parsed.database,
                                     collation="utf8mb4_bin", client_flags=[ClientFlag.MULTI_STATEMENTS])
    connection.autocommit = True
    cursor = connection.cursor()
    cursor.execute("CREATE TABLE t (id INT AUTO_INCREMENT PRIMARY KEY, s VARCHAR(2000) UNIQUE, "
                   "price DECIMAL(10,2), at DATETIME(3), blob_ BLOB)")
    yield connection
    connection.close()


def _count_of(conn: mysql_dbapi.Connection, command: str) -> int:
    cursor = conn.cursor()
    cursor.execute(f"SHOW SESSION STATUS LIKE '{command}'")
    return int(cursor.fetchall()[0][1])


@pytest.mark.parametrize("value", AWKWARD)
def test_values_travel_as_data_named_and_positional(conn: mysql_dbapi.Connection, value: str) -> None:
    cursor = conn.cursor()
    cursor.execute("INSERT INTO t (s) VALUES (%(s)s)", {"s": value})
    assert cursor.rowcount == 1 and cursor.lastrowid > 0
    cursor.execute("SELECT s, '5%' AS pct FROM t WHERE s = %s", (value,))
    assert cursor.fetchall() == [(value, "5%")]
    assert [d[0] for d in cursor.description or []] == ["s", "pct"]
    cursor.execute("SELECT COUNT(*) FROM t")
    assert cursor.fetchone() == (1,)  # the "DROP TABLE" value dropped nothing


def _drivers_connection(url: str) -> Any:
    parsed = make_url(url)
    return mysql.connector.connect(host=parsed.host, port=parsed.port or 3306, user=parsed.username,
                                   password=parsed.password or "", database=parsed.database, use_pure=False,
                                   autocommit=True)


AS_THE_DRIVER_READS = [  # (statement, parameters): this module and the driver's cursor agree
    ("SELECT %s, '50%%', '5%'", ("v",)),  # any % but the placeholders stays as written
    ("SELECT DATE_FORMAT('2026-01-02 03:04:05', '%H:%i:%s'), %(x)s", {"x": "it's"}),
    ("SELECT %(x)s, %(x)s, '%%(x)s'", {"x": 1}),
    ("SELECT 'no parameters: %s %%'", None),
    ("INSERT INTO t (s) VALUES (%s), (%s)", ("a2", "b")),
    ("UPDATE t SET price = %(p)s WHERE s IN (%(a)s, %(b)s)", {"p": 1, "a": "a", "b": "zzz"}),
    ("UPDATE t SET price = NULL WHERE s = 'a'", None),  # changes nothing: 0 rows, as the driver says
]


@pytest.mark.parametrize(("statement", "params"), AS_THE_DRIVER_READS)
def test_statements_read_as_the_drivers_cursor_reads_them(url: str, conn: mysql_dbapi.Connection,
                                                          statement: str, params: Any) -> None:
    drivers = _drivers_connection(url)
    ours, theirs = conn.cursor(), drivers.cursor()
    for cursor in (ours, theirs):
        cursor.execute("DELETE FROM t")
        cursor.execute("INSERT INTO t (s) VALUES ('a')")
        cursor.execute(statement, params)
        if cursor is ours:
            mine = (ours.fetchall() if ours.description else None), ours.rowcount
    assert mine == ((theirs.fetchall() if theirs.description else None), theirs.rowcount)
    drivers.close()


def test_parameters_left_over_or_missing_are_refused(conn: mysql_dbapi.Connection) -> None:
    with pytest.raises(errors.ProgrammingError, match="Not all parameters were used"):
        conn.cursor().execute("SELECT %s", (1, 2))
    with pytest.raises(errors.ProgrammingError, match="no value for the parameter y"):
        conn.cursor().execute("SELECT %(x)s, %(y)s", {"x": 1})


def test_types_come_back_as_python_values(conn: mysql_dbapi.Connection) -> None:
    at = datetime.datetime(2026, 11, 28, 6, 1, 2, 345000)
    cursor = conn.cursor()
    cursor.execute("INSERT INTO t (s, price, at, blob_) VALUES (%s, %s, %s, %s)",
                   (None, decimal.Decimal("12.30"), at, b"\x00\xff'"))
    cursor.execute("SELECT s, price, at, blob_ FROM t")
    assert cursor.fetchone() == (None, decimal.Decimal("12.30"), at, b"\x00\xff'")
    assert cursor.fetchone() is None


def test_run_answers_each_statement_of_a_query(conn: mysql_dbapi.Connection) -> None:
    outcomes = conn.run(b"START TRANSACTION;INSERT INTO t (s) VALUES ('a'), ('b');"
                        b"UPDATE t SET price = 1 WHERE s = 'a';SELECT s FROM t ORDER BY s;COMMIT")
    assert [(rows, count) for rows, count, _ in outcomes] == [
        ([], 0), ([], 2), ([], 1), ([("a",), ("b",)], 2), ([], 0)]
    assert outcomes[1][2] > 0  # the first id the INSERT made
    assert not conn.in_transaction


def test_a_later_statements_error_is_raised_and_nothing_after_it_runs(conn: mysql_dbapi.Connection) -> None:
    conn.run(b"INSERT INTO t (s) VALUES ('taken')")
    with pytest.raises(errors.IntegrityError) as raised:
        conn.run(b"START TRANSACTION;INSERT INTO t (s) VALUES ('new');"
                 b"INSERT INTO t (s) VALUES ('taken');INSERT INTO t (s) VALUES ('after')")
    assert raised.value.errno == 1062
    assert conn.in_transaction  # the failed statement ended nothing: the caller rolls back
    conn.rollback()
    assert conn.run(b"SELECT s FROM t ORDER BY s")[0][0] == [("taken",)]  # still usable


def test_in_transaction_follows_the_server(conn: mysql_dbapi.Connection) -> None:
    conn.run(b"START TRANSACTION")
    assert conn.in_transaction
    conn.commit()
    assert not conn.in_transaction


def test_many_rows_go_in_few_queries_of_bounded_size(conn: mysql_dbapi.Connection) -> None:
    rows = [(f"row {n:05d} " + "x" * 990,) for n in range(3000)]  # about 3 MB
    before = _count_of(conn, "Com_insert")
    cursor = conn.cursor()
    cursor.executemany("INSERT INTO t (s) VALUES (%s)", rows)
    queries = _count_of(conn, "Com_insert") - before
    assert cursor.rowcount == 3000
    assert 3 <= queries <= 5  # about 1 MB each, not one per row, not one of 3 MB
    cursor.execute("SELECT COUNT(*), MIN(s), MAX(s) FROM t")
    assert cursor.fetchone() == (3000, rows[0][0], rows[-1][0])


def test_executemany_with_on_duplicate_key_update_runs_each_row(url: str) -> None:
    engine = make_engine(url)
    table = Table("counts", MetaData(), Column("name", String(20), primary_key=True), Column("n", Integer))
    table.metadata.create_all(engine)
    upsert = mysql_insert(table)
    upsert = upsert.on_duplicate_key_update(n=table.c.n + upsert.inserted.n)
    with engine.begin() as c:
        c.execute(upsert, [{"name": "a", "n": 1}, {"name": "b", "n": 2}, {"name": "a", "n": 10}])
    with engine.connect() as c:
        assert c.execute(select(table).order_by(table.c.name)).all() == [("a", 11), ("b", 2)]
    engine.dispose()


def test_executemany_of_other_statements_runs_each_adding_counts(conn: mysql_dbapi.Connection) -> None:
    cursor = conn.cursor()
    cursor.executemany("INSERT INTO t (s) VALUES (%(s)s)", [{"s": v} for v in AWKWARD])
    cursor.executemany("UPDATE t SET price = %(p)s WHERE s = %(s)s",
                       [{"p": n, "s": v} for n, v in enumerate(AWKWARD, 1)] + [{"p": 1, "s": "none"}])
    assert cursor.rowcount == len(AWKWARD)
    cursor.execute("SELECT s, price FROM t ORDER BY price")
    assert cursor.fetchall() == [(v, decimal.Decimal(n)) for n, v in enumerate(AWKWARD, 1)]


def test_errors_arrive_as_the_drivers(conn: mysql_dbapi.Connection) -> None:
    cursor = conn.cursor()
    with pytest.raises(errors.ProgrammingError) as raised:
        cursor.execute("SELEKT 1")
    assert raised.value.errno == 1064
    with pytest.raises(errors.ProgrammingError, match="Not enough parameters"):
        cursor.execute("SELECT %s, %s", (1,))


def test_a_killed_connection_is_a_disconnect_to_sqlalchemy(url: str, conn: mysql_dbapi.Connection) -> None:
    dialect = make_engine(url).dialect
    own_id = conn.run(b"SELECT CONNECTION_ID()")[0][0][0][0]
    assert conn.connection_id == own_id
    killer = mysql_dbapi.connect(host=make_url(url).host, port=make_url(url).port or 3306, user="root")
    killer.run(f"KILL CONNECTION {own_id}".encode())
    killer.close()
    with pytest.raises(errors.Error) as raised:
        conn.run(b"SELECT 1")
    assert dialect.is_disconnect(raised.value, conn, None)  # type: ignore[arg-type]
    conn.close()
    with pytest.raises(errors.OperationalError) as closed:
        conn.cursor().execute("SELECT 1")
    assert dialect.is_disconnect(closed.value, conn, None)  # type: ignore[arg-type]


def test_a_connection_the_server_timed_out_is_a_disconnect(url: str, conn: mysql_dbapi.Connection) -> None:
    conn.run(b"SET SESSION wait_timeout = 1")
    time.sleep(2.5)
    with pytest.raises(errors.OperationalError) as raised:  # 2006 or 2013: both a lost connection
        conn.run(b"SELECT 1")
    assert raised.value.errno in (2006, 2013)
    assert make_engine(url).dialect.is_disconnect(raised.value, conn, None)  # type: ignore[arg-type]


def test_unknown_options_are_refused_by_name() -> None:
    with pytest.raises(errors.InterfaceError, match="not supported here: pool_size"):
        mysql_dbapi.connect(host="127.0.0.1", pool_size=3)
    with pytest.raises(errors.InterfaceError, match="C extension"):
        mysql_dbapi.connect(host="127.0.0.1", use_pure=True)


def test_options_from_a_urls_query_string_arrive_as_text(url: str) -> None:
    parsed = make_url(url)
    conn = mysql_dbapi.connect(host=parsed.host, port=str(parsed.port or 3306), user=parsed.username,
                               ssl_disabled="true", read_timeout="30", compress="no")
    assert conn.run(b"SELECT 1")[0][0] == [(1,)]
    conn.close()
    with pytest.raises(errors.InterfaceError, match="read_timeout='soon': not a number"):
        mysql_dbapi.connect(host="127.0.0.1", read_timeout="soon")
    engine = make_engine(url + "?ssl_disabled=true&read_timeout=30")
    with engine.connect() as c:
        assert c.exec_driver_sql("SELECT 2").scalar() == 2
    engine.dispose()


def test_an_unreachable_server_is_the_drivers_error() -> None:
    with pytest.raises(errors.DatabaseError) as raised:
        mysql_dbapi.connect(host="127.0.0.1", port=1, connection_timeout=2)
    assert raised.value.errno == 2003  # can't connect


def test_sqlalchemy_core_runs_on_it(url: str) -> None:
    engine = make_engine(url)
    assert engine.dialect.name == "mysql" and driver_url(url).drivername == "mysql+mysqlconnector"
    table = Table("things", MetaData(), Column("id", Integer, primary_key=True),
                  Column("unit-name", String(40)), Column("price", Numeric(10, 2)), Column("at", DateTime),
                  Column("data", LargeBinary))
    table.metadata.create_all(engine)
    at = datetime.datetime(2026, 1, 2, 3, 4, 5)
    with engine.begin() as c:
        first = c.execute(insert(table).values({"unit-name": "it's", "price": decimal.Decimal("1.50"),
                                                "at": at, "data": b"\x00"}))
        c.execute(insert(table), [{"unit-name": f"n{i}", "price": i, "at": at, "data": b""}
                                  for i in range(100)])
    assert first.inserted_primary_key == (1,)
    with engine.connect() as c:
        name = table.c["unit-name"]  # a column whose name is no Python name: its parameter neither
        rows = c.execute(select(table).where(name.in_(["it's", "n7"])).order_by(table.c.id)).all()
        assert c.execute(text("SELECT DATE_FORMAT(at, '%H:%i:%s') FROM things WHERE id = :id"),
                         {"id": 1}).scalar() == "03:04:05"
    assert [tuple(r) for r in rows] == [(1, "it's", decimal.Decimal("1.50"), at, b"\x00"),
                                        (9, "n7", decimal.Decimal("7.00"), at, b"")]
    engine.dispose()
