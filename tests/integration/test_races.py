"""Races with many threads: no overselling, one purchase per idempotency key,
one vote per purchased item — on SQLite and MariaDB.
"""
from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest
from support import CARD, PASSWORD, Market, codes, race

from db import Database
from db.engine import WRITE_KEY
from operate.audit import audit, violations
from wire import Connection, ProtocolError


def twins_of(market: Market, conn: Connection, count: int) -> list[Connection]:
    """`conn` and count - 1 more connections with its token: one session, many requests at once."""
    twins = [conn] + [Connection(*market.buyer_server.address) for _ in range(count - 1)]
    for twin in twins[1:]:
        twin.token = conn.token
        market.connections.append(twin)
    return twins


def test_fifty_buyers_race_for_ten_units(market: Market) -> None:
    seller = market.user("seller")
    item_id = market.item(seller, quantity=10)
    buyers = [market.user("buyer") for _ in range(50)]
    for buyer in buyers:
        buyer.call("add_to_cart", {"item_id": item_id, "quantity": 1})
    results = race([lambda b=b: b.call("make_purchase", CARD) for b in buyers])
    assert codes(results) == Counter({"OK": 10, "CONFLICT": 40})
    assert buyers[0].call("get_item", {"item_id": item_id})["quantity"] == 0
    assert seller.call("get_seller_rating")["items_sold"] == 10
    losers = [b for b, r in zip(buyers, results, strict=True) if isinstance(r, ProtocolError)]
    assert all(len(b.call("display_cart")["cart"]["items"]) == 1 for b in losers)


def test_multi_item_carts_race_without_deadlock_or_overselling(market: Market) -> None:
    seller = market.user("seller")
    items = [market.item(seller, quantity=6) for _ in range(3)]
    buyers = [market.user("buyer") for _ in range(12)]
    for n, buyer in enumerate(buyers):  # every buyer wants two of the three, added in varied order
        for item_id in (items[n % 3], items[(n + 1) % 3])[:: 1 if n % 2 else -1]:
            buyer.call("add_to_cart", {"item_id": item_id, "quantity": 1})
    results = race([lambda b=b: b.call("make_purchase", CARD) for b in buyers])
    assert codes(results)["INTERNAL"] == 0 and codes(results)["BUSY"] == 0
    sold = sum(2 for r in results if not isinstance(r, ProtocolError))
    left = [buyers[0].call("get_item", {"item_id": i})["quantity"] for i in items]
    assert sold + sum(left) == 18 and min(left) >= 0, left  # no item oversold, not only in sum
    assert seller.call("get_seller_rating")["items_sold"] == sold
    assert audit(market.db) == []


def test_the_same_idempotency_key_sent_twice_at_once_buys_once(market: Market) -> None:
    seller, buyer = market.user("seller"), market.user("buyer")
    item_id = market.item(seller, quantity=100)
    twins = twins_of(market, buyer, 6)
    for round_ in range(5):  # the window between two requests is narrow: try a few times
        buyer.call("add_to_cart", {"item_id": item_id, "quantity": 3})
        args = {**CARD, "idempotency_key": f"checkout-{round_}"}
        results = race([lambda c=c, a=args: c.call("make_purchase", a) for c in twins])
        assert codes(results) == Counter({"OK": 6}), [getattr(r, "message", "") for r in results]
        assert len({r["order_id"] for r in results}) == 1
        assert buyer.call("get_item", {"item_id": item_id})["quantity"] == 100 - 3 * (round_ + 1)
    assert len(buyer.call("get_purchase_history")["purchases"]) == 5


def test_one_vote_per_purchased_item_under_a_race(market: Market) -> None:
    seller, buyer = market.user("seller"), market.user("buyer")
    item_id = market.item(seller, quantity=1)
    buyer.call("add_to_cart", {"item_id": item_id, "quantity": 1})
    buyer.call("make_purchase", CARD)
    voters = twins_of(market, buyer, 10)
    results = race([lambda c=c, n=n: c.call("provide_feedback", {"item_id": item_id,
                                                                 "vote": "up" if n % 2 else "down"})
                    for n, c in enumerate(voters)])
    assert codes(results) == Counter({"OK": 1, "CONFLICT": 9})
    rating = buyer.call("get_seller_rating", {"seller_id": seller.user_id})
    assert rating["thumbs_up"] + rating["thumbs_down"] == 1
    item = buyer.call("get_item", {"item_id": item_id})
    assert item["thumbs_up"] + item["thumbs_down"] == 1


def snapshot_violations(database: Database) -> list[str]:
    """The audit's rules read in one consistent snapshot (MariaDB, REPEATABLE READ)."""
    with database.engine.connect() as conn:
        conn.info[WRITE_KEY] = False  # no START TRANSACTION of our own: the snapshot's instead
        conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        conn.exec_driver_sql("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
        try:
            return violations(conn)
        finally:
            conn.exec_driver_sql("COMMIT")


@pytest.mark.parametrize("db_url", ["mariadb"], indirect=True)
def test_a_reader_during_a_race_sees_every_purchase_and_vote_whole(market: Market) -> None:
    """Stock, order lines, totals, sellers' counts and votes go in with one COMMIT (some of
    them deferred to it): a snapshot taken at any moment of the race balances."""
    seller = market.user("seller")
    items = [market.item(seller, quantity=500, keywords=["race", f"k{n}"]) for n in range(4)]
    buyers = [market.user("buyer") for _ in range(6)]
    done = threading.Event()
    snapshots: list[list[str]] = []

    def shop(buyer: Connection, n: int) -> None:
        voted: set[int] = set()
        for round_ in range(12):
            cart = {items[n % 4], items[(n + round_) % 4]}
            for item_id in cart:
                buyer.call("add_to_cart", {"item_id": item_id, "quantity": 1 + round_ % 2})
            buyer.call("make_purchase", CARD)
            for item_id in cart - voted:
                buyer.call("provide_feedback", {"item_id": item_id, "vote": "up" if n % 2 else "down"})
                voted.add(item_id)

    def read() -> None:
        while not done.is_set():
            snapshots.append(snapshot_violations(market.db))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        results = race([lambda b=b, n=n: shop(b, n) for n, b in enumerate(buyers)])
    finally:
        done.set()
        reader.join()
    assert results == [None] * len(buyers)  # every call answered without an error
    assert len(snapshots) >= 3 and [v for v in snapshots if v] == []
    assert snapshot_violations(market.db) == []
    assert len(buyers[0].call("get_purchase_history")["purchases"]) >= 12


def test_one_session_adding_to_its_cart_on_many_connections_loses_nothing(market: Market) -> None:
    seller, buyer = market.user("seller"), market.user("buyer")
    item_id = market.item(seller, quantity=1000)
    twins = twins_of(market, buyer, 8)
    expected = 0
    for round_ in range(5):  # a new line (INSERT) in the first round, the same line after
        results = race([lambda c=c: c.call("add_to_cart", {"item_id": item_id, "quantity": 2})
                        for c in twins])
        assert codes(results) == Counter({"OK": 8}), [getattr(r, "message", "") for r in results]
        expected += 16
        [line] = buyer.call("display_cart")["cart"]["items"]
        assert line["quantity"] == expected, f"round {round_}"
    results = race([lambda c=c: c.call("remove_from_cart", {"item_id": item_id, "quantity": 3})
                    for c in twins])
    assert codes(results) == Counter({"OK": 8})
    [line] = buyer.call("display_cart")["cart"]["items"]
    assert line["quantity"] == expected - 24


def test_one_session_cannot_hold_more_than_is_on_sale_by_adding_at_once(market: Market) -> None:
    seller, buyer = market.user("seller"), market.user("buyer")
    item_id = market.item(seller, quantity=5)
    results = race([lambda c=c: c.call("add_to_cart", {"item_id": item_id, "quantity": 1})
                    for c in twins_of(market, buyer, 10)])
    assert codes(results) == Counter({"OK": 5, "CONFLICT": 5})
    assert buyer.call("display_cart")["cart"]["items"][0]["quantity"] == 5


def test_six_sessions_of_one_buyer_saving_at_once_keep_one_saved_cart(market: Market) -> None:
    """Six sessions of one buyer, each cart of another item, save at once, round after round:
    the saved cart is always one of them (before: on MariaDB a third of the rounds saved a
    mix of two, both DELETEs of the old lines locking nothing at READ COMMITTED)."""
    seller, buyer = market.user("seller"), market.user("buyer")
    sessions = [buyer] + [market.connect("buyer") for _ in range(5)]
    for n, conn in enumerate(sessions):  # every cart differs and none is empty
        if n:
            conn.token = conn.call("login", {"username": buyer.username, "password": PASSWORD})["token"]
        conn.call("add_to_cart", {"item_id": market.item(seller, quantity=10), "quantity": n + 1})
    carts = [cart_lines(s) for s in sessions]
    for round_ in range(30):  # the first round saves over an empty saved cart, the others over one
        results = race([lambda c=c: c.call("save_cart") for c in sessions])
        assert codes(results) == Counter({"OK": 6}), [getattr(r, "message", "") for r in results]
        fresh = market.connect("buyer")
        fresh.token = fresh.call("login", {"username": buyer.username, "password": PASSWORD})["token"]
        assert cart_lines(fresh) in carts, f"round {round_}: a saved cart of no session"
        fresh.call("logout")


def cart_lines(conn: Any) -> list[tuple[int, int]]:
    return [(line["item_id"], line["quantity"]) for line in conn.call("display_cart")["cart"]["items"]]


ROUNDS = 30  # each race below is narrow: it must come out right round after round


def test_an_add_during_a_purchase_of_the_same_session_is_bought_or_stays_in_the_cart(market: Market) -> None:
    """Before: the purchase's DELETE of the session's cart took a line added on another
    connection while it ran, neither bought nor kept."""
    seller = market.user("seller")
    buying, adding = twins_of(market, market.user("buyer"), 2)
    for round_ in range(ROUNDS):
        bought_item, added_item = market.item(seller, quantity=5), market.item(seller, quantity=5)
        buying.call("add_to_cart", {"item_id": bought_item, "quantity": 1})
        add = {"item_id": added_item, "quantity": 1}
        results = race([lambda: buying.call("make_purchase", CARD),
                        lambda a=add: adding.call("add_to_cart", a)])
        assert codes(results) == Counter({"OK": 2}), results
        bought = {line["item_id"] for line in results[0]["lines"]}
        kept = {item_id for item_id, _ in cart_lines(buying)}
        assert bought_item in bought, (round_, bought)
        assert (added_item in bought) != (added_item in kept), (round_, bought, kept)
        buying.call("clear_cart")


def test_a_save_racing_a_logout_saves_the_cart_or_is_unauthenticated(market: Market) -> None:
    """Four saves and a logout of one session at once. Before: the logout emptied the cart
    under a save's copy, which answered OK and left an empty saved cart."""
    seller, buyer = market.user("seller"), market.user("buyer")
    for round_ in range(ROUNDS):
        conn = market.connect("buyer")
        conn.token = conn.call("login", {"username": buyer.username, "password": PASSWORD})["token"]
        conn.call("clear_cart")
        conn.call("add_to_cart", {"item_id": market.item(seller, quantity=ROUNDS), "quantity": round_ + 1})
        cart = cart_lines(conn)
        *saving, leaving = twins_of(market, conn, 5)
        *saves, logout = race([lambda s=s: s.call("save_cart") for s in saving]
                              + [lambda le=leaving: le.call("logout")])
        assert logout == {}, logout
        assert all(save.code == "UNAUTHENTICATED" for save in saves if isinstance(save, ProtocolError)), saves
        fresh = market.connect("buyer")
        fresh.token = fresh.call("login", {"username": buyer.username, "password": PASSWORD})["token"]
        if codes(saves)["OK"]:
            assert cart_lines(fresh) == cart, f"round {round_}: saved, but not the cart"
        fresh.call("logout")


def test_a_logout_racing_an_add_of_the_same_session_never_fails(market: Market) -> None:
    """Before: the logout's DELETE of the session could follow the add's new line and fail on
    its foreign key: INTERNAL, and the session lived on."""
    seller, buyer = market.user("seller"), market.user("buyer")
    for round_ in range(ROUNDS):
        conn = market.connect("buyer")
        conn.token = conn.call("login", {"username": buyer.username, "password": PASSWORD})["token"]
        adding, leaving = twins_of(market, conn, 2)
        args = {"item_id": market.item(seller, quantity=5), "quantity": 1}
        add, logout = race([lambda a=adding, x=args: a.call("add_to_cart", x),
                            lambda le=leaving: le.call("logout")])
        assert logout == {} and (not isinstance(add, ProtocolError) or add.code == "UNAUTHENTICATED"), \
            (round_, add, logout)
        with pytest.raises(ProtocolError, match="log in again"):
            adding.call("display_cart")


def innodb_deadlocks(database: Database) -> int:
    with database.engine.connect() as conn:
        return int(conn.exec_driver_sql("SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'").one()[1])


@pytest.mark.parametrize("db_url", ["mariadb"], indirect=True)
def test_votes_and_purchases_of_the_same_items_do_not_deadlock(market: Market) -> None:
    # before: a vote's insert held the item's row shared (its foreign key) and its count's
    # update then waited behind a purchase waiting for that row: a deadlock, retried, about
    # 15 of them per run of this race, and now and then retried out into BUSY
    seller = market.user("seller")
    items = [market.item(seller, quantity=500) for _ in range(3)]
    buyers = [market.user("buyer") for _ in range(6)]

    def shop(buyer: Connection, n: int) -> None:
        for round_ in range(10):
            item_id = items[(n + round_) % 3]
            buyer.call("add_to_cart", {"item_id": item_id, "quantity": 1})
            buyer.call("make_purchase", CARD)
            if round_ < 3:
                buyer.call("provide_feedback", {"item_id": item_id, "vote": "up"})

    before = innodb_deadlocks(market.db)
    results = race([lambda b=b, n=n: shop(b, n) for n, b in enumerate(buyers)])
    assert results == [None] * len(buyers)
    assert innodb_deadlocks(market.db) - before == 0
