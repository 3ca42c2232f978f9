"""Schema version 4: the search by text's word index (item_words), made and filled with the
words of every item on sale, so that items listed before the upgrade are found by name.

One function over a connection inside the upgrade's transaction; safe to run on a database
whose table exists already but is empty (create_all made it).
"""
from __future__ import annotations

import json
import logging

from sqlalchemy import Connection, insert, select

from .schema import item_words, items, word_rows

log = logging.getLogger("market.db")


def upgrade(conn: Connection, chunk: int = 10_000) -> None:
    """Create item_words if missing and index the words of every item on sale, a chunk of
    items at a time, with the same rule put_item uses (schema.word_rows)."""
    item_words.create(conn, checkfirst=True)
    after, filled = 0, 0
    while True:
        page = conn.execute(select(items.c.item_id, items.c.name, items.c.category, items.c.keywords)
                            .where(items.c.item_id > after, items.c.quantity > 0)
                            .order_by(items.c.item_id).limit(chunk)).all()
        if not page:
            break
        rows = [row for item in page
                for row in word_rows(item.item_id, item.category, item.name, json.loads(item.keywords))]
        if rows:
            conn.execute(insert(item_words), rows)
        after, filled = page[-1].item_id, filled + len(rows)
    log.info("indexed %d words of the names and keywords of the items on sale", filled)
