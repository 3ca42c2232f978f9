"""A consistency audit of the whole database: every counter against the rows it counts,
every acknowledged purchase present, the payment ledger agreeing with the orders. Run it with
no load (MySQL reads statement by statement, no snapshot). No violations: the books balance.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, and_, case, distinct, exists, func, inspect, select

from db.database import Database, now_ms
from db.ledger import CAPTURED, Payment, payments
from db.purchases import COMPLETED, PAID, PENDING, VOID, VOIDING, is_completed
from db.schema import (
    feedback,
    item_keyword_pairs,
    item_keywords,
    item_words,
    items,
    keyword_pair_rows,
    keyword_rows,
    order_lines,
    orders,
    users,
    word_rows,
)

from .admin import count

_CHUNK = 500  # ids per IN (...) list
SETTLE_WITHIN_MS = 60_000  # how long a purchase may stay unsettled (the settler's longest wait, and more)


@dataclass(frozen=True)
class AckedOrder:
    """A purchase a buyer was told succeeded: its order id, buyer and item_id -> quantity."""

    order_id: int
    buyer_id: int
    lines: dict[int, int] = field(default_factory=dict)


def audit(database: Database, acknowledged: Iterable[AckedOrder] = (),
          ledger: Iterable[Payment] | None = None) -> list[str]:
    """Every violation of the marketplace's invariants; empty when consistent. `ledger`: the
    payment processor's entries (default: the payments table of this database, if any)."""
    acked = list(acknowledged)  # read again if the call is retried
    entries = ledger_of(database) if ledger is None else list(ledger)
    return database.run(lambda tx: violations(tx, acked, entries), write=False)


def violations(tx: Connection, acknowledged: Iterable[AckedOrder] = (),
               ledger: Iterable[Payment] | None = None) -> list[str]:
    """Every violation the rules find through `tx` (with no load running: see the module)."""
    entries = list(ledger) if ledger is not None else _ledger_here(tx)
    return [*_item_rules(tx), *_index_rules(tx), *_seller_rules(tx),
            *_order_line_rules(tx), *_line_owner_rules(tx), *_feedback_rules(tx),
            *_acknowledged_rules(tx, list(acknowledged)), *_payment_rules(tx, entries)]


def _ledger_here(tx: Connection) -> list[Payment]:
    """The simulated processor's ledger when it lives in this database; else none."""
    if not inspect(tx).has_table(payments.name):
        return []
    return [Payment(**row._asdict()) for row in tx.execute(select(payments))]


def _payment_rules(tx: Connection, ledger: list[Payment]) -> Iterator[str]:
    """Every capture has one completed order of its buyer and total, every completed order
    one capture, nothing captured twice, nothing unsettled past the settling time."""
    by_key = {entry.payment_key: entry for entry in ledger}
    late = now_ms() - SETTLE_WITHIN_MS
    keyed = tx.execute(select(orders.c.order_id, orders.c.buyer_id, orders.c.total_cents, orders.c.status,
                              orders.c.payment_key, orders.c.created_ms)
                       .where(orders.c.payment_key.is_not(None)).order_by(orders.c.order_id)).all()
    for order in keyed:
        entry = by_key.pop(order.payment_key, None)
        yield from _order_against_ledger(order, entry, in_progress=order.created_ms >= late)
        if order.status not in (*COMPLETED, VOID) and order.created_ms < late:
            yield f"order {order.order_id}: still {order.status} after the settling time"
    for entry in by_key.values():  # keys of no order: only a void may be (a key voided unused)
        if entry.state == CAPTURED:
            yield f"payment {entry.payment_key}: captured {entry.amount_cents} cents for no order"
        elif entry.state != "voided" and entry.created_ms < late:
            yield f"payment {entry.payment_key}: {entry.state} for no order"


def _order_against_ledger(order: Any, entry: Payment | None, in_progress: bool) -> Iterator[str]:
    """A paid order has its capture, of its buyer and total; no other has one, but a pending
    order whose purchase is `in_progress`."""
    name = f"order {order.order_id} ({order.status})"
    if entry is not None and entry.captures > 1:
        yield f"{name}: captured {entry.captures} times"
    captured = entry is not None and entry.state == CAPTURED
    if order.status == PAID and not captured:
        yield f"{name}: paid, but its payment is {entry.state if entry else 'missing'}"
    elif captured and order.status not in COMPLETED and not (order.status == PENDING and in_progress):
        yield f"{name}: its payment was captured, but the purchase was not completed"
    elif captured and entry and (entry.buyer_id, entry.amount_cents) != (order.buyer_id, order.total_cents):
        yield (f"{name}: buyer {order.buyer_id} owes {order.total_cents} cents, the capture says "
               f"buyer {entry.buyer_id}, {entry.amount_cents} cents")


def _item_rules(tx: Connection) -> Iterator[str]:
    sold = _by_key(tx, select(order_lines.c.item_id, func.sum(order_lines.c.quantity),
                              func.count(distinct(order_lines.c.buyer_id)))
                   .group_by(order_lines.c.item_id))
    thumbs = (func.sum(case((feedback.c.vote == vote, 1), else_=0)) for vote in ("up", "down"))
    votes = _by_key(tx, select(feedback.c.item_id, *thumbs).group_by(feedback.c.item_id))
    for item in tx.execute(select(items).order_by(items.c.item_id)):
        name = f"item {item.item_id}"
        yield from _negatives(name, item, ("quantity", "listed", "sold", "removed",
                                           "thumbs_up", "thumbs_down", "price_cents"))
        if item.listed != item.quantity + item.sold + item.removed:
            yield (f"{name}: listed {item.listed} != on sale {item.quantity} + sold {item.sold}"
                   f" + removed {item.removed}")
        units, buyers = sold.get(item.item_id, (0, 0))
        if item.sold != units:
            yield f"{name}: sold {item.sold} != {units} units in order lines"
        up, down = votes.get(item.item_id, (0, 0))
        yield from _thumbs(name, item, (up, down), "feedback rows")
        if up + down > buyers:
            yield f"{name}: {up + down} votes from only {buyers} distinct buyers"


def _index_rules(tx: Connection) -> Iterator[str]:
    """The search indexes hold exactly the rows db.schema makes of each item on sale, none of
    an item off sale: item_keywords and item_keyword_pairs of its keywords, item_words of its
    name and keywords."""
    for index, source, tables, rows_of in (
            ("search index", "keywords", (item_keywords, item_keyword_pairs), lambda item, words: [
                *keyword_rows(item.item_id, item.category, words), *keyword_pair_rows(item.item_id, words)]),
            ("word index", "name and keywords", (item_words,),
             lambda item, words: word_rows(item.item_id, item.category, item.name, words))):
        indexed: dict[int, set[tuple[Any, ...]]] = {}
        for table in tables:
            for row in tx.execute(select(table)):
                indexed.setdefault(row.item_id, set()).add(_values(row._asdict()))
        for item in tx.execute(select(items.c.item_id, items.c.quantity, items.c.name, items.c.keywords,
                                      items.c.category)):
            made = rows_of(item, json.loads(item.keywords)) if item.quantity > 0 else []
            if indexed.pop(item.item_id, set()) != {_values(row) for row in made}:
                yield (f"item {item.item_id}: {index} rows differ from its {source}"
                       f" (on sale: {item.quantity})")
        for item_id in indexed:
            yield f"{index} rows for item {item_id}, which does not exist"


def _values(row: dict[str, Any]) -> tuple[Any, ...]:
    """A row's values in the order of its columns' names (tuples: an index may have millions)."""
    return tuple(value for _, value in sorted(row.items()))


def _seller_rules(tx: Connection) -> Iterator[str]:
    sold = _by_key(tx, select(order_lines.c.seller_id, func.sum(order_lines.c.quantity))
                   .group_by(order_lines.c.seller_id))
    thumbs = _by_key(tx, select(items.c.seller_id, func.sum(items.c.thumbs_up),
                                func.sum(items.c.thumbs_down)).group_by(items.c.seller_id))
    for user in tx.execute(select(users).order_by(users.c.user_id)):
        name = f"{user.role} {user.user_id} ({user.username})"
        yield from _negatives(name, user, ("items_sold", "thumbs_up", "thumbs_down"))
        units = sold.get(user.user_id, (0,))[0]
        if user.items_sold != units:
            yield f"{name}: items_sold {user.items_sold} != {units} units in its order lines"
        yield from _thumbs(name, user, thumbs.get(user.user_id, (0, 0)), "its items'")


def _order_line_rules(tx: Connection) -> Iterator[str]:
    """An order's total is its lines' (each of positive quantity and price); an undone order's
    lines went with the stock given back."""
    totals = _by_key(tx, select(order_lines.c.order_id,
                                func.sum(order_lines.c.quantity * order_lines.c.price_cents),
                                func.min(order_lines.c.quantity), func.min(order_lines.c.price_cents))
                     .group_by(order_lines.c.order_id))
    for order in tx.execute(select(orders.c.order_id, orders.c.total_cents, orders.c.status)
                            .order_by(orders.c.order_id)):
        name, lines = f"order {order.order_id}", totals.pop(order.order_id, None)
        if order.status in (VOIDING, VOID):
            if lines:
                yield f"{name}: undone, but it still has lines"
        elif lines is None:
            yield f"{name}: has no lines"
        else:
            if order.total_cents != lines[0]:
                yield f"{name}: total {order.total_cents} cents != {lines[0]} from its lines"
            if min(lines[1:]) <= 0:
                yield f"{name}: a line with quantity or price not positive"
    for order_id in sorted(totals):
        yield f"order lines of order {order_id}: no such order"


def _line_owner_rules(tx: Connection) -> Iterator[str]:
    """A line's buyer is its order's, its seller its item's: history and the right to vote
    are read from the lines."""
    mismatched = (select(order_lines.c.order_id, order_lines.c.item_id, order_lines.c.buyer_id,
                         order_lines.c.seller_id, orders.c.buyer_id.label("order_buyer"),
                         items.c.seller_id.label("item_seller"))
                  .join(orders, orders.c.order_id == order_lines.c.order_id)
                  .join(items, items.c.item_id == order_lines.c.item_id)
                  .where((order_lines.c.buyer_id != orders.c.buyer_id)
                         | (order_lines.c.seller_id != items.c.seller_id))
                  .order_by(order_lines.c.order_id, order_lines.c.item_id))
    for line in tx.execute(mismatched):
        yield (f"order {line.order_id}, item {line.item_id}: the line says buyer {line.buyer_id} "
               f"and seller {line.seller_id}, its order and item say {line.order_buyer} and "
               f"{line.item_seller}")


def _feedback_rules(tx: Connection) -> Iterator[str]:
    bought = exists().where(and_(order_lines.c.buyer_id == feedback.c.buyer_id,
                                 order_lines.c.item_id == feedback.c.item_id))
    for row in tx.execute(select(feedback.c.buyer_id, feedback.c.item_id).where(~bought)
                          .order_by(feedback.c.buyer_id, feedback.c.item_id)):
        yield f"feedback of buyer {row.buyer_id} on item {row.item_id}: the buyer never bought it"


def _acknowledged_rules(tx: Connection, acked: list[AckedOrder]) -> Iterator[str]:
    """Each purchase a buyer was told succeeded is in the orders, its buyer's, with the lines told."""
    told: dict[int, AckedOrder] = {}
    for order in acked:
        first = told.setdefault(order.order_id, order)
        if first != order:  # the same purchase told twice (an idempotent retry) is no violation
            yield (f"acknowledged order {order.order_id}: told to buyer {first.buyer_id} as {first.lines}"
                   f" and to buyer {order.buyer_id} as {order.lines}")
    ids = list(told)
    buyers: dict[int, int] = {}
    lines: dict[int, dict[int, int]] = {}
    for chunk in (ids[start:start + _CHUNK] for start in range(0, len(ids), _CHUNK)):
        buyers.update(tx.execute(select(orders.c.order_id, orders.c.buyer_id)
                                 .where(orders.c.order_id.in_(chunk))).all())
        for row in tx.execute(select(order_lines.c.order_id, order_lines.c.item_id, order_lines.c.quantity)
                              .where(order_lines.c.order_id.in_(chunk))):
            lines.setdefault(row.order_id, {})[row.item_id] = row.quantity
    for order_id, order in told.items():
        name = f"acknowledged order {order_id}"
        if order_id not in buyers:
            yield f"{name}: missing from the orders table"
        elif buyers[order_id] != order.buyer_id:
            yield f"{name}: belongs to buyer {buyers[order_id]}, not {order.buyer_id}"
        elif lines.get(order_id, {}) != order.lines:
            yield f"{name}: lines {lines.get(order_id, {})} != acknowledged {order.lines}"


def _by_key(tx: Connection, query: Any) -> dict[Any, tuple[int, ...]]:
    """Rows of a grouped query as key -> the other columns, as ints."""
    return {row[0]: tuple(int(value or 0) for value in row[1:]) for row in tx.execute(query)}


def _thumbs(name: str, row: Any, counted: tuple[int, ...], source: str) -> Iterator[str]:
    if (row.thumbs_up, row.thumbs_down) != counted:
        yield (f"{name}: thumbs {row.thumbs_up} up / {row.thumbs_down} down != {source}"
               f" {counted[0]} up / {counted[1]} down")


def _negatives(name: str, row: Any, columns: tuple[str, ...]) -> Iterator[str]:
    for column in columns:
        if getattr(row, column) < 0:
            yield f"{name}: {column} is negative ({getattr(row, column)})"


def ledger_of(database: Database, payments_url: str | None = None) -> list[Payment]:
    """The payment ledger's entries: in the database at `payments_url` (MARKET_PAYMENTS_URL)
    when given, else in `database`; none if that database has no payments table."""
    apart = Database(payments_url, pool_size=1) if payments_url else database
    try:
        with apart.engine.connect() as conn:
            return _ledger_here(conn)
    finally:
        if apart is not database:
            apart.close()


def book_totals(tx: Connection, ledger: list[Payment]) -> dict[str, int]:
    """Rows per table, the units sold, the money the orders took, the ledger's entries and the
    money it captured (in cents)."""
    tables = {"users": users, "items": items, "orders": orders, "order lines": order_lines,
              "feedback": feedback}
    totals = {name: count(tx, table) for name, table in tables.items()}
    totals["units sold"] = count(tx, order_lines, column=order_lines.c.quantity)
    totals["cents taken"] = count(tx, orders, is_completed(orders.c.status), column=orders.c.total_cents)
    totals["payments"] = len(ledger)
    totals["cents captured"] = sum(entry.amount_cents for entry in ledger if entry.state == CAPTURED)
    return totals
