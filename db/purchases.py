"""A purchase's transactions (docs/design.md, "Money"): open_order, then complete or undo, and
a settler's finish. Each is conditional on the order's status, so that the purchase's own thread
and a settler racing it never both act on one order; none waits on the payment processor, which
buyer_server.checkout calls between them.
"""
from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Integer, bindparam, delete, exists, insert, null, select, update
from sqlalchemy.exc import IntegrityError

from wire.errors import BusyError, ConflictError
from wire.values import format_money

from .accounts import Session
from .catalog import relist, unlist
from .database import RetryTransaction, now_ms
from .schema import cart_lines, items, order_lines, orders, saved_cart_lines, users
from .unit_of_work import UnitOfWork

PENDING, CAPTURING, PAID, VOIDING, VOID = "pending", "capturing", "paid", "voiding", "void"
COMPLETED = (CAPTURING, PAID)  # in the history, replayed for their key


def is_completed(status: Any) -> Any:
    """The purchase completed, as a condition on orders.status (an IN list is compiled per call)."""
    return (status == CAPTURING) | (status == PAID)


@dataclass(frozen=True)
class DueOrder:
    """An order a settler has to finish: its status says how."""

    order_id: int
    payment_key: str
    status: str


@dataclass(frozen=True)
class Purchase:
    """What completing an order changes: its status, and the bought lines in its buyer's
    carts (the session's, if known: orders of revision 0006 did not record it)."""

    order_id: int
    buyer_id: int
    session_id: int | None
    item_ids: tuple[int, ...]


@dataclass(frozen=True)
class OpenOrder(Purchase):
    """A pending order: what the later steps need to know of it."""

    payment_key: str
    total_cents: int
    receipt: dict[str, Any] = field(compare=False)


class OrderInProgressError(BusyError):
    """The order with this idempotency key is not settled yet: its purchase is running, or
    was cut off (`order` says where it is, `age_ms` since when)."""

    def __init__(self, row: Any) -> None:
        super().__init__("a purchase with this idempotency key is in progress; ask again shortly")
        self.order = DueOrder(row.order_id, row.payment_key, row.status)
        self.age_ms = now_ms() - row.created_ms


_NEW_ORDER = insert(orders).values(
    buyer_id=bindparam("buyer_id"), total_cents=0, idempotency_key=bindparam("key"),
    created_ms=bindparam("now"), status=PENDING, payment_key=bindparam("payment_key"),
    session_id=bindparam("session_id"))
# Another order of this session still pending: a purchase cut off after its capture, whose
# bought lines are still in the cart until it is settled (the pending are few: by ix_orders_status).
_SESSION_PENDING = ((orders.c.status == PENDING) & (orders.c.session_id == bindparam("session_id"))
                    & (orders.c.payment_key != bindparam("payment_key")))
# The cart with its items' sellers, names, prices and stock, locked in item order (as the
# stock updates take them) so that what the order records is exact; each line says whether
# the session has another order pending (the orders are read, not locked).
CART_LINES = (select(cart_lines.c.item_id, cart_lines.c.quantity, items.c.seller_id, items.c.name,
                     items.c.price_cents.label("cents"), items.c.quantity.label("available"),
                     exists().where(_SESSION_PENDING).label("cut_off"))
              .join_from(cart_lines, items, items.c.item_id == cart_lines.c.item_id)
              .where(cart_lines.c.session_id == bindparam("session_id"))
              .order_by(cart_lines.c.item_id).with_for_update())
_SELL = (update(items)  # n < 0: given back
         .where(items.c.item_id == bindparam("item_id"), items.c.quantity >= bindparam("n"))
         .values(quantity=items.c.quantity - bindparam("n"), sold=items.c.sold + bindparam("n")))
_ITEMS_SOLD = (update(users).where(users.c.user_id == bindparam("seller_id"))  # n < 0: unsold
               .values(items_sold=users.c.items_sold + bindparam("n")))
_DROP_LINES = delete(order_lines).where(order_lines.c.order_id == bindparam("order_id"))
_SET_TOTAL = (update(orders).where(orders.c.order_id == bindparam("order_id"))
              .values(total_cents=bindparam("total")))
_ORDER = select(orders.c.order_id, orders.c.total_cents, orders.c.status, orders.c.payment_key,
                orders.c.created_ms, orders.c.buyer_id, orders.c.session_id)
_ORDER_BY_KEY = _ORDER.where(orders.c.buyer_id == bindparam("buyer_id"),
                             orders.c.idempotency_key == bindparam("key"))
_LINES_OF_ORDER = (select(order_lines.c.item_id, order_lines.c.name, order_lines.c.quantity,
                          order_lines.c.price_cents.label("cents"), order_lines.c.seller_id)
                   .where(order_lines.c.order_id == bindparam("order_id")).order_by(order_lines.c.item_id))
_IN_STATUS = (orders.c.order_id == bindparam("order_id")) & (orders.c.status == bindparam("before"))
_MOVE = update(orders).where(_IN_STATUS).values(status=bindparam("after"))
_MOVE_FREEING_KEY = update(orders).where(_IN_STATUS).values(status=bindparam("after"), idempotency_key=null())
# Completing moves the order to an interim status that no other transaction ever sees (it is
# moved on to paid before the COMMIT), and empties the carts only if the order is in it: only
# the transaction that moved the order empties them, and nothing needs reading before the
# COMMIT, so the whole step is held and sent with it, one round trip.
_COMPLETING = "completes"
_MOVED_HERE = exists().where(orders.c.order_id == bindparam("order_id"), orders.c.status == _COMPLETING)
_EMPTY_BOUGHT_LINE = delete(cart_lines).where(cart_lines.c.session_id == bindparam("session_id"),
                                              cart_lines.c.item_id == bindparam("item_id"), _MOVED_HERE)
_EMPTY_SAVED = delete(saved_cart_lines).where(saved_cart_lines.c.buyer_id == bindparam("buyer_id"),
                                              _MOVED_HERE)
_PENDING_OF_SESSION = _ORDER.where(_SESSION_PENDING).limit(1)
_ORDER_BY_ID = _ORDER.where(orders.c.order_id == bindparam("order_id"))
# What the settlers look for, every few seconds: by the index on (status, created_ms).
DUE_ORDERS = (select(orders.c.order_id, orders.c.payment_key, orders.c.status)
              .where((orders.c.status == CAPTURING) | (orders.c.status == VOIDING)
                     | ((orders.c.status == PENDING) & (orders.c.created_ms < bindparam("pending_before"))))
              .order_by(orders.c.order_id).limit(bindparam("limit", type_=Integer)))
_LOCK_ITEM = (select(items.c.item_id, items.c.quantity, items.c.category, items.c.name, items.c.keywords)
              .where(items.c.item_id == bindparam("item_id")).with_for_update())


def open_order(tx: UnitOfWork, session: Session, idempotency_key: str | None,
               expected_total: int | None = None) -> OpenOrder | dict[str, Any]:
    """Step one: the order, pending, with the cart's stock taken, or the receipt of the completed
    order of this idempotency key; CONFLICT unless the cart's total equals `expected_total`."""
    # The session's row first: a cart change of the session on another connection waits.
    live = session.lock()
    payment_key = secrets.token_urlsafe(32)  # made here, per order: never another order's
    # The order row first: a second request with the same key waits on it, then replays. The
    # INSERT is held and travels with the cart's read (one round trip); a key that has an
    # order already fails it (then the transaction runs again, the INSERT sent alone).
    ids = {"buyer_id": live.user_id, "session_id": live.session_id, "payment_key": payment_key}
    try:
        created = tx.execute(_NEW_ORDER, {**ids, "key": idempotency_key, "now": now_ms()})
        cart = tx.execute(CART_LINES, ids).all()
        order_id = int(created.lastrowid)
    except IntegrityError:  # the key's order, committed (if it was in progress, after it was)
        done = _replay(tx, live.user_id, idempotency_key) if idempotency_key is not None else None
        if done is None:
            raise RetryTransaction from None  # undone meanwhile, its key free again: buy
        return done
    if not cart:
        raise ConflictError("your cart is empty")
    if cart[0].cut_off:  # its lines may be bought already: settle it before buying them again
        pending = tx.execute(_PENDING_OF_SESSION, ids).first()
        raise OrderInProgressError(pending) if pending is not None else RetryTransaction  # settled meanwhile
    total = cart_total(cart, expected_total)
    _take(tx, live.user_id, order_id, cart)  # held: sent with the COMMIT
    tx.execute(_SET_TOTAL, {"order_id": order_id, "total": total})
    return OpenOrder(order_id, live.user_id, live.session_id, tuple(line.item_id for line in cart),
                     payment_key, total, receipt(order_id, total, cart))


def cart_total(cart: Sequence[Any], expected_total: int | None) -> int:
    """The total of cart lines (quantity, cents, available); CONFLICT unless it is `expected_total`
    (when given), then for a line over its stock."""
    total = sum(line.cents * line.quantity for line in cart)
    if expected_total is not None and total != expected_total:
        raise ConflictError(f"the cart's total is now {format_money(total)}; nothing was bought")
    for line in cart:
        if line.quantity > line.available:
            raise ConflictError(f"item {line.item_id}: only {line.available} left")
    return total


def _replay(tx: UnitOfWork, buyer_id: int, key: str) -> dict[str, Any] | None:
    """The receipt of the buyer's paid order with this key; None if none; OrderInProgressError if unpaid."""
    order = tx.execute(_ORDER_BY_KEY, {"buyer_id": buyer_id, "key": key}).first()
    if order is None:
        return None
    if order.status != PAID:  # pending (or capturing: a purchase of revision 0006)
        raise OrderInProgressError(order)
    rows = tx.execute(_LINES_OF_ORDER, {"order_id": order.order_id}).all()
    return receipt(order.order_id, order.total_cents, rows)


def complete(tx: UnitOfWork, purchase: Purchase) -> None:
    """Once the payment is captured: pending -> paid, and the bought lines leave the session's
    cart and the saved cart; nothing if the order was not pending (completed already)."""
    tx.execute(_MOVE, {"order_id": purchase.order_id, "before": PENDING, "after": _COMPLETING})
    if purchase.session_id is not None:
        for item_id in purchase.item_ids:
            tx.execute(_EMPTY_BOUGHT_LINE, {"session_id": purchase.session_id, "item_id": item_id,
                                            "order_id": purchase.order_id})
    tx.execute(_EMPTY_SAVED, {"buyer_id": purchase.buyer_id, "order_id": purchase.order_id})
    tx.execute(_MOVE, {"order_id": purchase.order_id, "before": _COMPLETING, "after": PAID})


def purchase_in(tx: UnitOfWork, order_id: int) -> Purchase:
    """What completing an order changes, read from the database (for a settler)."""
    order = tx.execute(_ORDER_BY_ID, {"order_id": order_id}).one()
    lines = tx.execute(_LINES_OF_ORDER, {"order_id": order_id}).all()
    return Purchase(order_id, order.buyer_id, order.session_id, tuple(line.item_id for line in lines))


def undo(tx: UnitOfWork, order_id: int, status: str) -> bool:
    """pending -> voiding (to be voided next) or void (voided): the stock, the sellers' counts and the
    search index as they were, the lines gone, the key free again; False if it was not pending."""
    moved = tx.execute(_MOVE_FREEING_KEY, {"order_id": order_id, "before": PENDING, "after": status})
    if moved.rowcount != 1:
        return False
    lines = tx.execute(_LINES_OF_ORDER, {"order_id": order_id}).all()
    _give_stock_back(tx, lines)
    _count_sold(tx, lines, -1)
    tx.execute(_DROP_LINES, {"order_id": order_id})
    return True


def finish(tx: UnitOfWork, order_id: int, status: str) -> None:
    """voiding -> void, or capturing -> paid (an order of revision 0006): the processor did its part."""
    before = {PAID: CAPTURING, VOID: VOIDING}[status]
    tx.execute(_MOVE, {"order_id": order_id, "before": before, "after": status})


def due_orders(tx: UnitOfWork, pending_before_ms: int, limit: int = 100) -> list[DueOrder]:
    """Orders a settler should finish: capturing or voiding ones, and pending ones opened before
    `pending_before_ms` (their purchase was cut off)."""
    rows = tx.execute(DUE_ORDERS, {"pending_before": pending_before_ms, "limit": limit}).all()
    return [DueOrder(r.order_id, r.payment_key, r.status) for r in rows]


def _take(tx: UnitOfWork, buyer_id: int, order_id: int, cart: Sequence[Any]) -> None:
    """Take the cart's units (checked by cart_total), write the order's lines, count each seller's
    units sold and unlist what sold out. The cart's read locked the item rows, so `available` is
    exact and every update applies: all is held for the COMMIT (each keeps `quantity >= n`)."""
    for line in cart:
        tx.execute(_SELL, {"item_id": line.item_id, "n": line.quantity})
    tx.execute(insert(order_lines), [
        {"order_id": order_id, "item_id": ln.item_id, "buyer_id": buyer_id, "seller_id": ln.seller_id,
         "name": ln.name, "quantity": ln.quantity, "price_cents": ln.cents} for ln in cart])
    _count_sold(tx, cart, 1)
    unlist(tx, [ln.item_id for ln in cart if ln.available == ln.quantity])  # the last units went


def _count_sold(tx: UnitOfWork, lines: Sequence[Any], sign: int) -> None:
    """Each seller's units sold, counted up (sign 1) or back down (-1), in seller order."""
    for seller_id, units in sold_by_seller(lines):
        tx.execute(_ITEMS_SOLD, {"seller_id": seller_id, "n": sign * units})


def sold_by_seller(lines: Sequence[Any]) -> list[tuple[int, int]]:
    """(seller_id, units) of lines (seller_id, quantity), in seller order, as the rows are locked."""
    sold: Counter[int] = Counter()
    for line in lines:
        sold[line.seller_id] += line.quantity
    return sorted(sold.items())


def _give_stock_back(tx: UnitOfWork, lines: Sequence[Any]) -> None:
    """The lines' units on sale again (in item order, as purchases lock them); an item that
    had sold out goes back into the search indexes."""
    for line in lines:
        item = tx.execute(_LOCK_ITEM, {"item_id": line.item_id}).one()
        tx.execute(_SELL, {"item_id": line.item_id, "n": -line.quantity})
        if item.quantity == 0:
            relist(tx, [item])


def receipt(order_id: int, total: int, lines: Sequence[Any]) -> dict[str, Any]:
    """The answer to make_purchase, of order or cart lines (item_id, name, quantity, cents)."""
    return {"order_id": order_id, "total": format_money(total),
            "lines": [{"item_id": ln.item_id, "name": ln.name, "quantity": ln.quantity,
                       "price": format_money(ln.cents)} for ln in lines]}
