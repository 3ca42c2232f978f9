"""`python -m simulation.opcost`: what each op costs the server, one call at a time.

Builds both servers' apps in this process over an empty database of its own (no sockets: the
server loop is left out, `--mix ping` of market-sim measures that) and calls each op --calls
times per round, on one thread, the ops taking turns. For each op it reports the median over
the rounds of the CPU a call took on that thread (everything the server does for it but the
framing), its wall time, and, when the database is a MariaDB on this machine, the CPU that
mariadbd used meanwhile (10 ms ticks, spread over the calls). Carts hold three lines when shown
or bought, as a shopper's do. Last, the default mix's average call over the ops measured (all
but sign-ups, logouts, feedback and the cart edits other than add), weighted as market-sim
draws them. Run it in two checkouts to compare two releases op by op.

Writes opcost.md to --out. Exits 2 on bad arguments or a database that is not empty, 3 when
the database cannot be used (one line saying why).
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from buyer_server.ops import build_app as buyer_app
from db import Database
from db.migrations import make_current
from db.schema import items as items_table
from runtime.config import Settings, positive_int
from seller_server.ops import build_app as seller_app
from wire.app import App

from .behaviour import CARD, KEYWORDS, LOAD_TEST_PREFIX, new_item
from .mixes import DEFAULT
from .stats import process_cpu_s

STOCK = 1_000_000  # units of each listed item: no run buys them all
CART_LINES = 3  # lines in the cart that display_cart shows and make_purchase buys


@dataclass(frozen=True)
class Cost:
    """One op's costs per call, in microseconds (database None: not measured)."""

    op: str
    cpu_us: float
    wall_us: float
    database_us: float | None


class Market:
    """Both apps over one database, a seller and a buyer logged in, `items` listed, and a few
    purchases made (so that the history has some)."""

    def __init__(self, db: Database, items: int) -> None:
        self.seller = seller_app(Settings(role="seller"), db)
        self.buyer = buyer_app(Settings(role="buyer"), db)
        self.seller_token = self._account(self.seller, "opcost-seller")
        self.buyer_token = self._account(self.buyer, "opcost-buyer")
        rng = random.Random(0)
        self.items = [self.call(self.seller, "put_item", **new_item(rng, n, STOCK, STOCK))["item_id"]
                      for n in range(items)]
        for _ in range(5):
            self.fill_cart(rng)
            self.call(self.buyer, "make_purchase", **CARD)

    def _account(self, app: App, name: str) -> str:
        username, password = f"{LOAD_TEST_PREFIX}{name}", "opcost-password"
        app.handle({"id": 0, "op": "create_account",
                    "args": {"username": username, "password": password, "name": name}}, "127.0.0.1")
        reply = app.handle({"id": 0, "op": "login", "args": {"username": username, "password": password}},
                           "127.0.0.1")
        return str(reply["result"]["token"])

    def call(self, app: App, op: str, **args: Any) -> dict[str, Any]:
        """One request through the app, as the server loop hands it over; its result."""
        token = self.seller_token if app is self.seller else self.buyer_token
        return app.handle({"id": 1, "op": op, "token": token, "args": args})["result"]  # type: ignore[no-any-return]

    def empty_cart(self, rng: random.Random) -> None:
        """The buyer's cart emptied."""
        self.call(self.buyer, "clear_cart")

    def fill_cart(self, rng: random.Random) -> None:
        """The buyer's cart holding CART_LINES lines."""
        self.empty_cart(rng)
        for item_id in rng.sample(self.items, CART_LINES):
            self.call(self.buyer, "add_to_cart", item_id=item_id, quantity=1)


@dataclass(frozen=True)
class Plan:
    """One op measured: its app, the arguments of a call, and what is done before each call
    outside the clock."""

    app: App
    args: Callable[[random.Random], dict[str, Any]]
    before: Callable[[random.Random], None] = lambda rng: None


def plans(market: Market) -> dict[str, Plan]:
    """Every op measured, by name."""
    seller, buyer, items = market.seller, market.buyer, market.items
    return {
        "ping": Plan(seller, lambda rng: {}),
        "put_item": Plan(seller, lambda rng: new_item(rng, rng.randrange(10**6), 50, 50)),
        "change_price": Plan(seller, lambda rng: {"item_id": rng.choice(items), "price": "7.50"}),
        "remove_item": Plan(seller, lambda rng: {"item_id": rng.choice(items), "quantity": 1}),
        "display_items": Plan(seller, lambda rng: {"limit": 50}),
        "get_seller_rating": Plan(seller, lambda rng: {}),
        "search_items": Plan(buyer, lambda rng: {"limit": 20, "category": rng.randrange(10),
                                                 "keywords": rng.sample(KEYWORDS, 1)}),
        "get_item": Plan(buyer, lambda rng: {"item_id": rng.choice(items)}),
        "add_to_cart": Plan(buyer, lambda rng: {"item_id": rng.choice(items), "quantity": 1},
                            market.empty_cart),
        "display_cart": Plan(buyer, lambda rng: {}, market.fill_cart),
        "get_purchase_history": Plan(buyer, lambda rng: {"limit": 20}),
        "make_purchase": Plan(buyer, lambda rng: dict(CARD), market.fill_cart),
    }


class DatabaseClock:
    """CPU seconds of the MariaDB the engine talks to, when it runs on this machine and its pid
    file can be read here (else `pid` is None and the clock always reads 0)."""

    def __init__(self, db: Database) -> None:
        self.pid: int | None = None
        if db.is_sqlite or make_url(db.url).host not in ("127.0.0.1", "localhost"):
            return
        with db.engine.connect() as conn:
            pid_file = conn.execute(text("SELECT @@pid_file")).scalar_one()
        try:
            self.pid = int(Path(pid_file).read_text().split()[0])
            self.seconds()
        except (OSError, ValueError, IndexError):  # not readable from here
            self.pid = None

    def seconds(self) -> float:
        """The process's user + system CPU so far."""
        return 0.0 if self.pid is None else sum(process_cpu_s(self.pid))


def measure(market: Market, op: str, plan: Plan, calls: int, clock: DatabaseClock,
            rng: random.Random) -> Cost:
    """`calls` calls of `op`; each cost per call, in microseconds."""
    cpu = wall = database = 0.0
    for _ in range(calls):
        args = plan.args(rng)
        plan.before(rng)
        database -= clock.seconds()  # read outside the CPU and wall clocks, before and after
        started_cpu, started_wall = time.thread_time(), time.perf_counter()
        market.call(plan.app, op, **args)
        cpu += time.thread_time() - started_cpu
        wall += time.perf_counter() - started_wall
        database += clock.seconds()
    return Cost(op, 1e6 * cpu / calls, 1e6 * wall / calls, 1e6 * database / calls)


def empty_database(db: Database) -> str | None:
    """Why the tool must not write into this database (it holds items), or None."""
    with db.engine.connect() as conn:
        held = conn.execute(select(func.count()).select_from(items_table)).scalar_one()
    return f"{db.where} holds {held:,} items: give an empty database of its own" if held else None


def measure_all(db: Database, calls: int, rounds: int) -> list[Cost]:
    """Every op, `rounds` rounds of `calls` calls each, the ops taking turns; medians of the rounds."""
    market, clock, rng = Market(db, 200), DatabaseClock(db), random.Random(1)
    ops = plans(market)
    runs: dict[str, list[Cost]] = {}
    for _ in range(rounds):
        for op, plan in ops.items():
            runs.setdefault(op, []).append(measure(market, op, plan, calls, clock, rng))
    return [Cost(op, statistics.median(c.cpu_us for c in each), statistics.median(c.wall_us for c in each),
                 statistics.median(c.database_us or 0.0 for c in each) if clock.pid else None)
            for op, each in runs.items()]


def mix_weights(measured: set[str]) -> dict[str, float]:
    """Each measured op's share of the default mix's calls (both roles alike, each role's ops
    not measured left out): they add up to 1."""
    weights: dict[str, float] = {}
    for role in ("seller", "buyer"):
        role_weights = {op: w for op, w in DEFAULT.weights(role).items() if op in measured}
        total = sum(role_weights.values())
        for op, weight in role_weights.items():
            weights[op] = weights.get(op, 0.0) + weight / total / 2
    return weights


def mix_average(costs: list[Cost]) -> Cost:
    """The default mix's average call over the ops measured."""
    weights = mix_weights({c.op for c in costs})
    measured = [c for c in costs if c.op in weights]
    databases = [c.database_us for c in measured]
    database = (None if None in databases
                else sum(weights[c.op] * (c.database_us or 0.0) for c in measured))
    return Cost("default mix, average call (ops measured)", sum(weights[c.op] * c.cpu_us for c in measured),
                sum(weights[c.op] * c.wall_us for c in measured), database)


_ITEM_COLUMNS = ("item_id, seller_id, name, category, keywords, item_condition, price_cents, quantity, "
                 "listed, sold, removed, thumbs_up, thumbs_down, created_ms, item_id + 1, price_cents + 1")


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
    parser.add_argument("--db-url", help="an empty database of its own (default: a fresh SQLite file)")
    parser.add_argument("--calls", type=positive_int, default=300,
                        help="calls per op per round (default 300)")
    parser.add_argument("--rounds", type=positive_int, default=3, help="rounds, medians taken (default 3)")
    parser.add_argument("--out", type=Path, default=Path("sim-results"), help="folder of opcost.md")
    return parser.parse_args(argv)


def measured_text(args: argparse.Namespace, argv: list[str], db_url: str) -> str:
    """The report of what the arguments ask for, over `db_url` (made current first)."""
    db = Database(db_url, pool_size=4)
    try:
        make_current(db)
        refusal = empty_database(db)
        if refusal:
            raise ValueError(refusal)
        where = db.where if args.db_url else "a fresh SQLite file"
        return report(measure_all(db, args.calls, args.rounds), argv, where)
    finally:
        db.close()


def main(argv: list[str] | None = None) -> int:
    """Entry point: measure, print and write opcost.md."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        try:
            text_ = measured_text(args, argv, args.db_url or f"sqlite:///{Path(scratch) / 'opcost.db'}")
        except ValueError as refused:
            print(f"python -m simulation.opcost: {refused}", file=sys.stderr)
            return 2
        except DBAPIError as exc:
            print(f"python -m simulation.opcost: cannot use the database: {' '.join(str(exc.orig).split())}",
                  file=sys.stderr)
            return 3
    (args.out / "opcost.md").write_text(text_)
    print(text_, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
