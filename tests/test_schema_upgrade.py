"""Databases made by an earlier version of the schema are brought up to date at start."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import Connection, insert, inspect, select, text, update

import db.engine as engine_module
from db import Database, DatabaseUnusable
from db.audit import audit
from db.schema import SCHEMA_VERSION, item_keyword_pairs, item_keywords, items, orders, schema_info, users


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
    database.run(lambda tx: tx.execute(update(schema_info).values(version=1)))
    database.create_schema()
    indexed = database.run(lambda tx: tx.execute(select(item_keywords.c.item_id)).scalars().all())
    assert indexed == [2]
    assert database.run(lambda tx: tx.execute(select(schema_info.c.version)).scalar()) == SCHEMA_VERSION


def test_version_2_gets_the_keyword_pairs_of_the_items_on_sale(database: Database) -> None:
    database.run(lambda tx: tx.execute(insert(users).values(
        user_id=1, role="seller", username="s1", name="S", password_hash="x", created_ms=0)))
    database.run(lambda tx: _item(tx, 1, 1, ("old", "lamp", "desk")))
    database.run(lambda tx: _item(tx, 2, 1, ("one",)))
    database.run(lambda tx: tx.execute(update(schema_info).values(version=2)))
    assert audit(database) != []  # item 1 is missing its pairs
    database.create_schema()
    pairs = database.run(lambda tx: tx.execute(
        select(item_keyword_pairs.c.first_keyword, item_keyword_pairs.c.second_keyword,
               item_keyword_pairs.c.item_id).order_by(item_keyword_pairs.c.first_keyword,
                                                      item_keyword_pairs.c.second_keyword)).all())
    assert [tuple(row) for row in pairs] == [("desk", "lamp", 1), ("desk", "old", 1), ("lamp", "old", 1)]
    assert audit(database) == []
    assert database.run(lambda tx: tx.execute(select(schema_info.c.version)).scalar()) == SCHEMA_VERSION


def test_version_2_gets_one_index_for_unlisting_an_items_keywords(database: Database) -> None:
    if database.is_sqlite:  # SQLite had none (MySQL had the foreign key's, which stays alone)
        database.run(lambda tx: tx.execute(text("DROP INDEX ix_item_keywords_item")))
    database.run(lambda tx: tx.execute(update(schema_info).values(version=2)))
    database.create_schema()

    def by_item(tx: Connection) -> list[str]:
        return [ix["name"] for ix in inspect(tx.core).get_indexes("item_keywords")
                if ix["column_names"][:1] == ["item_id"]]

    assert len(database.run(by_item)) == 1


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
    database.run(lambda tx: tx.execute(update(schema_info).values(version=2)))
    database.create_schema()

    def types(tx: Connection) -> list[str]:
        wanted = (("item_keywords", "keyword"), ("orders", "idempotency_key"))
        return [str(column["type"]) for table, name in wanted
                for column in inspect(tx.core).get_columns(table) if column["name"] == name]

    assert database.run(types) == ["VARBINARY(32)", "VARBINARY(512)"]
    assert database.run(lambda tx: tx.execute(select(item_keywords.c.keyword)).scalars().all()) == ["old"]
    assert audit(database) == []


def test_two_servers_upgrading_one_database_at_once_both_start(db_url: str) -> None:
    """As two server processes would: each its own Database, create_schema at the same moment."""
    setup = Database(db_url, pool_size=1)
    setup.create_schema()
    setup.run(lambda tx: tx.execute(insert(users).values(
        user_id=1, role="seller", username="s1", name="S", password_hash="x", created_ms=0)))
    for item_id in range(1, 41):
        setup.run(lambda tx: _item(tx, item_id, 1, ("a", "b", f"w{item_id % 7}")))  # noqa: B023
    setup.run(lambda tx: tx.execute(update(schema_info).values(version=2)))
    servers = [Database(db_url, pool_size=1) for _ in range(2)]
    start, failures = threading.Barrier(len(servers)), []

    def start_server(database: Database) -> None:
        start.wait()
        try:
            database.create_schema()
        except Exception as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=start_server, args=(database,)) for database in servers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert failures == []
    assert setup.run(lambda tx: tx.execute(select(schema_info.c.version)).scalar()) == SCHEMA_VERSION
    pairs = setup.run(lambda tx: tx.execute(select(item_keyword_pairs.c.item_id)).scalars().all())
    assert sorted(pairs) == sorted(list(range(1, 41)) * 3)  # three pairs an item, once each
    assert audit(setup) == []
    for database in (setup, *servers):
        database.close()


@pytest.fixture
def short_lock_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lock waited for 1 s (15 s in service) before the database gives up on it."""
    monkeypatch.setattr(engine_module, "LOCK_WAIT_S", 1)
    monkeypatch.setattr(engine_module, "_POLL_LOCK_S", 0.2)
    monkeypatch.setattr(engine_module, "SQLITE_BUSY_TIMEOUT_MS", 800)


def _hold_the_schema(db_url: str, seconds: float) -> threading.Thread:
    """Another server's long upgrade: the schema's row locked for `seconds`."""
    holder, locked = Database(db_url, pool_size=1), threading.Event()
    holder.create_schema()

    def hold(tx: Connection) -> None:
        tx.execute(select(schema_info.c.version).with_for_update()).scalar()
        tx.execute(update(schema_info).values(version=schema_info.c.version))  # SQLite: the write lock
        locked.set()
        time.sleep(seconds)

    def run() -> None:
        try:
            holder.run(hold)
        finally:
            holder.close()

    thread = threading.Thread(target=run)
    thread.start()
    assert locked.wait(10)
    return thread


@pytest.mark.usefixtures("short_lock_waits")
def test_a_server_starting_during_a_long_upgrade_waits_for_it(db_url: str) -> None:
    # before: five lock waits (about 7 s here, 77 s in service) and the server stopped
    # with a traceback, though an upgrade of a large catalogue takes minutes
    holder = _hold_the_schema(db_url, 9.0)
    starting = Database(db_url, pool_size=1)
    try:
        began = time.monotonic()
        starting.create_schema()
        assert time.monotonic() - began > 8  # it waited the upgrade out
        assert starting.run(lambda tx: tx.execute(select(schema_info.c.version)).scalar()) == SCHEMA_VERSION
    finally:
        holder.join()
        starting.close()


@pytest.mark.usefixtures("short_lock_waits")
def test_a_schema_locked_past_the_wait_is_refused_in_one_line(db_url: str) -> None:
    holder = _hold_the_schema(db_url, 5.0)
    starting = Database(db_url, pool_size=1)
    try:
        with pytest.raises(DatabaseUnusable, match=r"its schema stayed locked for over 2 s \(another server"):
            starting.create_schema(wait_s=2)
    finally:
        holder.join()
        starting.close()


def test_a_newer_schema_is_refused_with_a_clear_error(database: Database) -> None:
    database.run(lambda tx: tx.execute(update(schema_info).values(version=SCHEMA_VERSION + 1)))
    with pytest.raises(DatabaseUnusable, match=f"schema version {SCHEMA_VERSION + 1}, newer than this code"):
        database.create_schema()


def test_a_server_on_a_newer_schema_says_so_in_one_line(tmp_path: Path) -> None:
    # before: a RuntimeError traceback, exit status 1 (restarted in a loop by systemd)
    url = f"sqlite:///{tmp_path / 'newer.db'}"
    database = Database(url)
    database.create_schema()
    database.run(lambda tx: tx.execute(update(schema_info).values(version=SCHEMA_VERSION + 1)))
    database.close()
    done = subprocess.run([sys.executable, "-m", "buyer_server", "--port", "0", "--db-url", url],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"error: buyer server: cannot use the database {url}: it has schema version {SCHEMA_VERSION + 1}, "
        f"newer than this code's {SCHEMA_VERSION}: run a newer version of the marketplace"]


# MariaDB only: SQLite cannot drop a column of a table's UNIQUE constraint, which a version 4
# table has (its upgrade adds a unique index instead, by the same code).
@pytest.mark.parametrize("db_url", ["mariadb"], indirect=True)
def test_version_3_orders_become_paid_orders_without_a_payment_key(database: Database) -> None:
    def to_version_3(tx: Connection) -> None:  # the orders table as version 3 made it
        for index in ("ix_orders_status", "uq_orders_payment_key"):
            tx.execute(text(f"DROP INDEX {index} ON orders"))
        for column in ("status", "payment_key"):
            tx.execute(text(f"ALTER TABLE orders DROP COLUMN {column}"))
        tx.execute(update(schema_info).values(version=3))
        tx.execute(insert(users).values(user_id=1, role="buyer", username="b1", name="B", password_hash="x",
                                        created_ms=0))
        tx.execute(text("INSERT INTO orders (order_id, buyer_id, total_cents, created_ms)"
                        " VALUES (7, 1, 0, 0)"))

    database.run(to_version_3)
    database.create_schema()
    database.create_schema()  # a second server finds it done
    order = database.run(lambda tx: tx.execute(select(orders.c.status, orders.c.payment_key)).one(),
                         write=False)
    assert tuple(order) == ("paid", None)
    assert database.run(lambda tx: tx.execute(select(schema_info.c.version)).scalar()) == SCHEMA_VERSION
    indexes = database.run(lambda tx: inspect(tx.core).get_indexes("orders"), write=False)
    names = {index["name"] for index in indexes}
    assert {"ix_orders_status", "uq_orders_payment_key"} <= names
