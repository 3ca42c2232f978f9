"""EXPLAIN on MariaDB: the read paths of every op use indexes, never a full table scan.

A few thousand seeded items make the optimiser's choice meaningful (on a tiny table
a scan is cheapest and would be chosen anyway); ANALYZE TABLE gives it statistics.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import literal, select, text
from support import fresh_mysql_database

from db import Database
from db.accounts import _SESSION_BY_TOKEN
from db.carts import _CART, _CART_OF_TOKEN, _IN_CART, _STOCK_AND_HELD
from db.catalog import (
    _ITEM_FOR_SESSION,
    _ITEM_FOR_SESSION_LOCKED,
    _ON_SALE,
    _RATING_FOR_SESSION,
    _SELLER_ITEMS,
)
from db.login_throttle import _FAILURES
from db.migrations import make_current
from db.orders import _HISTORY, _VOTE_OF_BUYER
from db.purchases import CART_LINES, DUE_ORDERS
from db.schema import cart_lines, item_keywords, items, login_failures, metadata, sessions
from db.search import (
    WINDOW,
    _many_keywords_first_page,
    _one_keyword_search,
    _plain_search,
    _ranked_search,
    _two_keyword_search,
    _typo_candidates,
    pair_params,
    query_terms,
)
from operate.seed import seed

# Run in parallel (scripts/test.sh), the module stays on one worker: its seeded database is made once.
pytestmark = pytest.mark.xdist_group("explain")

PARAMS: dict[str, Any] = {
    "item_id": 1500, "seller_id": 3, "after": 0, "limit": 51, "category": 4,
    "keyword0": "lamp", "keyword1": "desk", "keyword2": "chair", "last_matches": 2,
    "after_both": 0,
    "token_hash": "ab" * 32, "role": "buyer",
    "session_id": 1, "buyer_id": 2, "last_order": 2**62, "last_item": 0, "username": "someone",
    "keyword3": "light", "keyword4": "table",
}
PARAMS.update(pair_params(["lamp", "desk", "chair", "light", "table"]))  # three keywords use the first three
WORDS = ["lamp", "desk", "chair", "light", "table", "w0005", "w0006", "w0007"]
TERMS = query_terms(WORDS, {"chair": ["chairs"], "table": ["tables"]})  # 8 words: 21 terms
TEXT = {"window": WINDOW, **{f"{key}{n}": value for n, term in enumerate(TERMS)
                             for key, value in zip(("term", "group", "weight"), term, strict=True)}}
FIVE = ["lamp", "desk", "chair", "light", "table"]
KEYWORDS = {"window": WINDOW, **{f"{key}{n}": value for n, word in enumerate(FIVE)
                                 for key, value in (("term", word), ("group", n), ("weight", 1))}}
TYPOS = {f"{key}{n}": value for n, word in enumerate(["chiar", "tabel"])
         for key, value in (("length", 5), ("head", word[:2]), ("head_end", word[:2] + "\U0010ffff"),
                            ("tail", word[::-1][:2]), ("tail_end", word[::-1][:2] + "\U0010ffff"))}
SELLER = {"token_hash": "cd" * 32, "role": "seller"}  # the seeded seller 3's session
STATEMENTS = {
    "get_item": _ITEM_FOR_SESSION, "display_items": (_SELLER_ITEMS, SELLER),
    "get_seller_rating": _RATING_FOR_SESSION,
    "own seller rating": (_RATING_FOR_SESSION, {**SELLER, "seller_id": None}),
    "search by category": _plain_search(True), "search all": _plain_search(False),
    "search one keyword": _one_keyword_search(False),
    "search one keyword+category": _one_keyword_search(True),
    "search two keywords": _two_keyword_search(),
    "search three keywords, first page": (_many_keywords_first_page(3), {"window": WINDOW}),
    "search five keywords, first page": (_many_keywords_first_page(5), {"window": WINDOW}),
    "search five keywords, next page": (_ranked_search(5, False, True, keywords=True), KEYWORDS),
    "search keywords+category": (_ranked_search(2, True, False, keywords=True), KEYWORDS),
    "search keywords+category, next page": (_ranked_search(2, True, True, keywords=True), KEYWORDS),
    "display_cart": _CART_OF_TOKEN, "the cart a cart write answers": _CART,
    "search by text, one word": (_ranked_search(3, False, False), TEXT),
    "search by text, one word+category": (_ranked_search(3, True, False), TEXT),
    "search by text, eight words": (_ranked_search(len(TERMS), False, False), TEXT),
    "search by text+category, next page": (_ranked_search(len(TERMS), True, True), TEXT),
    "search by text, typos of two words": (_typo_candidates(2), TYPOS),
    "put_item's count of the seller's items on sale": (_ON_SALE, {"cap": 10_000}),
    "token check": _SESSION_BY_TOKEN,
    "own item (change_price, remove_item)": (_ITEM_FOR_SESSION_LOCKED, SELLER),
    "add_to_cart": _STOCK_AND_HELD, "remove_from_cart": _IN_CART,
    "make_purchase's cart": (CART_LINES, {"payment_key": "k"}),
    "purchase history": _HISTORY, "orders due to settle": (DUE_ORDERS, {"pending_before": 0, "limit": 100}),
    "login backoff": _FAILURES, "provide_feedback's vote": (_VOTE_OF_BUYER, {"vote": "up", "now": 0}),
}


@pytest.fixture(scope="module")
def seeded(mysql_server: str) -> Iterator[Database]:
    for url in fresh_mysql_database(mysql_server, prefix="market_explain"):
        db = Database(url, pool_size=2)
        make_current(db)
        seed(db, sellers=50, items_count=3000)
        db.run(lambda tx: tx.execute(sessions.insert(), [
            {"token_hash": "ab" * 32, "user_id": 3, "role": "buyer", "created_ms": 0, "last_seen_ms": 0},
            {"token_hash": "cd" * 32, "user_id": 3, "role": "seller", "created_ms": 0, "last_seen_ms": 0}]))
        db.run(lambda tx: tx.execute(login_failures.insert().values(
            role="buyer", username="someone", failures=1, last_failure_ms=0)))
        db.run(lambda tx: tx.execute(cart_lines.insert().from_select(  # the buyer's cart holds an item
            ["session_id", "item_id", "quantity"],
            select(sessions.c.session_id, literal(PARAMS["item_id"]), literal(1))
            .where(sessions.c.role == "buyer"))))
        with db.engine.connect() as conn:
            for table in metadata.tables:
                conn.execute(text(f"ANALYZE TABLE {table}")).all()
        yield db
        db.close()


def plan_of(db: Database, statement: Any) -> tuple[list[dict[str, Any]], str]:
    """EXPLAIN's rows for a statement (or a (statement, parameter overrides) pair), and its SQL."""
    statement, overrides = statement if isinstance(statement, tuple) else (statement, {})
    sql = str(statement.params(**{**PARAMS, **overrides}).compile(
        dialect=db.engine.dialect, compile_kwargs={"literal_binds": True}))
    with db.engine.connect() as conn:
        plan = conn.exec_driver_sql("EXPLAIN " + sql.replace("%%", "%")).mappings().all()
    cut_short = [row["Extra"] for row in plan if "Impossible" in str(row["Extra"])]
    assert not cut_short, f"the plan stopped early ({cut_short}): the parameters find nothing\n{sql}"
    return [dict(row) for row in plan], sql


def full_scans(db: Database, statement: Any) -> tuple[list[str], str]:
    """Base tables the plan reads in full (type ALL), and the SQL explained (derived tables and
    a UNION's result are the statement's own few rows, not tables)."""
    plan, sql = plan_of(db, statement)
    return [row["table"] for row in plan
            if row["type"] == "ALL" and not str(row["table"]).startswith(("<derived", "<union"))], sql


@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_no_full_table_scan(seeded: Database, name: str) -> None:
    scans, sql = full_scans(seeded, STATEMENTS[name])
    assert not scans, f"{name}: full scan of {scans}\n{sql}"


def test_the_check_does_see_a_full_scan(seeded: Database) -> None:
    unindexed = select(items.c.item_id).where(items.c.name == "no such name")
    assert full_scans(seeded, unindexed)[0] == ["items"]


@pytest.mark.parametrize("name", ["display_items", "search all", "search by category"])
def test_listings_in_item_order_read_the_index_in_order(seeded: Database, name: str) -> None:
    """No sort of every on-sale row: the index gives item_id order and the LIMIT stops the read."""
    plan, sql = plan_of(seeded, STATEMENTS[name])
    assert not [row for row in plan if "filesort" in str(row["Extra"])], f"{name} sorts\n{sql}"


KEYWORD_INDEXES = ("item_keywords", "keyword0", "keyword1", "item_keyword_pairs",
                   "item_words")  # tables and aliases


def keyword_index_work(db: Database, statement: Any) -> list[str]:
    """The Extra notes of the plan's reads of the keyword indexes that mean a sort or temporary table."""
    plan, _sql = plan_of(db, statement)
    return [note for row in plan if row["table"] in KEYWORD_INDEXES
            for note in ("filesort", "temporary") if note in str(row["Extra"])]


@pytest.mark.parametrize("by_category", [False, True])
def test_one_keyword_search_reads_the_keyword_index_in_order(seeded: Database, by_category: bool) -> None:
    """No grouping or sort of every match: the LIMIT stops the read of the index range."""
    plan, sql = plan_of(seeded, _one_keyword_search(by_category))
    assert keyword_index_work(seeded, _one_keyword_search(by_category)) == [], sql
    assert [row["table"] for row in plan if row["table"] in KEYWORD_INDEXES] == ["item_keywords"]


@pytest.mark.parametrize("by_category", [False, True])
def test_search_by_text_reads_each_term_in_item_order_stopped_by_the_window(seeded: Database,
                                                                          by_category: bool) -> None:
    """Each term's range of item_words is read in item order (no sort of its matches), each
    stopped by its LIMIT; only those few rows are grouped and sorted."""
    statement = (_ranked_search(len(TERMS), by_category, False), TEXT)
    plan, sql = plan_of(seeded, statement)
    reads = [row["type"] for row in plan if row["table"] == "item_words"]
    assert reads == ["ref"] * len(TERMS), sql
    assert keyword_index_work(seeded, statement) == [], sql


def test_two_keyword_search_reads_the_keyword_indexes_in_order(seeded: Database) -> None:
    """The pair's range and each keyword's range are read in item order, each stopped by its
    LIMIT; only the page's few rows are sorted."""
    assert keyword_index_work(seeded, _two_keyword_search()) == []


def test_two_keyword_search_checks_the_other_keyword_one_row_at_a_time(seeded: Database) -> None:
    """The look-up for "has the other keyword too" is one primary-key row (eq_ref), not a
    read of the other keyword's whole range per item."""
    plan, sql = plan_of(seeded, _two_keyword_search())
    reads = sorted((row["table"], row["type"]) for row in plan if row["table"] in KEYWORD_INDEXES)
    assert reads == [("item_keyword_pairs", "range"), ("keyword0", "eq_ref"), ("keyword0", "range"),
                     ("keyword1", "eq_ref"), ("keyword1", "range")], sql


@pytest.mark.parametrize("by_category", [False, True])
@pytest.mark.parametrize("count", [3, 5])
def test_ranked_keyword_search_reads_each_keyword_in_item_order(seeded: Database, count: int,
                                                              by_category: bool) -> None:
    """Each keyword's range in item order, stopped by the window: only those rows are grouped
    and sorted, not every item with any of the keywords."""
    statement = (_ranked_search(count, by_category, False, keywords=True), KEYWORDS)
    plan, sql = plan_of(seeded, statement)
    assert [row["type"] for row in plan if row["table"] in KEYWORD_INDEXES] == ["ref"] * count, sql
    assert keyword_index_work(seeded, statement) == [], sql


@pytest.mark.parametrize("count", [3, 5])
def test_many_keywords_first_page_reads_the_keyword_indexes_in_order(seeded: Database, count: int) -> None:
    """Each keyword's range in item order, stopped by its LIMIT, and each pair's range, stopped
    by the window: only those few rows are grouped and sorted."""
    statement = (_many_keywords_first_page(count), {"window": WINDOW})
    plan, sql = plan_of(seeded, statement)
    reads = sorted((row["table"], row["type"]) for row in plan if row["table"] in KEYWORD_INDEXES)
    pairs = count * (count - 1) // 2
    assert reads == [("item_keyword_pairs", "ref")] * pairs + [("item_keywords", "ref")] * count, sql
    assert keyword_index_work(seeded, statement) == [], sql


def test_the_order_check_does_see_a_sort_of_the_keyword_index(seeded: Database) -> None:
    two_ranges = (select(item_keywords.c.item_id).where(item_keywords.c.keyword.in_(["lamp", "desk"]))
                  .order_by(item_keywords.c.item_id))
    assert keyword_index_work(seeded, two_ranges) != []
