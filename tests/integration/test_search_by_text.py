"""search_items with `query` (protocol 1.1, "Search by text") over TCP, on SQLite and MariaDB:
words of names and keywords, ranking, paging through ties, errors, and the upgrade that
indexes the items listed before it."""
from __future__ import annotations

import json
import random
from typing import Any

import pytest
from sqlalchemy import insert, select, text
from support import CARD, Market

from db import Database
from db.migrations import revision_of
from db.schema import (
    item_word_pairs,
    item_words,
    items,
    keyword_pairs,
    users,
    word_pair_hash,
    word_rows,
)
from operate.audit import audit
from operate.seed import seed
from wire import Connection
from wire.errors import BadRequestError
from wire.values import item_search_words, search_words


def found(buyer: Connection, query: str, **args: Any) -> list[int]:
    """The item ids of the first page of a search by text."""
    return [item["item_id"] for item in buyer.call("search_items", {"query": query, **args})["items"]]


def every_page(buyer: Connection, limit: int, **args: Any) -> list[list[int]]:
    """The item ids of every page of one search, following next_cursor to the last page."""
    pages, cursor = [], None
    while True:
        page = buyer.call("search_items", {**args, "limit": limit, "cursor": cursor})
        pages.append([item["item_id"] for item in page["items"]])
        if (cursor := page["next_cursor"]) is None:
            return pages


def test_a_query_word_matches_a_word_of_the_name_or_a_keyword_whatever_its_case_and_accents(
        market: Market) -> None:
    seller, buyer = market.user("seller"), market.user("buyer")
    lamp = market.item(seller, name="Brass Café-Lamp", keywords=["vintage"])
    desk = market.item(seller, name="Oak desk", keywords=["Lamp", "t-shirt"])
    strasse = market.item(seller, name="Straße Nº5", keywords=[])
    assert found(buyer, "lamp") == [lamp, desk]
    assert found(buyer, "CAFE") == found(buyer, "café") == found(buyer, "cafe!") == [lamp]
    assert found(buyer, "VINTAGE") == [lamp]  # a keyword, folded like the query
    assert found(buyer, "strasse") == found(buyer, "no5") == [strasse]  # ß is ss; º is o
    assert found(buyer, "shirt") == found(buyer, "t") == []  # "t-shirt" is one keyword, no word of it
    assert found(buyer, "bras") == found(buyer, "brasses") == []  # whole words only


def test_a_name_folding_to_a_word_of_192_characters_is_indexed_and_found(market: Market) -> None:
    """U+3316 decomposes into six letters (キロメートル), the most of any character whose letters
    form one word: 32 of them are one word of 192 characters."""
    seller, buyer = market.user("seller"), market.user("buyer")
    longest = market.item(seller, name="\u3316" * 32, keywords=[])
    assert found(buyer, "\u3316" * 32) == found(buyer, "\u3316" * 24 + "キロメートル" * 8) == [longest]
    assert found(buyer, "\u3316" * 31) == []


def test_items_rank_by_distinct_query_words_matched_then_by_item_id(market: Market) -> None:
    seller, buyer = market.user("seller"), market.user("buyer")
    one = market.item(seller, name="Red chair", keywords=[])
    both_in_name = market.item(seller, name="Red lamp", keywords=[], category=3)
    name_and_keyword = market.item(seller, name="Lamp", keywords=["red", "LAMP"])  # lamp counts once
    three = market.item(seller, name="Big red lamp", keywords=[], category=3)
    market.item(seller, name="Blue sofa", keywords=["blue"])
    assert found(buyer, "red lamp big") == [three, both_in_name, name_and_keyword, one]
    assert found(buyer, "lamp lamp LAMP red") == [both_in_name, name_and_keyword, three, one]
    assert found(buyer, "red lamp", category=3) == [both_in_name, three]  # category narrows
    assert found(buyer, "nothing here") == []


def test_query_and_keywords_together_or_a_query_without_words_are_bad_requests(market: Market) -> None:
    buyer = market.user("buyer")
    bad = [{"query": "lamp", "keywords": ["lamp"]}, {"query": "lamp", "keywords": []},
           {"query": "!?  --"}, {"query": ""}, {"query": "x" * 101}, {"query": "a b c d e f g h i"},
           {"query": 5}, {"query": ["lamp"]}]
    for args in bad:
        with pytest.raises(BadRequestError):
            buyer.call("search_items", args)
    assert buyer.call("search_items", {"query": "a b c d e f g h", "keywords": None})["items"] == []
    assert buyer.call("search_items", {"query": "ü" * 100})["items"] == []


def test_paging_through_a_ranked_result_with_many_ties_follows_the_ranking_worked_out_in_python(
        market: Market) -> None:
    """60 items named with random words of a few, many of the same rank: every page of searches
    of one to eight words, with and without a category, against the ranking from the names."""
    rng = random.Random(7)
    seller = market.user("seller")
    vocabulary = "apple berry cherry damson elder fig grape".split()
    names: dict[int, tuple[set[str], int]] = {}
    for n in range(60):
        words, category = rng.sample(vocabulary, rng.randint(1, 4)), rng.randrange(2)
        item_id = market.item(seller, name=" ".join(words).title()[:32], keywords=[], category=category,
                              quantity=1)
        names[item_id] = (set(words), category)
        if n % 9 == 0:  # sold out: leaves the search
            market.user("buyer").call("add_to_cart", {"item_id": item_id, "quantity": 1})
    buyer = market.user("buyer")
    for item_id in [i for n, i in enumerate(names) if n % 9 == 0]:
        buyer.call("add_to_cart", {"item_id": item_id, "quantity": 1})
        buyer.call("make_purchase", CARD)
        del names[item_id]
    for count in range(1, 9):
        query = rng.sample(vocabulary + ["zebra"], count)
        for category in (None, 1):
            limit = rng.randint(1, 9)
            ranked = sorted((-len(words & set(query)), item_id) for item_id, (words, cat) in names.items()
                            if category in (None, cat) and words & set(query))
            expected = [item_id for _, item_id in ranked]
            args = {"query": " ".join(query), **({} if category is None else {"category": category})}
            pages = every_page(buyer, limit, **args)
            assert [i for page in pages for i in page] == expected, (query, category, limit)
            assert all(len(page) == limit for page in pages[:-1])
            assert len(expected) > 3


def test_an_item_leaves_the_search_by_text_when_it_sells_out(market: Market) -> None:
    seller, buyer = market.user("seller"), market.user("buyer")
    bought = market.item(seller, name="Gone soon", keywords=[], quantity=1)
    removed = market.item(seller, name="Gone later", keywords=[], quantity=2)
    buyer.call("add_to_cart", {"item_id": bought, "quantity": 1})
    buyer.call("make_purchase", CARD)
    assert found(buyer, "gone") == [removed]
    seller.call("remove_item", {"item_id": removed, "quantity": 2})
    assert found(buyer, "gone soon later") == []
    indexed = market.db.run(lambda tx: tx.execute(select(item_words.c.item_id)).scalars().all())
    assert bought not in indexed and removed not in indexed
    assert buyer.call("get_item", {"item_id": bought})["name"] == "Gone soon"
    assert audit(market.db) == []


def test_the_audit_names_word_index_rows_that_differ_from_the_items(market: Market) -> None:
    seller = market.user("seller")
    lamp = market.item(seller, name="Lamp", keywords=[])
    assert audit(market.db) == []
    market.db.run(lambda tx: tx.execute(insert(item_words).values(word="stray", item_id=lamp, category=2)))
    assert audit(market.db) == [
        f"item {lamp}: word index rows differ from its name and keywords (on sale: 5)"]


def test_the_index_holds_each_folded_word_of_a_name_and_its_one_word_keywords_once() -> None:
    assert search_words("Ｆｕｌｌ-width ＬＡＭＰ lamp") == ["full", "width", "lamp"]
    assert item_search_words("Desk lamp", ["LAMP", "a b", "Über", "x_y"]) == ["desk", "lamp", "uber"]
    assert item_search_words("!!!", []) == []


def test_items_listed_before_the_upgrade_are_found_by_name(database: Database) -> None:
    """A database at schema version 3 (no word index) with items on sale and sold out: the
    upgrade indexes the words of those on sale, and a search by text finds them."""
    database.run(lambda tx: tx.execute(insert(users).values(
        user_id=1, role="seller", username="s1", name="S", password_hash="x", created_ms=0)))
    old_items = [{"item_id": item_id, "seller_id": 1, "name": name, "category": 1,
                  "keywords": json.dumps(["Antique"]), "item_condition": "used", "price_cents": 100,
                  "quantity": quantity, "listed": 2, "sold": 2 - quantity, "created_ms": 0}
                 for item_id, name, quantity in ((1, "Old brass lamp", 1), (2, "Old chair", 0),
                                                 (3, "Lamp shade", 2))]
    database.run(lambda tx: tx.execute(insert(items), old_items))
    database.run(lambda tx: tx.execute(text("UPDATE alembic_version SET version_num = '0004_payments'")))
    item_word_pairs.drop(database.engine)  # the revision before had neither
    item_words.drop(database.engine)
    database.create_schema()
    rows = database.run(lambda tx: tx.execute(select(item_words.c.item_id, item_words.c.word)
                                              .order_by(item_words.c.item_id, item_words.c.word)).all())
    assert [tuple(row) for row in rows] == [(1, "antique"), (1, "brass"), (1, "lamp"), (1, "old"),
                                            (3, "antique"), (3, "lamp"), (3, "shade")]
    pairs = database.run(lambda tx: tx.execute(
        select(item_word_pairs.c.item_id, item_word_pairs.c.pair_hash)).all())
    expected = [(item_id, word_pair_hash(*pair)) for item_id, words in
                ((1, ["antique", "brass", "lamp", "old"]), (3, ["antique", "lamp", "shade"]))
                for pair in keyword_pairs(words)]
    assert sorted(map(tuple, pairs)) == sorted(expected) and len(expected) == 9
    assert revision_of(database).is_head


def test_seeded_items_are_indexed_by_the_words_of_their_names_and_keywords(database: Database) -> None:
    seed(database, sellers=2, items_count=40)
    on_sale = database.run(lambda tx: tx.execute(select(items).where(items.c.quantity > 0)).all())
    expected = sorted((row["word"], row["item_id"]) for item in on_sale
                      for row in word_rows(item.item_id, item.category, item.name, json.loads(item.keywords)))
    indexed = database.run(lambda tx: tx.execute(select(item_words.c.word, item_words.c.item_id)).all())
    assert sorted(map(tuple, indexed)) == expected and len(expected) > 40
