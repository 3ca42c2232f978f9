"""The buyer shell's commands, one per buyer op (aliased by its wire name). A purchase carries
a fresh idempotency key, so that one cut off in flight is safely sent again, and the total shown
(`expected_total`), so that a changed price is asked about again instead of charged.
"""
from __future__ import annotations

import uuid
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from wire.errors import ConflictError

from . import fields
from .common_commands import COMMON
from .registry import Arg, Command, RefusedError, Registry, UsageError, one_of, saying, word_list
from .render import cart_table, history_table, item_lines, items_table, money, rating_line, receipt_table

if TYPE_CHECKING:
    from .shell import Shell

BUYER = Registry()

# A buyer's login and logout are the common ones, with what they do to the cart in their help.
BUYER.add(replace(COMMON.get("login"), help="Log in (your session's cart starts as your saved cart)."),
          replace(COMMON.get("logout"), help="Log out (asking whether to save an unsaved cart; a script "
                                             "drops it unless run with --save-on-exit)."))

QUANTITY = Arg("quantity", convert=fields.quantity, required=False, default=1,
               hint=fields.QUANTITY_RANGE)

@BUYER.command("search", "Find items on sale by words, category and/or exact keywords "
               "(best match first).",
               Arg("words", convert=list, required=False, many=True, default=[]),
               Arg("keywords", "--keywords", convert=word_list, required=False, default=[],
                   hint="exact keywords, apart or joined by commas"),
               Arg("category", "--category", convert=fields.category, required=False,
                   hint=fields.CATEGORY_LIST, choices=fields.CATEGORY_NAMES), fields.LIMIT,
               aliases=("search_items",))
def search(shell: Shell, args: dict[str, Any]) -> None:
    shell.page("search_items", search_request(args), lambda result: items_table(result["items"]))


def search_request(args: dict[str, Any]) -> dict[str, Any]:
    """The search_items arguments of a `search` line: its words as a `query` (search by text),
    or `--keywords`, the exact keyword search."""
    if args["words"] and args["keywords"]:
        raise UsageError("give words to search for or --keywords, not both")
    text = {"query": " ".join(args["words"])} if args["words"] else {"keywords": args["keywords"]}
    return {"category": args["category"], "limit": args["limit"], **text}


@BUYER.command("item", "Show one item.", fields.ITEM_ID, aliases=("get_item",))
def item(shell: Shell, args: dict[str, Any]) -> None:
    for line in item_lines(shell.call("get_item", args)):
        shell.out.say(line)


@BUYER.command("add", "Put an item in your cart.", fields.ITEM_ID, QUANTITY, aliases=("add_to_cart",))
def add(shell: Shell, args: dict[str, Any]) -> None:
    content = show_cart(shell, "add_to_cart", args)
    line = next((line for line in content["items"] if line["item_id"] == args["item_id"]), None)
    if line is not None:
        shell.out.say(f"Item {line['item_id']} ({line['name']}): {line['available']} in stock, "
                      f"{line['quantity']} in your cart.")


BUYER.add(
    Command("remove", "Take an item out of your cart (all of it unless QUANTITY is given).",
            args=(fields.ITEM_ID, replace(QUANTITY, default=1_000_000)), aliases=("remove_from_cart",),
            handler=lambda shell, args: show_cart(shell, "remove_from_cart", args)),
    Command("cart", "Show your cart.", aliases=("display_cart",),
            handler=lambda shell, args: show_cart(shell, "display_cart", changed=False)),
    Command("clear", "Empty your cart (the saved cart stays until you save).", aliases=("clear_cart",),
            handler=lambda shell, args: show_cart(shell, "clear_cart")),
    Command("save", "Save your cart, so that it is there at your next login.", aliases=("save_cart",),
            handler=lambda shell, args: shell.save_cart()),
)


def cart_can_be_bought(shell: Shell) -> None:
    """RefusedError, before any card detail is asked for, if the cart is empty or holds more
    of an item than is in stock."""
    content = shell.call("display_cart")["cart"]
    shell.cart.seen(content)
    if not content["items"]:
        raise RefusedError("your cart is empty: `add ITEM_ID` first")
    short = [f"item {line['item_id']} ({line['name']}): {line['quantity']} in your cart, "
             f"{line['available']} in stock" for line in content["items"]
             if line["quantity"] > line["available"]]
    if short:
        raise RefusedError(f"not enough in stock: {'; '.join(short)} (`remove ITEM_ID N` first)")
    shell.out.say(f"Your cart: {shell.cart.summary()}; total {money(content['total'])}.")


@BUYER.command("buy", "Buy everything in your cart.",
               Arg("card_name", "--card-name", hint="the name on the card, 1 to 64 characters"),
               Arg("card_number", "--card-number", secret=True, convert=fields.card_number,
                   hint="12 to 19 digits, spaces or dashes allowed"),
               Arg("card_expiry", "--expiry", convert=fields.card_expiry,
                   hint="MM/YY, not past"),
               aliases=("make_purchase",), check=cart_can_be_bought)
def buy(shell: Shell, args: dict[str, Any]) -> None:
    """make_purchase for the total shown; a total changed meanwhile is asked about again."""
    while True:
        expected = money(shell.cart.total or "0")
        try:
            receipt = shell.call("make_purchase", {**args, "idempotency_key": str(uuid.uuid4()),
                                                   "expected_total": expected})
            break
        except ConflictError:
            content = shell.call("display_cart")["cart"]
            shell.cart.seen(content)
            now = money(content["total"])
            if now == expected or not content["items"]:
                raise  # not the total: the stock
            if not (shell.interactive and shell.confirm(f"The total changed: {now}, not {expected}. "
                                                        f"Buy for {now}?")):
                raise RefusedError(f"the cart's total is now {now}, not {expected}: nothing was bought; "
                                   f"`buy` again to pay {now}") from None
    shell.cart.bought()
    shell.out.table(receipt_table(receipt))
    shell.out.say(f"Bought: order {receipt['order_id']}, total {money(receipt['total'])}.")


BUYER.add(
    Command("rate", "Give an item you bought a thumbs up or down.",
            args=(fields.ITEM_ID, Arg("vote", convert=one_of("up", "down"))), aliases=("provide_feedback",),
            handler=saying("provide_feedback", lambda args, answer: f"Thanks: thumbs {args['vote']} "
                           f"for item {args['item_id']}.")),
    Command("rating", "Show a seller's rating.", args=(Arg("seller_id", convert=fields.whole_number),),
            aliases=("get_seller_rating",),
            handler=saying("get_seller_rating", lambda args, answer: rating_line(answer))),
    Command("history", "Show what you bought, newest first.", args=(fields.LIMIT,),
            aliases=("get_purchase_history",),
            handler=lambda shell, args: shell.page("get_purchase_history", args, lambda answer: (
                history_table(answer["purchases"])))),
)


def show_cart(shell: Shell, op: str, args: dict[str, Any] | None = None,
              changed: bool = True) -> dict[str, Any]:
    """Run a cart op and show the cart it answers, lines and total; `changed`: the op changed
    it, so that it now differs from the saved cart."""
    content: dict[str, Any] = shell.call(op, args)["cart"]
    shell.cart.seen(content, unsaved=True if changed else None)
    shell.out.table(cart_table(content))
    if content["items"]:
        shell.out.say(f"Total: {money(content['total'])}")
    return content
