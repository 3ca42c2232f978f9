"""EXPLAIN on MariaDB: the read paths of every op use indexes, never a full table scan.

A few thousand seeded items make the optimiser's choice meaningful (on a tiny table
a scan is cheapest and would be chosen anyway); ANALYZE TABLE gives it statistics.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from conftest import fresh_mysql_database
from sqlalchemy import select, text

from db import Database
from db.accounts import _SESSION_BY_TOKEN
from db.carts import _CART
from db.catalog import _ITEM_BY_ID, _SELLER_ITEMS, _SELLER_RATING, _plain_search, _ranked_search
from db.login_throttle import _FAILURES
from db.orders import _HISTORY
from db.schema import items, metadata
from db.seed import seed

PARAMS: dict[str, Any] = {
    "item_id": 1500, "seller_id": 3, "after": 0, "limit": 51, "category": 4,
    "keyword0": "lamp", "keyword1": "desk", "last_matches": 2, "token_hash": "ab" * 32, "role": "buyer",
    "session_id": 1, "buyer_id": 2, "last_order": 2**62, "last_item": 0, "username": "someone",
}
STATEMENTS = {
    "get_item": _ITEM_BY_ID, "display_items": _SELLER_ITEMS, "get_seller_rating": _SELLER_RATING,
    "search by category": _plain_search(True), "search all": _plain_search(False),
    "search keywords": _ranked_search(False, False, 2),
    "search keywords+category": _ranked_search(True, False, 2),
    "search keywords, next page": _ranked_search(True, True, 2), "display_cart": _CART,
    "token check": _SESSION_BY_TOKEN, "purchase history": _HISTORY, "login backoff": _FAILURES,
}


@pytest.fixture(scope="module")
def seeded(mysql_server: str) -> Iterator[Database]:
    for url in fresh_mysql_database(mysql_server, prefix="market_explain"):
        db = Database(url, pool_size=2)
        db.create_schema()
        seed(db, sellers=50, items_count=3000)
        db.run(lambda tx: [tx.execute(text(f"ANALYZE TABLE {t}")).all() for t in metadata.tables])
        yield db
        db.close()


def full_scans(db: Database, statement: Any) -> tuple[list[str], str]:
    """Base tables the plan reads in full (type ALL), and the SQL explained."""
    statement = getattr(statement, "statement", statement)  # a Prepared one, or plain Core
    sql = str(statement.params(**PARAMS).compile(dialect=db.engine.dialect,
                                                  compile_kwargs={"literal_binds": True}))
    plan = db.run(lambda tx: tx.exec_driver_sql("EXPLAIN " + sql.replace("%%", "%")).mappings().all(),
                  write=False)
    return [row["table"] for row in plan
            if row["type"] == "ALL" and not str(row["table"]).startswith("<derived")], sql


@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_no_full_table_scan(seeded: Database, name: str) -> None:
    scans, sql = full_scans(seeded, STATEMENTS[name])
    assert not scans, f"{name}: full scan of {scans}\n{sql}"


def test_the_check_does_see_a_full_scan(seeded: Database) -> None:
    unindexed = select(items.c.item_id).where(items.c.name == "no such name")
    assert full_scans(seeded, unindexed)[0] == ["items"]
