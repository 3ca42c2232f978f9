"""What a shell accepts for each kind of value, checked as it is typed: categories by name,
prices, quantities, card numbers with spaces or dashes. The rules are wire.values' own (the
contract's Values); a refusal is a ValueError whose message says what would do.
"""
from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

from wire import values
from wire.errors import BadRequestError

from .registry import Arg, word_list

CATEGORY_NAMES = values.CATEGORY_NAMES  # the names clients show (PROTOCOL.md); the wire carries the number
CATEGORY_LIST = ", ".join(CATEGORY_NAMES)  # for help and errors

Convert = Callable[[str], Any]


def wire_rule(rule: values.Validator, name: str, whole: bool = False) -> Convert:
    """A converter applying one of wire's value rules to the typed text (unchanged if valid),
    or with `whole` to the integer it spells (a quantity, an item id)."""
    def convert(text: str) -> Any:
        value = whole_number(text) if whole else text
        try:
            number = rule(name, value)
        except BadRequestError as exc:
            raise ValueError(exc.message.removeprefix(f"{name}: ")) from None
        return int(number) if whole else text
    return convert


def whole_number(text: str) -> int:
    """An integer argument, with a message people understand."""
    try:
        return int(text)
    except ValueError:
        shown = text if len(text) <= 24 else f"{text[:20]}… ({len(text)} characters)"
        if text.strip().isdigit():  # past Python's 4,300 digits
            raise ValueError(f"{shown} is far too large") from None
        raise ValueError(f"{shown!r} is not a whole number") from None


def category(text: str) -> int:
    """A category by name (any case, or the start of one name) or by number."""
    if text.strip().isdigit():
        return wire_rule(values.category, "category", whole=True)(text)
    wanted = text.strip().lower()
    matches = [number for number, name in enumerate(CATEGORY_NAMES) if name.lower().startswith(wanted)]
    exact = [number for number in matches if CATEGORY_NAMES[number].lower() == wanted]
    if len(exact or matches) == 1 and wanted:
        return (exact or matches)[0]
    raise ValueError(f"{text!r} is not a category; one of {CATEGORY_LIST}")


def category_name(number: int) -> str:
    """The name of a category number (the number itself if the contract names none)."""
    return CATEGORY_NAMES[number] if 0 <= number < len(CATEGORY_NAMES) else str(number)


def card_number(text: str) -> str:
    """A card number as printed on the card: digits, with spaces or dashes between groups."""
    digits = "".join(char for char in text if char not in " -")
    return str(wire_rule(values.card_number, "card_number")(digits))


def price(text: str) -> str:
    """An amount of money, refused in words a seller understands."""
    amount = text.strip().lstrip("$€£")
    try:
        value = Decimal(amount)
    except InvalidOperation:
        raise ValueError(f"{text!r} is not an amount of money; write it like 12.50") from None
    if not value.is_finite() or not Decimal("0.01") <= value <= values.MAX_CENTS / 100:
        raise ValueError(f"{text} is not a price: a price is from 0.01 to "
                         f"{values.format_money(values.MAX_CENTS)}, like 12.50")
    if value != value.quantize(Decimal("0.01")):
        raise ValueError("has at most two decimals (cents), like 12.50")
    return f"{value:.2f}"


def card_expiry(text: str) -> str:
    """MM/YY, refused with the part that is wrong."""
    month, _, year = text.strip().partition("/")
    if not (month.isdigit() and year.isdigit() and len(year) == 2 and 1 <= len(month) <= 2):
        raise ValueError(f"{text!r} is not a date as printed on the card: write it MM/YY, like 08/29")
    if not 1 <= int(month) <= 12:
        raise ValueError(f"{month} is not a month (01 to 12): write the date MM/YY, like 08/29")
    return str(wire_rule(values.card_expiry, "card_expiry")(f"{int(month):02d}/{year}"))


def password(wrong: str = "") -> Convert:
    """A password's rule, 8 to 128 characters, checked before any request; `wrong`: how a
    login says that one of another length cannot be right."""
    def convert(text: str) -> str:
        if not 8 <= len(text) <= 128:
            raise ValueError(f"{wrong}{'every' if wrong else 'a'} password has 8 to 128 characters, "
                             f"not {len(text)}")
        return text
    return convert


def keywords(text: str | list[str]) -> list[str]:
    """Up to 5 keywords of 1 to 8 characters, apart or joined by commas."""
    words = word_list(text)
    too_long = [word for word in words if len(word) > 8]
    if too_long or len(words) > 5:
        raise ValueError(f"{too_long[0]!r} is longer than 8 characters" if too_long else
                         f"at most 5 keywords, not {len(words)}")
    return words


username = wire_rule(values.username, "username")
item_name = wire_rule(values.item_name, "name")
quantity = wire_rule(values.quantity, "quantity", whole=True)
item_id = wire_rule(values.object_id, "item_id", whole=True)
limit = wire_rule(values.limit, "limit", whole=True)

# The ranges `help COMMAND` lists (the wording of the contract's Values).
PRICE_RANGE = f"0.01 to {values.format_money(values.MAX_CENTS)}, at most two decimals"
QUANTITY_RANGE = "a whole number from 1 to 1000000"

ITEM_ID = Arg("item_id", convert=item_id, hint="an item's number, as lists show it")
LIMIT = Arg("limit", "--limit", convert=limit, required=False, default=20, hint="1 to 500 a page")
