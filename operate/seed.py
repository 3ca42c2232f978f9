"""Bulk seeding of a large catalogue, for measuring how the marketplace scales.

Batches of multi-row INSERTs with ids chosen here (max + 1, no lock: seed an idle database),
each index table's rows in key order so each page is visited once per batch. Seeded sellers
share one password (hashing 100,000 would take most of an hour).
"""
from __future__ import annotations

import itertools
import json
import operator
import random
import time
from collections.abc import Iterator
from typing import Any

from sqlalchemy import Connection, Table, func, insert, select

from db.catalog import INDEX_VOCABULARY
from db.database import Database, now_ms
from db.passwords import hash_password
from db.schema import (
    item_keyword_pairs,
    item_keywords,
    item_words,
    items,
    keyword_pair_rows,
    keyword_rows,
    users,
    vocabulary_rows,
    word_rows,
)

SEED_PASSWORD = "seeded-password"
WORDS = ["lamp", "desk", "chair", "light", "table", "sofa", "bed", "rug", "shelf", "clock",
         "mirror", "vase", "book", "pen", "mug", "plate", "bowl", "knife", "fork", "spoon",
         "phone", "cable", "radio", "camera", "bike", "helmet", "ball", "racket", "shoe", "coat",
         "hat", "scarf", "glove", "watch", "ring", "bag", "wallet", "toy", "game", "puzzle"]
# 40 everyday words and a long tail of made-up ones: 4,000 keywords in all, so that at a
# million items each keyword is on about 600 of them, as in a real shop's vocabulary.
VOCABULARY = WORDS + [f"w{n:04d}" for n in range(4000 - len(WORDS))]
BATCH = 50_000  # items per transaction: each index page is read and written once per batch
INSERT_ROWS = 10_000  # rows per INSERT on MySQL: well under the 16 MiB max_allowed_packet
SQLITE_CACHE_KIB = 512 * 1024  # SQLite keeps a batch's pages in memory to its COMMIT (default: 2 MiB)


def seed(db: Database, sellers: int, items_count: int, name: str | None = None) -> dict[str, Any]:
    """Add `sellers` sellers and `items_count` items spread over them (each named `name` if
    given, else by two of its keywords and its id); returns counts, first ids and seconds taken."""
    start = time.perf_counter()
    first_seller = _next_id(db, users.c.user_id)
    for batch in _batches(_seller_rows(first_seller, sellers), BATCH):
        with db.engine.begin() as conn:
            _bulk_insert(conn, users, batch)
    first_item = _next_id(db, items.c.item_id)
    for batch in _batches(_item_rows(first_item, items_count, first_seller, sellers, name), BATCH):
        with db.engine.begin() as conn:
            _insert_items(conn, batch)
    return {"sellers": sellers, "items": items_count, "first_seller_id": first_seller,
            "first_item_id": first_item, "seconds": round(time.perf_counter() - start, 1)}


def _insert_items(conn: Connection, item_rows: list[dict[str, Any]]) -> None:
    """A batch of items with their rows in the search indexes."""
    rows: dict[Table, list[dict[str, Any]]] = {
        items: item_rows, item_keywords: [], item_keyword_pairs: [], item_words: []}
    for row in item_rows:
        words = json.loads(row["keywords"])
        rows[item_keywords] += keyword_rows(row["item_id"], row["category"], words)
        rows[item_keyword_pairs] += keyword_pair_rows(row["item_id"], words)
        rows[item_words] += word_rows(row["item_id"], row["category"], row["name"], words)
    if conn.dialect.name == "sqlite":
        conn.exec_driver_sql(f"PRAGMA cache_size = -{SQLITE_CACHE_KIB}")
    for table, table_rows in rows.items():
        _bulk_insert(conn, table, table_rows)
    if new_words := vocabulary_rows({row["word"] for row in rows[item_words]}):
        conn.execute(INDEX_VOCABULARY, new_words)


def _bulk_insert(conn: Connection, table: Table, rows: list[dict[str, Any]]) -> None:
    """rows in primary key order, through the driver's executemany (INSERTs of INSERT_ROWS
    rows on MySQL)."""
    rows.sort(key=operator.itemgetter(*(column.name for column in table.primary_key.columns)))
    for start in range(0, len(rows), INSERT_ROWS):
        conn.execute(insert(table), rows[start:start + INSERT_ROWS])


def _next_id(db: Database, column: Any) -> int:
    return int(db.run(lambda tx: tx.execute(select(func.coalesce(func.max(column), 0))).scalar_one())) + 1


def _seller_rows(first: int, count: int) -> Iterator[dict[str, Any]]:
    password_hash, now = hash_password(SEED_PASSWORD), now_ms()
    for user_id in range(first, first + count):
        yield {"user_id": user_id, "role": "seller", "username": f"seed{user_id}",
               "name": f"Seeded seller {user_id}", "password_hash": password_hash, "created_ms": now}


def _item_rows(first: int, count: int, first_seller: int, sellers: int,
               name: str | None) -> Iterator[dict[str, Any]]:
    rng, now = random.Random(1), now_ms()
    for item_id in range(first, first + count):
        quantity = rng.randint(1, 100)
        words = rng.sample(VOCABULARY, rng.randint(0, 5))
        yield {"item_id": item_id, "seller_id": first_seller + rng.randrange(max(1, sellers)),
               "name": name or f"{' '.join(words[:2]) or 'thing'} {item_id}"[:32],
               "category": rng.randint(0, 9), "keywords": json.dumps(words),
               "item_condition": rng.choice(("new", "used")), "price_cents": rng.randint(1, 100_000),
               "quantity": quantity, "listed": quantity, "created_ms": now}


def _batches(rows: Iterator[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    while batch := list(itertools.islice(rows, size)):
        yield batch

