"""The seller shell's commands, one per seller op: sell, price, remove, items, rating.

Each command's alias is its op's wire name, so `help put_item` finds `sell`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .registry import Arg, Registry, one_of, whole_number, word_list
from .render import items_table, money, rating_line

if TYPE_CHECKING:
    from .shell import Shell

SELLER = Registry()

ITEM_ID = Arg("item_id", convert=whole_number)


@SELLER.command("sell", "Put an item on sale.", Arg("name"),
                Arg("category", "--category", convert=whole_number),
                Arg("keywords", "--keywords", convert=word_list, required=False, default=[]),
                Arg("condition", "--condition", convert=one_of("new", "used")),
                Arg("price", "--price"),
                Arg("quantity", "--qty", "--quantity", convert=whole_number),
                aliases=("put_item",))
def sell(shell: Shell, args: dict[str, Any]) -> None:
    """put_item."""
    item_id = shell.call("put_item", args)["item_id"]
    shell.out.say(f"Listed item {item_id}: {args['name']}, {args['quantity']} at "
                  f"{money(args['price'])}.")


@SELLER.command("price", "Change the price of one of your items.", ITEM_ID, Arg("price"),
                aliases=("change_price",))
def price(shell: Shell, args: dict[str, Any]) -> None:
    """change_price."""
    item = shell.call("change_price", args)
    shell.out.say(f"Item {item['item_id']} ({item['name']}) now costs {money(item['price'])}.")


@SELLER.command("remove", "Take units of one of your items off sale.", ITEM_ID,
                Arg("quantity", convert=whole_number), aliases=("remove_item",))
def remove(shell: Shell, args: dict[str, Any]) -> None:
    """remove_item."""
    item = shell.call("remove_item", args)
    shell.out.say(f"Removed {args['quantity']} of item {item['item_id']} ({item['name']}); "
                  f"{item['quantity']} left on sale.")


@SELLER.command("items", "Show your items on sale.",
                Arg("limit", "--limit", convert=whole_number, required=False, default=20),
                aliases=("display_items",))
def items(shell: Shell, args: dict[str, Any]) -> None:
    """display_items."""
    shell.page("display_items", args,
               lambda result: items_table(result["items"], "You have no items on sale."))


@SELLER.command("rating", "Show your rating as a seller.", aliases=("get_seller_rating",))
def rating(shell: Shell, args: dict[str, Any]) -> None:
    """get_seller_rating."""
    shell.out.say(rating_line(shell.call("get_seller_rating")))
