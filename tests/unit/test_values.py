"""Value rules of PROTOCOL.md, checked without a server."""
from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

import wire
from wire import BUYER_OPS, SELLER_OPS
from wire import values as v
from wire.errors import BadRequestError


def test_the_protocol_version_is_the_contracts() -> None:
    title = (Path(__file__).parents[2] / "docs" / "PROTOCOL.md").read_text().splitlines()[0]
    contract = re.fullmatch(r"# Marketplace wire protocol, version (\d+\.\d+)", title)
    assert contract is not None, title
    assert wire.PROTOCOL_VERSION == contract.group(1)  # what `market --version` says it speaks


@pytest.mark.parametrize("text,cents", [("12.5", 1250), ("12.50", 1250), ("0.01", 1), ("7", 700),
                                        ("1000000.00", 100_000_000), ("0012.05", 1205)])
def test_money_accepts_decimal_strings(text: str, cents: int) -> None:
    assert v.money("price", text) == cents


@pytest.mark.parametrize("bad", ["0", "0.00", "1000000.01", "1" * 16, "12.505", "-1", "1e3", "12.", ".5",
                                 " 12", "12,50", 12.5, 12, None, True, "١٢"])
def test_money_rejects(bad: object) -> None:
    with pytest.raises(BadRequestError, match="^price: "):
        v.money("price", bad)


def test_a_total_is_money_of_any_size() -> None:
    assert [v.total("expected_total", t) for t in ("0.00", "5", "2000001.50")] == [0, 500, 200_000_150]
    for bad in ("-1", "1e3", "12.505", 12):
        with pytest.raises(BadRequestError, match="^expected_total: must be a decimal string"):
            v.total("expected_total", bad)


def test_money_is_formatted_with_two_digits() -> None:
    assert [v.format_money(c) for c in (1, 1250, 100_000_000, 0)] == ["0.01", "12.50", "1000000.00", "0.00"]


@pytest.mark.parametrize("bad", [True, False, 1.0, "1", None])
def test_integers_are_integers_only(bad: object) -> None:
    with pytest.raises(BadRequestError, match="^quantity: must be an integer"):
        v.quantity("quantity", bad)


def test_integer_ranges() -> None:
    assert v.quantity("q", 1_000_000) == 1_000_000
    for bad in (0, 1_000_001, -1):
        with pytest.raises(BadRequestError, match="^q: must be from 1 to 1000000"):
            v.quantity("q", bad)


def test_keywords_are_lower_cased_in_order_and_distinct() -> None:
    assert v.keywords("keywords", ["Desk", "LIGHT", "é"]) == ["desk", "light", "é"]
    for bad in (["a", "A"], ["123456789"], [""], ["a"] * 6, "desk", [1], ["a", "b", "c", "d", "e", "f"]):
        with pytest.raises(BadRequestError, match="^keywords: "):
            v.keywords("keywords", bad)


def test_item_names_and_keywords_must_be_printable() -> None:
    # before: "Lamp\nFREE" and "ab\u202ecod.exe" were listed, shown to every buyer as
    # two lines or as a name that reads as another
    for good in ("Desk lamp", "Lampe à poser", "👩\u200d💻 mug", "李小龍 poster", "a "):
        assert v.item_name("name", good) == good
    for bad in ("Lamp\nFREE", "a\x00b", "ab\u202ecod.exe", "\u200b", " ", "a\tb"):
        with pytest.raises(BadRequestError, match="^name: must be printable text"):
            v.item_name("name", bad)
    assert v.keywords("keywords", ["a ", "é", "\u00a0x"]) == ["a ", "é", "\u00a0x"]
    for bad in (["a\nb"], ["\x00"], ["\u202ex"], [" "], ["ok", "\u200b"]):
        with pytest.raises(BadRequestError, match="^keywords: keyword .* must be printable text"):
            v.keywords("keywords", bad)


@pytest.mark.parametrize("name", ["abc", "A_b.c-9", "x" * 32])
def test_usernames_accepted(name: str) -> None:
    assert v.username("username", name) == name


@pytest.mark.parametrize("name", ["ab", "x" * 33, "has space", "ünï", "a/b", 5])
def test_usernames_rejected(name: object) -> None:
    with pytest.raises(BadRequestError, match="^username: "):
        v.username("username", name)


def test_person_names_must_be_printable() -> None:
    for good in ("Zoë O'Neil", "Jean\u00a0Luc", "می\u200cخواهم", "👩\u200d💻 Ada", "李小龍", "a b"):
        assert v.person_name("name", good) == good
    for bad in ("", "x" * 33, "a\nb", "a\x00b", "a\u2028b", "ab\u202ecod.exe", "\u2067x", " ", "\u00a0 ",
                "\u200b", "\ufeff", "\u200d\u200d", "\u00ad", "a\u200bb"):  # invisible ones too
        with pytest.raises(BadRequestError, match="^name: "):
            v.person_name("name", bad)


@pytest.mark.parametrize(("value", "why"), [
    ("a\u200bb", "without U+200B (character 2)"), ("Lamp\nFREE", "without U+000A (character 5)"),
    ("\u00a0 ", "not only spaces")])
def test_an_unprintable_name_is_told_what_is_wrong(value: str, why: str) -> None:
    with pytest.raises(BadRequestError) as refused:
        v.person_name("name", value)
    assert str(refused.value) == f"name: must be printable text, {why}"


def test_luhn() -> None:
    assert v.card_number("card_number", "4111111111111111") == "4111111111111111"
    for bad in ("4111111111111112", "41111111111", "4" * 20, "4111-1111-1111-1111", "٤١١١١١١١١١١١١١١١"):
        with pytest.raises(BadRequestError, match="^card_number: "):
            v.card_number("card_number", bad)


@pytest.mark.parametrize("number", ["000000000000", "4444444444444444", "0" * 19])
def test_a_card_number_of_one_repeated_digit_is_refused(number: str) -> None:
    assert v.luhn_valid("000000000000")  # the checksum alone lets a row of zeros pass
    with pytest.raises(BadRequestError, match="^card_number: is one digit repeated"):
        v.card_number("card_number", number)


def test_card_names_must_be_printable_text() -> None:
    for good in ("Zoë O'Neil", "李小龍", "A" * 64):
        assert v.card_name("card_name", good) == good
    for bad in ("", "A" * 65, "Ann\x1b[2J", "Ann\nLee", "Ann\u200bLee", "ab\u202ecod", " "):
        with pytest.raises(BadRequestError, match="^card_name: "):
            v.card_name("card_name", bad)


def test_card_expiry_is_valid_through_its_month() -> None:
    now = datetime.now(UTC)
    this_month = f"{now.month:02d}/{now.year % 100:02d}"
    assert v.card_expiry("card_expiry", this_month) == this_month
    last_year = f"{now.month:02d}/{(now.year - 1) % 100:02d}"
    for bad in (last_year, "13/30", "00/30", "1/30", "01/2030", 130):
        with pytest.raises(BadRequestError, match="^card_expiry: "):
            v.card_expiry("card_expiry", bad)


def test_cursors_round_trip_and_garbage_is_a_bad_request() -> None:
    assert v.decode_cursor(v.encode_cursor(3, 99), 2) == (3, 99)
    for bad in ("!!!", v.encode_cursor(1), "bm90IGEgY3Vyc29y"):
        with pytest.raises(BadRequestError, match="^cursor: "):
            v.decode_cursor(bad, 2)


def test_op_specs_name_unknown_missing_and_wrong_fields() -> None:
    spec = SELLER_OPS["change_price"]
    with pytest.raises(BadRequestError, match="^colour: unknown field"):
        spec.validate({"item_id": 1, "price": "1.00", "colour": "red"})
    with pytest.raises(BadRequestError, match="^price: required"):
        spec.validate({"item_id": 1})
    assert spec.validate({"item_id": 1, "price": "1.5"}) == {"item_id": 1, "price": 150}


def test_paging_defaults() -> None:
    assert BUYER_OPS["get_purchase_history"].validate({}) == {"limit": 50, "cursor": None}
    with pytest.raises(BadRequestError, match="^limit: "):
        BUYER_OPS["get_purchase_history"].validate({"limit": 501})
