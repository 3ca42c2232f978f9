"""The load tools end to end at small sizes: market-sim on each database (starting the
servers itself, and driving running ones), the audit catching a corrupted database,
and a short headless locust run. No timing assertions.
"""
from __future__ import annotations

import contextlib
import csv
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text
from support import CARD, Link, Market, Relay, free_port, running_market

import simulation.__main__ as sim
from db import Database
from operate.audit import AckedOrder, audit
from runtime.server import ServerLimits
from simulation import scenario, series
from simulation.behaviour import Buyer, Call, Outcome, make_actor
from simulation.mixes import DEFAULT
from simulation.scenario import wait_for
from wire import Connection
from wire.errors import UnauthenticatedError

SMALL = ["--users", "2", "--calls", "20", "--repeats", "1", "--no-progress"]
SQLITE_ONLY = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
LOCUSTFILE = Path(__file__).resolve().parents[2] / "simulation" / "locustfile.py"


def _csv_rows(out: Path) -> dict[str, dict[str, str]]:
    with (out / "results.csv").open() as f:
        return {row["op"]: row for row in csv.DictReader(f)}


def test_market_sim_starts_the_servers_runs_and_finds_the_books_balanced(
        database: Database, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = sim.main([*SMALL, "--db-url", database.url, "--out", str(tmp_path)])
    output = capsys.readouterr().out
    assert code == 0, output
    assert "consistency: OK" in output
    assert "1 run, 80 calls in all: about 1 s to run (a guess at 1,500 calls/s)" in output  # before any
    assert "calls in" in output and "(set-up before: " in output  # the set-up's time, said apart
    rows = _csv_rows(tmp_path)
    assert rows["ALL"]["calls"] == str(2 * 2 * 20) and rows["ALL"]["errors"] == "0"
    for name in ("results.md", "latency.png", "throughput.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert "| default | 2 | ALL | 80 | 0 |" in (tmp_path / "results.md").read_text()


def test_market_sim_says_why_a_server_could_not_start(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'no such folder' / 'sim.db'}"
    assert sim.main([*SMALL, "--db-url", url, "--out", str(tmp_path / "out")]) == 3
    output = capsys.readouterr().out
    assert f"the servers cannot start: cannot use the database {url}: unable to open database file" in output


@pytest.mark.parametrize("flag", ["--tls-cert", "--tls-key"])
def test_market_sim_wants_both_tls_flags_or_neither(flag: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    # before: one of them alone was a TypeError from Popen once the run had begun
    with pytest.raises(SystemExit) as exit_:
        sim.main([*SMALL, flag, str(tmp_path / "x.pem"), "--out", str(tmp_path)])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith("error: --tls-cert and --tls-key go together")


@pytest.mark.parametrize(("flag", "value"), [("--repeats", "0"), ("--calls", "0"), ("--calls", "-5")])
def test_market_sim_counts_must_be_at_least_one(flag: str, value: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    # before: -r 0 started the servers and ended in a plotting traceback; -k 0 reported empty runs as OK
    with pytest.raises(SystemExit) as exit_:
        sim.main(["--no-progress", flag, value, "--out", str(tmp_path)])
    assert exit_.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err


def test_market_sim_drives_running_servers_with_the_classic_mix(
        market: Market, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    buyer, seller = (":".join(map(str, s.address)) for s in (market.buyer_server, market.seller_server))
    code = sim.main([*SMALL, "--mix", "classic", "--buyer", buyer, "--seller", seller,
                     "--db-url", market.db.url, "--out", str(tmp_path), "--allow-live"])
    assert code == 0
    assert "consistency: OK" in capsys.readouterr().out
    assert set(_csv_rows(tmp_path)) == {"get_seller_rating", "put_item", "display_items",
                                        "search_items", "ALL"}
    with market.db.engine.connect() as conn:  # what it made can be told from the marketplace's own
        names = conn.execute(text("SELECT username FROM users")).scalars().all()
        items = conn.execute(text("SELECT name FROM items")).scalars().all()
    assert names and all(name.startswith("loadtest-") for name in names)
    assert items and all(name.startswith("loadtest-") for name in items)


def test_market_sim_ping_mix_calls_ping_alone(market: Market, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    buyer, seller = (":".join(map(str, s.address)) for s in (market.buyer_server, market.seller_server))
    code = sim.main([*SMALL, "--mix", "ping", "--buyer", buyer, "--seller", seller,
                     "--db-url", market.db.url, "--out", str(tmp_path), "--allow-live"])
    assert code == 0
    assert "consistency: OK" in capsys.readouterr().out
    assert set(_csv_rows(tmp_path)) == {"ping", "ALL"}


def test_market_sim_refuses_servers_it_did_not_start_without_allow_live(
        market: Market, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    buyer, seller = (":".join(map(str, s.address)) for s in (market.buyer_server, market.seller_server))
    with pytest.raises(SystemExit) as exit_:
        sim.main([*SMALL, "--buyer", buyer, "--seller", seller, "--db-url", market.db.url,
                  "--out", str(tmp_path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "creates accounts and items named loadtest-" in err
    assert "--allow-live" in err
    with market.db.engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM users")).scalar_one() == 0


@SQLITE_ONLY
def test_market_sim_lists_violations_and_exits_non_zero(
        market: Market, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    market.user("seller")  # a seller of the market's own, whose count the run's audit finds wrong
    market.db.run(lambda tx: tx.execute(text("UPDATE users SET items_sold = 7 WHERE role = 'seller'")))
    buyer, seller = (":".join(map(str, s.address)) for s in (market.buyer_server, market.seller_server))
    code = sim.main([*SMALL, "--users", "1", "--buyer", buyer, "--seller", seller,
                     "--db-url", market.db.url, "--out", str(tmp_path), "--allow-live"])
    output = capsys.readouterr().out
    assert code == 1
    assert "consistency: 1 violations" in output and "items_sold 7 != 0 units in its order lines" in output


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
    ("DELETE FROM item_words", "item ITEM: word index rows differ from its name and keywords"),
    ("UPDATE items SET sold = sold + 1", "listed 5 != on sale 2 + sold 3 + removed 1"),
    ("UPDATE items SET quantity = -1", "quantity is negative (-1)"),
    ("UPDATE items SET thumbs_up = 2", "thumbs 2 up / 0 down != feedback rows 1 up / 0 down"),
    ("UPDATE users SET items_sold = 7 WHERE role = 'seller'", "items_sold 7 != 2 units in its order lines"),
    ("UPDATE order_lines SET quantity = 1", "lines {ITEM: 1} != acknowledged {ITEM: 2}"),
    ("DELETE FROM feedback", "!= feedback rows 0 up / 0 down"),
    ("UPDATE order_lines SET buyer_id = buyer_id + 1000", "the line says buyer"),
    ("UPDATE order_lines SET seller_id = seller_id + 1000", "its order and item say"),
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


def test_the_audit_catches_one_order_id_acknowledged_for_two_purchases(market: Market) -> None:
    item_id, order = _shop(market)
    other = AckedOrder(order.order_id, order.buyer_id, {item_id + 1: 2})
    for acknowledged in ([order, other], [other, order]):  # either order of the two answers
        assert any(f"acknowledged order {order.order_id}: told to buyer" in violation
                   for violation in audit(market.db, acknowledged)), acknowledged
    assert audit(market.db, [order, order]) == []  # an idempotent retry told the same purchase twice


@pytest.mark.parametrize("corruption", [
    "DELETE FROM item_keyword_pairs WHERE first_keyword = 'b'",  # a pair lost
    "UPDATE item_keyword_pairs SET second_keyword = 'd' WHERE first_keyword = 'a' AND second_keyword = 'c'",
    "INSERT INTO item_keyword_pairs (first_keyword, second_keyword, item_id) VALUES ('a', 'z', ITEM)",
])
def test_the_audit_catches_a_keyword_pair_index_that_differs_from_the_keywords(
        market: Market, corruption: str) -> None:
    item_id = market.item(market.user("seller"), keywords=["c", "b", "a"])
    assert audit(market.db) == []
    with market.db.engine.begin() as conn:
        conn.execute(text(corruption.replace("ITEM", str(item_id))))
    assert audit(market.db) == [f"item {item_id}: search index rows differ from its keywords (on sale: 5)"]


@SQLITE_ONLY
def test_locust_headless_run_reports_every_op_without_failures(market: Market, tmp_path: Path) -> None:
    # the addresses come from a .env file in the working folder, as .env.example says they may
    (tmp_path / ".env").write_text(f"MARKET_BUYER_ADDR={':'.join(map(str, market.buyer_server.address))}\n"
                                   f"MARKET_SELLER_ADDR={':'.join(map(str, market.seller_server.address))}\n")
    env = {name: value for name, value in os.environ.items() if not name.startswith("MARKET_")}
    env["MARKET_LOCUST_ALLOW_LIVE"] = "1"
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


def test_locust_stops_with_one_line_unless_allowed_to_write_into_a_live_marketplace(tmp_path: Path) -> None:
    env = {name: value for name, value in os.environ.items() if not name.startswith("MARKET_")}
    command = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "-u", "1", "-r", "1",
               "-t", "2s"]
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "set MARKET_LOCUST_ALLOW_LIVE=1 to go ahead" in done.stderr.strip().splitlines()[-1]


def test_a_login_lost_to_a_dropped_connection_is_tried_again() -> None:
    port = free_port()  # nothing listens there: the connection is refused
    seller = make_actor("seller", "lost", random.Random(1))
    login = seller.login_call()
    outcome = seller.perform(Connection("127.0.0.1", port, timeout=2), login)
    assert outcome.kind == "CONNECTION"
    assert seller.next_call("ping") == login


class AnswerDropper(Relay):
    """A relay to a server that, once armed, hangs up instead of passing on the next answer:
    the server did the work, the client never hears of it. With `delay_s`, it holds the first
    answer it sees that long."""

    def __init__(self, upstream: tuple[str, int], delay_s: float = 0.0) -> None:
        self.armed, self.delay_s = threading.Event(), delay_s
        super().__init__(upstream, answers=self._answer)

    def _answer(self, data: bytes, link: Link) -> tuple[bytes, bool]:
        if self.armed.is_set():
            self.armed.clear()
            return b"", True
        if self.delay_s:
            time.sleep(self.delay_s)
            self.delay_s = 0.0
        return data, False


@contextlib.contextmanager
def logged_in_buyer(market: Market, name: str) -> Iterator[tuple[Buyer, Connection, AnswerDropper]]:
    """A simulated buyer, set up through a relay that can drop an answer."""
    buyer = Buyer(name, random.Random(2))
    relay = AnswerDropper(market.buyer_server.address)
    with Connection(*relay.address, timeout=10) as conn:
        for call in buyer.setup_calls():
            assert buyer.perform(conn, call).kind == "ok"
        yield buyer, conn, relay
    relay.close()


def test_a_logout_done_but_its_answer_lost_is_followed_by_a_login(market: Market) -> None:
    """The server ended the session, the answer never came: the next call is a login, not
    a run of UNAUTHENTICATED calls on a dead token (seen when a server instance was killed)."""
    with logged_in_buyer(market, "lostlogout") as (buyer, conn, relay):
        dead = conn.token
        relay.armed.set()
        assert buyer.perform(conn, buyer.plan("logout")).kind == "CONNECTION"
        assert not relay.armed.is_set(), "the relay dropped the logout's answer"
        with pytest.raises(UnauthenticatedError):
            market.connect("buyer").call("display_cart", token=dead)  # the logout did happen
        kinds = [buyer.perform(conn, buyer.next_call("display_cart")).kind for _ in range(3)]
        assert kinds == ["ok", "ok", "ok"]
        assert conn.token not in (None, dead)


def test_a_read_answered_only_when_sent_again_counts_as_an_error(market: Market) -> None:
    """The connection hides a lost connection by sending a read again: the simulator still
    sees it, so "no errors" also means no connection was dropped."""
    with logged_in_buyer(market, "resent") as (buyer, conn, relay):
        relay.armed.set()
        outcome = buyer.perform(conn, buyer.next_call("display_cart"))
        assert not relay.armed.is_set(), "the relay dropped the answer"
        assert outcome.kind == "RESENT" and outcome.result is not None and "cart" in outcome.result
        assert buyer.perform(conn, buyer.next_call("display_cart")).kind == "ok"


def test_an_answer_on_a_new_connection_counts_as_an_error_whatever_it_says(database: Database) -> None:
    """Before: a call the connection made on a new socket, the server having hung up between
    two calls, passed for a clean one (an expected CONFLICT too)."""
    with running_market(database, limits=ServerLimits(threads=4, idle_timeout_s=0.2)) as market:
        item_id = market.item(market.user("seller"), quantity=1)
        too_many = Call("add_to_cart", {"item_id": item_id, "quantity": 2})
        buyer = Buyer("redial", random.Random(2))
        with Connection(*market.buyer_server.address, timeout=10) as conn:
            for call in buyer.setup_calls():
                assert buyer.perform(conn, call).kind == "ok"
            assert buyer.perform(conn, too_many).kind == "conflict"
            for call in (too_many, buyer.next_call("display_cart")):
                time.sleep(1.5)  # the server closes a connection idle for 0.2 s (swept every 0.5 s)
                assert buyer.perform(conn, call).kind == "RESENT"


class ScriptedBuyer(Buyer):
    """A simulated buyer whose calls end as told, without a server."""

    def __init__(self, outcomes: list[Outcome]) -> None:
        super().__init__("loadtest-scripted", random.Random(1))
        self.outcomes = iter(outcomes)

    def perform(self, conn: Connection, call: Call) -> Outcome:
        return next(self.outcomes)


def test_an_error_is_counted_but_neither_timed_nor_in_the_throughput() -> None:
    """Before: a BUSY answered in no time went into the latencies and the calls per second,
    so a server failing fast looked faster (8,033 against 4,721 ops/s in one check)."""
    buyer = ScriptedBuyer([Outcome("BUSY", 0.0001), Outcome("ok", 0.005), Outcome("conflict", 0.004)])
    user = scenario.SimulatedUser(buyer, ("127.0.0.1", 9), DEFAULT, 3, threading.Barrier(1))
    for _ in range(3):
        user.record(None, Call("add_to_cart"))  # type: ignore[arg-type]
    entry = user.log["add_to_cart"]
    assert entry.latencies == [0.005, 0.004] and entry.errors == 1 and entry.conflicts == 1
    assert user.error_kinds == {"add_to_cart: BUSY": 1}


@SQLITE_ONLY
def test_a_run_whose_set_up_outlasts_the_barrier_fails_instead_of_counting_nothing(market: Market) -> None:
    """The seller waits at the start 0.3 s, the buyer's first answer comes after 1 s: the run
    raises, where it used to return an empty run of 0 calls that the report took as passed."""
    relay = AnswerDropper(market.buyer_server.address, delay_s=1.0)
    try:
        with pytest.raises(scenario.SimulationError, match="did not all finish setting up within 0.3 s"):
            scenario.run_once(DEFAULT, 1, 5, relay.address, market.seller_server.address, setup_timeout_s=0.3)
    finally:
        relay.close()


def test_an_unauthenticated_answer_is_counted_once_then_a_login_follows(market: Market) -> None:
    with logged_in_buyer(market, "expired") as (buyer, conn, _relay):
        market.connect("buyer").call("logout", token=conn.token)  # say, the session expired
        kinds = [buyer.perform(conn, buyer.next_call("display_cart")).kind for _ in range(4)]
        assert kinds == ["UNAUTHENTICATED", "ok", "ok", "ok"]


def test_waiting_for_the_users_does_not_spin_once_the_first_has_finished() -> None:
    """The first thread ends at once, the second after 0.6 s: about three reports, not thousands
    (a wait that joined the finished thread again and again spun, holding the GIL)."""
    release = threading.Event()
    threads = [threading.Thread(target=lambda: None), threading.Thread(target=release.wait)]
    for thread in threads:
        thread.start()
    threads[0].join()
    threading.Timer(0.6, release.set).start()
    reports: list[bool] = []
    wait_for(threads, lambda: reports.append(threads[1].is_alive()), every_s=0.2)
    assert not any(thread.is_alive() for thread in threads)
    assert 2 <= len(reports) <= 10 and reports[-1] is False


def test_buyers_add_only_items_with_units_left_and_pick_them_evenly() -> None:
    from collections import Counter

    from simulation.behaviour import Buyer

    buyer = Buyer("b", random.Random(7))
    assert buyer.plan("add_to_cart").op == "search_items"  # knows no item yet
    buyer.known = {n: {"item_id": n, "seller_id": 1, "quantity": 2} for n in range(1, 11)}
    buyer.cart = {n: 2 for n in range(1, 8)}  # items 1-7: every unit already in the cart
    picks = Counter(buyer.plan("add_to_cart").args["item_id"] for _ in range(3000))
    assert set(picks) == {8, 9, 10}
    assert all(800 < count < 1200 for count in picks.values())  # 1,000 each if even
    buyer.cart.update({8: 2, 9: 2, 10: 2})
    assert buyer.plan("add_to_cart").op == "search_items"


def test_the_simulators_set_up_waits_out_a_full_hashing_queue(database: Database) -> None:
    """Twenty users signing up at once against a queue of one hash: every one gets set up,
    each BUSY answer tried again after a pause, and the run itself counts no error."""
    from runtime.config import Settings

    with running_market(database, Settings(role="buyer", hash_queue=1)) as market:
        result = scenario.run_once(DEFAULT, 10, 5, market.buyer_server.address, market.seller_server.address)
    assert not result.error_kinds, result.error_kinds
    assert sum(len(log.latencies) for log in result.ops.values()) == 2 * 10 * 5


def _result(users: int, elapsed_s: float, setup_s: float = 0.0, setup_busy: int = 0,
            mix: str = "default") -> scenario.RunResult:
    from collections import Counter

    log = scenario.OpLog(latencies=[0.001] * (2 * users * 100))
    return scenario.RunResult(mix, users, 0, elapsed_s, {"ping": log}, Counter(), [], [],
                              setup_s=setup_s, setup_busy=setup_busy)


def test_a_run_says_how_long_its_set_up_took_and_what_waited_on_the_servers_limits() -> None:
    # before: a run of 0.36 s under a progress bar that said 5 s, the sign-ups' waits unsaid
    line = series.describe(_result(2, 0.36, setup_s=4.6, setup_busy=37))
    assert "400 calls in 0.36 s" in line
    assert ("(set-up before: 4.60 s; 37 sign-ups and logins answered BUSY by the server's limits of "
            "password hashing, sent again after a pause)") in line
    assert "answered BUSY" not in series.describe(_result(2, 0.36, setup_s=0.1))


def test_the_length_of_a_series_is_estimated_before_it_starts_and_again_as_it_goes() -> None:
    # before: plain market-sim started 1, 10, 100 users x 1,000 calls x 10 runs without a word
    runs = [("default", users, run) for users in (1, 10, 100) for run in range(10)]
    assert series.estimate(runs, 1000, []) == (
        "about 36 min to run (a guess at 1,500 calls/s); -n, -k and -r make it shorter")
    measured = [_result(1, 2.0, setup_s=0.5)]  # 100 calls/s at N=1; 0.25 s of set-up per user
    left = [("default", 1, 1), ("default", 10, 0)]
    # 2 x (100 / 100 + 0.25) = 2.5 s, and N=10 at N=1's rate: 20 x 1.25 = 25 s
    assert series.estimate(left, 100, measured) == "about 28 s left (measured so far)"
    # N=10 measured at 2,000 calls/s, no set-up: 20 x 0.05 = 1 s
    assert series.estimate(left, 100, [*measured, _result(10, 1.0)]) == "about 4 s left (measured so far)"


def test_plots_draw_bars_for_one_user_count_and_lines_for_several(tmp_path: Path) -> None:
    from simulation.report import op_groups, plot_latency, plot_throughput
    from simulation.stats import summarise

    groups = op_groups("default", {"put_item", "search_items", "ping", "ALL"})
    assert groups == [("seller ops", ["put_item"]), ("buyer ops", ["search_items"]),
                      ("ops of both roles", ["ping", "ALL"])]
    for counts in ([5], [1, 5, 20]):
        rows = summarise([_result(n, 1.0) for n in counts])
        plot_latency(rows, tmp_path / f"latency{len(counts)}.png")
        plot_throughput(rows, tmp_path / f"throughput{len(counts)}.png")
        assert (tmp_path / f"latency{len(counts)}.png").stat().st_size > 0
        assert (tmp_path / f"throughput{len(counts)}.png").stat().st_size > 0
