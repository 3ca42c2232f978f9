"""`python -m simulation.catalogue`: how read latency holds up as the catalogue grows.

Seeds a database to a given size (db.seed: sellers and items in bulk), starts both
servers on it, and times the reads a shopper makes most — keyword search (with and
without a category), category browsing, item pages, and a seeded seller's first
`display_items` page — one call at a time from one client, reporting p50 and p95; and
the second page of searches of three and five keywords that have one (at 1,000 items
almost none do).
Run it at two sizes and compare: the issue's bar is p95 within 2x from 1,000 to
1,000,000 items.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from db import Database, DatabaseUnusable
from db.seed import SEED_PASSWORD, VOCABULARY, timed_seed
from wire import Connection

from .servers import running_servers
from .stats import percentile


def main(argv: list[str] | None = None) -> int:
    """Seed to --items (unless --no-seed) and print a latency table for the read ops."""
    args = _parser().parse_args(argv)
    database = Database(args.db_url, pool_size=2)
    try:
        database.create_schema()
    except DatabaseUnusable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not args.no_seed:
        print(f"seeded: {timed_seed(database, args.sellers, args.items)}", flush=True)
    first_seller, last_item, item_count = _bounds(database)
    database.close()
    with tempfile.TemporaryDirectory() as logs, running_servers(args.db_url, Path(logs)) as addresses:
        rows = measure(addresses, first_seller, last_item, args.calls, random.Random(args.seed))
    print(f"| op | calls | p50 ms | p95 ms |  ({item_count} items in {args.db_url})")
    print("|---|---:|---:|---:|")
    for op, latencies in rows.items():
        ordered = sorted(latencies)
        if not ordered:  # no search with a second page at this size
            print(f"| {op} | 0 | - | - |")
            continue
        print(f"| {op} | {len(ordered)} | {statistics.median(ordered) * 1000:.2f} | "
              f"{percentile(ordered, 95) * 1000:.2f} |")
    return 0


def measure(addresses: dict[str, tuple[str, int]], seller_id: int, last_item: int, calls: int,
            rng: random.Random) -> dict[str, list[float]]:
    """Seconds per call for each read op."""
    buyer, seller = Connection(*addresses["buyer"]), Connection(*addresses["seller"])
    name = f"reader{uuid.uuid4().hex[:12]}"  # new each run: --no-seed may measure a database again
    buyer.call("create_account", {"username": name, "password": SEED_PASSWORD, "name": "Reader"})
    buyer.token = buyer.call("login", {"username": name, "password": SEED_PASSWORD})["token"]
    seller.token = seller.call("login", {"username": f"seed{seller_id}", "password": SEED_PASSWORD})["token"]
    ops: dict[str, Callable[[], Any]] = {
        "search_items (1 keyword)": lambda: buyer.call(
            "search_items", {"keywords": [rng.choice(VOCABULARY)], "limit": 20}),
        "search_items (2 keywords)": lambda: buyer.call(
            "search_items", {"keywords": rng.sample(VOCABULARY, 2), "limit": 20}),
        "search_items (keyword + category)": lambda: buyer.call(
            "search_items", {"keywords": [rng.choice(VOCABULARY)], "category": rng.randrange(10),
                             "limit": 20}),
        "search_items (category only)": lambda: buyer.call(
            "search_items", {"category": rng.randrange(10), "limit": 20}),
        "get_item": lambda: buyer.call("get_item", {"item_id": rng.randint(1, last_item)}),
        "display_items (first page)": lambda: seller.call("display_items", {"limit": 20}),
        # last, so that the draws of the ops above stay those of earlier versions of this tool
        "search_items (3 keywords)": lambda: buyer.call(
            "search_items", {"keywords": rng.sample(VOCABULARY, 3), "limit": 20}),
        "search_items (5 keywords)": lambda: buyer.call(
            "search_items", {"keywords": rng.sample(VOCABULARY, 5), "limit": 20}),
    }
    timed = {op: [_timed(call) for _ in range(calls)] for op, call in ops.items()}
    for count in (3, 5):  # a later page: the first fetched untimed; searches with one page are skipped
        pages = [_second_page(buyer, rng.sample(VOCABULARY, count)) for _ in range(calls)]
        timed[f"search_items ({count} keywords, second page)"] = [_timed(call) for call in pages if call]
    return timed


def _second_page(buyer: Connection, keywords: list[str]) -> Callable[[], Any] | None:
    """The call for the second page of a 20-item search, or None when it has one page."""
    cursor = buyer.call("search_items", {"keywords": keywords, "limit": 20})["next_cursor"]
    if cursor is None:
        return None
    return lambda: buyer.call("search_items", {"keywords": keywords, "limit": 20, "cursor": cursor})


def _timed(call: Callable[[], Any]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def _bounds(database: Database) -> tuple[int, int, int]:
    """A seeded seller's id, the largest item id and the number of items."""
    from sqlalchemy import func, select

    from db.schema import items, users

    def work(tx: Any) -> tuple[int, int, int]:
        seller = tx.execute(select(func.min(users.c.user_id)).where(users.c.username.like("seed%"))).scalar()
        last, count = tx.execute(select(func.max(items.c.item_id), func.count())).one()
        return int(seller or 0), int(last or 0), int(count)

    return database.run(work, write=False)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m simulation.catalogue", description=__doc__)
    parser.add_argument("--db-url", required=True)
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--sellers", type=int, default=100)
    parser.add_argument("--calls", type=int, default=300, help="calls per op")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--no-seed", action="store_true", help="measure the database as it is")
    return parser


if __name__ == "__main__":
    sys.exit(main())
