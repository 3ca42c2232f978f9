"""The search by text's index made again from every item on sale (revisions 0005 and 0010):
item_words with the rules put_item uses (schema.word_rows: category names, stems, scripts
without spaces, at most 12 words an item), the vocabulary of typos filled, and the word pairs
of revisions 0005 to 0009 dropped.

One function over a connection inside the upgrade's transaction; safe to run again.
"""
from __future__ import annotations

import json
import logging

from sqlalchemy import Connection, insert, select, text

from db.catalog import INDEX_VOCABULARY
from db.schema import item_words, items, vocabulary, vocabulary_rows, word_rows

log = logging.getLogger("market.db")


def upgrade(conn: Connection, chunk: int = 10_000) -> None:
    """Make item_words and the vocabulary anew and index the words of every item on sale, a
    chunk of items at a time."""
    conn.execute(text("DROP TABLE IF EXISTS item_word_pairs"))
    item_words.drop(conn, checkfirst=True)  # its words were up to 576 characters long
    item_words.create(conn)
    vocabulary.create(conn, checkfirst=True)
    after, filled = 0, 0
    while True:
        page = conn.execute(select(items.c.item_id, items.c.name, items.c.category, items.c.keywords)
                            .where(items.c.item_id > after, items.c.quantity > 0)
                            .order_by(items.c.item_id).limit(chunk)).all()
        if not page:
            break
        rows = [row for item in page
                for row in word_rows(item.item_id, item.category, item.name, json.loads(item.keywords))]
        conn.execute(insert(item_words), rows)
        if new_words := vocabulary_rows({row["word"] for row in rows}):
            conn.execute(INDEX_VOCABULARY, new_words)
        after, filled = page[-1].item_id, filled + len(rows)
    if filled:  # a new database's empty catalogue is no news
        log.info("indexed %d words of the names and keywords of the items on sale", filled)
