"""search_items with `query` (protocol 1.2, "Search by text") over TCP, on SQLite and MariaDB:
equal words, stems, typos, category names, scripts without spaces, ranking, paging through
ties, the bounds on a search's work and an item's index, errors, and the upgrade that indexes
the items listed before it."""
from __future__ import annotations

import json
import random
from typing import Any

import pytest
from sqlalchemy import func, insert, select, text
from support import CARD, Market, running_market

from db import Database
from db.migrations import make_current, revision_of
from db.schema import (
    item_keyword_pairs,
    item_keywords,
    item_words,
    items,
    keyword_pair_rows,
    keyword_rows,
    users,
    vocabulary,
    word_rows,
)
from db.search import WINDOW
from operate.audit import audit
from operate.seed import seed
from wire import Connection
from wire.errors import BadRequestError
from wire.values import MAX_ITEM_WORDS, item_search_words, one_edit_apart, search_words, stem


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
    assert found(buyer, "bras") == found(buyer, "ras") == []  # whole words (a stem is a whole word's)


def test_words_sharing_a_stem_match_and_rank_below_equal_words(market: Market) -> None:
    seller, buyer = market.user("seller"), market.user("buyer")
    lamps = market.item(seller, name="Desk lamps", keywords=[])
    lamp = market.item(seller, name="Desk lamp", keywords=[])
    boxes = market.item(seller, name="Boxes of pens", keywords=[])
    running = market.item(seller, name="Running shoe", keywords=[])
    assert found(buyer, "lamps") == [lamps, lamp]  # equal before stem
    assert found(buyer, "lamp") == [lamp, lamps]
    assert found(buyer, "box") == found(buyer, "BOXES") == [boxes]
    assert found(buyer, "run") == found(buyer, "runs") == [running]
    assert found(buyer, "pen shoes") == [boxes, running]  # one query word each: by item_id


def test_words_of_five_letters_or_more_match_one_edit_away_and_rank_below_stems(market: Market) -> None:
    seller, buyer = market.user("seller"), market.user("buyer")
    table = market.item(seller, name="Oak table", keywords=[])
    tables = market.item(seller, name="Tables", keywords=[])
    chair = market.item(seller, name="Chair", keywords=[])
    lamp = market.item(seller, name="Lamp", keywords=[])
    assert found(buyer, "tabel") == [table]  # two neighbours swapped
    assert found(buyer, "tablex") == [table, tables]  # a letter added; "tables" is one changed
    assert found(buyer, "table") == [table, tables]  # equal, then the stem
    assert found(buyer, "chai") == []  # four letters: typos only from five
    assert found(buyer, "cair") == []  # four letters
    for typo in ("chiar", "charr", "hchair", "chairr"):
        assert found(buyer, typo) == [chair], typo
    assert found(buyer, "lmap") == []  # four letters
    assert found(buyer, "tabel chiar oak") == [table, chair]  # "tables" is two edits from "tabel"
    assert found(buyer, "lamb") == [] and found(buyer, "lamps") == [lamp]


def test_every_page_of_one_word_ranks_equal_words_then_stems_then_typos_whatever_their_item_order(
        market: Market) -> None:
    """A one-word first page reads a page's length of each term's range: items of a lower weight
    listed first, and one matching three terms, still come in rank order on every page."""
    seller, buyer = market.user("seller"), market.user("buyer")
    typos = [market.item(seller, name="Chain", keywords=[]) for _ in range(3)]  # "chain": 81
    both = market.item(seller, name="Chairs and a chair", keywords=[])  # chair, chairs, ~chair: 90
    stems = [market.item(seller, name="Chairs", keywords=[]) for _ in range(3)]  # ~chair 82, chairs 81
    equal = [market.item(seller, name="Chair", keywords=[]) for _ in range(3)]  # chair: 90
    expected = [both, *equal, *stems, *typos]
    for args in ({}, {"category": 2}):
        pages = every_page(buyer, 2, query="chair", **args)
        assert pages == [expected[n:n + 2] for n in range(0, len(expected), 2)], args


def test_a_query_word_naming_a_category_matches_every_item_of_it(market: Market) -> None:
    seller, buyer = market.user("seller"), market.user("buyer")
    home_lamp = market.item(seller, name="Lamp", keywords=[], category=2)
    book = market.item(seller, name="Lamp making", keywords=[], category=1)
    home_rug = market.item(seller, name="Rug", keywords=[], category=2)
    assert found(buyer, "home") == found(buyer, "HOME") == [home_lamp, home_rug]
    assert found(buyer, "lamp home") == [home_lamp, book, home_rug]
    assert found(buyer, "books") == found(buyer, "book") == [book]  # the stem of a category's name
    assert found(buyer, "home", category=1) == []


def test_in_scripts_written_without_spaces_each_character_is_a_word(market: Market) -> None:
    seller, buyer = market.user("seller"), market.user("buyer")
    bowl = market.item(seller, name="日本の茶碗", keywords=[])
    tea = market.item(seller, name="中国茶", keywords=[])
    assert found(buyer, "日本") == [bowl]
    assert found(buyer, "茶") == [bowl, tea]
    assert found(buyer, "中国の茶") == [tea, bowl]  # three characters matched, then two
    assert search_words("日本の茶碗 desk") == ["日", "本", "の", "茶", "碗", "desk"]


def test_an_emoji_only_query_is_a_bad_request_saying_so_and_emoji_beside_words_are_left_out(
        market: Market) -> None:
    seller, buyer = market.user("seller"), market.user("buyer")
    lamp = market.item(seller, name="Lamp 💡", keywords=[])
    assert found(buyer, "💡 lamp") == [lamp]
    with pytest.raises(BadRequestError, match="emoji and punctuation are not searched"):
        buyer.call("search_items", {"query": "💡🙂"})


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
           {"query": "日本の茶碗ですよね"}, {"query": 5}, {"query": ["lamp"]}]
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
    vocabulary_ = "apple berry cherry damson elder fig grape".split()
    names: dict[int, tuple[set[str], int]] = {}
    for n in range(60):
        words, category = rng.sample(vocabulary_, rng.randint(1, 4)), rng.randrange(2)
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
        query = rng.sample(vocabulary_ + ["zebra"], count)
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


def test_a_search_ranks_at_most_the_first_window_of_items_of_each_word(database: Database) -> None:
    """The attack of items named "a b c d e f g h ...": whatever the catalogue, a ranked search
    (by text, or of three keywords) reads at most WINDOW rows of each term's range (fewer for
    its first pages), so its pages hold the first WINDOW items."""
    database.run(lambda tx: tx.execute(insert(users).values(
        user_id=1, role="seller", username="s1", name="S", password_hash="x", created_ms=0)))
    name, count = "a b c d e f g h i j k l m n o p", WINDOW + 40
    rows = [{"item_id": n, "seller_id": 1, "name": name, "category": 0, "keywords": json.dumps(["q", "r"]),
             "item_condition": "new", "price_cents": 100, "quantity": 1, "listed": 1, "created_ms": 0}
            for n in range(1, count + 1)]
    database.run(lambda tx: tx.execute(insert(items), rows))
    database.run(lambda tx: tx.execute(insert(item_words), [
        row for n in range(1, count + 1) for row in word_rows(n, 0, name, ["q", "r"])]))
    database.run(lambda tx: tx.execute(insert(item_keywords), [
        row for n in range(1, count + 1) for row in keyword_rows(n, 0, ["q", "r"])]))
    database.run(lambda tx: tx.execute(insert(item_keyword_pairs), [
        row for n in range(1, count + 1) for row in keyword_pair_rows(n, ["q", "r"])]))
    with running_market(database) as market:
        buyer = market.user("buyer")
        by_text = every_page(buyer, 100, query="a b c d e f g h")
        by_keywords = every_page(buyer, 100, keywords=["q", "r", "s"])  # three keywords: ranked alike
        one_keyword = every_page(buyer, 100, keywords=["q"])  # a range read page by page: every item
    assert [i for page in by_text for i in page] == list(range(1, WINDOW + 1))
    assert [i for page in by_keywords for i in page] == list(range(1, WINDOW + 1))
    assert [i for page in one_keyword for i in page] == list(range(1, count + 1))


def test_an_item_brings_at_most_twelve_words_into_the_index(market: Market) -> None:
    seller = market.user("seller")
    item_id = market.item(seller, name="a b c d e f g h i j k l m n o p", keywords=["q", "r", "s", "t", "u"],
                          category=0)
    indexed = market.db.run(lambda tx: tx.execute(
        select(item_words.c.word).where(item_words.c.item_id == item_id)).all())
    assert sorted(row[0] for row in indexed) == sorted(["other", *"abcdefghijk"]) and MAX_ITEM_WORDS == 12


def test_an_item_leaves_the_search_by_text_when_it_sells_out(market: Market) -> None:
    seller, buyer = market.user("seller"), market.user("buyer")
    bought = market.item(seller, name="Gone soon", keywords=[], quantity=1)
    removed = market.item(seller, name="Gone later", keywords=[], quantity=2)
    buyer.call("add_to_cart", {"item_id": bought, "quantity": 1})
    buyer.call("make_purchase", CARD)
    assert found(buyer, "gone") == [removed]
    seller.call("remove_item", {"item_id": removed, "quantity": 2})
    assert found(buyer, "gone soon later") == []
    indexed = market.db.run(lambda tx: tx.execute(select(item_words.c.item_id)).all())
    assert bought not in [row[0] for row in indexed] and removed not in [row[0] for row in indexed]
    assert buyer.call("get_item", {"item_id": bought})["name"] == "Gone soon"
    assert audit(market.db) == []


def test_the_audit_names_word_index_rows_that_differ_from_the_items(market: Market) -> None:
    seller = market.user("seller")
    lamp = market.item(seller, name="Lamp", keywords=[])
    assert audit(market.db) == []
    market.db.run(lambda tx: tx.execute(insert(item_words).values(word="stray", item_id=lamp, category=2)))
    assert audit(market.db) == [
        f"item {lamp}: word index rows differ from its name and keywords (on sale: 5)"]


def test_the_word_rules_without_a_database() -> None:
    assert search_words("Ｆｕｌｌ-width ＬＡＭＰ lamp") == ["full", "width", "lamp"]
    assert search_words("\ufb03" * 32) == ["ffi" * 10 + "ff"]  # cut to 32 characters
    assert item_search_words("Desk lamp", ["LAMP", "a b", "Über", "x_y", "日本"], 2) == \
        ["home", "desk", "lamp", "uber"]
    assert item_search_words("!!!", [], 9) == ["collectibles"]
    words = ("lamps", "boxes", "running", "watches", "batteries", "glass", "ring")
    assert [stem(word) for word in words] == ["lamp", "box", "run", "watch", "battery", "glass", "ring"]
    others = ("tabel", "tables", "able", "tablx", "tbale", "tabla x")
    assert [one_edit_apart("table", other) for other in others] == [True, True, True, True, True, False]
    assert not one_edit_apart("table", "table") and not one_edit_apart("table", "btale")


def test_items_listed_before_the_upgrade_are_found_by_name_stem_and_typo(database: Database) -> None:
    """A database at revision 0008 (word pairs, no vocabulary) with items on sale and sold out:
    the upgrade indexes the words of those on sale anew, and a search by text finds them."""
    database.run(lambda tx: tx.execute(insert(users).values(
        user_id=1, role="seller", username="s1", name="S", password_hash="x", created_ms=0)))
    old_items = [{"item_id": item_id, "seller_id": 1, "name": name, "category": 1,
                  "keywords": json.dumps(["Antique"]), "item_condition": "used", "price_cents": 100,
                  "quantity": quantity, "listed": 2, "sold": 2 - quantity, "created_ms": 0}
                 for item_id, name, quantity in ((1, "Old brass lamps", 1), (2, "Old chair", 0),
                                                 (3, "Lamp shade", 2))]
    database.run(lambda tx: tx.execute(insert(items), old_items))
    at_0009 = text("UPDATE alembic_version SET version_num = '0009_device_tokens'")
    database.run(lambda tx: tx.execute(at_0009))
    database.run(lambda tx: tx.execute(text("CREATE TABLE item_word_pairs (pair_hash BIGINT)")))
    vocabulary.drop(database.engine)
    make_current(database)
    rows = database.run(lambda tx: tx.execute(select(item_words.c.item_id, item_words.c.word)
                                              .order_by(item_words.c.item_id, item_words.c.word)).all())
    assert [tuple(row) for row in rows] == [(1, "antique"), (1, "books"), (1, "brass"), (1, "lamps"),
                                            (1, "old"), (1, "~antiqu"), (1, "~book"), (1, "~lamp"),
                                            (3, "antique"), (3, "books"), (3, "lamp"), (3, "shade"),
                                            (3, "~antiqu"), (3, "~book"), (3, "~shad")]
    words = database.run(lambda tx: tx.execute(select(vocabulary.c.word).order_by(vocabulary.c.word)).all())
    assert [row[0] for row in words] == ["antique", "books", "brass", "lamp", "lamps", "shade"]
    tables = database.run(lambda tx: tx.execute(select(func.count()).select_from(items)).scalar())
    assert tables == 3 and revision_of(database).is_head
    with database.engine.connect() as conn:  # closed: an open read would hold SQLite's lock
        assert "item_word_pairs" not in database.engine.dialect.get_table_names(conn)
    with running_market(database) as market:
        buyer = market.user("buyer")
        assert found(buyer, "lamp") == [3, 1] and found(buyer, "antiqeu") == [1, 3]
    assert not [problem for problem in audit(database) if "word index" in problem]


def test_seeded_items_are_indexed_by_the_words_of_their_names_and_keywords(database: Database) -> None:
    seed(database, sellers=2, items_count=40)
    on_sale = database.run(lambda tx: tx.execute(select(items).where(items.c.quantity > 0)).all())
    expected = sorted((row["word"], row["item_id"]) for item in on_sale
                      for row in word_rows(item.item_id, item.category, item.name, json.loads(item.keywords)))
    indexed = database.run(lambda tx: tx.execute(select(item_words.c.word, item_words.c.item_id)).all())
    assert sorted(map(tuple, indexed)) == expected and len(expected) > 40
    assert database.run(lambda tx: tx.execute(select(func.count()).select_from(vocabulary)).scalar()) > 10
