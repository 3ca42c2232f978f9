"""Housekeeping: expired sessions with their cart lines and old failed-login counts go, in
small batches, on both databases, with any number of housekeepers at once."""
from __future__ import annotations

import secrets
import threading
from typing import Any

from sqlalchemy import func, insert, select, update
from support import Market

from db import Database, housekeeping
from db.accounts import CLEANUP_GRACE_MS, SessionPolicy
from db.database import now_ms
from db.schema import cart_lines, login_failures, saved_cart_lines, sessions
from runtime.housekeeping import Housekeeper

POLICY = SessionPolicy()
LONG_AGO_MS = POLICY.max_s * 1000 + CLEANUP_GRACE_MS + 60_000


def _count(db: Database, table: Any) -> int:
    return int(db.run(lambda tx: tx.execute(select(func.count()).select_from(table)).scalar_one(),
                      write=False))


def _age_session(db: Database, token_user_id: int, by_ms: int) -> None:
    db.run(lambda tx: tx.execute(update(sessions).where(sessions.c.user_id == token_user_id).values(
        last_seen_ms=sessions.c.last_seen_ms - by_ms, created_ms=sessions.c.created_ms - by_ms)))


def test_expired_sessions_go_with_their_cart_lines_but_saved_carts_stay(market: Market) -> None:
    seller = market.user("seller")
    item = market.item(seller)
    gone, recent, live = (market.user("buyer") for _ in range(3))
    for buyer in (gone, recent, live):
        buyer.call("add_to_cart", {"item_id": item, "quantity": 1})
    gone.call("save_cart")
    _age_session(market.db, gone.user_id, LONG_AGO_MS)  # type: ignore[attr-defined]
    # ended, but within the grace a read accepted at its last moment may still need it
    idle_end = POLICY.idle_s * 1000 + POLICY.touch_interval_ms + 1000
    _age_session(market.db, recent.user_id, idle_end)  # type: ignore[attr-defined]

    assert housekeeping.sweep(market.db, POLICY) == 1
    left = market.db.run(lambda tx: tx.execute(select(sessions.c.user_id)).scalars().all(), write=False)
    assert sorted(left) == sorted([seller.user_id, recent.user_id, live.user_id])  # type: ignore[attr-defined]
    assert _count(market.db, cart_lines) == 2 and _count(market.db, saved_cart_lines) == 1
    assert len(live.call("display_cart")["cart"]["items"]) == 1


def test_only_failed_login_counts_untouched_for_a_day_are_forgotten(database: Database) -> None:
    now = now_ms()
    rows = [{"role": "buyer", "username": f"nobody{n}", "failures": 3,
             "last_failure_ms": now - housekeeping.FORGET_FAILURES_AFTER_MS - 1000 * (n % 2 * -2 + 1)}
            for n in range(10)]  # odd n: an hour short of a day
    database.run(lambda tx: tx.execute(insert(login_failures), rows))
    assert housekeeping.sweep(database, POLICY, batch=3) == 5
    kept = database.run(lambda tx: tx.execute(select(login_failures.c.username)).scalars().all(),
                        write=False)
    assert sorted(kept) == sorted(f"nobody{n}" for n in range(1, 10, 2))


def _many_old_rows(market: Market, count: int) -> None:
    buyer = market.user("buyer")
    item = market.item(market.user("seller"))
    long_ago = now_ms() - LONG_AGO_MS
    market.db.run(lambda tx: tx.execute(insert(sessions), [
        {"token_hash": secrets.token_hex(32), "user_id": buyer.user_id,  # type: ignore[attr-defined]
         "role": "buyer", "created_ms": long_ago, "last_seen_ms": long_ago} for _ in range(count)]))
    ids = market.db.run(lambda tx: tx.execute(select(sessions.c.session_id).where(
        sessions.c.last_seen_ms == long_ago)).scalars().all())
    market.db.run(lambda tx: tx.execute(insert(cart_lines), [
        {"session_id": sid, "item_id": item, "quantity": 1} for sid in ids]))
    old = now_ms() - housekeeping.FORGET_FAILURES_AFTER_MS - 1000
    market.db.run(lambda tx: tx.execute(insert(login_failures), [
        {"role": "seller", "username": f"gone{n}", "failures": 9, "last_failure_ms": old}
        for n in range(count)]))


def test_two_housekeepers_racing_delete_every_old_row_once(market: Market, db_url: str) -> None:
    _many_old_rows(market, 300)
    before = _count(market.db, sessions)
    keepers = [Database(db_url, pool_size=1) for _ in range(2)]
    deleted: list[int] = []
    barrier = threading.Barrier(2)

    def sweep(db: Database) -> None:
        barrier.wait()
        deleted.append(housekeeping.sweep(db, POLICY, batch=25))

    threads = [threading.Thread(target=sweep, args=(db,)) for db in keepers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    for db in keepers:
        db.close()
    assert len(deleted) == 2 and sum(deleted) == 600, deleted
    assert _count(market.db, sessions) == before - 300
    assert _count(market.db, cart_lines) == 0 and _count(market.db, login_failures) == 0


def test_the_housekeeping_thread_sweeps_until_stopped(market: Market) -> None:
    _many_old_rows(market, 30)
    keeper = Housekeeper(market.db, POLICY, interval_s=0.05)
    keeper.start()
    try:
        deadline = now_ms() + 10_000
        while _count(market.db, login_failures) and now_ms() < deadline:
            threading.Event().wait(0.05)
    finally:
        keeper.stop()
    assert _count(market.db, login_failures) == 0 and _count(market.db, cart_lines) == 0
