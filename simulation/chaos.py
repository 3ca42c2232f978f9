"""python -m simulation.chaos: buyers purchase in a loop while the buyer server is killed
(SIGKILL) every second or so and started again on the same port.

Each buyer retries a purchase with the same idempotency key until it hears an answer, as a
patient client would. At the end the script waits for the settler, then compares what the
buyers were told with the payment processor's ledger and runs the audit. It prints the
number of kills, purchases acknowledged, mismatches (must be 0) and the audit's verdict;
the exit status is 0 only when both are clean.
"""
from __future__ import annotations

import argparse
import os
import random
import secrets
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import select

from db import Database
from db.ledger import CAPTURED, Ledger
from db.purchases import COMPLETED, PAID, VOID
from db.schema import orders
from operate.audit import AckedOrder, audit
from runtime.config import env, positive_int
from wire import Connection, ProtocolError

from .servers import Address, start_server

CARD = {"card_name": "Chaos Buyer", "card_number": "4111111111111111", "card_expiry": "12/39"}
PASSWORD = "chaos-password"
SETTLE_ENV = {"MARKET_SETTLE_AFTER_S": "2", "MARKET_SETTLE_PERIOD_S": "0.5"}
GIVE_UP_S = 60.0  # a call unanswered this long (through restarts) is reported, not retried


@dataclass
class Buyer:
    """One client buying in a loop; what it was told, by order id."""

    name: str
    address: Address
    acked: dict[int, dict[str, Any]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def run(self, stop: threading.Event, item_ids: list[int]) -> None:
        conn = Connection(*self.address, timeout=10)
        try:
            self._patiently(lambda: conn.call("create_account", {"username": self.name, "password": PASSWORD,
                                                                 "name": self.name}))
            self._log_in(conn)
            n = 0
            while not stop.is_set():
                n += 1
                self._patiently(lambda: conn.call("add_to_cart", {"item_id": random.choice(item_ids),
                                                                  "quantity": 1}))
                purchase = {**CARD, "idempotency_key": f"{self.name}-{n}"}
                receipt = self._patiently(lambda: conn.call("make_purchase", purchase))  # noqa: B023
                self.acked[receipt["order_id"]] = receipt
        except Exception as exc:  # noqa: BLE001 - reported at the end
            self.failures.append(f"{self.name}: {exc!r}")
        finally:
            conn.close()

    def _log_in(self, conn: Connection) -> None:
        conn.token = self._patiently(lambda: conn.call("login", {"username": self.name,
                                                                 "password": PASSWORD}))["token"]

    def _patiently(self, call: Any) -> Any:
        """The call, asked again while the server is away or says to retry."""
        deadline = time.monotonic() + GIVE_UP_S
        while True:
            try:
                return call()
            except (OSError, ProtocolError) as exc:
                retry = isinstance(exc, OSError) or exc.retryable
                if not retry or time.monotonic() > deadline:
                    if isinstance(exc, ProtocolError) and exc.code == "CONFLICT":
                        return {}  # create_account asked again after it had committed
                    raise
                time.sleep(0.05)


def mismatches(database: Database, ledger: Ledger, buyers: list[Buyer]) -> list[str]:
    """What the buyers were told against the ledger: every acknowledged order captured once,
    for its total; every capture an order some buyer was told of."""
    captured = {p.payment_key: p for p in ledger.entries() if p.state == CAPTURED}
    query = select(orders.c.order_id, orders.c.payment_key, orders.c.total_cents, orders.c.status)
    rows = database.run(lambda tx: tx.execute(query).all(), write=False)
    by_id = {row.order_id: row for row in rows}
    told = {order_id: receipt for buyer in buyers for order_id, receipt in buyer.acked.items()}
    found = []
    for order_id, receipt in sorted(told.items()):
        row = by_id.get(order_id)
        payment = captured.pop(row.payment_key, None) if row else None
        if row is None or row.status not in COMPLETED or payment is None or payment.captures != 1:
            found.append(f"order {order_id}: acknowledged, but {'missing' if row is None else row.status}, "
                         f"payment {payment.state if payment else 'not captured'}")
        elif f"{payment.amount_cents / 100:.2f}" != receipt["total"]:
            found.append(f"order {order_id}: told {receipt['total']}, captured {payment.amount_cents} cents")
    found += [f"payment {key}: captured, but no buyer was told of its order" for key in captured]
    return found


def settle_wait(database: Database, within_s: float = 60.0) -> None:
    """Until every order is paid or void (the settler of the last server started)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        statuses = set(database.run(lambda tx: tx.execute(select(orders.c.status).distinct()).scalars().all(),
                                    write=False))
        if statuses <= {PAID, VOID}:
            return
        time.sleep(0.2)


def run(db_url: str, seconds: float, buyers_count: int, kill_every_s: float, log_dir: Path) -> int:
    """The chaos run; its exit status."""
    server_env = {**os.environ, **SETTLE_ENV}
    seller_proc, seller_addr = start_server("seller", db_url, log_dir / "seller_server.log", env=server_env)
    buyer_proc, buyer_addr = start_server("buyer", db_url, log_dir / "buyer_server.log", env=server_env)
    kills = 0
    try:
        item_ids = _list_items(seller_addr)
        buyers = [Buyer(f"chaos{secrets.token_hex(4)}", buyer_addr) for _ in range(buyers_count)]
        stop = threading.Event()
        threads = [threading.Thread(target=b.run, args=(stop, item_ids), daemon=True) for b in buyers]
        for thread in threads:
            thread.start()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(random.uniform(0.5, 1.5) * kill_every_s)
            buyer_proc.kill()
            buyer_proc.wait()
            kills += 1
            buyer_proc, _ = start_server("buyer", db_url, log_dir / "buyer_server.log", buyer_addr[1],
                                         server_env)
        stop.set()
        for thread in threads:
            thread.join(GIVE_UP_S + 15)
        return _report(db_url, buyers, kills)  # the last buyer server settles what a kill cut off
    finally:
        for proc in (buyer_proc, seller_proc):
            proc.terminate()
            proc.wait(20)


def _report(db_url: str, buyers: list[Buyer], kills: int) -> int:
    """Once settled, compare and audit; print it all."""
    database = Database(db_url, pool_size=2)
    payments_url = os.environ.get("MARKET_PAYMENTS_URL")  # the servers' ledger, if kept apart
    ledger_db = Database(payments_url, pool_size=2) if payments_url else database
    try:
        settle_wait(database)
        ledger = Ledger(ledger_db)
        found = mismatches(database, ledger, buyers)
        told = [AckedOrder(order_id, _buyer_id(database, order_id), _lines(receipt))
                for b in buyers for order_id, receipt in b.acked.items()]
        violations = audit(database, [order for order in told if order.buyer_id], ledger.entries())
        failures = [f for b in buyers for f in b.failures]
    finally:
        database.close()
        if ledger_db is not database:
            ledger_db.close()
    print(f"kills: {kills}")
    print(f"purchases acknowledged: {len(told)}")
    print(f"mismatches: {len(found)}")
    for line in found[:20]:
        print(f"  {line}")
    print(f"audit: {'passed' if not violations else f'{len(violations)} violations'}")
    for line in violations[:20]:
        print(f"  {line}")
    for line in failures[:10]:
        print(f"client failure: {line}")
    return 0 if not found and not violations and not failures else 1


def _buyer_id(database: Database, order_id: int) -> int:
    """The order's buyer (the client knows its receipt, not its user id)."""
    found = database.run(lambda tx: tx.execute(select(orders.c.buyer_id).where(orders.c.order_id == order_id))
                         .scalar(), write=False)
    return int(found or 0)


def _lines(receipt: dict[str, Any]) -> dict[int, int]:
    return {line["item_id"]: line["quantity"] for line in receipt["lines"]}


def _list_items(address: Address) -> list[int]:
    seller = Connection(*address, timeout=10)
    name = f"chaosseller{secrets.token_hex(4)}"
    seller.call("create_account", {"username": name, "password": PASSWORD, "name": name})
    seller.token = seller.call("login", {"username": name, "password": PASSWORD})["token"]
    ids = [int(seller.call("put_item", {"name": f"Chaos {n}", "category": 1, "keywords": ["chaos"],
                                        "condition": "new", "price": f"{n + 1}.50",
                                        "quantity": 1_000_000})["item_id"]) for n in range(5)]
    seller.close()
    return ids


def main(argv: list[str] | None = None) -> int:
    """Entry point: python -m simulation.chaos --seconds 60 [--db-url URL]."""
    parser = argparse.ArgumentParser(prog="python -m simulation.chaos", description=__doc__.splitlines()[0])
    parser.add_argument("--db-url", default=env("MARKET_DB_URL"),
                        help="the database (default: a new SQLite file in a temporary folder)")
    parser.add_argument("--seconds", type=positive_int, default=60, help="how long the buyers buy")
    parser.add_argument("--buyers", type=positive_int, default=4)
    parser.add_argument("--kill-every", type=float, default=1.0, metavar="S",
                        help="seconds between kills of the buyer server, on average")
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="market-chaos-"))  # kept: the servers' logs
    db_url = args.db_url or f"sqlite:///{folder / 'chaos.db'}"
    print(f"chaos: {args.seconds} s, {args.buyers} buyers, a kill every ~{args.kill_every:g} s; "
          f"server logs in {folder}", flush=True)
    return run(db_url, args.seconds, args.buyers, args.kill_every, folder)


if __name__ == "__main__":
    sys.exit(main())
