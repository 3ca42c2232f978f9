"""A purchase's transactions, each conditional on the order's status, so that the purchase's
own thread and any settler racing it can never both act on one order.

    open_order:    the stock taken, the order and its lines written, status pending
    mark_paid:     pending -> capturing, the bought lines out of the carts
    start_undo:    pending -> voiding, the stock and the sellers' counts given back
    finish:        capturing -> paid (captured), voiding -> void (voided)

No transaction waits on the payment processor: the processor is called between them
(buyer_server.checkout). Stock is taken with conditional updates in item_id order, so
concurrent purchases lock in the same order.
"""
from __future__ import annotations

import json
import secrets
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Integer, bindparam, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from wire.errors import BusyError, ConflictError
from wire.values import format_money

from .accounts import Session
from .catalog import unlist
from .database import RetryTransaction, inserted_id, now_ms
from .schema import (
    cart_lines,
    item_keyword_pairs,
    item_keywords,
    items,
    keyword_pair_rows,
    keyword_rows,
    order_lines,
    orders,
    saved_cart_lines,
    users,
)

PENDING, CAPTURING, PAID, VOIDING, VOID = "pending", "capturing", "paid", "voiding", "void"
COMPLETED = (CAPTURING, PAID)  # in the history, replayed for their key


def is_completed(status: Any) -> Any:
    """A condition on an orders.status column: the purchase completed (no IN list: the
    prepared statements of db.prepared take no expanding parameters)."""
    return (status == CAPTURING) | (status == PAID)


@dataclass(frozen=True)
class OpenOrder:
    """A pending order: what the later steps need to know of it."""

    order_id: int
    payment_key: str
    buyer_id: int
    session_id: int
    total_cents: int
    receipt: dict[str, Any] = field(compare=False)


@dataclass(frozen=True)
class DueOrder:
    """An order a settler has to finish: its status says how."""

    order_id: int
    payment_key: str
    status: str


class OrderInProgressError(BusyError):
    """The order with this idempotency key is not settled yet: its purchase is running, or
    was cut off (`order` says where it is, `age_ms` since when)."""

    def __init__(self, order: DueOrder, age_ms: int) -> None:
        super().__init__("a purchase with this idempotency key is in progress; ask again shortly")
        self.order, self.age_ms = order, age_ms


def open_order(tx: Connection, session: Session, idempotency_key: str | None) -> OpenOrder | dict[str, Any]:
    """Step one: the order, pending, with the cart's stock taken; or the receipt of the
    completed order that has this idempotency key."""
    # The session's row first: a cart change of the session on another connection waits.
    live = session.lock()
    if idempotency_key is not None:
        done = replay(tx, live.user_id, idempotency_key)
        if done is not None:
            return done
    payment_key = secrets.token_urlsafe(32)  # made here, per order: never another order's
    try:  # the order row first: a second request with the same key waits on it, then replays
        order_id = inserted_id(tx.execute(insert(orders).values(
            buyer_id=live.user_id, total_cents=0, idempotency_key=idempotency_key, created_ms=now_ms(),
            status=PENDING, payment_key=payment_key)))
    except IntegrityError:
        raise RetryTransaction from None  # the same key has just committed: replay it
    cart = _locked_cart(tx, live.session_id)
    if not cart:
        raise ConflictError("your cart is empty")
    _take_stock(tx, cart)
    lines = _write_lines(tx, live.user_id, order_id, cart)
    total = sum(line["cents"] * line["quantity"] for line in lines)
    tx.execute(update(orders).where(orders.c.order_id == order_id).values(total_cents=total))
    return OpenOrder(order_id, payment_key, live.user_id, live.session_id, total,
                     _receipt(order_id, total, lines))


def replay(tx: Connection, buyer_id: int, key: str) -> dict[str, Any] | None:
    """The receipt of the buyer's paid order with this key; None if there is none;
    OrderInProgressError while it is not settled."""
    order = tx.execute(select(orders.c.order_id, orders.c.total_cents, orders.c.status, orders.c.payment_key,
                              orders.c.created_ms)
                       .where(orders.c.buyer_id == buyer_id, orders.c.idempotency_key == key)).first()
    if order is None:
        return None
    if order.status != PAID:  # pending, or its capture not confirmed yet
        raise OrderInProgressError(DueOrder(order.order_id, order.payment_key, order.status),
                                   now_ms() - order.created_ms)
    rows = tx.execute(select(order_lines.c.item_id, order_lines.c.name, order_lines.c.quantity,
                             order_lines.c.price_cents.label("cents"))
                      .where(order_lines.c.order_id == order.order_id).order_by(order_lines.c.item_id)).all()
    return _receipt(order.order_id, order.total_cents, [r._asdict() for r in rows])


def mark_paid(tx: Connection, order: OpenOrder) -> bool:
    """Step three, once authorised: pending -> capturing, and the bought lines leave the
    session's cart and the saved cart. False if a settler undid the order first."""
    if not _move(tx, order.order_id, PENDING, CAPTURING):
        return False
    bought = [line["item_id"] for line in order.receipt["lines"]]
    tx.execute(delete(cart_lines).where(cart_lines.c.session_id == order.session_id,
                                        cart_lines.c.item_id.in_(bought)))
    tx.execute(delete(saved_cart_lines).where(saved_cart_lines.c.buyer_id == order.buyer_id))
    return True


def start_undo(tx: Connection, order_id: int) -> bool:
    """pending -> voiding: the stock, the sellers' counts and the search index as they were,
    the lines gone, the idempotency key free again. False if the order was no longer pending."""
    if not _move(tx, order_id, PENDING, VOIDING, idempotency_key=None):
        return False
    lines = tx.execute(select(order_lines.c.item_id, order_lines.c.seller_id, order_lines.c.quantity)
                       .where(order_lines.c.order_id == order_id).order_by(order_lines.c.item_id)).all()
    _give_stock_back(tx, lines)
    for seller_id, units in sorted(_units_by_seller(lines).items()):
        tx.execute(update(users).where(users.c.user_id == seller_id)
                   .values(items_sold=users.c.items_sold - units))
    tx.execute(delete(order_lines).where(order_lines.c.order_id == order_id))
    return True


def finish(tx: Connection, order_id: int, status: str) -> bool:
    """capturing -> paid, or voiding -> void: the processor has done its part."""
    before = {PAID: CAPTURING, VOID: VOIDING}[status]
    return _move(tx, order_id, before, status)


def status_of(tx: Connection, order_id: int) -> str:
    """The order's status now."""
    return str(tx.execute(select(orders.c.status).where(orders.c.order_id == order_id)).scalar_one())


def due_orders(tx: Connection, pending_before_ms: int, limit: int = 100) -> list[DueOrder]:
    """Orders a settler should finish: capturing or voiding ones (any age), and pending ones
    opened before `pending_before_ms`, whose purchase was cut off."""
    rows = tx.execute(DUE_ORDERS, {"pending_before": pending_before_ms, "limit": limit}).all()
    return [DueOrder(r.order_id, r.payment_key, r.status) for r in rows]


def _move(tx: Connection, order_id: int, before: str, after: str, **also: Any) -> bool:
    moved = tx.execute(update(orders).where(orders.c.order_id == order_id, orders.c.status == before)
                       .values(status=after, **also))
    return moved.rowcount == 1


# The cart with its items' sellers, names, prices and stock, locked in item order (as the
# stock updates take them) so that what the order records is exact.
CART_LINES = (select(cart_lines.c.item_id, cart_lines.c.quantity, items.c.seller_id, items.c.name,
                     items.c.price_cents, items.c.quantity.label("available"))
              .join_from(cart_lines, items, items.c.item_id == cart_lines.c.item_id)
              .where(cart_lines.c.session_id == bindparam("session_id"))
              .order_by(cart_lines.c.item_id).with_for_update())
# What the settlers look for, every few seconds: by the index on (status, created_ms).
DUE_ORDERS = (select(orders.c.order_id, orders.c.payment_key, orders.c.status)
              .where(orders.c.status.in_((CAPTURING, VOIDING))
                     | ((orders.c.status == PENDING) & (orders.c.created_ms < bindparam("pending_before"))))
              .order_by(orders.c.order_id).limit(bindparam("limit", type_=Integer)))


def _locked_cart(tx: Connection, session_id: int) -> list[Any]:
    return list(tx.execute(CART_LINES, {"session_id": session_id}).all())


def _take_stock(tx: Connection, cart: Sequence[Any]) -> None:
    """Take the cart's units; the item rows are locked, so `available` is exact, and each
    conditional update's row count is checked all the same."""
    for line in cart:
        if line.quantity > line.available:
            raise _short_of(line)
    for line in cart:
        n = line.quantity
        taken = tx.execute(update(items).where(items.c.item_id == line.item_id, items.c.quantity >= n)
                           .values(quantity=items.c.quantity - n, sold=items.c.sold + n))
        if taken.rowcount != 1:
            raise _short_of(line)


def _short_of(line: Any) -> ConflictError:
    return ConflictError(f"item {line.item_id}: only {line.available} left")


def _write_lines(tx: Connection, buyer_id: int, order_id: int, cart: Sequence[Any]) -> list[dict[str, Any]]:
    """The order's lines, each seller's units sold, and the search index of what sold out."""
    tx.execute(insert(order_lines), [
        {"order_id": order_id, "item_id": ln.item_id, "buyer_id": buyer_id, "seller_id": ln.seller_id,
         "name": ln.name, "quantity": ln.quantity, "price_cents": ln.price_cents} for ln in cart])
    for seller_id, units in sorted(_units_by_seller(cart).items()):
        tx.execute(update(users).where(users.c.user_id == seller_id)
                   .values(items_sold=users.c.items_sold + units))
    unlist(tx, [ln.item_id for ln in cart if ln.available == ln.quantity])  # the last units went
    return [{"item_id": ln.item_id, "name": ln.name, "quantity": ln.quantity, "cents": ln.price_cents}
            for ln in cart]


def _units_by_seller(lines: Sequence[Any]) -> Counter[int]:
    sold: Counter[int] = Counter()
    for line in lines:
        sold[line.seller_id] += line.quantity
    return sold


def _give_stock_back(tx: Connection, lines: Sequence[Any]) -> None:
    """The lines' units on sale again (in item order, as purchases lock them); an item that
    had sold out goes back into the search indexes."""
    ids = [line.item_id for line in lines]
    found = {row.item_id: row for row in tx.execute(
        select(items.c.item_id, items.c.quantity, items.c.category, items.c.keywords)
        .where(items.c.item_id.in_(ids)).order_by(items.c.item_id).with_for_update())}
    for line in lines:
        tx.execute(update(items).where(items.c.item_id == line.item_id)
                   .values(quantity=items.c.quantity + line.quantity, sold=items.c.sold - line.quantity))
        item = found[line.item_id]
        if item.quantity == 0:
            keywords = json.loads(item.keywords)
            if keywords:
                tx.execute(insert(item_keywords), keyword_rows(item.item_id, item.category, keywords))
            pairs = keyword_pair_rows(item.item_id, keywords)
            if pairs:
                tx.execute(insert(item_keyword_pairs), pairs)


def _receipt(order_id: int, total: int, lines: list[dict[str, Any]]) -> dict[str, Any]:
    return {"order_id": order_id, "total": format_money(total),
            "lines": [{"item_id": ln["item_id"], "name": ln["name"], "quantity": ln["quantity"],
                       "price": format_money(ln["cents"])} for ln in lines]}
