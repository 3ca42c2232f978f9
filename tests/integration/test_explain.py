"""EXPLAIN on MariaDB: the statements every op sends use indexes, never a full table scan.

Each op runs once for real, through both servers, over a database of a few thousand seeded
items (on a tiny table a scan is cheapest and would be chosen anyway; ANALYZE TABLE gives the
optimiser statistics), their connections to it through a relay that records the queries sent.
Each SELECT, UPDATE, DELETE and INSERT ... SELECT an op sent is explained afterwards, its values
in it, against the same database.
"""
from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import text
from support import CARD, RoundTrips, fresh_mysql_database, running_market

from db import Database
from db.migrations import make_current
from db.schema import metadata
from operate.seed import SEED_PASSWORD, seed
from wire import Connection
from wire.errors import ProtocolError

# Run in parallel (scripts/test.sh), the module stays on one worker: its seeded database is made once.
pytestmark = pytest.mark.xdist_group("explain")

THREE, FIVE = ["lamp", "desk", "chair"], ["lamp", "desk", "chair", "light", "table"]
EIGHT_WORDS = "lamp desk chair light table w0005 w0006 w0007"
# The seller lists a few items of these in category 4, so that every search below has a next page.
LISTED = {"name": "desk lamp", "category": 4, "keywords": FIVE, "condition": "new", "price": "9.50",
          "quantity": 5}
SEARCHES: dict[str, dict[str, Any]] = {
    "search all": {}, "search by category": {"category": 4},
    "search one keyword": {"keywords": ["lamp"]},
    "search one keyword+category": {"keywords": ["lamp"], "category": 4},
    "search two keywords": {"keywords": ["lamp", "desk"]},
    "search three keywords, first page": {"keywords": THREE},
    "search five keywords, first page": {"keywords": FIVE},
    "search keywords+category": {"keywords": ["lamp", "desk"], "category": 4},
    "search three keywords+category": {"keywords": THREE, "category": 4},
    "search five keywords+category": {"keywords": FIVE, "category": 4},
    "search by text, one word": {"query": "lamp"},
    "search by text, one word+category": {"query": "lamp", "category": 4},
    "search by text, eight words": {"query": EIGHT_WORDS},
    "search by text+category, eight words": {"query": EIGHT_WORDS, "category": 4},
    "search by text, typos of two words": {"query": "chiar tabel"},
}
NEXT_PAGES: dict[str, dict[str, Any]] = {  # explained: the page after the first page of one item
    "search three keywords, next page": {"keywords": THREE, "limit": 1},
    "search five keywords, next page": {"keywords": FIVE, "limit": 1},
    "search keywords+category, next page": {"keywords": ["lamp", "desk"], "category": 4, "limit": 1},
    "search by text+category, next page": {"query": EIGHT_WORDS, "category": 4, "limit": 1},
}
OPS = ["token check", "put_item's count of the seller's items on sale",
       "own item (change_price, remove_item)", "display_items", "own seller rating", "get_seller_rating",
       "get_item", "add_to_cart", "remove_from_cart", "display_cart", "the cart a cart write answers",
       "make_purchase's cart", "purchase history", "provide_feedback's vote", "login backoff",
       "orders due to settle"]
NAMES = sorted([*OPS, *SEARCHES, *NEXT_PAGES])  # what run_ops records
EXPLAINED = re.compile(r"(SELECT|UPDATE|DELETE|INSERT\b.*\bSELECT)\b", re.IGNORECASE | re.DOTALL)
Record = Callable[[str], contextlib.AbstractContextManager[None]]


@pytest.fixture(scope="module")
def seeded(mysql_server: str) -> Iterator[Database]:
    for url in fresh_mysql_database(mysql_server, prefix="market_explain"):
        db = Database(url, pool_size=2)
        make_current(db)
        seed(db, sellers=50, items_count=3000)
        with db.engine.connect() as conn:
            for table in metadata.tables:
                conn.execute(text(f"ANALYZE TABLE {table}")).all()
        yield db
        db.close()


@pytest.fixture(scope="module")
def sent(seeded: Database) -> Iterator[dict[str, list[str]]]:
    """The statements worth explaining that each op sent, by name: every op run once, in turn,
    by a new buyer and a seeded seller, the servers' connections to the database through a relay."""
    trips = RoundTrips()
    relayed = Database(trips.through(seeded.url), pool_size=4)
    statements: dict[str, list[str]] = {}

    @contextlib.contextmanager
    def record(name: str) -> Iterator[None]:
        start = len(trips.queries)
        yield
        statements[name] = [statement.strip() for query in trips.queries[start:]
                            for statement in query.split(";") if EXPLAINED.match(statement.strip())]

    with running_market(relayed) as market:
        buyer, seller = market.user("buyer"), market.connect("seller")
        seller.token = seller.call("login", {"username": "seed3", "password": SEED_PASSWORD})["token"]
        run_ops(market.connect("buyer"), buyer, seller, record)
        with record("orders due to settle"):  # a pass of the buyer server's settler
            market.buyer_server.app.checkout.settle_due(30)  # type: ignore[attr-defined]
    relayed.close()
    trips.close()
    assert sorted(statements) == NAMES
    yield statements


def run_ops(stranger: Connection, buyer: Connection, seller: Connection, record: Record) -> None:
    """Every op of the explained statements, in an order that leaves each one's rows there."""
    with record("token check"):  # an empty cart's display: the token checked alone
        buyer.call("display_cart")
    for _ in range(3):
        seller.call("put_item", LISTED)
    with record("put_item's count of the seller's items on sale"):
        item = {"item_id": seller.call("put_item", LISTED)["item_id"]}
    with record("own item (change_price, remove_item)"):
        seller.call("change_price", {**item, "price": "9.25"})
    with record("display_items"):
        seller.call("display_items")
    with record("own seller rating"):
        seller.call("get_seller_rating")
    with record("get_seller_rating"):
        buyer.call("get_seller_rating", {"seller_id": 3})
    with record("get_item"):
        buyer.call("get_item", {"item_id": 1500})
    for name, args in SEARCHES.items():
        with record(name):
            buyer.call("search_items", args)
    for name, args in NEXT_PAGES.items():
        cursor = buyer.call("search_items", args)["next_cursor"]
        assert cursor, f"{name}: no next page"
        with record(name):
            buyer.call("search_items", {**args, "cursor": cursor})
    for name, op, args in [("add_to_cart", "add_to_cart", {**item, "quantity": 2}),
                           ("remove_from_cart", "remove_from_cart", {**item, "quantity": 1}),
                           ("display_cart", "display_cart", {}),
                           ("the cart a cart write answers", "save_cart", {}),
                           ("make_purchase's cart", "make_purchase", CARD),
                           ("purchase history", "get_purchase_history", {}),
                           ("provide_feedback's vote", "provide_feedback", {**item, "vote": "up"})]:
        with record(name):
            buyer.call(op, args)
    buyer.call("add_to_cart", {**item, "quantity": 1})  # as when remove_from_cart ran
    with record("login backoff"), pytest.raises(ProtocolError, match="wrong username or password"):
        stranger.call("login", {"username": buyer.username, "password": "a wrong password"})  # type: ignore[attr-defined]


def plan_of(db: Database, sql: str) -> list[dict[str, Any]]:
    """EXPLAIN's rows for a statement sent. A read's plan must not stop early (its values then
    find nothing, and the plan shows no read); a write's that does is left out ([]): the op
    changed the rows it was for (a purchase's DELETE of the cart lines of an order still
    completing, say)."""
    with db.engine.connect() as conn:
        plan = [dict(row) for row in conn.exec_driver_sql("EXPLAIN " + sql).mappings()]
    cut_short = [row["Extra"] for row in plan if "Impossible" in str(row["Extra"])]
    if cut_short and re.match(r"(UPDATE|DELETE)\b", sql):
        return []
    assert not cut_short, f"the plan stopped early ({cut_short}): its values find nothing\n{sql}"
    return plan


def full_scans(db: Database, sql: str) -> list[str]:
    """Base tables the plan reads in full (type ALL; derived tables and a UNION's result are
    the statement's own few rows, not tables)."""
    return [row["table"] for row in plan_of(db, sql)
            if row["type"] == "ALL" and not str(row["table"]).startswith(("<derived", "<union"))]


def the_statement(sent: dict[str, list[str]], name: str, reading: str) -> str:
    """The one statement of an op that reads the table (or alias) `reading`."""
    found = [sql for sql in sent[name] if re.search(rf"\b{reading}\b", sql)]
    assert len(found) == 1, f"{name}: {len(found)} statements read {reading}: {sent[name]}"
    return found[0]


@pytest.mark.parametrize("name", NAMES)
def test_no_full_table_scan(seeded: Database, sent: dict[str, list[str]], name: str) -> None:
    assert sent[name], f"{name}: no statement sent"
    for sql in sent[name]:
        scans = full_scans(seeded, sql)
        assert not scans, f"{name}: full scan of {scans}\n{sql}"


def test_the_check_does_see_a_full_scan(seeded: Database) -> None:
    assert full_scans(seeded, "SELECT item_id FROM items WHERE name = 'no such name'") == ["items"]


@pytest.mark.parametrize("name", ["display_items", "search all", "search by category"])
def test_listings_in_item_order_read_the_index_in_order(seeded: Database, sent: dict[str, list[str]],
                                                        name: str) -> None:
    """No sort of every on-sale row: the index gives item_id order and the LIMIT stops the read."""
    sql = the_statement(sent, name, "items")
    sorts = [row for row in plan_of(seeded, sql) if "filesort" in str(row["Extra"])]
    assert not sorts, f"{name} sorts\n{sql}"


NUMBERS = {3: "three", 5: "five"}
KEYWORD_INDEXES = ("item_keywords", "keyword0", "keyword1", "item_keyword_pairs",
                   "item_words")  # tables and aliases


def keyword_index_work(plan: list[dict[str, Any]]) -> list[str]:
    """The Extra notes of the plan's reads of the keyword indexes that mean a sort or temporary table."""
    return [note for row in plan if row["table"] in KEYWORD_INDEXES
            for note in ("filesort", "temporary") if note in str(row["Extra"])]


def keyword_reads(plan: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(table or alias, access type) of each read of the keyword indexes, sorted."""
    return sorted((row["table"], row["type"]) for row in plan if row["table"] in KEYWORD_INDEXES)


@pytest.mark.parametrize("by_category", [False, True])
def test_one_keyword_search_reads_the_keyword_index_in_order(seeded: Database, sent: dict[str, list[str]],
                                                             by_category: bool) -> None:
    """No grouping or sort of every match: the LIMIT stops the read of the index range."""
    name = "search one keyword+category" if by_category else "search one keyword"
    sql = the_statement(sent, name, "item_keywords")
    plan = plan_of(seeded, sql)
    assert keyword_index_work(plan) == [], sql
    assert [table for table, _ in keyword_reads(plan)] == ["item_keywords"], sql


@pytest.mark.parametrize("by_category", [False, True])
def test_search_by_text_reads_each_term_in_item_order_stopped_by_the_window(
        seeded: Database, sent: dict[str, list[str]], by_category: bool) -> None:
    """Each term's range of item_words is read in item order (no sort of its matches), each
    stopped by its LIMIT; only those few rows are grouped and sorted."""
    name = "search by text+category, eight words" if by_category else "search by text, eight words"
    sql = the_statement(sent, name, "item_words")
    plan = plan_of(seeded, sql)
    terms = sql.count("item_words.word =")
    assert terms >= 8 and keyword_reads(plan) == [("item_words", "ref")] * terms, sql
    assert keyword_index_work(plan) == [], sql


def test_two_keyword_search_reads_the_keyword_indexes_in_order(seeded: Database,
                                                               sent: dict[str, list[str]]) -> None:
    """The pair's range and each keyword's range are read in item order, each stopped by its
    LIMIT; only the page's few rows are sorted."""
    sql = the_statement(sent, "search two keywords", "item_keyword_pairs")
    assert keyword_index_work(plan_of(seeded, sql)) == [], sql


def test_two_keyword_search_checks_the_other_keyword_one_row_at_a_time(seeded: Database,
                                                                       sent: dict[str, list[str]]) -> None:
    """The look-up for "has the other keyword too" is one primary-key row (eq_ref), not a
    read of the other keyword's whole range per item."""
    sql = the_statement(sent, "search two keywords", "item_keyword_pairs")
    assert keyword_reads(plan_of(seeded, sql)) == [
        ("item_keyword_pairs", "range"), ("keyword0", "eq_ref"), ("keyword0", "range"),
        ("keyword1", "eq_ref"), ("keyword1", "range")], sql


@pytest.mark.parametrize("by_category", [False, True])
@pytest.mark.parametrize("count", [3, 5])
def test_ranked_keyword_search_reads_each_keyword_in_item_order(seeded: Database, sent: dict[str, list[str]],
                                                              count: int, by_category: bool) -> None:
    """Each keyword's range in item order, stopped by the window: only those rows are grouped
    and sorted, not every item with any of the keywords (without a category, a first page is
    the pairs' instead: the next page's)."""
    name = f"search {NUMBERS[count]} keywords" + ("+category" if by_category else ", next page")
    sql = the_statement(sent, name, "item_keywords")
    plan = plan_of(seeded, sql)
    assert keyword_reads(plan) == [("item_keywords", "ref")] * count, sql
    assert keyword_index_work(plan) == [], sql


@pytest.mark.parametrize("count", [3, 5])
def test_many_keywords_first_page_reads_the_keyword_indexes_in_order(seeded: Database,
                                                                     sent: dict[str, list[str]],
                                                                     count: int) -> None:
    """Each keyword's range in item order, stopped by its LIMIT, and each pair's range, stopped
    by the window: only those few rows are grouped and sorted."""
    name = f"search {NUMBERS[count]} keywords, first page"
    sql = the_statement(sent, name, "item_keywords")
    plan = plan_of(seeded, sql)
    pairs = count * (count - 1) // 2
    ranges = [("item_keyword_pairs", "ref")] * pairs + [("item_keywords", "ref")] * count
    assert keyword_reads(plan) == ranges, sql
    assert keyword_index_work(plan) == [], sql


def test_the_order_check_does_see_a_sort_of_the_keyword_index(seeded: Database) -> None:
    two_ranges = "SELECT item_id FROM item_keywords WHERE keyword IN ('lamp', 'desk') ORDER BY item_id"
    assert keyword_index_work(plan_of(seeded, two_ranges)) != []
