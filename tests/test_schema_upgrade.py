"""Databases made by an earlier version of the schema are brought up to date at start."""
from __future__ import annotations

import pytest
from sqlalchemy import insert, select, update

from db import Database
from db.schema import SCHEMA_VERSION, item_keywords, items, schema_info, users


def _item(tx: object, item_id: int, quantity: int) -> None:
    tx.execute(insert(items).values(  # type: ignore[attr-defined]
        item_id=item_id, seller_id=1, name="Lamp", category=1, keywords='["old"]', item_condition="new",
        price_cents=100, quantity=quantity, listed=1, sold=1 - quantity, created_ms=0))
    tx.execute(insert(item_keywords).values(keyword="old", item_id=item_id, category=1))  # type: ignore[attr-defined]


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


def test_a_newer_schema_is_refused_with_a_clear_error(database: Database) -> None:
    database.run(lambda tx: tx.execute(update(schema_info).values(version=SCHEMA_VERSION + 1)))
    with pytest.raises(RuntimeError, match="newer than this code"):
        database.create_schema()
