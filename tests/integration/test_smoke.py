"""A first end-to-end pass: a seller lists, a buyer buys and rates."""
from support import CARD, Market


def test_a_seller_lists_and_a_buyer_buys_and_rates(market: Market) -> None:
    seller = market.user("seller")
    buyer = market.user("buyer")
    item_id = market.item(seller, quantity=3)
    assert buyer.call("search_items", {"keywords": ["lamp", "desk"]})["items"][0]["item_id"] == item_id
    cart = buyer.call("add_to_cart", {"item_id": item_id, "quantity": 2})["cart"]
    assert cart["total"] == "25.00"
    receipt = buyer.call("make_purchase", CARD)
    assert receipt["total"] == "25.00" and receipt["lines"][0]["quantity"] == 2
    buyer.call("provide_feedback", {"item_id": item_id, "vote": "up"})
    rating = buyer.call("get_seller_rating", {"seller_id": seller.user_id})
    assert rating == {"seller_id": seller.user_id, "thumbs_up": 1, "thumbs_down": 0, "items_sold": 2}
    assert seller.call("display_items")["items"][0]["quantity"] == 1
