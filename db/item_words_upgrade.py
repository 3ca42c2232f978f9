"""Schema version 4: the search by text's word indexes (item_words, item_word_pairs), made and
filled from every item on sale, so that items listed before the upgrade are found by name.

One function over a connection inside the upgrade's transaction; safe to run on a database
whose tables exist already but are empty (create_all made them).
"""
from __future__ import annotations

import json
import logging

from sqlalchemy import Connection, insert, select

from .schema import item_word_pairs, item_words, items, word_pair_rows, word_rows

log = logging.getLogger("market.db")


def upgrade(conn: Connection, chunk: int = 10_000) -> None:
    """Create the word indexes if missing and index the words of every item on sale, a chunk
    of items at a time, with the rules put_item uses (schema.word_rows, word_pair_rows)."""
    item_words.create(conn, checkfirst=True)
    item_word_pairs.create(conn, checkfirst=True)
    after, filled = 0, 0
    while True:
        page = conn.execute(select(items.c.item_id, items.c.name, items.c.category, items.c.keywords)
                            .where(items.c.item_id > after, items.c.quantity > 0)
                            .order_by(items.c.item_id).limit(chunk)).all()
        if not page:
            break
        rows = [word_rows(item.item_id, item.category, item.name, json.loads(item.keywords)) for item in page]
        pairs = [pair for item, words in zip(page, rows, strict=True)
                 for pair in word_pair_rows(item.item_id, [row["word"] for row in words])]
        singles = [row for words in rows for row in words]
        for table, new_rows in ((item_words, singles), (item_word_pairs, pairs)):
            if new_rows:
                conn.execute(insert(table), new_rows)
        after, filled = page[-1].item_id, filled + sum(map(len, rows))
    if filled:  # a new database's empty catalogue is no news
        log.info("indexed %d words of the names and keywords of the items on sale", filled)
