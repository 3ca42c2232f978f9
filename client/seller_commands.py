"""The seller shell's commands, one per seller op: sell, price, remove, items, rating.

Each command's alias is its op's wire name, so `help put_item` finds `sell`.
"""
from __future__ import annotations

from dataclasses import replace

from . import fields
from .registry import Arg, Command, Registry, one_of, saying
from .render import items_table, money, rating_line

PRICE = Arg("price", "--price", convert=fields.price, hint=fields.PRICE_RANGE)
SELL = (Arg("name", convert=fields.item_name, hint="1 to 32 characters"),
        Arg("category", "--category", convert=fields.category, hint=fields.CATEGORY_LIST,
            choices=fields.CATEGORY_NAMES),
        Arg("keywords", "--keywords", convert=fields.keywords, required=False, default=[],
            hint="up to 5 words of 1 to 8 characters, apart or joined by commas", asked=True),
        Arg("condition", "--condition", convert=one_of("new", "used"), hint="new or used",
            choices=("new", "used")),
        PRICE,
        Arg("quantity", "--qty", "--quantity", convert=fields.quantity, hint=fields.QUANTITY_RANGE))

SELLER = Registry()
SELLER.add(
    Command("sell", "Put an item on sale.", args=SELL, aliases=("put_item",),
            handler=saying("put_item", lambda args, answer: f"Listed item {answer['item_id']}: "
                           f"{args['name']}, {args['quantity']} at {money(args['price'])}.")),
    Command("price", "Change the price of one of your items.",
            args=(fields.ITEM_ID, replace(PRICE, flag=None)), aliases=("change_price",),
            handler=saying("change_price", lambda args, item: f"Item {item['item_id']} ({item['name']}) "
                           f"now costs {money(item['price'])}.")),
    Command("remove", "Take units of one of your items off sale.",
            args=(fields.ITEM_ID, Arg("quantity", convert=fields.quantity, hint=fields.QUANTITY_RANGE)),
            aliases=("remove_item",),
            handler=saying("remove_item", lambda args, item: f"Removed {args['quantity']} of item "
                           f"{item['item_id']} ({item['name']}); {item['quantity']} left on sale.")),
    Command("items", "Show your items on sale.", args=(fields.LIMIT,), aliases=("display_items",),
            handler=lambda shell, args: shell.page("display_items", args, lambda answer: items_table(
                answer["items"], "You have no items on sale."))),
    Command("rating", "Show your rating as a seller.", aliases=("get_seller_rating",),
            handler=saying("get_seller_rating", lambda args, answer: rating_line(answer))),
)
