"""The load tools end to end at small sizes: market-sim on each database (starting the
servers itself, and driving running ones), the audit catching a corrupted database,
and a short headless locust run. No timing assertions.
"""
from __future__ import annotations

import csv
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CARD, Market
from sqlalchemy import text

import simulation.__main__ as sim
from db import Database
from db.audit import AckedOrder, audit
from simulation.behaviour import make_actor
from simulation.mixes import DEFAULT
from wire import Connection

SMALL = ["--users", "2", "--calls", "20", "--repeats", "1", "--no-progress"]
SQLITE_ONLY = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
LOCUSTFILE = Path(__file__).resolve().parent.parent / "simulation" / "locustfile.py"


def _csv_rows(out: Path) -> dict[str, dict[str, str]]:
    with (out / "results.csv").open() as f:
        return {row["op"]: row for row in csv.DictReader(f)}


def test_market_sim_starts_the_servers_runs_and_finds_the_books_balanced(
        db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = sim.main([*SMALL, "--db-url", db_url, "--out", str(tmp_path)])
    output = capsys.readouterr().out
    assert code == 0, output
    assert "consistency: OK" in output
    rows = _csv_rows(tmp_path)
    assert rows["ALL"]["calls"] == str(2 * 2 * 20) and rows["ALL"]["errors"] == "0"
    for name in ("results.md", "latency.png", "throughput.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert "| default | 2 | ALL | 80 | 0 |" in (tmp_path / "results.md").read_text()


def test_market_sim_drives_running_servers_with_the_classic_mix(
        market: Market, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    buyer, seller = (":".join(map(str, s.address)) for s in (market.buyer_server, market.seller_server))
    code = sim.main([*SMALL, "--mix", "classic", "--buyer", buyer, "--seller", seller,
                     "--db-url", market.db.url, "--out", str(tmp_path)])
    assert code == 0
    assert "consistency: OK" in capsys.readouterr().out
    assert set(_csv_rows(tmp_path)) == {"get_seller_rating", "put_item", "display_items",
                                        "search_items", "ALL"}


@SQLITE_ONLY
def test_market_sim_lists_violations_and_exits_non_zero(
        market: Market, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sim, "audit", lambda database, acknowledged: ["item 1: sold 2 != 1 units"])
    buyer, seller = (":".join(map(str, s.address)) for s in (market.buyer_server, market.seller_server))
    code = sim.main([*SMALL, "--users", "1", "--buyer", buyer, "--seller", seller,
                     "--db-url", market.db.url, "--out", str(tmp_path)])
    output = capsys.readouterr().out
    assert code == 1
    assert "consistency: 1 violations" in output and "item 1: sold 2 != 1 units" in output


def _shop(market: Market) -> tuple[int, AckedOrder]:
    seller, buyer = market.user("seller"), market.user("buyer")
    item_id = market.item(seller, quantity=5)
    buyer.call("add_to_cart", {"item_id": item_id, "quantity": 2})
    receipt = buyer.call("make_purchase", CARD)
    buyer.call("provide_feedback", {"item_id": item_id, "vote": "up"})
    seller.call("remove_item", {"item_id": item_id, "quantity": 1})
    return item_id, AckedOrder(receipt["order_id"], buyer.user_id, {item_id: 2})  # type: ignore[attr-defined]


CORRUPTIONS = [  # applied one after another; each must add its own violation
    ("DELETE FROM item_keywords", "item ITEM: search index rows differ from its keywords"),
    ("UPDATE items SET sold = sold + 1", "listed 5 != on sale 2 + sold 3 + removed 1"),
    ("UPDATE items SET quantity = -1", "quantity is negative (-1)"),
    ("UPDATE items SET thumbs_up = 2", "thumbs 2 up / 0 down != feedback rows 1 up / 0 down"),
    ("UPDATE users SET items_sold = 7 WHERE role = 'seller'", "items_sold 7 != 2 units in its order lines"),
    ("UPDATE order_lines SET quantity = 1", "lines {ITEM: 1} != acknowledged {ITEM: 2}"),
    ("DELETE FROM feedback", "!= feedback rows 0 up / 0 down"),
]


def test_the_audit_catches_rows_corrupted_behind_the_servers_back(market: Market) -> None:
    item_id, order = _shop(market)
    assert audit(market.db, [order]) == []
    for corruption, expected in CORRUPTIONS:
        with market.db.engine.begin() as conn:
            conn.execute(text(corruption))
        violations = audit(market.db, [order])
        assert any(expected.replace("ITEM", str(item_id)) in v for v in violations), (corruption, violations)


def test_the_audit_misses_no_acknowledged_order(database: Database) -> None:
    assert audit(database, [AckedOrder(99, 1, {1: 1})]) == [
        "acknowledged order 99: missing from the orders table"]


@SQLITE_ONLY
def test_locust_headless_run_reports_every_op_without_failures(market: Market, tmp_path: Path) -> None:
    env = {**os.environ,
           "MARKET_BUYER_ADDR": ":".join(map(str, market.buyer_server.address)),
           "MARKET_SELLER_ADDR": ":".join(map(str, market.seller_server.address))}
    prefix = tmp_path / "locust"
    command = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "-u", "4", "-r", "4",
               "-t", "8s", "--csv", str(prefix), "--html", str(tmp_path / "locust.html"), "--only-summary"]
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(f"{prefix}_stats.csv") as f:
        stats = {row["Name"]: row for row in csv.DictReader(f)}
    every_op = {*DEFAULT.buyer, *DEFAULT.seller, "login"}  # (importing locust here would patch threads)
    assert every_op <= set(stats), sorted(every_op - set(stats))
    assert stats["Aggregated"]["Failure Count"] == "0", done.stderr[-3000:]


def test_a_login_lost_to_a_dropped_connection_is_tried_again() -> None:
    with socket.socket() as sock:  # a port with nothing listening: the connection is refused
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    seller = make_actor("seller", "lost", random.Random(1))
    login = seller.setup_calls()[1]
    outcome = seller.perform(Connection("127.0.0.1", port, timeout=2), login)
    assert outcome.kind == "CONNECTION"
    assert seller.next_call("ping") == login


def test_buyers_add_only_items_with_units_left_and_pick_them_evenly() -> None:
    from collections import Counter

    from simulation.behaviour import Buyer

    buyer = Buyer("b", random.Random(7))
    assert buyer._plan_add_to_cart().op == "search_items"  # knows no item yet
    buyer.known = {n: {"item_id": n, "seller_id": 1, "quantity": 2} for n in range(1, 11)}
    buyer.cart = {n: 2 for n in range(1, 8)}  # items 1-7: every unit already in the cart
    picks = Counter(buyer._plan_add_to_cart().args["item_id"] for _ in range(3000))
    assert set(picks) == {8, 9, 10}
    assert all(800 < count < 1200 for count in picks.values())  # 1,000 each if even
    buyer.cart.update({8: 2, 9: 2, 10: 2})
    assert buyer._plan_add_to_cart().op == "search_items"
