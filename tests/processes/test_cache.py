"""The catalogue read cache (MARKET_CACHE=one-host): answers served again only while fresh.

The rule: a read sent after a write was answered, to any server process of the host, never
returns older data. Proved with real processes (two buyer and two seller servers on one
database), many threads writing and reading at once; also the bound on memory, the token
checked on every hit, and the refusal of any mode but off and one-host.
"""
from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from support import CARD, PASSWORD, Market, ServerProcess, running_market, unique_name

from db import Database
from db.cache import Generations, ReadCache
from db.engine import driver_url
from runtime.config import Settings
from wire import Connection
from wire.errors import UnauthenticatedError

CACHED = Settings(role="buyer", cache="one-host")


@pytest.fixture
def cached_market(database: Database, tmp_path: Path) -> Iterator[Market]:
    """Both servers in this process, the cache on, counters in a file of the test's own."""
    settings = replace(CACHED, cache_file=str(tmp_path / "counters"))
    with running_market(database, settings) as m:
        yield m


def test_a_repeated_read_is_answered_from_the_cache_until_a_write_changes_it(cached_market: Market) -> None:
    seller, buyer = cached_market.user("seller"), cached_market.user("buyer")
    item = cached_market.item(seller)
    first = buyer.call("get_item", {"item_id": item})
    cache = cached_market.buyer_server.app.cache
    hits_before = cache.hits
    assert buyer.call("get_item", {"item_id": item}) == first
    assert cache.hits == hits_before + 1
    seller.call("change_price", {"item_id": item, "price": "99.00"})
    assert buyer.call("get_item", {"item_id": item})["price"] == "99.00"


def test_a_logged_out_token_is_refused_even_for_a_cached_read(cached_market: Market) -> None:
    seller, buyer = cached_market.user("seller"), cached_market.user("buyer")
    item = cached_market.item(seller)
    buyer.call("get_item", {"item_id": item})
    other = cached_market.connect("buyer")
    other.token = buyer.token
    other.call("logout")
    with pytest.raises(UnauthenticatedError):
        buyer.call("get_item", {"item_id": item})


def test_a_sellers_own_listing_and_rating_are_not_served_to_another_seller(cached_market: Market) -> None:
    first, second = cached_market.user("seller"), cached_market.user("seller")
    cached_market.item(first)
    assert len(first.call("display_items")["items"]) == 1
    assert second.call("display_items")["items"] == []
    assert first.call("get_seller_rating")["seller_id"] == first.user_id
    assert second.call("get_seller_rating")["seller_id"] == second.user_id


def test_the_cache_holds_no_more_bytes_than_its_bound(tmp_path: Path) -> None:
    cache = ReadCache(Generations(str(tmp_path / "counters")), max_bytes=50_000)
    answer = {"items": [{"name": "x" * 200, "item_id": n} for n in range(10)]}
    for n in range(1_000):
        tags, _ = cache.lookup(("search_items", None, n), (0, 1))
        cache.keep(("search_items", None, n), tags, answer)
    assert 40_000 < cache.size_bytes <= 50_000
    tags, kept = cache.lookup(("search_items", None, 999), (0, 1))
    assert kept == answer
    assert cache.lookup(("search_items", None, 0), (0, 1))[1] is None  # the oldest went


def test_counters_bumped_by_one_process_are_seen_by_another(tmp_path: Path) -> None:
    path = str(tmp_path / "counters")
    mine = Generations(path)
    before = mine.read((0, 1, 7))
    script = "import sys; from db.cache import Generations; Generations(sys.argv[1]).bump((1, 7))"
    subprocess.run([sys.executable, "-c", script, path], check=True, timeout=60)
    assert mine.read((0, 1, 7)) == (before[0], before[1] + 1, before[2] + 1)


def test_bumps_from_many_threads_and_processes_are_never_lost(tmp_path: Path) -> None:
    path = str(tmp_path / "counters")
    script = ("import sys, threading; from db.cache import Generations; g = Generations(sys.argv[1])\n"
              "def run():\n    for _ in range(500): g.bump((3,))\n"
              "ts = [threading.Thread(target=run) for _ in range(4)]\n"
              "[t.start() for t in ts]; [t.join() for t in ts]")
    procs = [subprocess.Popen([sys.executable, "-c", script, path]) for _ in range(3)]
    assert [p.wait(timeout=60) for p in procs] == [0, 0, 0]
    assert Generations(path).read((3,)) == (3 * 4 * 500,)


@pytest.mark.parametrize("mode", ["on", "redis", "ONE-HOST"])
def test_a_cache_mode_other_than_off_or_one_host_is_refused_in_one_line(mode: str, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "buyer_server", "--port", "0", "--db-url",
                           f"sqlite:///{tmp_path / 'm.db'}"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "MARKET_CACHE": mode})
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert f"--cache {mode}: one of off, one-host" in done.stderr


def test_a_counters_file_the_server_cannot_open_is_named_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "seller_server", "--port", "0", "--db-url",
                           f"sqlite:///{tmp_path / 'm.db'}", "--cache", "one-host"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "MARKET_CACHE_COUNTERS": str(tmp_path / "no" / "counters")})
    assert done.returncode == 2
    assert done.stderr.strip() == (f"error: seller server: cannot use the read cache's counters file "
                                   f"{tmp_path / 'no' / 'counters'}: No such file or directory")


# --- the rule, with real processes -------------------------------------------------------------


class Cluster:
    """Two buyer and two seller server processes over one database, the cache on."""

    def __init__(self, db_url: str, counter_file: Path) -> None:
        os.environ["MARKET_CACHE_COUNTERS"] = str(counter_file)  # read by the servers started now
        try:
            # the tests sign up from 8 threads at once: each waits for a hashing thread
            # rather than being turned away, however slow the machine
            limits = {"MARKET_HASH_QUEUE": "32", "MARKET_HASH_QUEUE_PER_ADDRESS": "32"}
            self.servers = {role: [ServerProcess(role, db_url, 0, "--cache", "one-host", **limits)
                                   for _ in range(2)] for role in ("buyer", "seller")}
            for server in self.all():
                server.wait_ready()
        finally:
            del os.environ["MARKET_CACHE_COUNTERS"]

    def all(self) -> list[ServerProcess]:
        return [s for servers in self.servers.values() for s in servers]

    def user(self, role: str, process: int) -> Connection:
        """A connection to one process of the role, logged in as a new user."""
        conn = self.servers[role][process].connect()
        name = unique_name(role)
        conn.user_id = conn.call("create_account",  # type: ignore[attr-defined]
                                 {"username": name, "password": PASSWORD, "name": name})["user_id"]
        conn.token = conn.call("login", {"username": name, "password": PASSWORD})["token"]
        return conn

    def stop(self) -> None:
        for server in self.all():
            server.stop()


@pytest.fixture
def cluster(db_url: str, tmp_path: Path) -> Iterator[Cluster]:
    started = Cluster(db_url, tmp_path / "counters")
    yield started
    started.stop()


def _item(seller: Connection, keyword: str, quantity: int) -> int:
    args = {"name": "Lamp", "category": 3, "keywords": [keyword], "condition": "new", "price": "1.00",
            "quantity": quantity}
    return int(seller.call("put_item", args)["item_id"])


def _listed(conn: Connection, op: str, args: dict[str, Any], item_id: int) -> dict[str, Any] | None:
    """The item as a listing (search page or display_items) shows it; None when absent."""
    found = [i for i in conn.call(op, {**args, "limit": 100})["items"] if i["item_id"] == item_id]
    return found[0] if found else None


class Writer:
    """A seller (on seller process 0) and a buyer (on buyer process 0) writing to their own item;
    after each answered write, every cached read it changes is made on the other processes."""

    def __init__(self, cluster: Cluster, n: int) -> None:
        self.keyword = f"k{n}p{os.getpid() % 10_000}"
        self.seller, self.buyer = cluster.user("seller", 0), cluster.user("buyer", 0)
        self.quantity, self.price = 1000, 100
        self.item = _item(self.seller, self.keyword, self.quantity)
        self.readers = {"buyer": cluster.user("buyer", 1), "seller": cluster.servers["seller"][1].connect()}
        self.readers["seller"].token = self.seller.token  # the same seller, on the other process
        self.stale: list[str] = []

    def step(self, n: int) -> None:
        """One write of each kind, each followed at once by every cached read it changes."""
        self.price += 1
        self.seller.call("change_price", {"item_id": self.item, "price": f"{self.price}.00"})
        self.expect(lambda item: item["price"] == f"{self.price}.00", f"change_price {self.price}")
        self.seller.call("remove_item", {"item_id": self.item, "quantity": 1})
        self.quantity -= 1
        self.expect(lambda item: item["quantity"] == self.quantity, "remove_item")
        self.buyer.call("add_to_cart", {"item_id": self.item, "quantity": 1})
        assert self.buyer.call("make_purchase", CARD)["lines"][0]["item_id"] == self.item
        self.quantity -= 1
        self.expect(lambda item: item["quantity"] == self.quantity, "make_purchase")
        self.expect_rating(lambda r: r["items_sold"] == n + 1, "make_purchase")
        if n == 0:  # one vote per purchased item
            self.buyer.call("provide_feedback", {"item_id": self.item, "vote": "up"})
            self.expect(lambda item: item["thumbs_up"] == 1, "provide_feedback")
            self.expect_rating(lambda r: r["thumbs_up"] == 1, "provide_feedback")
        self.expect_new_item_listed_then_gone()

    def expect_new_item_listed_then_gone(self) -> None:
        """put_item shows in every listing at once; a remove_item that sells it out leaves them."""
        new = _item(self.seller, self.keyword, 1)
        for op, args in self.listings():
            if _listed(self.readers[_role_of(op)], op, args, new) is None:
                self.stale.append(f"put_item: {op} {args} misses item {new}")
        self.seller.call("remove_item", {"item_id": new, "quantity": 1})
        for op, args in self.listings():
            if _listed(self.readers[_role_of(op)], op, args, new) is not None:
                self.stale.append(f"remove_item of the last unit: {op} {args} still lists item {new}")

    def listings(self) -> list[tuple[str, dict[str, Any]]]:
        return [("search_items", {"keywords": [self.keyword]}), ("search_items", {"category": 3}),
                ("display_items", {})]

    def expect(self, fresh: Callable[[dict[str, Any]], bool], write: str) -> None:
        item = self.readers["buyer"].call("get_item", {"item_id": self.item})
        if not fresh(item):
            self.stale.append(f"{write}: get_item {item}")
        for op, args in self.listings():
            listed = _listed(self.readers[_role_of(op)], op, args, self.item)
            if listed is None or not fresh(listed):
                self.stale.append(f"{write}: {op} {args} {listed}")

    def expect_rating(self, fresh: Callable[[dict[str, Any]], bool], write: str) -> None:
        ratings = [self.readers["buyer"].call("get_seller_rating", {"seller_id": self.seller.user_id}),
                   self.readers["seller"].call("get_seller_rating")]
        self.stale += [f"{write}: get_seller_rating {r}" for r in ratings if not fresh(r)]


def _role_of(op: str) -> str:
    return "seller" if op == "display_items" else "buyer"


def _keep_warm(cluster: Cluster, writers: list[Writer], stop: threading.Event) -> int:
    """Make every cached read, on every process, over and over while the writers write, so that
    an entry a write should have dropped is there to be served. Returns the calls made."""
    buyers = [cluster.user("buyer", p) for p in (0, 1)]
    sellers = [cluster.servers["seller"][p].connect() for p in (0, 1)]
    for turn in itertools.count():
        if stop.is_set():
            return turn
        writer, buyer, seller = writers[turn % len(writers)], buyers[turn % 2], sellers[turn % 2]
        buyer.call("get_item", {"item_id": writer.item})
        for op, args in writer.listings()[:2]:
            buyer.call(op, {**args, "limit": 100})
        buyer.call("get_seller_rating", {"seller_id": writer.seller.user_id})
        seller.token = writer.seller.token
        seller.call("display_items", {"limit": 100})
        seller.call("get_seller_rating")
    return 0


@pytest.mark.slow
def test_no_read_on_another_process_returns_data_older_than_an_answered_write(cluster: Cluster) -> None:
    writers = [Writer(cluster, n) for n in range(6)]
    stop, deadline = threading.Event(), time.monotonic() + 5
    with ThreadPoolExecutor(len(writers) + 3) as pool:
        warmers = [pool.submit(_keep_warm, cluster, writers, stop) for _ in range(3)]

        def write(writer: Writer) -> int:
            steps = 0
            while time.monotonic() < deadline or steps < 2:
                writer.step(steps)
                steps += 1
            return steps

        try:
            steps = list(pool.map(write, writers))
        finally:
            stop.set()
        assert all(warmer.result() > 0 for warmer in warmers)
    assert min(steps) >= 2
    assert [stale for w in writers for stale in w.stale] == []


def test_a_logout_on_one_process_refuses_the_token_at_once_on_the_others(cluster: Cluster) -> None:
    seller = cluster.user("seller", 0)
    item = _item(seller, "logout", 5)

    def log_in_read_log_out(n: int) -> list[str]:
        wrong = []
        for _ in range(5):
            writer, reader = cluster.user("buyer", n % 2), cluster.servers["buyer"][1 - n % 2].connect()
            reader.token = writer.token
            for _ in range(3):  # the session is kept by the reader's process now
                reader.call("get_item", {"item_id": item})
            writer.call("logout")
            try:
                reader.call("get_item", {"item_id": item})
                wrong.append("a read after logout was answered")
            except UnauthenticatedError:
                pass
        return wrong

    with ThreadPoolExecutor(8) as pool:
        assert [w for wrong in pool.map(log_in_read_log_out, range(8)) for w in wrong] == []


def test_the_servers_do_answer_from_their_caches(cluster: Cluster, db_url: str) -> None:
    """A change made behind the servers' backs (plain SQL) is not seen until a write bumps:
    proof that the processes of the test above do serve cached answers."""
    seller, reader = cluster.user("seller", 0), cluster.user("buyer", 1)
    item = _item(seller, "behind", 5)
    assert reader.call("get_item", {"item_id": item})["price"] == "1.00"
    engine = create_engine(driver_url(db_url))
    with engine.begin() as conn:
        conn.execute(text("UPDATE items SET price_cents = 777 WHERE item_id = :i"), {"i": item})
    engine.dispose()
    assert reader.call("get_item", {"item_id": item})["price"] == "1.00"  # the cached answer
    seller.call("change_price", {"item_id": item, "price": "8.00"})
    assert reader.call("get_item", {"item_id": item})["price"] == "8.00"
