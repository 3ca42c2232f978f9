"""Schema migrations (db.migrations): databases made before them, or by an older revision, are
brought to head under a lock; servers refuse a database not at head in one line."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, insert, inspect, select, text, update
from support import ServerProcess, fresh_mysql_database

from db import Database, DatabaseUnusable
from db.migrations import head, make_current, revision_of, upgrade, upgrade_lock
from db.schema import item_keyword_pairs, item_keywords, items, metadata, orders, schema_info, users
from operate.audit import audit

FIXTURES = Path(__file__).parents[1] / "fixtures"
LAST_VERSION = 3  # schema_info's version when migrations came: schema3
# server processes of these tests refuse what is not current, as in service
_REFUSING = {k: v for k, v in os.environ.items() if k != "MARKET_UPGRADE_SCHEMA"}


def _before_migrations(database: Database, version: int) -> None:
    """The database as a release before migrations left it: schema_info at `version`, no alembic_version."""
    database.run(lambda tx: tx.execute(text("DROP TABLE alembic_version")))
    database.run(lambda tx: tx.execute(update(schema_info).values(version=version)))


def _version(database: Database) -> int:
    return int(database.run(lambda tx: tx.execute(select(schema_info.c.version)).scalar()))


def _item(tx: object, item_id: int, quantity: int, keywords: tuple[str, ...] = ("old",)) -> None:
    """An item as an older version wrote it: its keywords indexed one by one, no pairs."""
    tx.execute(insert(items).values(  # type: ignore[attr-defined]
        item_id=item_id, seller_id=1, name="Lamp", category=1, keywords=json.dumps(keywords),
        item_condition="new", price_cents=100, quantity=quantity, listed=1, sold=1 - quantity, created_ms=0))
    for word in keywords:
        tx.execute(insert(item_keywords).values(  # type: ignore[attr-defined]
            keyword=word, item_id=item_id, category=1))


def test_version_1_loses_the_index_rows_of_sold_out_items(database: Database) -> None:
    database.run(lambda tx: tx.execute(insert(users).values(
        user_id=1, role="seller", username="s1", name="S", password_hash="x", created_ms=0)))
    for item_id, quantity in ((1, 0), (2, 1)):
        database.run(lambda tx: _item(tx, item_id, quantity))  # noqa: B023 - run at once
    _before_migrations(database, 1)
    make_current(database)
    indexed = database.run(lambda tx: tx.execute(select(item_keywords.c.item_id)).scalars().all())
    assert indexed == [2]
    assert _version(database) == LAST_VERSION and revision_of(database).is_head


def test_version_2_gets_the_keyword_pairs_of_the_items_on_sale(database: Database) -> None:
    database.run(lambda tx: tx.execute(insert(users).values(
        user_id=1, role="seller", username="s1", name="S", password_hash="x", created_ms=0)))
    database.run(lambda tx: _item(tx, 1, 1, ("old", "lamp", "desk")))
    database.run(lambda tx: _item(tx, 2, 1, ("one",)))
    _before_migrations(database, 2)
    assert audit(database) != []  # item 1 is missing its pairs
    make_current(database)
    pairs = database.run(lambda tx: tx.execute(
        select(item_keyword_pairs.c.first_keyword, item_keyword_pairs.c.second_keyword,
               item_keyword_pairs.c.item_id).order_by(item_keyword_pairs.c.first_keyword,
                                                      item_keyword_pairs.c.second_keyword)).all())
    assert [tuple(row) for row in pairs] == [("desk", "lamp", 1), ("desk", "old", 1), ("lamp", "old", 1)]
    assert audit(database) == []
    assert _version(database) == LAST_VERSION and revision_of(database).is_head


def test_version_2_gets_one_index_for_unlisting_an_items_keywords(database: Database) -> None:
    if database.is_sqlite:  # SQLite had none (MySQL had the foreign key's, which stays alone)
        database.run(lambda tx: tx.execute(text("DROP INDEX ix_item_keywords_item")))
    _before_migrations(database, 2)
    make_current(database)

    by_item = [ix["name"] for ix in inspect(database.engine).get_indexes("item_keywords")
               if ix["column_names"][:1] == ["item_id"]]
    assert len(by_item) == 1


@pytest.mark.parametrize("db_url", ["mariadb"], indirect=True)
def test_version_2_on_mysql_compares_keywords_and_idempotency_keys_exactly(database: Database) -> None:
    """Version 2 kept them in VARCHAR with a PAD SPACE collation ("a" = "a "); version 3
    makes them VARBINARY, keeping what they hold."""
    old_columns = "MODIFY keyword VARCHAR(8) COLLATE utf8mb4_bin NOT NULL", \
        "MODIFY idempotency_key VARCHAR(128) COLLATE utf8mb4_bin NULL"
    database.run(lambda tx: [tx.execute(text(f"ALTER TABLE {table} {change}"))
                             for table, change in zip(("item_keywords", "orders"), old_columns, strict=True)])
    database.run(lambda tx: tx.execute(insert(users).values(
        user_id=1, role="seller", username="s1", name="S", password_hash="x", created_ms=0)))
    database.run(lambda tx: _item(tx, 1, 1, ("old",)))
    _before_migrations(database, 2)
    make_current(database)

    wanted = (("item_keywords", "keyword"), ("orders", "idempotency_key"))
    types = [str(column["type"]) for table, name in wanted
             for column in inspect(database.engine).get_columns(table) if column["name"] == name]
    assert types == ["VARBINARY(32)", "VARBINARY(512)"]
    assert database.run(lambda tx: tx.execute(select(item_keywords.c.keyword)).scalars().all()) == ["old"]
    assert audit(database) == []


def test_two_servers_upgrading_one_database_at_once_both_start(database: Database) -> None:
    """As two servers with --upgrade-schema would: each its own Database, upgrading at once."""
    setup, db_url = database, database.url
    setup.run(lambda tx: tx.execute(insert(users).values(
        user_id=1, role="seller", username="s1", name="S", password_hash="x", created_ms=0)))
    for item_id in range(1, 41):
        setup.run(lambda tx: _item(tx, item_id, 1, ("a", "b", f"w{item_id % 7}")))  # noqa: B023
    _before_migrations(setup, 2)
    servers = [Database(db_url, pool_size=1) for _ in range(2)]
    start, failures = threading.Barrier(len(servers)), []

    def start_server(database: Database) -> None:
        start.wait()
        try:
            make_current(database)
        except Exception as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=start_server, args=(database,)) for database in servers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert failures == []
    assert _version(setup) == LAST_VERSION and revision_of(setup).is_head
    pairs = setup.run(lambda tx: tx.execute(select(item_keyword_pairs.c.item_id)).scalars().all())
    assert sorted(pairs) == sorted(list(range(1, 41)) * 3)  # three pairs an item, once each
    assert audit(setup) == []
    for server in servers:
        server.close()


def _load_release_fixture(db_url: str) -> None:
    """A database made by the release before migrations (commit 16047ce, seeded with 2 sellers and
    6 items), from the dump of it in tests/fixtures."""
    database = Database(db_url, pool_size=1)
    try:
        if database.is_sqlite:
            with sqlite3.connect(database.engine.url.database) as raw:  # type: ignore[arg-type]
                raw.executescript((FIXTURES / "release-16047ce.sqlite.sql").read_text())
            return
        dump = (FIXTURES / "release-16047ce.mariadb.sql").read_text()
        with database.engine.begin() as conn:
            for statement in filter(str.strip, dump.split(";\n")):
                conn.exec_driver_sql(statement)
    finally:
        database.close()


def _schema_differences(database: Database) -> list[object]:
    with database.engine.connect() as conn:
        return list(compare_metadata(MigrationContext.configure(conn), metadata))


def test_a_database_of_the_release_before_migrations_is_recognised_and_upgraded(db_url: str) -> None:
    _load_release_fixture(db_url)
    database = Database(db_url, pool_size=2)
    try:
        assert revision_of(database).current == f"schema{LAST_VERSION}"
        assert not inspect(database.engine).has_table("alembic_version")
        before, after = upgrade(database)
        assert (before.current, after.current) == (f"schema{LAST_VERSION}", head())
        assert inspect(database.engine).has_table("alembic_version")
        assert _version(database) == LAST_VERSION  # a server of that release still runs on it
        kept = database.run(lambda tx: tx.execute(select(items.c.item_id)).scalars().all())
        assert sorted(kept) == [1, 2, 3, 4, 5, 6]
        assert audit(database) == []
        assert _schema_differences(database) == []
    finally:
        database.close()


def test_the_revisions_make_exactly_the_tables_the_code_uses(database: Database) -> None:
    assert _schema_differences(database) == []
    assert revision_of(database).is_head


def _market(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "client.main", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def test_market_db_upgrade_makes_an_empty_database_current_and_says_so(
        db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    from client.main import main

    def market_here(*args: str) -> tuple[int, str]:  # as the program below, without its start
        return main(list(args)), capsys.readouterr().out

    shown = make_url_shown(db_url)
    first = _market("db", "upgrade", "--db-url", db_url)
    assert (first.returncode, first.stdout) == (0, f"upgraded the database {shown} from revision none "
                                                   f"(empty) to {head()} (head)\n")
    assert market_here("db", "upgrade", "--db-url", db_url) == (
        0, f"the database {shown} is at revision {head()} (head): nothing to do\n")
    assert market_here("db", "current", "--db-url", db_url) == (0, f"{head()} (head)\n")


def test_market_db_current_on_an_older_database_exits_1(db_url: str) -> None:
    _load_release_fixture(db_url)
    database = Database(db_url, pool_size=1)
    database.run(lambda tx: tx.execute(update(schema_info).values(version=2)))
    database.close()
    current = _market("db", "current", "--db-url", db_url)
    assert (current.returncode, current.stdout) == (1, f"schema2 (not head: this code's head is {head()})\n")


def test_market_db_on_a_database_it_cannot_use_says_why_in_one_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'no such folder' / 'market.db'}"
    done = _market("db", "upgrade", "--db-url", url)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"error: cannot use the database {url}: unable to open database file"]
    missing = _market("db", "current", "--db-url", url)
    assert (missing.returncode, missing.stderr) == (2, f"error: no such database file: {url}\n")


def make_url_shown(db_url: str) -> str:
    """The URL as the commands print it (without a password)."""
    database = Database(db_url, pool_size=1)
    try:
        return database.where
    finally:
        database.close()


@pytest.mark.slow
def test_two_market_db_upgrade_processes_racing_both_succeed(db_url: str) -> None:
    """Alembic takes no lock: without ours, both would create the tables (one fails) or fill
    the keyword pairs twice (a duplicate key)."""
    _load_release_fixture(db_url)
    database = Database(db_url, pool_size=1)
    database.run(lambda tx: tx.execute(update(schema_info).values(version=2)))
    database.run(lambda tx: tx.execute(item_keyword_pairs.delete()))  # filled again by schema3
    racers = [subprocess.Popen([sys.executable, "-m", "client.main", "db", "upgrade", "--db-url", db_url],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(proc.wait(timeout=120), proc.stderr.read() if proc.stderr else "") for proc in racers]
    for proc in racers:
        proc.stdout.close() if proc.stdout else None
        proc.stderr.close() if proc.stderr else None
    try:
        assert results == [(0, "")] * 2
        assert revision_of(database).is_head
        assert audit(database) == []
    finally:
        database.close()


@contextmanager
def _lock_held_elsewhere(database: Database) -> Iterator[threading.Event]:
    """The database's upgrade lock, held by another thread until the block ends or the event
    it yields is set."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with database.engine.connect() as conn, upgrade_lock(conn, database, 10):
            held.set()
            release.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert held.wait(10)
        yield release
    finally:
        release.set()
        thread.join()


def test_an_upgrade_waits_for_another_holding_the_lock(db_url: str) -> None:
    holder, waiter = Database(db_url, pool_size=1), Database(db_url, pool_size=1)
    try:
        with _lock_held_elsewhere(holder) as release:
            with pytest.raises(DatabaseUnusable, match=r"held its lock for over 1 s; nothing was"):
                upgrade(waiter, wait_s=1)
            assert revision_of(waiter).current is None
            threading.Timer(1.0, release.set).start()
            began = time.monotonic()
            upgrade(waiter, wait_s=10)
            assert time.monotonic() - began > 0.5 and revision_of(waiter).is_head
    finally:
        holder.close()
        waiter.close()


def test_an_upgrade_of_another_database_on_the_same_server_does_not_wait(mysql_server: str) -> None:
    # before: MariaDB's GET_LOCK name was one for the whole server, so upgrading one database
    # waited for (or, past its wait, failed on) another database's upgrade
    fresh = contextmanager(fresh_mysql_database)
    with fresh(mysql_server) as one_url, fresh(mysql_server) as other_url:
        holder, other, same = (Database(url, pool_size=1) for url in (one_url, other_url, one_url))
        try:
            with _lock_held_elsewhere(holder):
                upgrade(other, wait_s=1)
                assert revision_of(other).is_head
                with pytest.raises(DatabaseUnusable, match="held its lock"):  # the same one still waits
                    upgrade(same, wait_s=1)
        finally:
            for database in (holder, other, same):
                database.close()


def _serve(db_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "buyer_server", "--port", "0", "--db-url", db_url],
                          capture_output=True, text=True, timeout=60, env=_REFUSING)


def test_a_server_on_an_older_database_says_what_to_run_and_exits_2(db_url: str) -> None:
    _load_release_fixture(db_url)
    database = Database(db_url, pool_size=1)
    database.run(lambda tx: tx.execute(update(schema_info).values(version=2)))
    database.close()
    done, shown = _serve(db_url), make_url_shown(db_url)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"error: buyer server: the database {shown} is at revision schema2, this server needs {head()}: "
        f"run `market db upgrade --db-url {shown}`"]


def test_servers_starting_at_once_on_an_empty_database_make_its_schema_and_serve(db_url: str) -> None:
    """Protocol 1.2: the schema of an empty database is made at start, once, under the upgrade
    lock, however many servers start on it at once."""
    servers = [ServerProcess(role, db_url, 0, MARKET_UPGRADE_SCHEMA="0")
               for role in ("seller", "buyer", "seller", "buyer")]
    try:
        ready = [server.wait_ready() for server in servers]
        for role, server in zip(("seller", "buyer"), ready[2:], strict=True):
            conn = server.connect()
            conn.call("create_account", {"username": f"{role}1", "password": "password1", "name": "N"})
            conn.token = conn.call("login", {"username": f"{role}1", "password": "password1"})["token"]
            if role == "seller":
                conn.call("put_item", {"name": "Desk Lamp", "category": 2, "keywords": ["desk"],
                                       "condition": "new", "price": "12.50", "quantity": 3})
            else:
                found = conn.call("search_items", {"category": 2})["items"]
                assert [item["name"] for item in found] == ["Desk Lamp"]
    finally:
        codes = [server.stop() for server in servers]
    assert codes == [0, 0, 0, 0], [server.stderr()[-2000:] for server in servers]
    database = Database(db_url, pool_size=1)
    try:
        assert revision_of(database).is_head
        assert audit(database) == []
    finally:
        database.close()


def test_a_server_on_a_newer_schema_says_so_in_one_line(tmp_path: Path) -> None:
    # before: a RuntimeError traceback, exit status 1 (restarted in a loop by systemd)
    url = f"sqlite:///{tmp_path / 'newer.db'}"
    database = Database(url)
    make_current(database)
    database.run(lambda tx: tx.execute(text("UPDATE alembic_version SET version_num = 'later1'")))
    with pytest.raises(DatabaseUnusable, match="it is at revision later1, newer than this code's"):
        upgrade(database)
    database.close()
    done = _serve(url)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"error: buyer server: cannot use the database {url}: it is at revision later1, newer than this "
        f"code's {head()}: run a newer version of the marketplace"]


def test_a_server_with_upgrade_schema_brings_an_older_database_to_head(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    _load_release_fixture(url)
    proc = subprocess.Popen([sys.executable, "-m", "buyer_server", "--port", "0", "--db-url", url,
                             "--upgrade-schema"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env=_REFUSING)
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("listening on ")
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        proc.stdout.close() if proc.stdout else None
    database = Database(url, pool_size=1)
    try:
        assert revision_of(database).is_head
    finally:
        database.close()



# MariaDB only: SQLite cannot drop a column of a table's UNIQUE constraint, which a version 4
# table has (its upgrade adds a unique index instead, by the same code).
@pytest.mark.parametrize("db_url", ["mariadb"], indirect=True)
def test_version_3_orders_become_paid_orders_without_a_payment_key(database: Database) -> None:
    def to_version_3(tx: Connection) -> None:  # the orders table as version 3 made it
        for index in ("ix_orders_status", "uq_orders_payment_key"):
            tx.execute(text(f"DROP INDEX {index} ON orders"))
        for column in ("status", "payment_key"):
            tx.execute(text(f"ALTER TABLE orders DROP COLUMN {column}"))
        tx.execute(text("UPDATE alembic_version SET version_num = 'schema3'"))
        tx.execute(insert(users).values(user_id=1, role="buyer", username="b1", name="B", password_hash="x",
                                        created_ms=0))
        tx.execute(text("INSERT INTO orders (order_id, buyer_id, total_cents, created_ms)"
                        " VALUES (7, 1, 0, 0)"))

    database.run(to_version_3)
    make_current(database)
    make_current(database)  # a second server finds it done
    order = database.run(lambda tx: tx.execute(select(orders.c.status, orders.c.payment_key)).one(),
                         write=False)
    assert tuple(order) == ("paid", None)
    assert revision_of(database).is_head
    indexes = inspect(database.engine).get_indexes("orders")
    names = {index["name"] for index in indexes}
    assert {"ix_orders_status", "uq_orders_payment_key"} <= names
