"""Purchases, purchase history and feedback.

A purchase is one transaction: stock is taken with conditional updates in item_id
order (so concurrent purchases lock in the same order), the order and its lines are
written, sellers' `items_sold` grow, the card is charged, and the carts are emptied;
any failure rolls all of it back. An idempotency key is a unique constraint: a
second purchase with the same key waits for the first, then replays its answer.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    Integer,
    String,
    Update,
    and_,
    bindparam,
    delete,
    insert,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError

from wire.errors import ConflictError, ForbiddenError
from wire.values import decode_cursor, encode_cursor, format_money, format_time

from .accounts import Session
from .catalog import item_for_session, split_page, unlist
from .database import RetryTransaction, now_ms
from .schema import cart_lines, feedback, items, order_lines, orders, saved_cart_lines, users
from .unit_of_work import UnitOfWork

# charge(amount_cents, card_name, card_number, card_expiry, idempotency_key); raises on refusal.
Charge = Callable[[int, str, str, str, str | None], None]


# The cart with its items' sellers, names, prices and stock, locked (in item order, as the
# stock updates take them) so that what the order records is exact.
_CART_LINES = (select(cart_lines.c.item_id, cart_lines.c.quantity, items.c.seller_id, items.c.name,
                              items.c.price_cents, items.c.quantity.label("available"))
                       .join_from(cart_lines, items, items.c.item_id == cart_lines.c.item_id)
                       .where(cart_lines.c.session_id == bindparam("session_id"))
                       .order_by(cart_lines.c.item_id).with_for_update())
_ADD_SOLD = (update(users).where(users.c.user_id == bindparam("seller_id"))
                     .values(items_sold=users.c.items_sold + bindparam("n")))
_NEW_ORDER = (insert(orders).values(buyer_id=bindparam("buyer_id"), total_cents=0,
                                            idempotency_key=bindparam("key"), created_ms=bindparam("now")))
_NEW_LINES = insert(order_lines)
_TAKE_STOCK = (update(items)
                       .where(items.c.item_id == bindparam("item_id"), items.c.quantity >= bindparam("n"))
                       .values(quantity=items.c.quantity - bindparam("n"),
                               sold=items.c.sold + bindparam("n")))
_SET_TOTAL = (update(orders).where(orders.c.order_id == bindparam("order_id"))
                      .values(total_cents=bindparam("total")))
_EMPTY_CART = (delete(cart_lines).where(cart_lines.c.session_id == bindparam("session_id")))
_EMPTY_SAVED = (delete(saved_cart_lines).where(saved_cart_lines.c.buyer_id == bindparam("buyer_id")))
_ORDER_BY_KEY = (select(orders.c.order_id, orders.c.total_cents)
                         .where(orders.c.buyer_id == bindparam("buyer_id"),
                                orders.c.idempotency_key == bindparam("key")))
_ORDER_LINES = (select(order_lines.c.item_id, order_lines.c.name, order_lines.c.quantity,
                               order_lines.c.price_cents.label("cents"))
                        .where(order_lines.c.order_id == bindparam("order_id"))
                        .order_by(order_lines.c.item_id))


def make_purchase(tx: UnitOfWork, session: Session, card_name: str, card_number: str,
                  card_expiry: str, idempotency_key: str | None, *, charge: Charge) -> dict[str, Any]:
    """Buy the whole cart or nothing."""
    # The session's row first: a cart change of the session on another connection waits for
    # the purchase, and is not emptied with the bought lines without being bought.
    session.lock()
    if idempotency_key is not None:
        done = _order_by_key(tx, session.user_id, idempotency_key)
        if done is not None:
            return done
    # The order row comes first: with a key, it is the lock that makes a second request
    # with the same key wait for this one, then replay it (read the cart only after it).
    order_id, cart = _order_and_cart(tx, session, idempotency_key)
    if not cart:
        raise ConflictError("your cart is empty")
    _take_stock(tx, cart)
    # What is left is written with the COMMIT: nothing in it is read back.
    lines = _write_lines(tx, session.user_id, order_id, cart)
    total = sum(line["cents"] * line["quantity"] for line in lines)
    tx.execute(_SET_TOTAL, {"order_id": order_id, "total": total})
    tx.call_outside(charge, total, card_name, card_number, card_expiry, idempotency_key)
    tx.execute(_EMPTY_CART, {"session_id": session.session_id})
    tx.execute(_EMPTY_SAVED, {"buyer_id": session.user_id})
    return _receipt(order_id, total, lines)


def _order_and_cart(tx: UnitOfWork, session: Session, key: str | None) -> tuple[int, Sequence[Any]]:
    """A new order's id, and the cart it buys, locked: one query, the order first."""
    order = {"buyer_id": session.user_id, "key": key, "now": now_ms()}
    try:
        created = tx.execute(_NEW_ORDER, order)
        cart = tx.execute(_CART_LINES, {"session_id": session.session_id}).all()
    except IntegrityError:
        raise RetryTransaction from None  # the same key has just committed: replay it
    return int(created.lastrowid), cart


def _take_stock(tx: UnitOfWork, cart: Sequence[Any]) -> None:
    """Take the cart's units, every line in one query; the item rows are locked, so `available`
    is exact, and each conditional update's row count is checked all the same."""
    for line in cart:
        if line.quantity > line.available:
            raise _short_of(line)
    taken = [tx.execute(_TAKE_STOCK, {"item_id": ln.item_id, "n": ln.quantity}) for ln in cart]
    for line, result in zip(cart, taken, strict=True):
        if result.rowcount != 1:
            raise _short_of(line)


def _short_of(line: Any) -> ConflictError:
    return ConflictError(f"item {line.item_id}: only {line.available} left")


def _write_lines(tx: UnitOfWork, buyer_id: int, order_id: int,
                 cart: Sequence[Any]) -> list[dict[str, Any]]:
    """The order's lines, each seller's units sold, and the search index of what sold out."""
    tx.execute(_NEW_LINES, [
        {"order_id": order_id, "item_id": ln.item_id, "buyer_id": buyer_id, "seller_id": ln.seller_id,
         "name": ln.name, "quantity": ln.quantity, "price_cents": ln.price_cents} for ln in cart])
    sold: Counter[int] = Counter()
    for ln in cart:
        sold[ln.seller_id] += ln.quantity
    for seller_id in sorted(sold):
        tx.execute(_ADD_SOLD, {"seller_id": seller_id, "n": sold[seller_id]})
    unlist(tx, [ln.item_id for ln in cart if ln.available == ln.quantity])  # the last units went
    return [{"item_id": ln.item_id, "name": ln.name, "quantity": ln.quantity, "cents": ln.price_cents}
            for ln in cart]


def _receipt(order_id: int, total: int, lines: list[dict[str, Any]]) -> dict[str, Any]:
    return {"order_id": order_id, "total": format_money(total),
            "lines": [{"item_id": ln["item_id"], "name": ln["name"], "quantity": ln["quantity"],
                       "price": format_money(ln["cents"])} for ln in lines]}


def _order_by_key(tx: UnitOfWork, buyer_id: int, key: str) -> dict[str, Any] | None:
    order = tx.execute(_ORDER_BY_KEY, {"buyer_id": buyer_id, "key": key}).first()
    if order is None:
        return None
    rows = tx.execute(_ORDER_LINES, {"order_id": order.order_id}).all()
    return _receipt(order.order_id, order.total_cents, [r._asdict() for r in rows])


def provide_feedback(tx: UnitOfWork, session: Session, item_id: int, vote: str) -> dict[str, Any]:
    """One vote per item bought, counted for the item and its seller."""
    # The item's row locked first, as a purchase locks it: else the vote's insert holds it
    # shared (its foreign key) and the count's update then waits behind a purchase waiting
    # for it, a deadlock, retried and under a race retried out (BUSY).
    item = item_for_session(tx, session, item_id, lock=True)
    who = {"buyer_id": session.user_id, "item_id": item_id, "vote": vote, "now": now_ms(),
           "seller_id": item.seller_id}
    try:
        voted = tx.execute(_VOTE_IF_BOUGHT, who).rowcount
    except IntegrityError:
        raise ConflictError(f"you have already rated item {item_id}") from None
    if voted != 1:
        raise ForbiddenError(f"you have not bought item {item_id}")
    for statement in _COUNT_VOTE[vote]:
        tx.execute(statement, who)  # with the COMMIT
    return {}


def _count_vote(column: str) -> tuple[Update, Update]:
    """+1 on the item's and on its seller's thumbs_up or thumbs_down."""
    return ((update(items).where(items.c.item_id == bindparam("item_id"))
                     .values({column: items.c[column] + 1})),
            (update(users).where(users.c.user_id == bindparam("seller_id"))
                     .values({column: users.c[column] + 1})))


# The vote, if the buyer bought the item (no row inserted otherwise): the check and the
# INSERT in one statement.
_VOTE_OF_BUYER = (select(order_lines.c.buyer_id, order_lines.c.item_id, bindparam("vote", type_=String),
                         bindparam("now", type_=BigInteger))
                  .where(order_lines.c.buyer_id == bindparam("buyer_id"),
                         order_lines.c.item_id == bindparam("item_id"))
                  .limit(1))
_VOTE_IF_BOUGHT = (insert(feedback).from_select(["buyer_id", "item_id", "vote", "created_ms"],
                                                        _VOTE_OF_BUYER))
_COUNT_VOTE = {"up": _count_vote("thumbs_up"), "down": _count_vote("thumbs_down")}


_FIRST_PAGE = (2**62, 0)  # a cursor before every (order_id, item_id)
_HISTORY = (
    select(order_lines.c.order_id, order_lines.c.item_id, order_lines.c.name, order_lines.c.quantity,
           order_lines.c.price_cents, orders.c.created_ms, feedback.c.vote)
    .join_from(order_lines, orders, orders.c.order_id == order_lines.c.order_id)
    .outerjoin(feedback, and_(feedback.c.buyer_id == order_lines.c.buyer_id,
                              feedback.c.item_id == order_lines.c.item_id))
    .where(order_lines.c.buyer_id == bindparam("buyer_id"),
           (order_lines.c.order_id < bindparam("last_order"))
           | ((order_lines.c.order_id == bindparam("last_order"))
              & (order_lines.c.item_id > bindparam("last_item"))))
    .order_by(order_lines.c.order_id.desc(), order_lines.c.item_id)
    .limit(bindparam("limit", type_=Integer)))


def get_purchase_history(tx: UnitOfWork, session: Session, limit: int,
                         cursor: str | None) -> dict[str, Any]:
    """The buyer's purchased lines, newest order first."""
    last_order, last_item = decode_cursor(cursor, 2) if cursor else _FIRST_PAGE
    rows = tx.execute(_HISTORY, {"buyer_id": session.user_id, "last_order": last_order,
                             "last_item": last_item, "limit": limit + 1}).all()
    rows, next_cursor = split_page(rows, limit, lambda r: encode_cursor(r.order_id, r.item_id))
    return {"purchases": [_history_line(r) for r in rows], "next_cursor": next_cursor}


def _history_line(row: Any) -> dict[str, Any]:
    return {"order_id": row.order_id, "item_id": row.item_id, "name": row.name,
            "quantity": row.quantity, "price": format_money(row.price_cents),
            "purchased_at": format_time(row.created_ms / 1000), "feedback": row.vote}
