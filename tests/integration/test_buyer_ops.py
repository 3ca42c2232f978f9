"""Every buyer op over TCP, with its errors, on SQLite and MariaDB."""
from __future__ import annotations

import json
import random
from typing import Any

import pytest
from sqlalchemy import select
from support import CARD, PASSWORD, Market, race, running_market

from db.carts import MAX_CART_LINES
from db.ledger import Ledger
from db.schema import item_keywords, items
from operate.audit import audit
from runtime.config import Settings
from wire import Connection
from wire.errors import (
    BadRequestError,
    ConflictError,
    ForbiddenError,
    NotFoundError,
    PaymentDeclinedError,
    UnauthenticatedError,
    UnknownOpError,
)
from wire.values import decode_cursor, encode_cursor


def test_search_by_category_and_keywords_ranks_by_matches_then_id(market: Market) -> None:
    seller = market.user("seller")
    one = market.item(seller, keywords=["desk"], category=2)
    two = market.item(seller, keywords=["desk", "light"], category=2)
    other_cat = market.item(seller, keywords=["desk", "light"], category=3)
    none = market.item(seller, keywords=[], category=2)
    market.item(seller, keywords=["chair"], category=2)
    sold_out = market.item(seller, keywords=["desk", "light"], category=2, quantity=1)
    seller.call("remove_item", {"item_id": sold_out, "quantity": 1})
    buyer = market.user("buyer")

    def ids(**args: object) -> list[int]:
        return [i["item_id"] for i in buyer.call("search_items", args)["items"]]

    assert ids(category=2, keywords=["LIGHT", "desk"]) == [two, one]
    assert ids(keywords=["desk", "light"]) == [two, other_cat, one]
    assert none in ids(category=2) and sold_out not in ids(category=2)
    assert ids(category=9) == []


def test_a_sold_out_item_leaves_the_search_index_by_purchase_or_removal(market: Market) -> None:
    seller, buyer = market.user("seller"), market.user("buyer")
    bought = market.item(seller, keywords=["gone", "soon"], quantity=1)
    removed = market.item(seller, keywords=["gone"], quantity=2)
    kept = market.item(seller, keywords=["soon"], quantity=3)

    def ids(*words: str) -> list[int]:
        return [i["item_id"] for i in buyer.call("search_items", {"keywords": list(words)})["items"]]

    assert ids("gone", "soon") == [bought, removed, kept]
    buyer.call("add_to_cart", {"item_id": bought, "quantity": 1})
    buyer.call("make_purchase", CARD)
    seller.call("remove_item", {"item_id": removed, "quantity": 1})
    assert ids("gone", "soon") == [removed, kept]  # one unit left: still listed
    seller.call("remove_item", {"item_id": removed, "quantity": 1})
    assert ids("gone", "soon") == [kept]
    indexed = market.db.run(lambda tx: tx.execute(select(item_keywords.c.item_id).distinct()).scalars().all())
    assert bought not in indexed and removed not in indexed and kept in indexed
    assert buyer.call("get_item", {"item_id": bought})["keywords"] == ["gone", "soon"]  # kept on the item
    assert audit(market.db) == []


def search_pages(buyer: Connection, cursor: str | None = None, **args: Any) -> list[dict[str, Any]]:
    """Every page of one search (from the cursor given), following next_cursor to the last."""
    pages = []
    while True:
        page = buyer.call("search_items", {**args, "cursor": cursor})
        pages.append(page)
        if (cursor := page["next_cursor"]) is None:
            return pages


def ids_of(pages: list[dict[str, Any]]) -> list[int]:
    return [item["item_id"] for page in pages for item in page["items"]]


def test_search_pages_through_the_ranked_order(market: Market) -> None:
    seller, buyer = market.user("seller"), market.user("buyer")
    for i in range(6):
        market.item(seller, keywords=["a", "b"] if i % 2 else ["a"], category=1)
    everything = buyer.call("search_items", {"keywords": ["a", "b"], "limit": 500})["items"]
    expected = [i["item_id"] for i in everything]
    seen = ids_of(search_pages(buyer, keywords=["a", "b"], limit=2))
    assert seen == expected and len(seen) == 6


def test_one_keyword_search_pages_in_item_order_with_the_ranked_cursor(market: Market) -> None:
    """One keyword ranks every match 1, so its pages are item_id order (read without grouping)."""
    seller, buyer = market.user("seller"), market.user("buyer")
    made = [(market.item(seller, keywords=["a", "b"][: 1 + i % 2], category=i % 3), i % 3) for i in range(9)]
    seller.call("remove_item", {"item_id": made[4][0], "quantity": 5})  # sold out: leaves the index
    on_sale = [(item_id, category) for item_id, category in made if item_id != made[4][0]]

    def pages(**args: object) -> tuple[list[int], set[int]]:
        found = search_pages(buyer, **args, keywords=["A"], limit=2)
        return ids_of(found), {decode_cursor(page["next_cursor"], 2)[0] for page in found[:-1]}

    assert pages() == ([item_id for item_id, _ in on_sale], {1})
    assert pages(category=1)[0] == [item_id for item_id, category in on_sale if category == 1]
    everything = [i["item_id"] for i in buyer.call("search_items", {"keywords": ["a"]})["items"]]
    assert everything == pages()[0]

    def after(cursor: str) -> list[int]:
        page = buyer.call("search_items", {"keywords": ["a"], "cursor": cursor})
        return [i["item_id"] for i in page["items"]]

    assert after(encode_cursor(2, 10**9)) == everything  # rank 1 comes after any rank-2 place
    assert after(encode_cursor(1, on_sale[2][0])) == everything[3:]
    assert after(encode_cursor(0, 0)) == []  # below rank 1: nothing follows


def random_catalogue(market: Market, rng: random.Random) -> Connection:
    """150 items with 1-5 of the keywords a-g in three categories (one with all of c-g),
    every seventh sold out; returns a buyer."""
    seller = market.user("seller")
    for n in range(150):
        keywords = rng.sample("abcdefg", rng.randint(1, 5)) if n != 1 else list("gcefd")
        item_id = market.item(seller, keywords=keywords, category=rng.randrange(3), quantity=2)
        if n % 7 == 0:
            seller.call("remove_item", {"item_id": item_id, "quantity": 2})
    return market.user("buyer")


def page_ids(buyer: Connection, keywords: list[str], limit: int, **args: object) -> list[list[int]]:
    """The item ids of every page of one search, page by page."""
    return [ids_of([page]) for page in search_pages(buyer, **args, keywords=keywords, limit=limit)]


def expected_pages(market: Market, keywords: list[str], limit: int,
                   category: int | None = None) -> list[list[int]]:
    """The protocol's ranking worked out in Python from every item on sale: most of the
    keywords first, then item_id; cut into pages of `limit`."""
    on_sale = market.db.run(lambda tx: tx.execute(select(items.c.item_id, items.c.keywords, items.c.category)
                                                  .where(items.c.quantity > 0)).all(), write=False)
    ranked = sorted((-len(set(json.loads(item.keywords)) & set(keywords)), item.item_id) for item in on_sale
                    if category is None or item.category == category)
    found = [item_id for minus_rank, item_id in ranked if minus_rank < 0]
    return [found[start:start + limit] for start in range(0, len(found), limit)] or [[]]


@pytest.mark.parametrize("count", [1, 2, 3, 4, 5])
def test_keyword_search_pages_follow_the_ranking_worked_out_in_python(market: Market, count: int) -> None:
    """Every page of random searches of `count` keywords, with and without a category, over
    random items (some sold out), against the ranking worked out from the items themselves."""
    rng = random.Random(10 + count)
    buyer = random_catalogue(market, rng)
    for _ in range(3):
        keywords = rng.sample("abcdefgz", count)  # z: a keyword no item has
        for category in (None, rng.randrange(3)):
            limit = rng.randint(2, 30)
            expected = expected_pages(market, keywords, limit, category)
            args = {} if category is None else {"category": category}
            assert page_ids(buyer, keywords, limit, **args) == expected, (keywords, category, limit)
            assert sum(map(len, expected)) > 5
    ranks = [sum(word in item["keywords"] for word in "cdefg")
             for item in buyer.call("search_items", {"keywords": list("gfedc"), "limit": 500})["items"]]
    assert {5, 4, 3, 2, 1} <= set(ranks)  # the catalogue has every rank a search can give


@pytest.mark.parametrize("keywords", [["a", "b", "c"], ["c", "b", "a", "e", "d"]])
def test_a_first_page_of_many_keywords_reads_each_range_as_far_as_the_page_needs(
        market: Market, keywords: list[str]) -> None:
    """The first page of three to five keywords takes each keyword's items of rank one from
    the start of its range, cut at the page plus one: here the two items of rank two and
    the first rank-one items all lie in keyword a's range, the last one the page needs (to
    know a next page exists) at its fourth row. One row fewer and the search would end early."""
    seller, buyer = market.user("seller"), market.user("buyer")
    both = [market.item(seller, keywords=["a", "b"]) for _ in range(2)]
    only_a = [market.item(seller, keywords=["a"]) for _ in range(3)]
    market.item(seller, keywords=["z"])
    assert page_ids(buyer, keywords, 3) == [both + only_a[:1], only_a[1:]]
    assert page_ids(buyer, keywords, 2) == [both, only_a[:2], only_a[2:]]
    assert page_ids(buyer, keywords, 5) == [both + only_a]


@pytest.mark.parametrize("keywords", [["a", "b", "c"], ["e", "c", "a", "b"]])
def test_a_later_page_of_many_keywords_reads_past_the_items_of_higher_rank(
        market: Market, keywords: list[str]) -> None:
    """Both items of rank two come after the first two of rank one in keyword a's range: the
    first page shows them before those, and the later pages, continuing at rank one, pass
    over them. (Reading each range only for the page plus one after a cursor at rank one
    would end the search early.)"""
    seller, buyer = market.user("seller"), market.user("buyer")
    first = [market.item(seller, keywords=["a"]) for _ in range(2)]
    both = [market.item(seller, keywords=["b", "a"]) for _ in range(2)]
    rest = [market.item(seller, keywords=["a"]) for _ in range(3)]
    assert page_ids(buyer, keywords, 2) == [both, first, rest[:2], rest[2:]]
    assert page_ids(buyer, keywords, 3) == [both + first[:1], first[1:] + rest[:2], rest[2:]]


def test_a_later_page_of_many_keywords_sees_items_of_higher_rank_added_since(market: Market) -> None:
    """Two items with two of the keywords are listed after the first page, in keyword a's
    range past the cursor: the later pages still hold every item of rank one after it."""
    seller, buyer = market.user("seller"), market.user("buyer")
    both = market.item(seller, keywords=["a", "b"])
    only_a = [market.item(seller, keywords=["a"]) for _ in range(3)]
    first = buyer.call("search_items", {"keywords": ["a", "b", "c"], "limit": 2})
    assert ids_of([first]) == [both, only_a[0]]
    [market.item(seller, keywords=["b", "a"]) for _ in range(2)]
    only_a.append(market.item(seller, keywords=["a"]))
    rest = search_pages(buyer, keywords=["a", "b", "c"], limit=2, cursor=first["next_cursor"])
    assert [ids_of([page]) for page in rest] == [only_a[1:3], only_a[3:]]


def test_a_search_that_finds_nothing_still_checks_the_token(market: Market) -> None:
    market.item(market.user("seller"), keywords=["x", "y", "z"])
    buyer = market.user("buyer")
    for words in (["p", "q", "r"], ["x", "y", "z"]):
        assert len(buyer.call("search_items", {"keywords": words})["items"]) == (words[0] == "x")
    buyer.call("logout")
    for words in (["p", "q", "r"], ["x", "y", "z"], ["p", "q"], ["x"]):
        with pytest.raises(UnauthenticatedError):
            buyer.call("search_items", {"keywords": words})


def test_a_two_keyword_cursor_continues_at_its_rank(market: Market) -> None:
    seller, buyer = market.user("seller"), market.user("buyer")
    made = [market.item(seller, keywords=["x", "y"] if n % 3 == 0 else ["y"]) for n in range(7)]
    both, one = made[::3], [item_id for n, item_id in enumerate(made) if n % 3]
    everything = ids_of([buyer.call("search_items", {"keywords": ["y", "x"]})])
    assert everything == both + one

    def after(matches: int, item_id: int) -> list[int]:
        return ids_of([buyer.call("search_items", {"keywords": ["x", "y"],
                                                   "cursor": encode_cursor(matches, item_id)})])

    assert after(3, 10**9) == everything  # above rank 2: everything follows
    assert after(2, both[0]) == both[1:] + one
    assert after(2, 10**9) == one  # past the last rank-2 item: rank 1 from its start
    assert after(1, one[1]) == one[2:]
    assert after(0, 0) == []


def test_get_item_shows_sold_out_items_and_unknown_is_not_found(market: Market) -> None:
    seller, buyer = market.user("seller"), market.user("buyer")
    item_id = market.item(seller, quantity=1)
    seller.call("remove_item", {"item_id": item_id, "quantity": 1})
    assert buyer.call("get_item", {"item_id": item_id})["quantity"] == 0
    with pytest.raises(NotFoundError):
        buyer.call("get_item", {"item_id": item_id + 1000})
    with pytest.raises(BadRequestError, match="^item_id: "):
        buyer.call("get_item", {"item_id": "1"})


def test_cart_add_remove_and_limits(market: Market) -> None:
    seller, buyer = market.user("seller"), market.user("buyer")
    item_id = market.item(seller, quantity=3, price="2.50")
    cart = buyer.call("add_to_cart", {"item_id": item_id, "quantity": 2})["cart"]
    assert cart == {"items": [{"item_id": item_id, "name": "Lamp", "price": "2.50", "quantity": 2,
                               "available": 3}], "total": "5.00"}
    with pytest.raises(ConflictError, match="only 3 left"):
        buyer.call("add_to_cart", {"item_id": item_id, "quantity": 2})
    with pytest.raises(NotFoundError):
        buyer.call("add_to_cart", {"item_id": item_id + 99, "quantity": 1})
    assert buyer.call("remove_from_cart", {"item_id": item_id, "quantity": 1})["cart"]["total"] == "2.50"
    assert buyer.call("remove_from_cart", {"item_id": item_id + 99, "quantity": 1})["cart"]["total"] == "2.50"
    assert buyer.call("remove_from_cart", {"item_id": item_id, "quantity": 9})["cart"]["items"] == []


def test_a_cart_holds_at_most_a_hundred_different_items(market: Market) -> None:
    """Unbounded, a cart of thousands of lines made every cart answer (and the receipt) larger
    than the 1 MiB frame a client reads: the buyer could no longer see the cart."""
    seller, buyer = market.user("seller"), market.user("buyer")
    items = [market.item(seller, quantity=3) for _ in range(MAX_CART_LINES + 1)]
    for item_id in items[:MAX_CART_LINES]:
        buyer.call("add_to_cart", {"item_id": item_id, "quantity": 1})
    with pytest.raises(ConflictError, match="holds 100 different items"):
        buyer.call("add_to_cart", {"item_id": items[-1], "quantity": 1})
    cart = buyer.call("add_to_cart", {"item_id": items[0], "quantity": 2})["cart"]  # more of one held
    assert len(cart["items"]) == MAX_CART_LINES and cart["items"][0]["quantity"] == 3
    buyer.call("remove_from_cart", {"item_id": items[0], "quantity": 3})
    assert len(buyer.call("add_to_cart", {"item_id": items[-1], "quantity": 1})["cart"]["items"]) == 100


def test_a_sold_out_item_cannot_go_in_a_cart(market: Market) -> None:
    seller, buyer = market.user("seller"), market.user("buyer")
    item_id = market.item(seller, quantity=1)
    seller.call("remove_item", {"item_id": item_id, "quantity": 1})
    with pytest.raises(ConflictError, match="only 0 left"):
        buyer.call("add_to_cart", {"item_id": item_id, "quantity": 1})


def test_saved_cart_survives_logout_and_the_session_cart_does_not(market: Market) -> None:
    seller, buyer = market.user("seller"), market.user("buyer")
    a, b = market.item(seller), market.item(seller)
    buyer.call("add_to_cart", {"item_id": a, "quantity": 1})
    buyer.call("save_cart")
    buyer.call("add_to_cart", {"item_id": b, "quantity": 1})  # not saved
    buyer.call("logout")
    relogin = market.connect("buyer")
    relogin.token = relogin.call("login", {"username": buyer.username, "password": PASSWORD})["token"]
    assert [line["item_id"] for line in relogin.call("display_cart")["cart"]["items"]] == [a]
    assert relogin.call("clear_cart")["cart"] == {"items": [], "total": "0.00"}
    other = market.connect("buyer")
    other.token = other.call("login", {"username": buyer.username, "password": PASSWORD})["token"]
    assert [line["item_id"] for line in other.call("display_cart")["cart"]["items"]] == [a]


def test_purchase_buys_everything_updates_stock_history_and_ratings(market: Market) -> None:
    seller, buyer = market.user("seller"), market.user("buyer")
    a = market.item(seller, quantity=5, price="10.00", name="A")
    b = market.item(seller, quantity=2, price="0.05", name="B")
    buyer.call("add_to_cart", {"item_id": a, "quantity": 2})
    buyer.call("add_to_cart", {"item_id": b, "quantity": 2})
    buyer.call("save_cart")
    receipt = buyer.call("make_purchase", CARD)
    assert receipt["total"] == "20.10"
    assert receipt["lines"] == [{"item_id": a, "name": "A", "quantity": 2, "price": "10.00"},
                                {"item_id": b, "name": "B", "quantity": 2, "price": "0.05"}]
    assert buyer.call("display_cart")["cart"]["items"] == []
    assert buyer.call("get_item", {"item_id": a})["quantity"] == 3
    assert buyer.call("get_item", {"item_id": b})["quantity"] == 0
    assert seller.call("get_seller_rating")["items_sold"] == 4
    history = buyer.call("get_purchase_history")["purchases"]
    assert [(h["item_id"], h["quantity"], h["price"], h["feedback"]) for h in history] == \
        [(a, 2, "10.00", None), (b, 2, "0.05", None)]
    assert history[0]["order_id"] == receipt["order_id"]
    assert history[0]["purchased_at"].endswith("Z") and "T" in history[0]["purchased_at"]
    seller.call("change_price", {"item_id": a, "price": "99.00"})
    assert buyer.call("get_purchase_history")["purchases"][0]["price"] == "10.00"


def test_a_purchase_is_made_only_at_the_total_the_buyer_confirmed(market: Market) -> None:
    """The attack of a price raised after the buyer filled the cart: the buyer saw 5.00."""
    seller, buyer = market.user("seller"), market.user("buyer")
    a, b = market.item(seller, quantity=5, price="2.00"), market.item(seller, quantity=1, price="1.00")
    buyer.call("add_to_cart", {"item_id": a, "quantity": 2})
    buyer.call("add_to_cart", {"item_id": b, "quantity": 1})
    assert buyer.call("display_cart")["cart"]["total"] == "5.00"
    seller.call("change_price", {"item_id": a, "price": "1000000.00"})
    with pytest.raises(ConflictError, match=r"^the cart's total is now 2000001\.00; nothing was bought$"):
        buyer.call("make_purchase", {**CARD, "expected_total": "5.00"})
    assert Ledger(market.db).entries() == []  # no authorisation taken
    assert [buyer.call("get_item", {"item_id": i})["quantity"] for i in (a, b)] == [5, 1]
    assert buyer.call("display_cart")["cart"]["total"] == "2000001.00"  # the cart kept, at today's prices
    assert buyer.call("get_purchase_history")["purchases"] == []
    seller.call("change_price", {"item_id": a, "price": "2.50"})
    receipt = buyer.call("make_purchase", {**CARD, "expected_total": "6.00"})
    assert receipt["total"] == "6.00" and [p.amount_cents for p in Ledger(market.db).entries()] == [600]
    buyer.call("add_to_cart", {"item_id": a, "quantity": 1})
    seller.call("change_price", {"item_id": a, "price": "3.00"})
    assert buyer.call("make_purchase", CARD)["total"] == "3.00"  # none confirmed: today's price
    with pytest.raises(BadRequestError, match="^expected_total: "):
        buyer.call("make_purchase", {**CARD, "expected_total": 3})
    assert audit(market.db) == []


def test_a_price_raised_while_buyers_pay_is_never_charged(market: Market) -> None:
    seller = market.user("seller")
    item_id = market.item(seller, quantity=100, price="1.00")
    buyers = [market.user("buyer") for _ in range(4)]
    for buyer in buyers:
        buyer.call("add_to_cart", {"item_id": item_id, "quantity": 1})
    confirmed = {**CARD, "expected_total": "1.00"}
    results = race([lambda b=buyer: b.call("make_purchase", confirmed) for buyer in buyers]
                   + [lambda: seller.call("change_price", {"item_id": item_id, "price": "9.00"})])
    paid = [r["total"] for r in results[:4] if isinstance(r, dict)]
    refused = [str(r) for r in results[:4] if not isinstance(r, dict)]
    assert paid == ["1.00"] * len(paid)
    assert refused == ["the cart's total is now 9.00; nothing was bought"] * len(refused)
    assert [p.amount_cents for p in Ledger(market.db).entries()] == [100] * len(paid)
    assert audit(market.db) == []


def test_history_is_newest_first_and_pages(market: Market) -> None:
    seller, buyer = market.user("seller"), market.user("buyer")
    item_id = market.item(seller, quantity=10)
    orders = []
    for _ in range(3):
        buyer.call("add_to_cart", {"item_id": item_id, "quantity": 1})
        orders.append(buyer.call("make_purchase", CARD)["order_id"])
    page = buyer.call("get_purchase_history", {"limit": 2})
    assert [p["order_id"] for p in page["purchases"]] == orders[::-1][:2]
    rest = buyer.call("get_purchase_history", {"limit": 2, "cursor": page["next_cursor"]})
    assert [p["order_id"] for p in rest["purchases"]] == [orders[0]] and rest["next_cursor"] is None


def test_purchase_needs_a_cart_and_a_valid_card(market: Market) -> None:
    seller, buyer = market.user("seller"), market.user("buyer")
    with pytest.raises(ConflictError, match="empty"):
        buyer.call("make_purchase", CARD)
    buyer.call("add_to_cart", {"item_id": market.item(seller), "quantity": 1})
    for field, bad in (("card_number", "4111111111111112"), ("card_number", "123"),
                       ("card_expiry", "01/20"), ("card_expiry", "13/30"), ("card_name", ""),
                       ("card_name", "x" * 65), ("card_name", "Ann\x07"), ("card_number", "0" * 12),
                       ("idempotency_key", ""), ("idempotency_key", "k" * 129)):
        with pytest.raises(BadRequestError, match=f"^{field}: "):
            buyer.call("make_purchase", {**CARD, field: bad})
    assert len(buyer.call("display_cart")["cart"]["items"]) == 1


def test_not_enough_stock_is_a_conflict_and_keeps_the_cart(market: Market) -> None:
    seller, buyer, rival = market.user("seller"), market.user("buyer"), market.user("buyer")
    a, b = market.item(seller, quantity=5), market.item(seller, quantity=1)
    buyer.call("add_to_cart", {"item_id": a, "quantity": 2})
    buyer.call("add_to_cart", {"item_id": b, "quantity": 1})
    rival.call("add_to_cart", {"item_id": b, "quantity": 1})
    rival.call("make_purchase", CARD)
    with pytest.raises(ConflictError, match=f"item {b}: only 0 left"):
        buyer.call("make_purchase", CARD)
    assert len(buyer.call("display_cart")["cart"]["items"]) == 2
    assert buyer.call("get_item", {"item_id": a})["quantity"] == 5  # nothing half done


def test_a_declined_card_changes_nothing(database: object) -> None:

    with running_market(database, Settings(role="buyer", payment_decline_rate=1.0)) as market:  # type: ignore[arg-type]
        seller, buyer = market.user("seller"), market.user("buyer")
        item_id = market.item(seller, quantity=2)
        buyer.call("add_to_cart", {"item_id": item_id, "quantity": 1})
        with pytest.raises(PaymentDeclinedError, match="1111"):
            buyer.call("make_purchase", CARD)
        assert buyer.call("get_item", {"item_id": item_id})["quantity"] == 2
        assert buyer.call("get_purchase_history")["purchases"] == []
        assert len(buyer.call("display_cart")["cart"]["items"]) == 1
        assert seller.call("get_seller_rating")["items_sold"] == 0


def test_an_idempotency_key_replays_the_same_answer(market: Market) -> None:
    seller, buyer = market.user("seller"), market.user("buyer")
    item_id = market.item(seller, quantity=5)
    buyer.call("add_to_cart", {"item_id": item_id, "quantity": 2})
    first = buyer.call("make_purchase", {**CARD, "idempotency_key": "order-1"})
    again = buyer.call("make_purchase", {**CARD, "idempotency_key": "order-1"})  # cart now empty
    assert again == first
    buyer.call("add_to_cart", {"item_id": item_id, "quantity": 1})
    assert buyer.call("make_purchase", {**CARD, "idempotency_key": "order-1"}) == first
    assert buyer.call("get_item", {"item_id": item_id})["quantity"] == 3
    second = buyer.call("make_purchase", {**CARD, "idempotency_key": "order-2"})
    assert second["order_id"] != first["order_id"]


def test_idempotency_keys_that_differ_only_in_trailing_spaces_are_two_purchases(market: Market) -> None:
    """MySQL's _bin collations compare "k" and "k " equal: the key column must not."""
    seller, buyer = market.user("seller"), market.user("buyer")
    item_id = market.item(seller, quantity=5)
    receipts = []
    for key in ("k", "k ", "k  "):
        buyer.call("add_to_cart", {"item_id": item_id, "quantity": 1})
        receipts.append(buyer.call("make_purchase", {**CARD, "idempotency_key": key}))
    assert len({receipt["order_id"] for receipt in receipts}) == 3
    assert buyer.call("get_item", {"item_id": item_id})["quantity"] == 2
    assert buyer.call("make_purchase", {**CARD, "idempotency_key": "k "}) == receipts[1]


def test_keywords_that_differ_only_in_trailing_spaces_are_two_keywords(market: Market) -> None:
    seller, buyer = market.user("seller"), market.user("buyer")
    both = market.item(seller, keywords=["a", "a "])
    spaced = market.item(seller, keywords=["a ", "b"])
    plain = market.item(seller, keywords=["a"])

    def ids(*words: str) -> list[int]:
        return ids_of([buyer.call("search_items", {"keywords": list(words)})])

    assert buyer.call("get_item", {"item_id": both})["keywords"] == ["a", "a "]
    assert ids("a") == [both, plain]
    assert ids("a ") == [both, spaced]
    assert ids("a", "a ") == [both, spaced, plain]
    assert ids("a ", "b") == [spaced, both]
    assert audit(market.db) == []


def test_the_same_key_from_another_buyer_is_another_purchase(market: Market) -> None:
    seller, one, two = market.user("seller"), market.user("buyer"), market.user("buyer")
    item_id = market.item(seller, quantity=5)
    for buyer in (one, two):
        buyer.call("add_to_cart", {"item_id": item_id, "quantity": 1})
    a = one.call("make_purchase", {**CARD, "idempotency_key": "same"})
    b = two.call("make_purchase", {**CARD, "idempotency_key": "same"})
    assert a["order_id"] != b["order_id"]


def test_feedback_once_per_bought_item_counts_for_item_and_seller(market: Market) -> None:
    seller, buyer = market.user("seller"), market.user("buyer")
    bought, not_bought = market.item(seller), market.item(seller)
    buyer.call("add_to_cart", {"item_id": bought, "quantity": 1})
    buyer.call("make_purchase", CARD)
    with pytest.raises(ForbiddenError):
        buyer.call("provide_feedback", {"item_id": not_bought, "vote": "up"})
    with pytest.raises(NotFoundError):
        buyer.call("provide_feedback", {"item_id": bought + 99, "vote": "up"})
    with pytest.raises(BadRequestError, match="^vote: "):
        buyer.call("provide_feedback", {"item_id": bought, "vote": "meh"})
    assert buyer.call("provide_feedback", {"item_id": bought, "vote": "down"}) == {}
    with pytest.raises(ConflictError):
        buyer.call("provide_feedback", {"item_id": bought, "vote": "up"})
    assert buyer.call("get_item", {"item_id": bought})["thumbs_down"] == 1
    assert buyer.call("get_seller_rating", {"seller_id": seller.user_id})["thumbs_down"] == 1
    assert buyer.call("get_purchase_history")["purchases"][0]["feedback"] == "down"


def test_seller_rating_of_an_unknown_seller_is_not_found(market: Market) -> None:
    buyer = market.user("buyer")
    with pytest.raises(NotFoundError):
        buyer.call("get_seller_rating", {"seller_id": buyer.user_id + 10**6})
    with pytest.raises(NotFoundError):  # a buyer is not a seller
        buyer.call("get_seller_rating", {"seller_id": buyer.user_id})
    with pytest.raises(BadRequestError, match="^seller_id: required"):
        buyer.call("get_seller_rating")


def test_seller_ops_are_unknown_on_the_buyer_server(market: Market) -> None:
    with pytest.raises(UnknownOpError):
        market.user("buyer").call("put_item", {})


@pytest.mark.parametrize("db_url", ["mariadb"], indirect=True)
def test_a_purchase_takes_a_few_round_trips_for_any_cart(market: Market, round_trips: list[int]) -> None:
    sellers = [market.user("seller") for _ in range(3)]
    buyer = market.user("buyer")

    def queries_of_purchase(item_ids: list[int]) -> int:
        for item_id in item_ids:
            buyer.call("add_to_cart", {"item_id": item_id, "quantity": 1})
        round_trips.clear()
        receipt = buyer.call("make_purchase", CARD)
        assert sorted(line["item_id"] for line in receipt["lines"]) == sorted(item_ids)
        return len(round_trips)

    one = queries_of_purchase([market.item(sellers[0], quantity=1)])  # the last unit: unlisted too
    many = queries_of_purchase([market.item(seller) for seller in sellers] + [market.item(sellers[0])])
    # The order: the token check; the order with the cart; the stock, lines and counts with
    # the COMMIT. Then one each, every write travelling with its COMMIT: the authorisation in
    # the ledger; the capture in the ledger; paid and the carts emptied.
    assert one == many == 6
    assert audit(market.db) == []
    assert len(buyer.call("get_purchase_history", {})["purchases"]) == 5  # every line recorded


@pytest.mark.parametrize("db_url", ["mariadb"], indirect=True)
def test_cart_writes_and_votes_carry_their_commit(market: Market, round_trips: list[int]) -> None:
    seller, buyer = market.user("seller"), market.user("buyer")
    item_id = market.item(seller, quantity=3)

    def queries_of(op: str, args: dict[str, Any]) -> tuple[int, Any]:
        round_trips.clear()
        result = buyer.call(op, args)
        return len(round_trips), result

    # the stock and the token; then the new line, the cart shown and the COMMIT
    count, result = queries_of("add_to_cart", {"item_id": item_id, "quantity": 2})
    assert count == 2 and result["cart"]["items"][0]["quantity"] == 2
    count, result = queries_of("remove_from_cart", {"item_id": item_id, "quantity": 1})
    assert count == 2 and result["cart"]["items"][0]["quantity"] == 1
    count, result = queries_of("save_cart", {})
    assert count == 2 and result["cart"]["items"][0]["quantity"] == 1
    count, result = queries_of("display_cart", {})  # the token checked in the cart's read
    assert count == 1 and result["cart"]["items"][0]["quantity"] == 1
    buyer.call("make_purchase", CARD)
    count, result = queries_of("get_purchase_history", {})  # the token checked in the read
    assert count == 1 and result["purchases"][0]["item_id"] == item_id
    # the item and the token; the vote if bought; the counters with the COMMIT
    assert queries_of("provide_feedback", {"item_id": item_id, "vote": "up"})[0] == 3
    item = buyer.call("get_item", {"item_id": item_id})
    assert (item["thumbs_up"], item["thumbs_down"]) == (1, 0)
    with pytest.raises(ConflictError):
        buyer.call("provide_feedback", {"item_id": item_id, "vote": "down"})
    assert buyer.call("display_cart", {})["cart"]["items"] == []  # the purchase committed its lines away
    assert audit(market.db) == []


def test_a_cursor_is_a_place_in_the_order_whatever_the_search_that_made_it(market: Market) -> None:
    """Sent with other arguments a cursor goes on from its place in the new search; one of the
    other order's shape (an item id in a ranked search, or the reverse) is a bad request."""
    seller, buyer = market.user("seller"), market.user("buyer")
    lamps = [market.item(seller, category=2) for _ in range(3)]
    chairs = [market.item(seller, category=3) for _ in range(3)]
    plain = buyer.call("search_items", {"category": 2, "limit": 2})
    assert ids_of([plain]) == lamps[:2]
    switched = buyer.call("search_items", {"category": 3, "cursor": plain["next_cursor"]})
    assert ids_of([switched]) == chairs  # every chair comes after the second lamp
    ranked = buyer.call("search_items", {"keywords": ["desk"], "limit": 2})
    assert ids_of([buyer.call("search_items", {"keywords": ["light"], "cursor": ranked["next_cursor"]})]) \
        == (lamps + chairs)[2:]
    with pytest.raises(BadRequestError, match="^cursor: "):
        buyer.call("search_items", {"keywords": ["desk"], "cursor": plain["next_cursor"]})
    with pytest.raises(BadRequestError, match="^cursor: "):
        buyer.call("search_items", {"cursor": ranked["next_cursor"]})


def test_a_cursor_past_the_databases_integers_is_a_bad_request(market: Market) -> None:
    # before: SQLite's driver raised OverflowError, answered INTERNAL
    seller, buyer = market.user("seller"), market.user("buyer")
    market.item(seller)
    huge = encode_cursor(2**63)
    with pytest.raises(BadRequestError, match="^cursor: "):
        seller.call("display_items", {"cursor": huge})
    for args in ({}, {"keywords": ["desk"]}, {"keywords": ["desk", "light"]}):
        with pytest.raises(BadRequestError, match="^cursor: "):
            buyer.call("search_items", {**args, "cursor": encode_cursor(2**63, 1)})
    with pytest.raises(BadRequestError, match="^cursor: "):
        buyer.call("get_purchase_history", {"cursor": huge})
    last = seller.call("display_items", {"cursor": encode_cursor(2**63 - 1)})
    assert last == {"items": [], "next_cursor": None}


def test_a_keyword_longer_than_8_once_lower_cased_is_a_bad_request(market: Market) -> None:
    # "İ".lower() is two characters: the stored keyword would have been 9 long
    seller = market.user("seller")
    with pytest.raises(BadRequestError, match="^keywords: each keyword must be"):
        market.item(seller, keywords=["İstanbul"])
    item_id = market.item(seller, keywords=["İstanbu"])
    assert market.user("buyer").call("get_item", {"item_id": item_id})["keywords"] == ["i̇stanbu"]
