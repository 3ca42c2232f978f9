"""`market admin purge-test-data`: remove the accounts named LOAD_TEST_PREFIX... and what
they wrote, one transaction per account, each leaving the books balanced for `market audit`
(units bought go back on sale, votes take their thumbs back). A test seller's item a real
buyer bought stays, off sale, and so does its seller, with no session.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, delete, func, inspect, select, update

from db.accounts import end_sessions
from db.catalog import relist
from db.database import Database
from db.ledger import payments
from db.purchases import COMPLETED
from db.schema import (
    cart_lines,
    device_tokens,
    feedback,
    item_keyword_pairs,
    item_keywords,
    item_words,
    items,
    login_failures,
    order_lines,
    orders,
    saved_cart_lines,
    sessions,
    suspensions,
    users,
)

from .admin import Operator, count, plural, record, withdraw

# What the load tools (market-sim, locust) name their accounts and items from.
LOAD_TEST_PREFIX = "loadtest-"


@dataclass
class PurgeCounts:
    """What a purge removed (or would remove), and the test sellers it had to keep."""

    removed: Counter[str] = field(default_factory=Counter)
    kept_sellers: list[str] = field(default_factory=list)

    def sentence(self) -> str:
        counted = [plural(self.removed[what], what) for what in ("test buyer", "order", "test seller", "item")
                   if self.removed[what]]
        said = ", ".join(counted) or "nothing"
        if self.kept_sellers:
            said += (f"; kept {plural(len(self.kept_sellers), 'test seller')}"
                     f" whose items real buyers bought ({', '.join(self.kept_sellers[:5])}"
                     f"{', ...' if len(self.kept_sellers) > 5 else ''})")
        return said


def _test_users(tx: Connection, role: str) -> list[int]:
    return list(tx.execute(select(users.c.user_id).where(
        users.c.role == role, users.c.username.startswith(LOAD_TEST_PREFIX, autoescape=True))
        .order_by(users.c.user_id)).scalars())


def preview(database: Database) -> PurgeCounts:
    """What a purge would remove now, and which test sellers it would keep (nothing is changed)."""
    def counted(tx: Connection) -> PurgeCounts:
        buyers, sellers = _test_users(tx, "buyer"), _test_users(tx, "seller")
        bought_by_others = select(order_lines.c.item_id).where(
            order_lines.c.item_id == items.c.item_id, order_lines.c.buyer_id.not_in(buyers)).exists()
        found = PurgeCounts(kept_sellers=list(tx.execute(
            select(users.c.username).where(users.c.user_id.in_(
                select(items.c.seller_id).where(items.c.seller_id.in_(sellers), bought_by_others)))
            .order_by(users.c.user_id)).scalars()))
        found.removed.update({
            "test buyer": len(buyers), "test seller": len(sellers) - len(found.kept_sellers),
            "order": count(tx, orders, orders.c.buyer_id.in_(buyers)),
            "item": count(tx, items, items.c.seller_id.in_(sellers) & ~bought_by_others)})
        return found
    return database.run(counted, write=False)


def purge(database: Database, operator: Operator) -> PurgeCounts:
    """Remove every test account and what it wrote, one account per transaction; the last
    transaction writes the log's row."""
    done = PurgeCounts()
    buyers = database.run(lambda tx: _test_users(tx, "buyer"), write=False)
    ledger_here = inspect(database.engine).has_table(payments.name)  # else a ledger elsewhere keeps them
    for buyer_id in buyers:
        done.removed.update(database.run(lambda tx: _purge_buyer(tx, buyer_id, ledger_here)))  # noqa: B023
    sellers = database.run(lambda tx: _test_users(tx, "seller"), write=False)
    for seller_id in sellers:
        counted, kept = database.run(lambda tx: _purge_seller(tx, seller_id))  # noqa: B023 - run at once
        done.removed.update(counted)
        done.kept_sellers.extend(kept)
    database.run(lambda tx: _forget_test_failures(tx, operator, done))
    return done


def _lock_out(tx: Connection, user_id: int) -> None:
    """End the account's sessions and hold its row to the commit (a login opening a session
    holds it shared, so it either ended here too or finds the account gone)."""
    end_sessions(tx, sessions.c.user_id == user_id)
    tx.execute(select(users.c.user_id).where(users.c.user_id == user_id).with_for_update())
    end_sessions(tx, sessions.c.user_id == user_id)


def _purge_buyer(tx: Connection, buyer_id: int, ledger_here: bool) -> Counter[str]:
    """One test buyer and all it did; the units it bought go back, its votes are taken back."""
    _lock_out(tx, buyer_id)
    # the units of completed orders only: an undone purchase gave its units back already
    bought = tx.execute(select(order_lines.c.item_id, func.sum(order_lines.c.quantity))
                        .join(orders, orders.c.order_id == order_lines.c.order_id)
                        .where(order_lines.c.buyer_id == buyer_id, orders.c.status.in_(COMPLETED))
                        .group_by(order_lines.c.item_id).order_by(order_lines.c.item_id)).all()
    votes = tx.execute(select(feedback.c.item_id, feedback.c.vote, items.c.seller_id)
                       .join(items, items.c.item_id == feedback.c.item_id)
                       .where(feedback.c.buyer_id == buyer_id)).all()
    _give_back(tx, bought)
    _take_back_votes(tx, votes)
    tx.execute(delete(feedback).where(feedback.c.buyer_id == buyer_id))
    tx.execute(delete(order_lines).where(order_lines.c.buyer_id == buyer_id))
    if ledger_here:  # the simulated processor's entries of its orders
        keys = tx.execute(select(orders.c.payment_key).where(orders.c.buyer_id == buyer_id)).scalars()
        tx.execute(delete(payments).where(payments.c.payment_key.in_([key for key in keys if key])))
    order_count = tx.execute(delete(orders).where(orders.c.buyer_id == buyer_id)).rowcount
    tx.execute(delete(saved_cart_lines).where(saved_cart_lines.c.buyer_id == buyer_id))
    _delete_account(tx, buyer_id)
    return Counter({"test buyer": 1, "order": order_count})


def _give_back(tx: Connection, bought: Sequence[Any]) -> None:
    """Units bought, (item_id, units) in item order, back to their items: on sale again unless
    the seller is suspended; then off their sellers' items_sold, in seller order."""
    sold: Counter[int] = Counter()
    for item_id, sum_of_units in bought:
        units = int(sum_of_units)  # a Decimal on MySQL
        item = tx.execute(select(items.c.item_id, items.c.seller_id, items.c.category, items.c.name,
                                 items.c.keywords, items.c.quantity, suspensions.c.user_id.label("suspended"))
                          .outerjoin(suspensions, suspensions.c.user_id == items.c.seller_id)
                          .where(items.c.item_id == item_id).with_for_update()).one()
        back = items.c.removed if item.suspended else items.c.quantity
        tx.execute(update(items).where(items.c.item_id == item_id)
                   .values({items.c.sold: items.c.sold - units, back: back + units}))
        if item.quantity == 0 and not item.suspended:
            relist(tx, [item])  # type: ignore[arg-type]
        sold[item.seller_id] += units
    for seller_id in sorted(sold):
        tx.execute(update(users).where(users.c.user_id == seller_id)
                   .values(items_sold=users.c.items_sold - sold[seller_id]))


def _take_back_votes(tx: Connection, votes: Sequence[Any]) -> None:
    """A deleted vote's thumb off its item and its seller."""
    for table, key, column in ((items, "item_id", items.c.item_id), (users, "seller_id", users.c.user_id)):
        for vote in sorted(votes, key=lambda v: getattr(v, key)):  # noqa: B023 - sorted at once
            thumb = "thumbs_up" if vote.vote == "up" else "thumbs_down"
            tx.execute(update(table).where(column == getattr(vote, key)).values({thumb: table.c[thumb] - 1}))


def _delete_account(tx: Connection, user_id: int) -> None:
    tx.execute(delete(suspensions).where(suspensions.c.user_id == user_id))
    tx.execute(delete(device_tokens).where(device_tokens.c.user_id == user_id))
    tx.execute(delete(users).where(users.c.user_id == user_id))


def _purge_seller(tx: Connection, seller_id: int) -> tuple[Counter[str], list[str]]:
    """One test seller and its items; an item a real buyer bought stays, off sale, and so
    does the seller (its name in the list returned)."""
    _lock_out(tx, seller_id)
    bought = select(order_lines.c.item_id).where(order_lines.c.item_id == items.c.item_id).exists()
    withdraw(tx, (items.c.seller_id == seller_id) & bought)
    gone = list(tx.execute(select(items.c.item_id).where(items.c.seller_id == seller_id, ~bought)
                           .order_by(items.c.item_id).with_for_update()).scalars())
    for chunk in (gone[start:start + 500] for start in range(0, len(gone), 500)):  # ids per IN (...)
        for table in (cart_lines, saved_cart_lines, item_keywords, item_keyword_pairs, item_words, feedback):
            tx.execute(delete(table).where(table.c.item_id.in_(chunk)))
        tx.execute(delete(items).where(items.c.item_id.in_(chunk)))
    if tx.execute(select(items.c.item_id).where(items.c.seller_id == seller_id).limit(1)).first():
        name = tx.execute(select(users.c.username).where(users.c.user_id == seller_id)).scalar_one()
        return Counter({"item": len(gone)}), [name]
    _delete_account(tx, seller_id)
    return Counter({"test seller": 1, "item": len(gone)}), []


def _forget_test_failures(tx: Connection, operator: Operator, done: PurgeCounts) -> None:
    """The failed-login counts of test names, and the log's row of the whole purge."""
    tx.execute(delete(login_failures).where(
        login_failures.c.username.startswith(LOAD_TEST_PREFIX, autoescape=True)))
    record(tx, operator, "purge-test-data", f"accounts named {LOAD_TEST_PREFIX}...",
           f"removed {done.sentence()}")
