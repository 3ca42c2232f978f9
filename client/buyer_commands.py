"""The buyer shell's commands, one per buyer op: search, the cart, buying, rating, history.

Each command's alias is its op's wire name, so `help add_to_cart` finds `add`. Every purchase
carries a fresh idempotency key, so a purchase cut off in flight is safely sent again.
"""
from __future__ import annotations

import uuid
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from .common_commands import COMMON
from .registry import Arg, Registry, one_of, whole_number, word_list
from .render import cart_table, history_table, item_lines, items_table, money, rating_line, receipt_table

if TYPE_CHECKING:
    from .shell import Shell

BUYER = Registry()

# A buyer's login and logout are the common ones, with what they do to the cart in their help.
BUYER.add(replace(COMMON.get("login"), help="Log in (your session's cart starts as your saved cart)."))
BUYER.add(replace(COMMON.get("logout"), help="Log out (an unsaved cart is dropped)."))

ITEM_ID = Arg("item_id", convert=whole_number)
LIMIT = Arg("limit", "--limit", convert=whole_number, required=False, default=20)


@BUYER.command("search", "Find items on sale, by category and/or keywords (best match first).",
               Arg("keywords", convert=word_list, required=False, many=True, default=[]),
               Arg("category", "--category", convert=whole_number, required=False), LIMIT,
               aliases=("search_items",))
def search(shell: Shell, args: dict[str, Any]) -> None:
    """search_items."""
    shell.page("search_items", args, lambda result: items_table(result["items"]))


@BUYER.command("item", "Show one item.", ITEM_ID, aliases=("get_item",))
def item(shell: Shell, args: dict[str, Any]) -> None:
    """get_item."""
    for line in item_lines(shell.call("get_item", args)):
        shell.out.say(line)


@BUYER.command("add", "Put an item in your cart.", ITEM_ID,
               Arg("quantity", convert=whole_number, required=False, default=1),
               aliases=("add_to_cart",))
def add(shell: Shell, args: dict[str, Any]) -> None:
    """add_to_cart."""
    show_cart(shell, shell.call("add_to_cart", args)["cart"])


@BUYER.command("remove", "Take an item out of your cart (all of it unless QUANTITY is given).",
               ITEM_ID, Arg("quantity", convert=whole_number, required=False, default=1_000_000),
               aliases=("remove_from_cart",))
def remove(shell: Shell, args: dict[str, Any]) -> None:
    """remove_from_cart."""
    show_cart(shell, shell.call("remove_from_cart", args)["cart"])


@BUYER.command("cart", "Show your cart.", aliases=("display_cart",))
def cart(shell: Shell, args: dict[str, Any]) -> None:
    """display_cart."""
    show_cart(shell, shell.call("display_cart")["cart"])


@BUYER.command("clear", "Empty your cart (the saved cart stays until you save).",
               aliases=("clear_cart",))
def clear(shell: Shell, args: dict[str, Any]) -> None:
    """clear_cart."""
    show_cart(shell, shell.call("clear_cart")["cart"])


@BUYER.command("save", "Save your cart, so that it is there at your next login.",
               aliases=("save_cart",))
def save(shell: Shell, args: dict[str, Any]) -> None:
    """save_cart."""
    saved = shell.call("save_cart")["cart"]
    shell.out.say(f"Cart saved: {len(saved['items'])} item(s), total {money(saved['total'])}.")


@BUYER.command("buy", "Buy everything in your cart.",
               Arg("card_name", "--card-name"), Arg("card_number", "--card-number", secret=True),
               Arg("card_expiry", "--expiry"), aliases=("make_purchase",))
def buy(shell: Shell, args: dict[str, Any]) -> None:
    """make_purchase, under a new idempotency key."""
    receipt = shell.call("make_purchase", {**args, "idempotency_key": str(uuid.uuid4())})
    shell.out.table(receipt_table(receipt))
    shell.out.say(f"Bought: order {receipt['order_id']}, total {money(receipt['total'])}.")


@BUYER.command("rate", "Give an item you bought a thumbs up or down.", ITEM_ID,
               Arg("vote", convert=one_of("up", "down")), aliases=("provide_feedback",))
def rate(shell: Shell, args: dict[str, Any]) -> None:
    """provide_feedback."""
    shell.call("provide_feedback", args)
    shell.out.say(f"Thanks: thumbs {args['vote']} for item {args['item_id']}.")


@BUYER.command("rating", "Show a seller's rating.", Arg("seller_id", convert=whole_number),
               aliases=("get_seller_rating",))
def rating(shell: Shell, args: dict[str, Any]) -> None:
    """get_seller_rating."""
    shell.out.say(rating_line(shell.call("get_seller_rating", args)))


@BUYER.command("history", "Show what you bought, newest first.", LIMIT,
               aliases=("get_purchase_history",))
def history(shell: Shell, args: dict[str, Any]) -> None:
    """get_purchase_history."""
    shell.page("get_purchase_history", args, lambda result: history_table(result["purchases"]))


def show_cart(shell: Shell, content: dict[str, Any]) -> None:
    """A cart's lines and total."""
    shell.out.table(cart_table(content))
    if content["items"]:
        shell.out.say(f"Total: {money(content['total'])}")
