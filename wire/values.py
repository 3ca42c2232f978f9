"""Value rules of PROTOCOL.md: one validator per kind of field.

A validator takes (field name, raw JSON value) and returns the normalised value
(money as integer cents, keywords lower-cased) or raises BadRequestError naming
the field. Formatting helpers turn normalised values back into wire form.
"""
from __future__ import annotations

import base64
import binascii
import re
import time
import unicodedata
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from .errors import BadRequestError

Validator = Callable[[str, Any], Any]

MAX_CENTS = 100_000_000
_USERNAME = re.compile(r"[A-Za-z0-9_.\-]{3,32}")
_MONEY = re.compile(r"([0-9]{1,15})(?:\.([0-9]{1,2}))?")
_EXPIRY = re.compile(r"([0-9]{2})/([0-9]{2})")
_NOT_TEXT = frozenset({"Cc", "Cs", "Zl", "Zp"})  # controls, surrogates, line/paragraph separators
_JOINERS = frozenset("\u200c\u200d")  # the only format characters (Cf) a name may hold


def integer(low: int, high: int) -> Validator:
    """An integer in [low, high]; booleans and floats are refused."""
    def check(name: str, value: Any) -> int:
        if type(value) is not int:
            raise BadRequestError(f"{name}: must be an integer")
        if not low <= value <= high:
            raise BadRequestError(f"{name}: must be from {low} to {high}")
        return value
    return check


def text(low: int, high: int, *, printable: bool = False, pattern: re.Pattern[str] | None = None,
         what: str = "") -> Validator:
    """A string of low..high characters, optionally printable or matching a pattern."""
    def check(name: str, value: Any) -> str:
        if not isinstance(value, str):
            raise BadRequestError(f"{name}: must be a string")
        if not low <= len(value) <= high:
            raise BadRequestError(f"{name}: must be {low} to {high} characters")
        if printable and (why := _unprintable(value)):
            raise BadRequestError(f"{name}: must be printable text, {why}")
        if pattern is not None and not pattern.fullmatch(value):
            raise BadRequestError(f"{name}: must be {what}")
        return value
    return check


def not_text(char: str) -> bool:
    """Whether a character is none a person writes: a control, surrogate, line or paragraph
    separator, or an invisible format character (a bidirectional override, say) but the two
    joiners names may hold."""
    kind = unicodedata.category(char)
    return kind in _NOT_TEXT or (kind == "Cf" and char not in _JOINERS)


def _unprintable(value: str) -> str | None:
    """Why `value` is not text a person would write (a not_text character, or nothing
    visible), or None if it is."""
    for at, char in enumerate(value, 1):
        if not_text(char):
            return f"without U+{ord(char):04X} (character {at})"
    visible = any(unicodedata.category(char) not in ("Zs", "Cf") for char in value)
    return None if visible else "not only spaces"


def choice(*options: str) -> Validator:
    def check(name: str, value: Any) -> str:
        if value not in options or not isinstance(value, str):
            raise BadRequestError(f"{name}: must be one of {', '.join(repr(o) for o in options)}")
        return value
    return check


def total(name: str, value: Any) -> int:
    """A sum of money (a cart's total): a decimal string of two fraction digits at most, as cents."""
    match = _MONEY.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise BadRequestError(f"{name}: must be a decimal string like \"12.50\"")
    return int(match.group(1)) * 100 + int((match.group(2) or "0").ljust(2, "0"))


def money(name: str, value: Any) -> int:
    """A price: a decimal string from 0.01 to 1000000.00, as integer cents."""
    cents = total(name, value)
    if not 1 <= cents <= MAX_CENTS:
        raise BadRequestError(f"{name}: must be from 0.01 to 1000000.00")
    return cents


def keywords(name: str, value: Any) -> list[str]:
    """0-5 distinct strings of 1-8 characters, lower-cased, in the order given."""
    if not isinstance(value, list):
        raise BadRequestError(f"{name}: must be a list of strings")
    if len(value) > 5:
        raise BadRequestError(f"{name}: at most 5 keywords")
    out: list[str] = []
    for word in value:
        lowered = word.lower() if isinstance(word, str) else ""
        if not 1 <= len(lowered) <= 8:  # lower-cased, as stored: "İ" is two characters then
            raise BadRequestError(f"{name}: each keyword must be a string of 1 to 8 characters")
        if why := _unprintable(lowered):
            raise BadRequestError(f"{name}: keyword {word!r} must be printable text, {why}")
        if lowered in out:
            raise BadRequestError(f"{name}: keyword {word!r} is given twice")
        out.append(lowered)
    return out


_WORD = re.compile(r"[^\W_]+")  # a run of letters and digits (\w without the underscore)
# Scripts written without spaces (Han, kana, Thai, Lao, Myanmar, Khmer): each character a word.
_SOLID = re.compile("([\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff\u3400-\u4dbf"
                    "\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003ffff])")
MAX_QUERY_WORDS = 8
MAX_WORD_LENGTH = 32  # characters a word keeps once folded (a folded name may be 18 times longer)
MAX_ITEM_WORDS = 12  # words an item brings into the search index: its category's and 11 more
TYPO_LENGTH = 5  # a query word this long or longer matches words one edit away
CATEGORY_NAMES = ("Other", "Books", "Home", "Electronics", "Clothing", "Sports", "Toys", "Garden",
                  "Health", "Collectibles")


def fold(text_: str) -> str:
    """Text as search compares it: case-folded, compatibility-decomposed (NFKD), without
    combining marks, so that "Café", "CAFE" and "café" are one word."""
    decomposed = unicodedata.normalize("NFKD", unicodedata.normalize("NFKD", text_).casefold())
    return "".join(char for char in decomposed if not unicodedata.category(char).startswith("M"))


def _words(text_: str) -> list[str]:
    """The folded words of a text, repeats included; in scripts written without spaces each
    character is a word."""
    return [part for run in _WORD.findall(fold(text_)) for part in _SOLID.split(run) if part]


def search_words(text_: str) -> list[str]:
    """The distinct words of a text, cut to MAX_WORD_LENGTH, in the order they first appear."""
    return list(dict.fromkeys(word[:MAX_WORD_LENGTH] for word in _words(text_)))


def item_search_words(name: str, keywords_: list[str], category_: int) -> list[str]:
    """The words an item is found by: its category's name, the words of its name, and each
    keyword that is one word once folded ("t-shirt" is none), at most MAX_ITEM_WORDS."""
    whole = [word for word in map(fold, keywords_) if _WORD.fullmatch(word) and not _SOLID.search(word)]
    words = [fold(CATEGORY_NAMES[category_]), *search_words(name), *(w[:MAX_WORD_LENGTH] for w in whole)]
    return list(dict.fromkeys(words))[:MAX_ITEM_WORDS]


def stem(word: str) -> str:
    """The English stem of a folded word (plurals, -ing, -ed, a final e): lamps and lamp,
    boxes and box, running and run share one. Other words are their own stem."""
    if len(word) < 4 or not (word.isascii() and word.isalpha()):
        return word
    if word.endswith("ies") and len(word) > 4:
        word = word[:-3] + "y"
    elif word.endswith(("sses", "xes", "ches", "shes", "zes")):
        word = word[:-2]
    elif word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
    for suffix in ("ing", "ed"):
        base = word.removesuffix(suffix)
        if base != word and len(base) >= 3 and any(vowel in base for vowel in "aeiouy"):
            word = base[:-1] if base[-1] == base[-2] and base[-1] not in "lsz" else base
            break
    return word[:-1] if word.endswith("e") and len(word) > 3 else word


def one_edit_apart(first: str, second: str) -> bool:
    """Whether two different words are a letter added, dropped or changed, or two neighbours
    swapped, apart."""
    if first == second or abs(len(first) - len(second)) > 1:
        return False
    start = next((n for n, (a, b) in enumerate(zip(first, second, strict=False)) if a != b),
                 min(len(first), len(second)))
    one, two = first[start:], second[start:]
    return (one[1:] == two[1:] or one[1:] == two or one == two[1:]
            or (len(one) == len(two) >= 2 and one[0] == two[1] and one[1] == two[0] and one[2:] == two[2:]))


_QUERY_TEXT = text(1, 100)


def query(name: str, value: Any) -> list[str]:
    """What a shopper types (1-100 characters, 1-8 words), as its distinct folded words."""
    words = _words(_QUERY_TEXT(name, value))
    if not words:
        raise BadRequestError(f"{name}: must hold a word of letters or digits (emoji and "
                              "punctuation are not searched)")
    if len(words) > MAX_QUERY_WORDS:
        raise BadRequestError(f"{name}: at most {MAX_QUERY_WORDS} words")
    return search_words(value)


def card_number(name: str, value: Any) -> str:
    """12-19 digits, not all one digit, passing the Luhn check."""
    if not isinstance(value, str) or not value.isascii() or not value.isdigit() \
            or not 12 <= len(value) <= 19:
        raise BadRequestError(f"{name}: must be 12 to 19 digits")
    if len(set(value)) == 1:
        raise BadRequestError(f"{name}: is one digit repeated, not a card number")
    if not luhn_valid(value):
        raise BadRequestError(f"{name}: fails the Luhn check")
    return value


def luhn_valid(digits: str) -> bool:
    """The Luhn checksum of a digit string."""
    total = 0
    for index, char in enumerate(reversed(digits)):
        digit = int(char)
        if index % 2 == 1:
            digit = digit * 2 - 9 if digit > 4 else digit * 2
        total += digit
    return total % 10 == 0


def card_expiry(name: str, value: Any) -> str:
    """"MM/YY", valid through the end of that month (UTC)."""
    match = _EXPIRY.fullmatch(value) if isinstance(value, str) else None
    if match is None or not 1 <= int(match.group(1)) <= 12:
        raise BadRequestError(f"{name}: must be \"MM/YY\"")
    now = datetime.now(UTC)
    if (2000 + int(match.group(2)), int(match.group(1))) < (now.year, now.month):
        raise BadRequestError(f"{name}: the card has expired")
    return value


def cursor(name: str, value: Any) -> str:
    """An opaque paging cursor; its content is checked by decode_cursor."""
    if not isinstance(value, str) or not 1 <= len(value) <= 200:
        raise BadRequestError(f"{name}: must be a cursor from a previous page")
    return value


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1  # what both databases' integers hold


def encode_cursor(*parts: int) -> str:
    """An opaque cursor holding a few integers."""
    raw = ".".join(str(part) for part in parts).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(value: str, count: int) -> tuple[int, ...]:
    """The integers of a cursor made by encode_cursor; BadRequestError if it is not one."""
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).decode()
        parts = tuple(int(part) for part in raw.split("."))
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise BadRequestError("cursor: not a cursor from a previous page") from None
    if len(parts) != count or not all(_INT64_MIN <= part <= _INT64_MAX for part in parts):
        raise BadRequestError("cursor: not a cursor from a previous page")
    return parts


def format_money(cents: int) -> str:
    """Integer cents as a decimal string with two digits."""
    return f"{cents // 100}.{cents % 100:02d}"


def format_time(epoch_seconds: float) -> str:
    """Epoch seconds as an ISO-8601 UTC string."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch_seconds))


username = text(3, 32, pattern=_USERNAME, what="3 to 32 characters of A-Z a-z 0-9 _ . -")
password = text(8, 128)
person_name = text(1, 32, printable=True)
item_name = text(1, 32, printable=True)  # shown to every buyer: no line breaks, no overrides
category = integer(0, 9)
condition = choice("new", "used")
quantity = integer(1, 1_000_000)
object_id = integer(1, 2**63 - 1)
limit = integer(1, 500)
vote = choice("up", "down")
card_name = text(1, 64, printable=True)
idempotency_key = text(1, 128)
