"""The seller shell's commands, one per seller op: sell, price, remove, items, rating.

Each command's alias is its op's wire name, so `help put_item` finds `sell`.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from . import fields
from .registry import Arg, Registry, one_of
from .render import items_table, money, rating_line

if TYPE_CHECKING:
    from .shell import Shell

SELLER = Registry()

PRICE = Arg("price", "--price", convert=fields.price, hint=fields.PRICE_RANGE)


@SELLER.command("sell", "Put an item on sale.",
                Arg("name", convert=fields.item_name, hint="1 to 32 characters"),
                Arg("category", "--category", convert=fields.category, hint=fields.CATEGORY_LIST,
                    choices=fields.CATEGORY_NAMES),
                Arg("keywords", "--keywords", convert=fields.keywords, required=False, default=[],
                    hint="up to 5 words of 1 to 8 characters, apart or joined by commas", asked=True),
                Arg("condition", "--condition", convert=one_of("new", "used"), hint="new or used",
                    choices=("new", "used")),
                PRICE,
                Arg("quantity", "--qty", "--quantity", convert=fields.quantity,
                    hint=fields.QUANTITY_RANGE),
                aliases=("put_item",))
def sell(shell: Shell, args: dict[str, Any]) -> None:
    item_id = shell.call("put_item", args)["item_id"]
    shell.out.say(f"Listed item {item_id}: {args['name']}, {args['quantity']} at "
                  f"{money(args['price'])}.")


@SELLER.command("price", "Change the price of one of your items.", fields.ITEM_ID,
                replace(PRICE, flag=None), aliases=("change_price",))
def price(shell: Shell, args: dict[str, Any]) -> None:
    item = shell.call("change_price", args)
    shell.out.say(f"Item {item['item_id']} ({item['name']}) now costs {money(item['price'])}.")


@SELLER.command("remove", "Take units of one of your items off sale.", fields.ITEM_ID,
                Arg("quantity", convert=fields.quantity, hint=fields.QUANTITY_RANGE),
                aliases=("remove_item",))
def remove(shell: Shell, args: dict[str, Any]) -> None:
    item = shell.call("remove_item", args)
    shell.out.say(f"Removed {args['quantity']} of item {item['item_id']} ({item['name']}); "
                  f"{item['quantity']} left on sale.")


@SELLER.command("items", "Show your items on sale.", fields.LIMIT, aliases=("display_items",))
def items(shell: Shell, args: dict[str, Any]) -> None:
    shell.page("display_items", args,
               lambda result: items_table(result["items"], "You have no items on sale."))


@SELLER.command("rating", "Show your rating as a seller.", aliases=("get_seller_rating",))
def rating(shell: Shell, args: dict[str, Any]) -> None:
    shell.out.say(rating_line(shell.call("get_seller_rating")))
