"""Items and ratings: listing, pricing, removing, displaying.

Keywords live as the item's JSON list (returned in order, no extra query) and in the search
indexes (db.schema), which hold items on sale only: an item's rows go when it sells out, and
come back only if it is given stock again (relist), so ranking runs on them alone (db.search).
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import orjson
from sqlalchemy import Integer, bindparam, delete, func, insert, select, update

from wire.errors import ConflictError, ForbiddenError, NotFoundError
from wire.values import decode_cursor, encode_cursor, format_money

from .accounts import Session, with_session
from .database import now_ms
from .schema import (
    item_keyword_pairs,
    item_keywords,
    item_words,
    items,
    keyword_pair_rows,
    keyword_rows,
    sessions,
    users,
    vocabulary,
    vocabulary_rows,
    word_rows,
)
from .unit_of_work import UnitOfWork

ItemRow = Any  # a Row with ITEM_COLUMNS (SQLAlchemy types rows by column count)
ITEM_COLUMNS = (items.c.item_id, items.c.seller_id, items.c.name, items.c.category, items.c.keywords,
                items.c.item_condition, items.c.price_cents, items.c.quantity, items.c.thumbs_up,
                items.c.thumbs_down)


def item_to_wire(row: ItemRow) -> dict[str, Any]:
    return {"item_id": row.item_id, "seller_id": row.seller_id, "name": row.name,
            "category": row.category, "keywords": orjson.loads(row.keywords),
            "condition": row.item_condition, "price": format_money(row.price_cents),
            "quantity": row.quantity, "thumbs_up": row.thumbs_up, "thumbs_down": row.thumbs_down}


def split_page(rows: Sequence[Any], limit: int, cursor_of: Any) -> tuple[Sequence[Any], str | None]:
    """Rows of one page and the cursor of the next (None on the last page)."""
    if len(rows) <= limit:
        return rows, None
    return rows[:limit], cursor_of(rows[limit - 1])


_NEW_ITEM = (insert(items).values(
    seller_id=bindparam("seller_id"), name=bindparam("name"), category=bindparam("category"),
    keywords=bindparam("keywords"), item_condition=bindparam("condition"), price_cents=bindparam("price"),
    quantity=bindparam("quantity"), listed=bindparam("quantity"), created_ms=bindparam("now")))
# (the seed and the upgrade write it too: words already there are kept)
INDEX_VOCABULARY = (insert(vocabulary).prefix_with("OR IGNORE", dialect="sqlite")
                     .prefix_with("IGNORE", dialect="mysql").prefix_with("IGNORE", dialect="mariadb"))
_ON_SALE = select(func.count()).select_from(
    select(items.c.item_id).where(items.c.seller_id == bindparam("seller_id"), items.c.quantity > 0)
    .limit(bindparam("cap", type_=Integer)).subquery())  # ix_items_seller_on_sale: at most `cap` keys
_ITEM_FOR_SESSION = with_session(*ITEM_COLUMNS, joined=items, on=items.c.item_id == bindparam("item_id"))
_ITEM_FOR_SESSION_LOCKED = _ITEM_FOR_SESSION.with_for_update()
_SET_PRICE = (update(items).where(items.c.item_id == bindparam("item_id"))
              .values(price_cents=bindparam("price")))
_REMOVE = (update(items).where(items.c.item_id == bindparam("item_id"), items.c.quantity >= bindparam("n"))
           .values(quantity=items.c.quantity - bindparam("n"), removed=items.c.removed + bindparam("n")))
_UNLIST = [delete(index).where(index.c.item_id == bindparam("item_id"))
           for index in (item_keywords, item_keyword_pairs, item_words)]
_SELLER_ITEMS = (
    with_session(*ITEM_COLUMNS, joined=items,
                 on=(items.c.seller_id == sessions.c.user_id) & (items.c.item_id > bindparam("after"))
                 & (items.c.quantity > 0))
    .order_by(items.c.item_id).limit(bindparam("limit", type_=Integer)))
_RATING_FOR_SESSION = with_session(
    users.c.user_id, users.c.thumbs_up, users.c.thumbs_down, users.c.items_sold, joined=users,
    on=(users.c.user_id == func.coalesce(bindparam("seller_id", type_=Integer), sessions.c.user_id))
    & (users.c.role == "seller"))


def put_item(tx: UnitOfWork, session: Session, name: str, category: int, keywords: list[str],
             condition: str, price: int, quantity: int, *, max_on_sale: int) -> dict[str, Any]:
    """List a new item for sale, unless the seller has max_on_sale items on sale already."""
    if tx.execute(_ON_SALE, {"seller_id": session.user_id, "cap": max_on_sale}).scalar() >= max_on_sale:
        raise ConflictError(f"you have {max_on_sale:,} items on sale, the most a seller may have on this "
                            "market; remove some (or wait for them to sell) before listing more")
    item_id = int(tx.execute(_NEW_ITEM, {
        "seller_id": session.user_id, "name": name, "category": category, "keywords": json.dumps(keywords),
        "condition": condition, "price": price, "quantity": quantity, "now": now_ms()}).lastrowid)
    _index(tx, item_id, category, name, keywords)
    return {"item_id": item_id}


def _index(tx: UnitOfWork, item_id: int, category: int, name: str, keywords: list[str]) -> None:
    """An item's rows of the search indexes (held for the COMMIT: nothing reads them back)."""
    tx.execute(insert(item_keywords), keyword_rows(item_id, category, keywords))
    tx.execute(insert(item_keyword_pairs), keyword_pair_rows(item_id, keywords))
    words = word_rows(item_id, category, name, keywords)  # the category's name at least
    tx.execute(insert(item_words), words)
    for word in vocabulary_rows(row["word"] for row in words):  # a row a statement: each keeps IGNORE
        tx.execute(INDEX_VOCABULARY, word)


def change_price(tx: UnitOfWork, session: Session, item_id: int, price: int) -> dict[str, Any]:
    row = item_for_session(tx, session, item_id, lock=True, own=True)
    tx.execute(_SET_PRICE, {"item_id": item_id, "price": price})
    return {**item_to_wire(row), "price": format_money(price)}  # the row is locked: nothing else moved


def remove_item(tx: UnitOfWork, session: Session, item_id: int, quantity: int) -> dict[str, Any]:
    row = item_for_session(tx, session, item_id, lock=True, own=True, remove=quantity)
    # the row is locked: the UPDATE applies (its condition says so again), so it goes with the COMMIT
    tx.execute(_REMOVE, {"item_id": item_id, "n": quantity})
    if row.quantity == quantity:
        unlist(tx, [item_id])
    return {**item_to_wire(row), "quantity": row.quantity - quantity}


def unlist(tx: UnitOfWork, sold_out: Sequence[int]) -> None:
    for item_id in sold_out:
        for statement in _UNLIST:
            tx.execute(statement, {"item_id": item_id})


def relist(tx: UnitOfWork, restocked: Sequence[ItemRow]) -> None:
    """Put items whose quantity rose from 0 back in the search indexes."""
    for item in restocked:
        _index(tx, item.item_id, item.category, item.name, json.loads(item.keywords))


def display_items(tx: UnitOfWork, session: Session, limit: int, cursor: str | None) -> dict[str, Any]:
    """The seller's items still on sale, by item_id."""
    after = decode_cursor(cursor, 1)[0] if cursor else 0
    params = {**session.check_params, "after": after, "limit": limit + 1}
    rows = session.accept_rows(tx.execute(_SELLER_ITEMS, params).all())
    rows, next_cursor = split_page(rows, limit, lambda r: encode_cursor(r.item_id))
    return {"items": [item_to_wire(r) for r in rows], "next_cursor": next_cursor}


def get_item(tx: UnitOfWork, session: Session, item_id: int) -> dict[str, Any]:
    """One item, also when sold out."""
    return item_to_wire(item_for_session(tx, session, item_id))


def item_for_session(tx: UnitOfWork, session: Session, item_id: int, lock: bool = False, *,
                     own: bool = False, remove: int = 0) -> ItemRow:
    """One item row with the token check in the same query, checked (checked_item) to be the
    caller's if `own`, with `remove` on sale; `lock`: FOR UPDATE, until the transaction ends."""
    statement = _ITEM_FOR_SESSION_LOCKED if lock else _ITEM_FOR_SESSION
    rows = session.accept_rows(tx.execute(statement, {**session.check_params, "item_id": item_id}).all())
    return checked_item(rows, item_id, session.user_id if own else None, remove)


def checked_item(rows: Sequence[ItemRow], item_id: int, seller_id: int | None = None,
                 remove: int = 0) -> ItemRow:
    """The row of an item op, checked in the contract's order: NOT_FOUND (no row), FORBIDDEN
    (not `seller_id`'s, when given), CONFLICT (fewer than `remove` on sale)."""
    if not rows:
        raise NotFoundError(f"no item {item_id}")
    if seller_id is not None and rows[0].seller_id != seller_id:
        raise ForbiddenError(f"item {item_id} belongs to another seller")
    if rows[0].quantity < remove:
        raise ConflictError(f"item {item_id}: only {rows[0].quantity} on sale, cannot remove {remove}")
    return rows[0]


def get_seller_rating(tx: UnitOfWork, session: Session, seller_id: int | None = None) -> dict[str, Any]:
    """The rating of the given seller, or of the calling seller (one query with the token check)."""
    params = {**session.check_params, "seller_id": seller_id}
    rows = session.accept_rows(tx.execute(_RATING_FOR_SESSION, params).all())
    if not rows:
        raise NotFoundError(f"no seller {seller_id if seller_id is not None else session.user_id}")
    row = rows[0]
    return {"seller_id": row.user_id, "thumbs_up": row.thumbs_up, "thumbs_down": row.thumbs_down,
            "items_sold": row.items_sold}
