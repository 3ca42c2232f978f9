"""Schema version 3: item_keyword_pairs filled for the items on sale, item_keywords indexed by
item_id, keywords and idempotency keys compared exactly on MySQL (db.schema.ExactText).

Each step finds its work done or not, so a database made by the release before migrations
(its version 1, 2 or 3 in schema_info) is stamped at that revision and goes on from there."""
import json
import logging

from alembic import op
from sqlalchemy import VARBINARY, Connection, insert, inspect, select, text, update

from db.engine import is_sqlite
from db.schema import item_keyword_pairs, item_keywords, items, keyword_pair_rows, orders, schema_info

revision = "schema3"
down_revision = "schema2"
log = logging.getLogger("market.db")


def upgrade() -> None:
    conn = op.get_bind()
    item_keyword_pairs.create(conn, checkfirst=True)
    _index_keywords_by_item(conn)
    _compare_exactly(conn)
    _fill_keyword_pairs(conn)
    conn.execute(update(schema_info).values(version=3))


def _fill_keyword_pairs(conn: Connection, chunk: int = 10_000) -> None:
    """Index the keyword pairs of every item on sale, a chunk of items at a time; pairs are
    made in Python (keyword_pair_rows), exactly as put_item makes them."""
    after, filled = 0, 0
    while True:
        page = conn.execute(select(items.c.item_id, items.c.keywords)
                            .where(items.c.item_id > after, items.c.quantity > 0)
                            .order_by(items.c.item_id).limit(chunk)).all()
        if not page:
            break
        rows = [pair for item in page for pair in keyword_pair_rows(item.item_id, json.loads(item.keywords))]
        if rows:
            conn.execute(insert(item_keyword_pairs), rows)
        after, filled = page[-1].item_id, filled + len(rows)
    if filled:  # a new database's empty catalogue is no news
        log.info("indexed %d keyword pairs of the items on sale", filled)


def _index_keywords_by_item(conn: Connection) -> None:
    """An index for unlisting an item's keywords, unless one leads with item_id already (MySQL
    made one for the foreign key; SQLite had none and read the whole table per sold-out item)."""
    existing = inspect(conn).get_indexes(item_keywords.name)
    if not any(index["column_names"][:1] == ["item_id"] for index in existing):
        next(ix for ix in item_keywords.indexes if ix.name == "ix_item_keywords_item").create(conn)


def _compare_exactly(conn: Connection) -> None:
    """Keywords and idempotency keys to ExactText's type (SQLite's compare exactly already)."""
    if is_sqlite(conn.engine):
        return
    for column in (item_keywords.c.keyword, orders.c.idempotency_key):
        current = {c["name"]: c["type"] for c in inspect(conn).get_columns(column.table.name)}[column.name]
        if isinstance(current, VARBINARY):
            continue
        null = "NULL" if column.nullable else "NOT NULL"
        conn.execute(text(f"ALTER TABLE {column.table.name} MODIFY {column.name} "
                          f"{column.type.compile(dialect=conn.dialect)} {null}"))
