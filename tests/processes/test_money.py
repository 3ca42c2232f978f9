"""Money: a purchase and its payment never disagree. A decline, the same key sent at once,
a buyer server killed (SIGKILL) at every step of a purchase and started again: afterwards
the audit passes, and the client's view (history, stock, replay by key) agrees with the
processor's ledger. Real sockets, real processes, both databases.
"""
from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import insert, select, update
from support import (
    CARD,
    MariaDBFaults,
    Market,
    PrivateMariaDB,
    ServerProcess,
    free_port,
    list_items,
    read_messages,
    running_market,
    sign_up,
)

from buyer_server.checkout import KILL_POINTS
from buyer_server.payments import Card, PaymentRefusedError, SimulatedProcessor
from db import Database, accounts, purchases
from db.ledger import CAPTURED, DECLINED, VOIDED, Ledger, Payment
from db.migrations import make_current
from db.purchases import PAID, PENDING
from db.schema import orders, users
from operate.audit import audit
from runtime.config import Settings
from wire import Connection, ProtocolError
from wire.errors import ConflictError, PaymentDeclinedError, UnavailableError
from wire.framing import encode_frame

SETTLE_ENV = {"MARKET_SETTLE_AFTER_S": "1", "MARKET_SETTLE_PERIOD_S": "0.2"}


def ledger_of(database: Database) -> list[Payment]:
    return Ledger(database).entries()


def order_statuses(database: Database) -> Counter[str]:
    rows = database.run(lambda tx: tx.execute(orders.select()).all(), write=False)
    return Counter(row.status for row in rows)


@dataclass
class Shop:
    """A market, its processor's ledger, and a buyer with an item of 2 in the cart."""

    market: Market
    ledger: Ledger
    buyer: Connection
    item_id: int


def settle_now(market: Market) -> int:
    """What the buyer server's settler does at its next pass, done now; how many it settled."""
    return int(market.buyer_server.app.checkout.settle_due(pending_for_s=0))  # type: ignore[attr-defined]


def purchase_answer(buyer: Connection) -> Any:
    """The purchase's receipt, or the error it was answered with."""
    try:
        return buyer.call("make_purchase", {**CARD, "idempotency_key": "k"})
    except ProtocolError as exc:
        return exc


def assert_ledger_agrees(shop: Shop, answer: Any) -> None:
    """What the buyer was told is what the ledger holds, and what the buyer sees now."""
    buyer, [payment] = shop.buyer, shop.ledger.entries()
    history = buyer.call("get_purchase_history")["purchases"]
    stock = buyer.call("get_item", {"item_id": shop.item_id})["quantity"]
    if isinstance(answer, dict):  # captured once, in the history, the key replays it
        assert (payment.state, payment.captures, stock) == (CAPTURED, 1, 0)
        assert [line["order_id"] for line in history] == [answer["order_id"]]
        assert buyer.call("make_purchase", {**CARD, "idempotency_key": "k"}) == answer
        assert buyer.call("display_cart")["cart"]["items"] == []
    else:  # nothing captured, nothing bought, the cart kept
        assert payment.state in (VOIDED, DECLINED) and payment.captures == 0
        assert (history, stock) == ([], 2)
        assert len(buyer.call("display_cart")["cart"]["items"]) == 1
    assert audit(shop.market.db, ledger=shop.ledger.entries()) == []


def test_a_purchase_captures_its_total_once(market: Market) -> None:
    seller, buyer = market.user("seller"), market.user("buyer")
    item_id = market.item(seller, price="12.50", quantity=5)
    buyer.call("add_to_cart", {"item_id": item_id, "quantity": 2})
    receipt = buyer.call("make_purchase", CARD)
    [payment] = ledger_of(market.db)
    assert (payment.state, payment.captures, payment.amount_cents, payment.buyer_id) == \
        (CAPTURED, 1, 2500, buyer.user_id)  # type: ignore[attr-defined]
    assert order_statuses(market.db) == Counter({PAID: 1})
    assert buyer.call("get_purchase_history")["purchases"][0]["order_id"] == receipt["order_id"]
    assert audit(market.db) == []


def test_a_decline_changes_nothing_and_leaves_the_cart(database: Database) -> None:
    with running_market(database, Settings(role="buyer", payment_decline_rate=1.0)) as market:
        seller, buyer = market.user("seller"), market.user("buyer")
        item_id = market.item(seller, quantity=2)
        buyer.call("add_to_cart", {"item_id": item_id, "quantity": 2})  # the last units: unlisted, then back
        with pytest.raises(PaymentDeclinedError):
            buyer.call("make_purchase", {**CARD, "idempotency_key": "k"})
        assert buyer.call("get_item", {"item_id": item_id})["quantity"] == 2
        assert [line["quantity"] for line in buyer.call("display_cart")["cart"]["items"]] == [2]
        assert buyer.call("get_purchase_history")["purchases"] == []
        found = buyer.call("search_items", {"keywords": ["desk"]})["items"]
        assert [item["item_id"] for item in found] == [item_id]  # listed again
        assert [p.state for p in ledger_of(database)] == [DECLINED]
        assert audit(database) == []
        with pytest.raises(PaymentDeclinedError):  # the key was not kept: a new attempt
            buyer.call("make_purchase", {**CARD, "idempotency_key": "k"})
        assert [p.state for p in ledger_of(database)] == [DECLINED, DECLINED]


def test_the_same_key_sent_many_times_at_once_captures_once(market: Market) -> None:
    seller, buyer = market.user("seller"), market.user("buyer")
    item_id = market.item(seller, quantity=100)
    buyer.call("add_to_cart", {"item_id": item_id, "quantity": 3})
    twins = [market.connect("buyer") for _ in range(16)]
    for twin in twins:
        twin.token = buyer.token
    answers: list[Any] = []
    start = threading.Barrier(len(twins))

    def buy(conn: Connection) -> None:
        start.wait()
        try:
            answers.append(conn.call("make_purchase", {**CARD, "idempotency_key": "once"}))
        except ProtocolError as exc:
            answers.append(exc)

    threads = [threading.Thread(target=buy, args=(twin,)) for twin in twins]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert all(isinstance(a, dict) for a in answers) and len({a["order_id"] for a in answers}) == 1, answers
    [payment] = ledger_of(market.db)
    assert (payment.state, payment.captures) == (CAPTURED, 1)
    assert buyer.call("get_item", {"item_id": item_id})["quantity"] == 97
    assert audit(market.db) == []


def test_the_audit_finds_a_capture_without_its_order(market: Market) -> None:
    seller, buyer = market.user("seller"), market.user("buyer")
    buyer.call("add_to_cart", {"item_id": market.item(seller), "quantity": 1})
    buyer.call("make_purchase", CARD)
    ledger = Ledger(market.db)
    ledger.record("stray", buyer.user_id, 100, CAPTURED)  # type: ignore[attr-defined]
    [key] = [p.payment_key for p in ledger.entries() if p.payment_key != "stray"]
    ledger.move(key, CAPTURED, VOIDED)
    assert sorted(audit(market.db)) == [
        f"order {order_id} (paid): paid, but its payment is voided"
        for order_id in [buyer.call("get_purchase_history")["purchases"][0]["order_id"]]
    ] + ["payment stray: captured 100 cents for no order"]


# -- the processor unreachable at the capture -----------------------------------------------------

class UnreachableProcessor:
    """The simulated processor behind a network that fails: a capture sent while `capture`
    is "refused" never reaches it (ConnectionRefusedError); one sent while it is "lost" is
    made, but its answer is lost (TimeoutError); a void fails as refused while `void` is."""

    def __init__(self, inner: SimulatedProcessor, capture: str, void: str = "") -> None:
        self.inner, self.capture_fault, self.void_fault = inner, capture, void

    def authorise(self, key: str, buyer_id: int, amount_cents: int, card: Card) -> None:
        self.inner.authorise(key, buyer_id, amount_cents, card)

    def capture(self, key: str) -> None:
        if self.capture_fault == "refused":
            raise ConnectionRefusedError("the processor refused the connection")
        self.inner.capture(key)
        if self.capture_fault == "lost":
            raise TimeoutError("the processor's answer did not come")

    def void(self, key: str) -> None:
        if self.void_fault == "refused":
            raise ConnectionRefusedError("the processor refused the connection")
        self.inner.void(key)


@contextlib.contextmanager
def market_with(database: Database, processor: UnreachableProcessor) -> Iterator[Shop]:
    """Both servers with this processor, a seller's item of 2 in a buyer's cart."""
    with running_market(database, processor=processor) as market:
        seller, buyer = market.user("seller"), market.user("buyer")
        item_id = market.item(seller, quantity=2)
        buyer.call("add_to_cart", {"item_id": item_id, "quantity": 2})
        yield Shop(market, processor.inner.ledger, buyer, item_id)


@pytest.mark.parametrize("void", ["", "refused"])
def test_a_capture_that_never_reached_the_processor_is_answered_as_not_charged(
        database: Database, void: str) -> None:
    """The processor unreachable at the capture: the buyer is told nothing was charged, and
    nothing is. With the void answered, the purchase is undone at once; without, the answer
    says the settler decides, and it undoes the purchase once the processor is back."""
    processor = UnreachableProcessor(SimulatedProcessor(Ledger(database)), capture="refused", void=void)
    with market_with(database, processor) as shop:
        answer = purchase_answer(shop.buyer)
        assert isinstance(answer, UnavailableError), answer
        if void:
            assert "did not answer" in str(answer) and order_statuses(database) == Counter({PENDING: 1})
            processor.void_fault = ""
            assert settle_now(shop.market) == 1
        else:
            assert "nothing was charged" in str(answer)
        assert order_statuses(database) == Counter({"void": 1})
        assert_ledger_agrees(shop, answer)
        processor.capture_fault = ""  # back: the same key buys the cart, which was kept
        assert purchase_answer(shop.buyer)["lines"][0]["quantity"] == 2


@pytest.mark.parametrize("void", ["", "refused"])
def test_a_capture_whose_answer_is_lost_is_found_by_the_void(database: Database, void: str) -> None:
    """The capture made, its answer lost: the void is refused (captured), so the buyer gets
    the receipt. If the void cannot be sent either, the answer says the outcome is not known
    yet; the settler then completes the purchase, and the key replays its receipt."""
    processor = UnreachableProcessor(SimulatedProcessor(Ledger(database)), capture="lost", void=void)
    with market_with(database, processor) as shop:
        answer = purchase_answer(shop.buyer)
        if void:
            assert isinstance(answer, UnavailableError) and "did not answer" in str(answer), answer
            processor.void_fault = ""
            assert settle_now(shop.market) == 1
            answer = shop.buyer.call("make_purchase", {**CARD, "idempotency_key": "k"})
        assert isinstance(answer, dict), answer
        assert order_statuses(database) == Counter({PAID: 1})
        assert_ledger_agrees(shop, answer)


# -- a buyer server killed at every step -------------------------------------------------------

def wait_until_settled(database: Database, within_s: float = 30.0) -> None:
    """Until no order is pending, capturing or voiding (the restarted server's settler)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        statuses = order_statuses(database)
        if not set(statuses) - {PAID, "void"}:
            return
        time.sleep(0.1)
    raise AssertionError(f"still unsettled after {within_s} s: {order_statuses(database)}")


@pytest.mark.slow
@pytest.mark.parametrize("point", KILL_POINTS)
def test_a_purchase_cut_off_by_a_kill_is_settled_by_the_ledger(
        database: Database, point: str) -> None:
    port = free_port()
    buyer_proc = ServerProcess("buyer", database.url, port, **SETTLE_ENV, MARKET_TEST_KILL_AT=point)
    buyer_proc.wait_ready()
    started = [buyer_proc]
    try:
        with running_market(database) as market:  # its seller server: not the one killed
            [item_id] = list_items(market.user("seller"), 1, 3)  # at 1.25
        buyer = sign_up(buyer_proc.connect(), "buyer")
        buyer.call("add_to_cart", {"item_id": item_id, "quantity": 3})
        with pytest.raises(OSError):  # killed at the point: no answer
            buyer.call("make_purchase", {**CARD, "idempotency_key": "cut"})
        assert buyer_proc.proc.wait(timeout=10) == -9
        started.append(ServerProcess("buyer", database.url, port, **SETTLE_ENV).wait_ready())
        wait_until_settled(database)
        [payment] = ledger_of(database)
        assert audit(database) == []
        history = buyer.call("get_purchase_history")["purchases"]
        stock = buyer.call("get_item", {"item_id": item_id})["quantity"]
        if point in ("before_authorise", "after_authorise"):  # the buyer never heard of success
            assert (payment.state, history, stock) == (VOIDED, [], 3)
            again = buyer.call("make_purchase", {**CARD, "idempotency_key": "cut"})  # the cart was kept
            assert again["lines"][0]["quantity"] == 3
        else:  # the order was committed as bought: it is completed
            assert (payment.state, payment.captures, stock) == (CAPTURED, 1, 0)
            [line] = history
            replay = buyer.call("make_purchase", {**CARD, "idempotency_key": "cut"})
            assert replay["order_id"] == line["order_id"] and replay["total"] == "3.75"
            assert buyer.call("display_cart")["cart"]["items"] == []
        assert audit(database) == []
        assert sum(p.captures for p in ledger_of(database)) == 1  # one purchase in the end, either way
        buyer.close()
    finally:
        for proc in started:
            proc.proc.kill()
            proc.proc.wait()


@pytest.mark.slow
def test_a_purchase_without_a_key_whose_answer_is_lost_is_not_charged_twice(
        database: Database) -> None:
    port = free_port()
    buyer_proc = ServerProcess("buyer", database.url, port, **SETTLE_ENV, MARKET_TEST_KILL_AT="after_capture")
    buyer_proc.wait_ready()
    with running_market(database) as market:
        seller = market.user("seller")
        item_id = market.item(seller, quantity=5)
        buyer = sign_up(buyer_proc.connect(), "buyer")
        market.connections.append(buyer)
        buyer.call("add_to_cart", {"item_id": item_id, "quantity": 1})
        started = [buyer_proc]
        try:
            with pytest.raises(OSError):
                buyer.call("make_purchase", CARD)
            started.append(ServerProcess("buyer", database.url, port, **SETTLE_ENV).wait_ready())
            with pytest.raises(ConflictError, match="cart is empty"):  # the client tries again
                buyer.call("make_purchase", CARD)
            wait_until_settled(database)
        finally:
            for proc in started:
                proc.proc.kill()
                proc.proc.wait()
    assert [(p.state, p.captures) for p in ledger_of(database)] == [(CAPTURED, 1)]
    assert order_statuses(database) == Counter({PAID: 1})
    assert audit(database) == []


def test_an_order_left_pending_is_undone_by_the_settler(market: Market) -> None:
    """The settler on its own: a pending order (its purchase cut off before authorising) is
    undone, its key voided so that a late authorisation is refused."""
    seller, buyer = market.user("seller"), market.user("buyer")
    item_id = market.item(seller, quantity=1)
    buyer.call("add_to_cart", {"item_id": item_id, "quantity": 1})
    checkout = market.buyer_server.app.checkout  # type: ignore[attr-defined]
    gate = accounts.SessionGate(market.db, "buyer", accounts.SessionPolicy())
    opened = gate.run(buyer.token or "", True, lambda tx, s: purchases.open_order(tx, s, None))
    assert order_statuses(market.db) == Counter({PENDING: 1})
    assert checkout.settle_due(pending_for_s=60) == 0  # not cut off yet: too young
    assert checkout.settle_due(pending_for_s=0) == 1
    assert buyer.call("get_item", {"item_id": item_id})["quantity"] == 1
    with pytest.raises(PaymentDeclinedError):  # the purchase's own thread, were it alive
        checkout.processor.authorise(opened.payment_key, opened.buyer_id, opened.total_cents,
                                     Card(CARD["card_name"], CARD["card_number"], CARD["card_expiry"]))
    assert [p.state for p in ledger_of(market.db)] == [VOIDED]
    assert audit(market.db) == []


# -- faults at the COMMIT of the step that marks an order paid (MariaDB) ------------------------

def marks_paid(queries: list[str]) -> bool:
    """The transaction that marks an order paid: its status changed and the saved cart emptied."""
    sql = "\n".join(queries)
    return "UPDATE orders SET status" in sql and "DELETE FROM saved_cart_lines" in sql


@contextlib.contextmanager
def market_through(database: Database, fault: str) -> Iterator[tuple[Market, MariaDBFaults]]:
    """A market whose database connections go through a relay making `fault` once."""
    faults = MariaDBFaults(database.url, marks_paid, fault)
    relayed = Database(faults.url)
    try:
        with running_market(relayed) as market:
            yield market, faults
    finally:
        relayed.close()
        faults.close()


@pytest.mark.parametrize("db_url", ["mariadb"], indirect=True)
def test_a_deadlock_at_the_commit_is_retried_and_captures_once(database: Database) -> None:
    with market_through(database, "deadlock") as (market, faults):
        seller, buyer = market.user("seller"), market.user("buyer")
        item_id = market.item(seller, quantity=4)
        buyer.call("add_to_cart", {"item_id": item_id, "quantity": 2})
        receipt = buyer.call("make_purchase", CARD)
        assert faults.made == 1
        assert buyer.call("get_purchase_history")["purchases"][0]["order_id"] == receipt["order_id"]
        assert buyer.call("get_item", {"item_id": item_id})["quantity"] == 2
    assert [(p.state, p.captures, p.amount_cents) for p in ledger_of(database)] == [(CAPTURED, 1, 2500)]
    assert audit(database) == []


@pytest.mark.parametrize("db_url", ["mariadb"], indirect=True)
def test_a_deadlock_at_a_commit_sent_alone_is_retried(database: Database) -> None:
    """On a Galera node every statement, COMMIT too, goes alone; a certification failure at
    that COMMIT is a deadlock to retry, not an internal error."""
    def bump(tx: Any) -> int:  # its row count read: the COMMIT goes alone
        sold = update(users).where(users.c.user_id == 1).values(items_sold=users.c.items_sold + 1)
        return int(tx.execute(sold).rowcount)

    def commit_alone(queries: list[str]) -> bool:
        return queries[-1].strip() == "COMMIT" and any("UPDATE users SET items_sold" in q for q in queries)

    database.run(lambda tx: tx.execute(insert(users).values(user_id=1, role="seller", username="s", name="S",
                                                            password_hash="x", created_ms=0)))
    faults = MariaDBFaults(database.url, commit_alone, "deadlock")
    with closing(faults), closing(Database(faults.url, pool_size=1)) as relayed:
        assert relayed.run(bump) == 1
    assert faults.made == 1
    assert database.run(lambda tx: tx.execute(select(users.c.items_sold)).scalar_one(), write=False) == 1


@pytest.mark.parametrize("db_url", ["mariadb"], indirect=True)
@pytest.mark.parametrize("lost", ["lost_before", "lost_after"])
def test_a_connection_lost_at_the_commit_answers_what_happened(database: Database, lost: str) -> None:
    """The connection of the step that marks the order paid lost at its COMMIT: before the
    query reached the server (nothing committed) or after the COMMIT ran (its answer never
    came). Either way the purchase goes on, and captures once."""
    with market_through(database, lost) as (market, faults):
        seller, buyer = market.user("seller"), market.user("buyer")
        item_id = market.item(seller, quantity=4)
        buyer.call("add_to_cart", {"item_id": item_id, "quantity": 2})
        receipt = buyer.call("make_purchase", CARD)
        assert faults.made == 1
        assert buyer.call("get_item", {"item_id": item_id})["quantity"] == 2
        assert buyer.call("display_cart")["cart"]["items"] == []
        history = buyer.call("get_purchase_history")["purchases"]
        assert [p["order_id"] for p in history] == [receipt["order_id"]]
    assert [(p.state, p.captures) for p in ledger_of(database)] == [(CAPTURED, 1)]
    assert audit(database) == []


# -- the database stopped between steps ---------------------------------------------------------

class StoppingProcessor:
    """The simulated processor (its ledger in a database of its own), which stops the
    marketplace's database server (a real kill) at one step of a purchase."""

    def __init__(self, inner: SimulatedProcessor, stop_at: str, server: PrivateMariaDB) -> None:
        self.inner, self.stop_at, self.server = inner, stop_at, server

    def authorise(self, key: str, buyer_id: int, amount_cents: int, card: Card) -> None:
        self._stop_if("before_authorise")
        self.inner.authorise(key, buyer_id, amount_cents, card)

    def capture(self, key: str) -> None:
        self.inner.capture(key)
        self._stop_if("after_capture")

    def void(self, key: str) -> None:
        self.inner.void(key)

    def _stop_if(self, step: str) -> None:
        if self.stop_at == step:
            self.stop_at = ""
            self.server.kill()


@contextlib.contextmanager
def market_on_a_private_mariadb(server: PrivateMariaDB, ledger_path: Any, stop_at: str = "",
                                decline_rate: float = 0.0, url: str = "") -> Iterator[Shop]:
    """Both servers over the private MariaDB (at `url`, if through a relay), the processor's
    ledger in an SQLite file (so that it answers while that database is stopped), a seller's
    item of 2 in a buyer's cart."""
    # a connect the relay accepts for a stopped database fails after 1 s (5 s in service)
    database = Database(f"{url or server.url}?connect_timeout=1", pool_size=4)
    database.away_s = 1.0  # waiting out the stopped database (6.5 s in service) ends all the same
    make_current(database)
    ledger_db = Database(f"sqlite:///{ledger_path}", pool_size=2)
    ledger = Ledger(ledger_db)
    processor = StoppingProcessor(SimulatedProcessor(ledger, decline_rate), stop_at, server)
    try:
        with running_market(database, processor=processor) as market:
            # a captured order's completion tried twice (0.3 s; about 6.3 s in service): the
            # database stays away all the same
            market.buyer_server.app.checkout.database_tries = 2  # type: ignore[attr-defined]
            seller, buyer = market.user("seller"), market.user("buyer")
            item_id = market.item(seller, quantity=2)
            buyer.call("add_to_cart", {"item_id": item_id, "quantity": 2})
            yield Shop(market, ledger, buyer, item_id)
    finally:
        database.close()
        ledger_db.close()


@pytest.mark.slow
@pytest.mark.parametrize("stop_at", ["before_authorise", "after_capture"])
def test_a_purchase_captured_while_the_database_is_stopped_is_answered_made(
        private_mariadb: PrivateMariaDB, tmp_path: Any, stop_at: str) -> None:
    """The processor answers while the marketplace's database is stopped: the capture is made,
    so the buyer gets the receipt, and the order is completed once the database is back."""
    with market_on_a_private_mariadb(private_mariadb, tmp_path / "ledger.db", stop_at) as shop:
        answer = purchase_answer(shop.buyer)
        private_mariadb.start()
        assert isinstance(answer, dict), answer
        assert order_statuses(shop.market.db) == Counter({PENDING: 1})  # not in the history yet
        assert settle_now(shop.market) == 1
        assert order_statuses(shop.market.db) == Counter({PAID: 1})
        assert_ledger_agrees(shop, answer)


@pytest.mark.slow
def test_a_decline_while_the_database_is_stopped_is_undone_once_it_is_back(
        private_mariadb: PrivateMariaDB, tmp_path: Any) -> None:
    with market_on_a_private_mariadb(private_mariadb, tmp_path / "ledger.db", "before_authorise",
                                     decline_rate=1.0) as shop:
        answer = purchase_answer(shop.buyer)
        private_mariadb.start()
        assert isinstance(answer, PaymentDeclinedError), answer
        assert settle_now(shop.market) == 1
        assert order_statuses(shop.market.db) == Counter({"void": 1})
        assert_ledger_agrees(shop, answer)


@pytest.mark.slow
def test_a_database_lost_at_the_commit_marking_an_order_paid_still_answers_made(
        private_mariadb: PrivateMariaDB, tmp_path: Any) -> None:
    """The step marking the order paid commits, then the database is gone (killed) before its
    answer comes, and stays away: the purchase's capture was made, so it is answered with its
    receipt, never an error (an error would be followed by a capture)."""
    faults = MariaDBFaults(private_mariadb.url, marks_paid, "lost_after", on_fault=private_mariadb.kill)
    with closing(faults), market_on_a_private_mariadb(private_mariadb, tmp_path / "ledger.db",
                                                      url=faults.url) as shop:
        answer = purchase_answer(shop.buyer)
        assert faults.made == 1
        private_mariadb.start()
        settle_now(shop.market)
        assert isinstance(answer, dict), answer
        assert order_statuses(shop.market.db) == Counter({PAID: 1})
        assert_ledger_agrees(shop, answer)


def test_settlers_racing_each_other_and_the_purchases_act_once(market: Market) -> None:
    """Eight settlers at once over orders left pending, while each order's own purchase
    tries to capture it and mark it paid: every order ends once, paid or void, and the
    stock and the ledger say the same."""
    seller = market.user("seller")
    item_id = market.item(seller, quantity=50)
    checkout = market.buyer_server.app.checkout  # type: ignore[attr-defined]
    gate = accounts.SessionGate(market.db, "buyer", accounts.SessionPolicy())
    opened, buyers = [], []
    for _ in range(6):
        buyer = market.user("buyer")
        buyer.call("add_to_cart", {"item_id": item_id, "quantity": 2})
        order = gate.run(buyer.token or "", True, lambda tx, s: purchases.open_order(tx, s, None))
        checkout.processor.authorise(order.payment_key, order.buyer_id, order.total_cents,
                                     Card(CARD["card_name"], CARD["card_number"], CARD["card_expiry"]))
        opened.append(order)
        buyers.append(buyer)
    start = threading.Barrier(8 + len(opened))
    paid: list[bool] = []

    def settle() -> None:
        start.wait()
        checkout.settle_due(pending_for_s=0)

    def purchase_goes_on(order: purchases.OpenOrder) -> None:
        start.wait()
        try:
            checkout.processor.capture(order.payment_key)
        except PaymentRefusedError:  # a settler voided it first: its purchase ends there
            return
        paid.append(True)
        market.db.run(lambda tx: purchases.complete(tx, order))

    threads = [threading.Thread(target=settle) for _ in range(8)]
    threads += [threading.Thread(target=purchase_goes_on, args=(order,)) for order in opened]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    checkout.settle_due(pending_for_s=0)  # what a settler moved to voiding after the others looked
    statuses = order_statuses(market.db)
    assert statuses[PAID] == len(paid) and statuses[PAID] + statuses["void"] == len(opened), statuses
    states = Counter(p.state for p in ledger_of(market.db))
    assert states == Counter({CAPTURED: len(paid), VOIDED: len(opened) - len(paid)})
    assert market.user("buyer").call("get_item", {"item_id": item_id})["quantity"] == 50 - 2 * len(paid)
    # a paid order's lines left its buyer's cart (emptied once, by its purchase or a settler);
    # an undone one's cart is as it was
    bought = {row.buyer_id for row in market.db.run(
        lambda tx: tx.execute(select(orders.c.buyer_id).where(orders.c.status == PAID)).all(), write=False)}
    for buyer in buyers:
        cart = [line["quantity"] for line in buyer.call("display_cart")["cart"]["items"]]
        assert cart == ([] if buyer.user_id in bought else [2])  # type: ignore[attr-defined]
    assert audit(market.db) == []


class SlowProcessor:
    """The simulated processor answering each authorisation after `delay_s`, as one across
    the internet may."""

    def __init__(self, inner: SimulatedProcessor, delay_s: float) -> None:
        self.inner, self.delay_s = inner, delay_s

    def authorise(self, key: str, buyer_id: int, amount_cents: int, card: Card) -> None:
        time.sleep(self.delay_s)
        self.inner.authorise(key, buyer_id, amount_cents, card)

    def capture(self, key: str) -> None:
        self.inner.capture(key)

    def void(self, key: str) -> None:
        self.inner.void(key)


def test_a_request_sent_behind_a_purchase_on_one_connection_is_answered_after_it(database: Database) -> None:
    """A purchase waiting on the processor holds its connection's later requests: answers
    come in the order asked, the cart shown after the purchase is empty."""
    processor = SlowProcessor(SimulatedProcessor(Ledger(database)), delay_s=0.5)
    with running_market(database, processor=processor) as market:
        seller, buyer = market.user("seller"), market.user("buyer")
        buyer.call("add_to_cart", {"item_id": market.item(seller), "quantity": 2})
        with socket.create_connection(market.buyer_server.address, timeout=10) as sock:
            asked = [("make_purchase", CARD), ("display_cart", {})]
            sock.sendall(b"".join(encode_frame({"id": n, "op": op, "token": buyer.token, "args": args})
                                  for n, (op, args) in enumerate(asked)))
            purchase, cart = read_messages(sock, 2)
    assert (purchase["id"], purchase["ok"], cart["id"]) == (0, True, 1), (purchase, cart)
    assert cart["result"]["cart"]["items"] == []
