"""`python -m simulation.opcost`: what each op costs the server, one call at a time.

Builds both servers' apps in this process over one database (no sockets: the server loop is
left out, `--mix ping` of market-sim measures that) and calls every op of the default mix
--calls times per round, on one thread. For each op it reports the median over the rounds of
the CPU the call took on that thread (framing aside, everything the server does for it), its
wall time, and, when the database is a MariaDB on this machine, the CPU mariadbd used meanwhile
(10 ms ticks spread over the calls). Last, the default mix's average call, weighted as market-sim
draws it. Run it in two checkouts to compare two releases op by op.

With --driver (MariaDB) it measures instead what the data layer's use of the driver's public
API costs: one SELECT of 16 columns (1 row, then 50) through the connection's `cmd_query` and
`get_rows`, against `query` and `fetch_row` on a connection of the C extension's documented API
(`_mysql_connector.MySQL`, which the driver's connection wraps).

Writes opcost.md to --out. Exits 2 on bad arguments.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from buyer_server.ops import build_app as buyer_app
from db import Database
from runtime.config import Settings, positive_int
from seller_server.ops import build_app as seller_app
from wire.app import App

from .behaviour import CARD, KEYWORDS, LOAD_TEST_PREFIX
from .mixes import DEFAULT

Plan = Callable[[random.Random], dict[str, Any]]


@dataclass(frozen=True)
class Cost:
    """One op's median costs per call, in microseconds (database None: not measured)."""

    op: str
    cpu_us: float
    wall_us: float
    database_us: float | None


class Market:
    """Both apps over one database, a seller and a buyer logged in, `items` listed."""

    def __init__(self, db: Database, items: int) -> None:
        self.seller = seller_app(Settings(role="seller"), db)
        self.buyer = buyer_app(Settings(role="buyer"), db)
        self.seller_token = self._account(self.seller, "opcost-seller")
        self.buyer_token = self._account(self.buyer, "opcost-buyer")
        rng = random.Random(0)
        self.items = [self.call(self.seller, "put_item", **_new_item(rng, 1000))["item_id"]
                      for _ in range(items)]

    def _account(self, app: App, name: str) -> str:
        username, password = f"{LOAD_TEST_PREFIX}{name}-{os.getpid()}", "opcost-password"
        app.handle({"id": 0, "op": "create_account",
                    "args": {"username": username, "password": password, "name": name}}, "127.0.0.1")
        reply = app.handle({"id": 0, "op": "login", "args": {"username": username, "password": password}},
                           "127.0.0.1")
        return str(reply["result"]["token"])

    def call(self, app: App, op: str, **args: Any) -> dict[str, Any]:
        """One request through the app, as the server loop hands it over; its result."""
        token = self.seller_token if app is self.seller else self.buyer_token
        return app.handle({"id": 1, "op": op, "token": token, "args": args})["result"]  # type: ignore[no-any-return]


def _new_item(rng: random.Random, quantity: int) -> dict[str, Any]:
    return {"name": f"{LOAD_TEST_PREFIX}{rng.choice(KEYWORDS)} {rng.randrange(10**6)}",
            "category": rng.randrange(10), "keywords": rng.sample(KEYWORDS, rng.randint(1, 3)),
            "condition": "new", "price": "9.99", "quantity": quantity}


def plans(market: Market) -> dict[str, tuple[App, Plan]]:
    """Each op measured: its app and the arguments of one call (a purchase buys two items,
    put in the cart before the clock starts)."""
    seller, buyer, items = market.seller, market.buyer, market.items
    return {
        "ping": (seller, lambda rng: {}),
        "put_item": (seller, lambda rng: _new_item(rng, 50)),
        "change_price": (seller, lambda rng: {"item_id": rng.choice(items), "price": "7.50"}),
        "remove_item": (seller, lambda rng: {"item_id": rng.choice(items), "quantity": 1}),
        "display_items": (seller, lambda rng: {"limit": 50}),
        "get_seller_rating": (seller, lambda rng: {}),
        "search_items": (buyer, lambda rng: {"limit": 20, "category": rng.randrange(10),
                                             "keywords": rng.sample(KEYWORDS, 1)}),
        "get_item": (buyer, lambda rng: {"item_id": rng.choice(items)}),
        "add_to_cart": (buyer, lambda rng: {"item_id": rng.choice(items[:50]), "quantity": 1}),
        "display_cart": (buyer, lambda rng: {}),
        "get_purchase_history": (buyer, lambda rng: {"limit": 20}),
        "make_purchase": (buyer, lambda rng: dict(CARD)),
    }


class DatabaseClock:
    """CPU seconds of the local mariadbd, when the database is one (else always 0 and off)."""

    def __init__(self, url: str) -> None:
        parsed = make_url(url)
        self.pid: int | None = None
        if parsed.get_backend_name() in ("mysql", "mariadb") and parsed.host in ("127.0.0.1", "localhost"):
            found = subprocess.run(["pgrep", "-o", "-x", "mariadbd"], capture_output=True, text=True).stdout
            self.pid = int(found.split()[0]) if found.strip() else None
        self._tick = os.sysconf("SC_CLK_TCK")

    def seconds(self) -> float:
        """The process's user + system CPU so far."""
        if self.pid is None:
            return 0.0
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self._tick


def measure(market: Market, op: str, app: App, plan: Plan, calls: int, clock: DatabaseClock,
            rng: random.Random) -> tuple[float, float, float]:
    """CPU, wall and database CPU of `calls` calls of `op`, each per call in microseconds."""
    cpu = wall = database = 0.0
    for _ in range(calls):
        args = plan(rng)
        if op == "make_purchase":
            for item_id in rng.sample(market.items[:50], 2):
                market.call(market.buyer, "add_to_cart", item_id=item_id, quantity=1)
        started = (time.thread_time(), time.perf_counter(), clock.seconds())
        market.call(app, op, **args)
        ended = (time.thread_time(), time.perf_counter(), clock.seconds())
        cpu, wall, database = (cpu + ended[0] - started[0], wall + ended[1] - started[1],
                               database + ended[2] - started[2])
    if op in ("add_to_cart", "make_purchase"):
        market.call(market.buyer, "clear_cart")  # the next round starts from an empty cart
    return 1e6 * cpu / calls, 1e6 * wall / calls, 1e6 * database / calls


def measure_all(db_url: str, calls: int, rounds: int) -> list[Cost]:
    """Every op, `rounds` rounds of `calls` calls each, taking turns; medians of the rounds."""
    db = Database(db_url, pool_size=4)
    try:
        db.create_schema()
        market, clock, rng = Market(db, 200), DatabaseClock(db_url), random.Random(1)
        runs: dict[str, list[tuple[float, float, float]]] = {}
        for _ in range(rounds):
            for op, (app, plan) in plans(market).items():
                runs.setdefault(op, []).append(measure(market, op, app, plan, calls, clock, rng))
    finally:
        db.close()
    return [Cost(op, statistics.median(run[0] for run in each), statistics.median(run[1] for run in each),
                 statistics.median(run[2] for run in each) if clock.pid else None)
            for op, each in runs.items()]


def mix_average(costs: list[Cost]) -> Cost:
    """The default mix's average call: each op weighted as market-sim draws it (both roles
    alike), over the ops measured here."""
    weights: dict[str, float] = {}
    for role in ("seller", "buyer"):
        role_weights = DEFAULT.weights(role)
        total = sum(w for op, w in role_weights.items() if any(c.op == op for c in costs))
        for op, weight in role_weights.items():
            weights[op] = weights.get(op, 0.0) + weight / total / 2
    measured = [c for c in costs if c.op in weights]

    def average(value: Callable[[Cost], float | None]) -> float | None:
        values = [value(c) for c in measured]
        if any(v is None for v in values):
            return None
        return sum(weights[c.op] * v for c, v in zip(measured, values, strict=True) if v is not None)

    return Cost("default mix, average call", average(lambda c: c.cpu_us) or 0.0,
                average(lambda c: c.wall_us) or 0.0, average(lambda c: c.database_us))


_ITEM_COLUMNS = ("item_id, seller_id, name, category, keywords, item_condition, price_cents, quantity, "
                 "listed, sold, removed, thumbs_up, thumbs_down, created_ms, item_id + 1, price_cents + 1")


def driver_costs(db_url: str, calls: int, rounds: int) -> list[str]:
    """Client CPU per query, public path against the C API, for a 1-row and a 50-row SELECT."""
    db = Database(db_url, pool_size=1)
    c_api = _c_api_connection(db.engine.url)
    try:
        db.create_schema()
        Market(db, 60)  # rows to read
        with db.engine.connect() as conn:
            connection: Any = conn.connection.driver_connection
            lines = []
            for rows in (1, 50):
                query = f"SELECT {_ITEM_COLUMNS} FROM items ORDER BY item_id LIMIT {rows}".encode()
                public, direct = _best_of(rounds, calls, partial(_public, connection, query),
                                          partial(_direct, c_api, query))
                lines.append(f"| {rows} | {public:,.0f} | {direct:,.0f} | {public - direct:,.0f} |")
    finally:
        c_api.close()
        db.close()
    return lines


def _c_api_connection(url: Any) -> Any:
    """A connection of the C extension's documented API (_mysql_connector.MySQL), opened on its own."""
    import _mysql_connector  # the C extension's module, documented as such by the driver

    c_api = _mysql_connector.MySQL()
    c_api.connect(host=url.host, user=url.username, password=url.password or "", database=url.database,
                  port=url.port or 3306)
    return c_api


def _public(connection: Any, query: bytes) -> None:
    connection.cmd_query(query)
    connection.get_rows()


def _direct(c_api: Any, query: bytes) -> None:
    c_api.query(query)
    while c_api.fetch_row():
        pass
    c_api.free_result()


def _best_of(rounds: int, calls: int, *ways: Callable[[], None]) -> list[float]:
    """Each way's least thread CPU per call (µs) over `rounds` rounds, the ways taking turns."""
    best = [float("inf")] * len(ways)
    for _ in range(rounds):
        for n, way in enumerate(ways):
            started = time.thread_time()
            for _ in range(calls):
                way()
            best[n] = min(best[n], 1e6 * (time.thread_time() - started) / calls)
    return best


def driver_report(lines: list[str], argv: list[str], where: str) -> str:
    """opcost.md for --driver."""
    return "\n".join([f"# The driver's public API against its C API\n\n`python -m simulation.opcost "
                      f"{' '.join(argv)}` on {where}, client CPU per query, best round\n",
                      "| rows | cmd_query + get_rows µs | MySQL.query + fetch_row µs | difference µs |",
                      "|---:|---:|---:|---:|", *lines]) + "\n"


def report(costs: list[Cost], argv: list[str], where: str) -> str:
    """opcost.md: the command, then one row per op and the mix's average."""
    lines = [f"# Cost per op\n\n`python -m simulation.opcost {' '.join(argv)}` on {where}, one thread, "
             f"{time.strftime('%Y-%m-%d %H:%M')}\n",
             "| op | server CPU µs | wall µs | database CPU µs |", "|---|---:|---:|---:|"]
    for cost in [*costs, mix_average(costs)]:
        database = "" if cost.database_us is None else f"{cost.database_us:,.0f}"
        lines.append(f"| {cost.op} | {cost.cpu_us:,.0f} | {cost.wall_us:,.0f} | {database} |")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m simulation.opcost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--db-url", help="the database (default: a fresh SQLite file)")
    parser.add_argument("--calls", type=positive_int, default=300,
                        help="calls per op per round (default 300)")
    parser.add_argument("--rounds", type=positive_int, default=3, help="rounds, medians taken (default 3)")
    parser.add_argument("--out", type=Path, default=Path("sim-results"), help="folder of opcost.md")
    parser.add_argument("--driver", action="store_true",
                        help="MariaDB: the driver's public API against its C API, instead of the ops")
    args = parser.parse_args(argv)
    if args.driver and not (args.db_url or "").startswith(("mysql", "mariadb")):
        parser.error("--driver measures the MySQL/MariaDB driver: give --db-url mysql://...")
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point: measure, print and write opcost.md."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        db_url = args.db_url or f"sqlite:///{Path(scratch) / 'opcost.db'}"
        where = (make_url(args.db_url).render_as_string(hide_password=True) if args.db_url
                 else "a fresh SQLite file")
        if args.driver:
            text = driver_report(driver_costs(db_url, args.calls, args.rounds), argv, where)
        else:
            text = report(measure_all(db_url, args.calls, args.rounds), argv, where)
    (args.out / "opcost.md").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
