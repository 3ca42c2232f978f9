"""The rules of carts (db.carts) on numbers the test gives: what an add may put in a cart,
and a cart as the buyer sees it."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from db.carts import MAX_CART_LINES, cart_object, line_after_add
from wire.errors import ConflictError


def test_an_add_puts_up_to_what_is_on_sale_in_the_cart() -> None:
    assert line_after_add(9, 2, held=0, available=5, lines=0) == 2
    assert line_after_add(9, 3, held=2, available=5, lines=1) == 5  # every unit on sale
    with pytest.raises(ConflictError, match="^item 9: only 5 left$"):
        line_after_add(9, 6, held=0, available=5, lines=0)
    with pytest.raises(ConflictError, match="^item 9: only 5 left, 2 already in your cart$"):
        line_after_add(9, 4, held=2, available=5, lines=1)
    with pytest.raises(ConflictError, match="^item 9: only 0 left$"):
        line_after_add(9, 1, held=0, available=0, lines=0)  # sold out


def test_a_cart_holds_at_most_a_hundred_different_items() -> None:
    assert MAX_CART_LINES == 100
    assert line_after_add(9, 1, held=0, available=5, lines=99) == 1  # the 100th
    with pytest.raises(ConflictError, match="^your cart holds 100 different items, the most it may"):
        line_after_add(9, 1, held=0, available=5, lines=100)  # a 101st
    assert line_after_add(9, 1, held=1, available=5, lines=100) == 2  # more of one it holds


def test_the_stock_is_told_before_the_cart_limit() -> None:
    with pytest.raises(ConflictError, match="^item 9: only 1 left$"):
        line_after_add(9, 2, held=0, available=1, lines=100)


def line(item_id: int, cents: int, quantity: int, available: int = 10) -> SimpleNamespace:
    return SimpleNamespace(item_id=item_id, name=f"item {item_id}", price_cents=cents, quantity=quantity,
                           available=available)


def test_a_cart_shows_each_lines_price_and_stock_and_the_total_at_todays_prices() -> None:
    cart = cart_object([line(1, 250, 2, available=1), line(4, 1, 3)])
    assert cart == {"cart": {"items": [
        {"item_id": 1, "name": "item 1", "price": "2.50", "quantity": 2, "available": 1},
        {"item_id": 4, "name": "item 4", "price": "0.01", "quantity": 3, "available": 10}],
        "total": "5.03"}}


def test_an_empty_cart_totals_zero_and_a_full_one_may_pass_a_million() -> None:
    assert cart_object([]) == {"cart": {"items": [], "total": "0.00"}}
    lines = [line(n, 100_000_000, 1_000_000) for n in range(MAX_CART_LINES)]
    assert cart_object(lines)["cart"]["total"] == f"{100 * 10**12}.00"  # exact, in integer cents
