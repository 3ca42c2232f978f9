"""The rules of a purchase (db.purchases) on cart lines made in the test: its total against
the one the buyer confirmed, the stock, the receipt, the sellers' counts, and which statuses
count as bought."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from db.purchases import (
    CAPTURING,
    COMPLETED,
    PAID,
    PENDING,
    VOID,
    VOIDING,
    cart_total,
    is_completed,
    receipt,
    sold_by_seller,
)
from wire.errors import ConflictError


def line(item_id: int, cents: int, quantity: int, available: int = 10, seller_id: int = 1) -> SimpleNamespace:
    return SimpleNamespace(item_id=item_id, name=f"item {item_id}", cents=cents, quantity=quantity,
                           available=available, seller_id=seller_id)


CART = [line(1, 250, 2), line(2, 101, 1)]


def test_without_a_confirmed_total_todays_prices_are_charged() -> None:
    assert cart_total(CART, None) == 601


def test_a_confirmed_total_must_be_the_carts_to_the_cent() -> None:
    assert cart_total(CART, 601) == 601
    for confirmed in (600, 602, 0, 60100):
        with pytest.raises(ConflictError, match=r"^the cart's total is now 6\.01; nothing was bought$"):
            cart_total(CART, confirmed)


def test_a_total_over_a_million_is_told_exactly() -> None:
    cart = [line(1, 100_000_000, 2), line(2, 100, 1)]
    with pytest.raises(ConflictError, match=r"^the cart's total is now 2000001\.00;"):
        cart_total(cart, 500)


def test_a_line_over_its_stock_is_a_conflict_after_the_total() -> None:
    short = [line(1, 250, 2), line(2, 101, 3, available=2), line(3, 1, 9, available=1)]
    with pytest.raises(ConflictError, match="^item 2: only 2 left$"):  # the first line short
        cart_total(short, None)
    with pytest.raises(ConflictError, match="^the cart's total is now"):  # a changed total first
        cart_total(short, 1)
    assert cart_total([line(1, 5, 2, available=2)], 10) == 10  # the last units on sale


def test_the_receipt_names_each_line_at_the_price_paid() -> None:
    assert receipt(41, 601, CART) == {"order_id": 41, "total": "6.01", "lines": [
        {"item_id": 1, "name": "item 1", "quantity": 2, "price": "2.50"},
        {"item_id": 2, "name": "item 2", "quantity": 1, "price": "1.01"}]}


def test_units_sold_are_counted_once_a_seller_in_seller_order() -> None:
    lines = [line(1, 1, 2, seller_id=30), line(2, 1, 5, seller_id=4), line(3, 1, 1, seller_id=30)]
    assert sold_by_seller(lines) == [(4, 5), (30, 3)]  # rows locked in key order: no deadlock
    assert sold_by_seller([]) == []


def test_only_completed_orders_count_as_bought() -> None:
    statuses = (PENDING, CAPTURING, PAID, VOIDING, VOID)
    assert [s for s in statuses if is_completed(s)] == [CAPTURING, PAID] == list(COMPLETED)
