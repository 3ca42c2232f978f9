"""The rules of the catalogue (db.catalog) on rows made in the test: the order of an item op's
checks, how an item is shown, and how a page is cut."""
from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from db.catalog import checked_item, item_to_wire, split_page
from wire.errors import ConflictError, ForbiddenError, NotFoundError


def item(seller_id: int = 1, quantity: int = 3, **more: Any) -> SimpleNamespace:
    return SimpleNamespace(item_id=9, seller_id=seller_id, quantity=quantity, **more)


def test_an_item_op_checks_not_found_then_forbidden_then_conflict() -> None:
    with pytest.raises(NotFoundError, match="^no item 9$"):
        checked_item([], 9, seller_id=1, remove=5)
    with pytest.raises(ForbiddenError, match="^item 9 belongs to another seller$"):
        checked_item([item(seller_id=2, quantity=0)], 9, seller_id=1, remove=5)
    with pytest.raises(ConflictError, match="^item 9: only 3 on sale, cannot remove 4$"):
        checked_item([item(quantity=3)], 9, seller_id=1, remove=4)


def test_a_seller_may_remove_every_unit_on_sale_and_reprice_a_sold_out_item() -> None:
    row = item(quantity=3)
    assert checked_item([row], 9, seller_id=1, remove=3) is row
    sold_out = item(quantity=0)
    assert checked_item([sold_out], 9, seller_id=1) is sold_out  # change_price removes nothing


def test_without_a_seller_any_items_row_is_found_even_sold_out() -> None:
    row = item(seller_id=2, quantity=0)  # get_item, and the vote on another seller's item
    assert checked_item([row], 9) is row


def test_an_item_is_shown_with_its_price_in_money_and_its_keywords_in_order() -> None:
    row = item(name="Desk lamp", category=2, keywords=json.dumps(["desk", "a ", "é"]), item_condition="used",
               price_cents=100_000_000, thumbs_up=4, thumbs_down=1)
    assert item_to_wire(row) == {
        "item_id": 9, "seller_id": 1, "name": "Desk lamp", "category": 2, "keywords": ["desk", "a ", "é"],
        "condition": "used", "price": "1000000.00", "quantity": 3, "thumbs_up": 4, "thumbs_down": 1}
    assert item_to_wire(SimpleNamespace(**{**vars(row), "price_cents": 5}))["price"] == "0.05"


def cursor_of(row: int) -> str:
    return f"after {row}"


@pytest.mark.parametrize(("found", "limit", "page", "cursor"), [
    ([], 3, [], None),
    ([1, 2], 3, [1, 2], None),
    ([1, 2, 3], 3, [1, 2, 3], None),  # exactly a page: the last one
    ([1, 2, 3, 4], 3, [1, 2, 3], "after 3"),  # the row read past the page says there is more
    ([1, 2], 1, [1], "after 1"),
])
def test_a_page_is_cut_from_one_row_more_than_its_length(found: list[int], limit: int, page: list[int],
                                                         cursor: str | None) -> None:
    assert split_page(found, limit, cursor_of) == (page, cursor)
