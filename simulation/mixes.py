"""Operation mixes: for each role, the ops a simulated user calls and their weights.

`default` covers every op of the protocol in shopping-like proportions (searches and
reads dominate; carts, purchases and feedback follow; sign-ups and logouts are rare
because each costs an Argon2 hash). `classic` is the historic four-op benchmark; `ping`
measures the server loop alone.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True)
class Mix:
    """Weights of the ops each role draws from, one draw per call."""

    name: str
    seller: dict[str, float]
    buyer: dict[str, float]
    description: str = ""

    def weights(self, role: str) -> dict[str, float]:
        """The op weights of `role` ("buyer" or "seller")."""
        return self.buyer if role == "buyer" else self.seller


DEFAULT = Mix(
    "default",
    seller={"display_items": 30, "get_seller_rating": 25, "put_item": 15, "change_price": 15,
            "remove_item": 8, "ping": 6.7, "logout": 0.2, "create_account": 0.1},
    buyer={"search_items": 30, "get_item": 16, "add_to_cart": 14, "make_purchase": 8,
           "get_seller_rating": 6, "display_cart": 6, "get_purchase_history": 5,
           "provide_feedback": 5, "remove_from_cart": 3, "save_cart": 2, "ping": 3.7,
           "clear_cart": 1, "logout": 0.2, "create_account": 0.1},
    description="every op, shopping-like proportions",
)

CLASSIC = Mix(
    "classic",
    seller={"get_seller_rating": 1, "put_item": 1, "display_items": 1},
    buyer={"search_items": 1},
    description="sellers: get_seller_rating, put_item, display_items; buyers: search_items",
)

BROWSE = Mix(
    "browse",
    seller={"display_items": 70, "get_seller_rating": 30},
    buyer={"search_items": 60, "get_item": 30, "get_seller_rating": 10},
    description="read-only: searches and item pages",
)

CHECKOUT = Mix(
    "checkout",
    seller={"put_item": 50, "display_items": 50},
    buyer={"add_to_cart": 35, "make_purchase": 25, "search_items": 15, "provide_feedback": 15,
           "display_cart": 10},
    description="write-heavy: carts, purchases and feedback",
)

PING = Mix(
    "ping",
    seller={"ping": 1},
    buyer={"ping": 1},
    description="ping alone: the server loop, framing and dispatch, no database",
)

MIXES: dict[str, Mix] = {mix.name: mix for mix in (DEFAULT, CLASSIC, BROWSE, CHECKOUT, PING)}


def mix_list(text: str) -> list[str]:
    """An argparse type: names of mixes separated by commas (default,browse)."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in MIXES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown mix {unknown}; choose from {', '.join(MIXES)}")
    return names
