"""Every seller op over TCP, with its errors, on SQLite and MariaDB."""
from __future__ import annotations

from dataclasses import replace

import pytest
from support import CARD, Market, running_market

from db import Database
from operate.audit import audit
from runtime.config import Settings
from wire.errors import BadRequestError, ConflictError, ForbiddenError, NotFoundError, UnknownOpError


def test_put_item_and_display_it(market: Market) -> None:
    seller = market.user("seller")
    item_id = market.item(seller, name="Desk lamp", keywords=["Desk", "LIGHT"], price="12.5", quantity=4)
    items = seller.call("display_items")
    assert items == {"next_cursor": None, "items": [{
        "item_id": item_id, "seller_id": seller.user_id, "name": "Desk lamp", "category": 2,
        "keywords": ["desk", "light"], "condition": "used", "price": "12.50", "quantity": 4,
        "thumbs_up": 0, "thumbs_down": 0}]}


def test_keywords_beyond_ascii_come_back_exactly(market: Market) -> None:
    seller = market.user("seller")
    words = ["naïve", "東京", "🛒cart", 'q"uote', "back\\"]  # stored as JSON with \u escapes
    item_id = market.item(seller, keywords=words)
    assert seller.call("display_items")["items"][0]["keywords"] == words
    buyer = market.user("buyer")
    assert buyer.call("get_item", {"item_id": item_id})["keywords"] == words
    assert buyer.call("search_items", {"keywords": ["🛒cart"]})["items"][0]["keywords"] == words


@pytest.mark.parametrize("override,field", [
    ({"name": ""}, "name"), ({"name": "x" * 33}, "name"), ({"category": 10}, "category"),
    ({"category": True}, "category"), ({"keywords": ["a", "A"]}, "keywords"),
    ({"keywords": ["toolongword"]}, "keywords"), ({"condition": "broken"}, "condition"),
    ({"price": 12.5}, "price"), ({"price": "0.00"}, "price"), ({"price": "1.234"}, "price"),
    ({"quantity": 0}, "quantity"), ({"quantity": 1.0}, "quantity"), ({"colour": "red"}, "colour"),
])
def test_put_item_checks_every_field(market: Market, override: dict, field: str) -> None:
    seller = market.user("seller")
    with pytest.raises(BadRequestError, match=f"^{field}: "):
        market.item(seller, **override)


def test_change_price_returns_the_item_and_guards_ownership(market: Market) -> None:
    seller, other = market.user("seller"), market.user("seller")
    item_id = market.item(seller)
    assert seller.call("change_price", {"item_id": item_id, "price": "9.9"})["price"] == "9.90"
    with pytest.raises(ForbiddenError):
        other.call("change_price", {"item_id": item_id, "price": "1.00"})
    with pytest.raises(NotFoundError):
        seller.call("change_price", {"item_id": 10**9, "price": "1.00"})
    assert seller.call("display_items")["items"][0]["price"] == "9.90"


def test_remove_item_leaves_the_rest_and_refuses_more_than_on_sale(market: Market) -> None:
    seller, other = market.user("seller"), market.user("seller")
    item_id = market.item(seller, quantity=5)
    assert seller.call("remove_item", {"item_id": item_id, "quantity": 2})["quantity"] == 3
    with pytest.raises(ConflictError, match="only 3"):
        seller.call("remove_item", {"item_id": item_id, "quantity": 4})
    with pytest.raises(ForbiddenError):
        other.call("remove_item", {"item_id": item_id, "quantity": 1})
    assert seller.call("remove_item", {"item_id": item_id, "quantity": 3})["quantity"] == 0
    assert seller.call("display_items")["items"] == []


def test_display_items_pages_in_item_order_and_shows_only_the_sellers_own(market: Market) -> None:
    seller, other = market.user("seller"), market.user("seller")
    ids = [market.item(seller, name=f"thing {i}") for i in range(7)]
    market.item(other)
    seen, cursor, pages = [], None, 0
    while True:
        page = seller.call("display_items", {"limit": 3, **({"cursor": cursor} if cursor else {})})
        seen += [item["item_id"] for item in page["items"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids and pages == 3
    with pytest.raises(BadRequestError, match="^cursor: "):
        seller.call("display_items", {"cursor": "garbage!"})
    with pytest.raises(BadRequestError, match="^limit: "):
        seller.call("display_items", {"limit": 0})


def test_seller_rating_starts_at_zero(market: Market) -> None:
    seller = market.user("seller")
    assert seller.call("get_seller_rating") == {"seller_id": seller.user_id, "thumbs_up": 0,
                                                "thumbs_down": 0, "items_sold": 0}
    with pytest.raises(BadRequestError, match="^seller_id: unknown"):
        seller.call("get_seller_rating", {"seller_id": seller.user_id})


def test_buyer_ops_are_unknown_on_the_seller_server(market: Market) -> None:
    seller = market.user("seller")
    with pytest.raises(UnknownOpError):
        seller.call("search_items")


@pytest.mark.parametrize("db_url", ["mariadb"], indirect=True)
def test_writes_nobody_reads_back_travel_with_the_commit(market: Market, round_trips: list[int]) -> None:
    seller = market.user("seller")

    def queries_of(op: str, args: dict[str, object]) -> int:
        round_trips.clear()
        seller.call(op, args)
        return len(round_trips)

    # the token check, the seller's items on sale counted (the cap), the item (its id is needed),
    # then its keywords, keyword pairs, words and vocabulary with the COMMIT
    assert queries_of("put_item", {"name": "Bare", "category": 1, "keywords": [], "condition": "new",
                                   "price": "1.00", "quantity": 2}) == 4
    five = {"name": "Five", "category": 1, "keywords": ["a", "b", "c", "d", "e"], "condition": "new",
            "price": "1.00", "quantity": 2}
    assert queries_of("put_item", five) == 4
    item_id = max(i["item_id"] for i in seller.call("display_items", {})["items"])
    assert queries_of("change_price", {"item_id": item_id, "price": "2.00"}) == 2  # the item locked, then all
    assert seller.call("display_items", {})["items"][-1]["price"] == "2.00"
    def on_sale() -> list[int]:
        return [i["quantity"] for i in seller.call("display_items", {})["items"] if i["item_id"] == item_id]

    assert queries_of("remove_item", {"item_id": item_id, "quantity": 1}) == 2  # likewise
    assert on_sale() == [1]
    assert queries_of("remove_item", {"item_id": item_id, "quantity": 1}) == 2  # the last: unlisted too
    assert on_sale() == []
    assert audit(market.db) == []  # keywords and their ten pairs indexed as the audit expects


def test_a_seller_has_at_most_the_configured_number_of_items_on_sale(database: Database) -> None:
    settings = replace(Settings(role="seller"), max_items_per_seller=2)
    with running_market(database, settings) as market:
        seller, other = market.user("seller"), market.user("seller")
        first, _second = market.item(seller, quantity=1), market.item(seller)
        with pytest.raises(ConflictError, match="you have 2 items on sale, the most a seller may have"):
            market.item(seller)
        market.item(other)  # the cap is each seller's
        buyer = market.user("buyer")
        buyer.call("add_to_cart", {"item_id": first, "quantity": 1})
        buyer.call("make_purchase", CARD)  # sold out: no longer on sale
        assert market.item(seller) > first
    assert Settings(role="seller").max_items_per_seller == 10_000
