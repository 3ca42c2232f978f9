"""The shells' rules that need no server: values refused in words people understand, errors
without protocol codes, one JSON document per command, completion, device tokens on disk."""
from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from prompt_toolkit.completion import CompleteEvent
from prompt_toolkit.document import Document

from client import fields
from client.buyer_commands import BUYER
from client.common_commands import COMMON, DeviceTokens
from client.completion import LineCompleter
from client.registry import Arg, BadValueError, Command, UsageError
from client.render import Output, Table
from client.shell import in_plain_words
from wire.errors import ERROR_CLASSES


@pytest.mark.parametrize(("text", "said"), [
    ("-3", "-3 is not a price: a price is from 0.01 to 1000000.00, like 12.50"),
    ("0", "0 is not a price"), ("1000000.01", "is not a price"),
    ("12.345", "at most two decimals"), ("twelve", "'twelve' is not an amount of money"),
    ("nan", "is not a price")])
def test_a_price_is_refused_in_words_a_seller_understands(text: str, said: str) -> None:
    with pytest.raises(ValueError, match=said.replace(".", r"\.").replace("(", r"\(").replace(")", r"\)")):
        fields.price(text)


def test_a_price_is_sent_with_two_decimals() -> None:
    assert [fields.price(text) for text in ("12.5", "3", " 7.05 ", "$4")] == ["12.50", "3.00", "7.05", "4.00"]


@pytest.mark.parametrize(("text", "said"), [
    ("13/27", "13 is not a month (01 to 12)"), ("1227", "write it MM/YY"), ("12/2027", "write it MM/YY"),
    ("01/20", "expired")])
def test_an_expiry_says_which_part_is_wrong(text: str, said: str) -> None:
    with pytest.raises(ValueError, match=said.replace("(", r"\(").replace(")", r"\)")):
        fields.card_expiry(text)
    assert fields.card_expiry("8/39") == "08/39"


def test_a_password_of_the_wrong_length_is_wrong_before_any_request() -> None:
    with pytest.raises(ValueError, match="^wrong password: every password has 8 to 128 characters, not 5$"):
        fields.password("wrong password: ")("short")
    with pytest.raises(ValueError, match="^a password has 8 to 128 characters, not 5$"):
        fields.password()("short")
    assert fields.password("wrong password: ")("long enough") == "long enough"


def test_a_password_from_the_environment_says_where_it_came_from(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MARKET_PASSWORD", "wrong")
    with pytest.raises(BadValueError, match=r"^password \(from MARKET_PASSWORD\): wrong password") as caught:
        COMMON.get("login").values(["bob"], None)
    assert "wrong" not in str(caught.value).split("):")[0]  # the secret itself is not repeated


def test_keywords_longer_than_eight_characters_or_more_than_five_are_refused() -> None:
    assert fields.keywords("desk, Light,desk") == ["desk", "Light"]
    with pytest.raises(ValueError, match="'lightbulb' is longer than 8"):
        fields.keywords("lamp lightbulb")
    with pytest.raises(ValueError, match="at most 5 keywords, not 6"):
        fields.keywords("a b c d e f")


def test_a_value_not_valid_is_asked_for_again_with_the_reason() -> None:
    asked: list[tuple[str, str]] = []

    def ask(arg: Arg, problem: str) -> str:
        asked.append((arg.name, problem))
        return "Home"
    sell = Arg("category", "--category", convert=fields.category)
    command = Command("sell", "", lambda shell, args: None, (sell,))
    assert command.values(["--category", "Kitchen"], ask) == {"category": 2}
    assert asked == [("category", "'Kitchen' is not a category; one of " + fields.CATEGORY_LIST)]
    with pytest.raises(BadValueError, match="category: 'Kitchen' is not a category"):
        command.values(["--category", "Kitchen"], None)


def test_an_optional_asked_argument_is_asked_only_along_with_a_required_one() -> None:
    asked: list[str] = []

    def ask(arg: Arg, problem: str) -> str:
        asked.append(arg.name)
        return "" if arg.name == "keywords" else "x"
    args = (Arg("name"), Arg("keywords", "--keywords", convert=fields.keywords, required=False, default=[],
                             asked=True))
    command = Command("sell", "", lambda shell, values: None, args)
    assert command.values(["Mug"], ask) == {"name": "Mug", "keywords": []} and asked == []
    assert command.values([], ask) == {"name": "x", "keywords": []} and asked == ["name", "keywords"]
    with pytest.raises(UsageError, match="missing name"):
        command.values([], None)


@pytest.mark.parametrize(("code", "message", "said"), [
    ("NOT_FOUND", "no item 9", "no item 9: check the number (a list such as `search` shows them)"),
    ("BUSY", "hashing queue full", "the server is busy right now; nothing was done: try again in a moment"),
    ("UNAVAILABLE", "db down", "cannot reach its database right now; nothing was changed"),
    ("PAYMENT_DECLINED", "refused", "the card was declined (refused); nothing was charged: try another card"),
    ("INTERNAL", "internal error", "the server failed (internal error): try again"),
    ("UNKNOWN_OP", "no such op", "is it the buyer server?")])
def test_an_error_answer_is_said_without_its_code_and_with_what_to_do(code: str, message: str,
                                                                       said: str) -> None:
    text = in_plain_words(ERROR_CLASSES[code](message), "buyer")
    assert said in text and code not in text


def test_json_output_is_one_document_per_command_with_numbers_as_numbers(
        capsys: pytest.CaptureFixture[str]) -> None:
    out = Output("json")
    for command in ("cart", "ping"):
        out.begin(command)
        if command == "cart":
            out.table(Table("Cart", ("item", "price", "qty", "name"), [(7, "12.50", 3, "Lamp")], "empty",
                            {"total": "37.50"}))
        out.say("Total: 37.50" if command == "cart" else "answers")
        out.end()
    out.begin("add")
    out.error("no item 9")
    out.end()
    captured = capsys.readouterr()
    docs = [json.loads(line) for line in captured.out.splitlines()]
    assert docs[0] == {"command": "cart", "ok": True, "table": "Cart", "total": "37.50",
                       "messages": ["Total: 37.50"],
                       "rows": [{"item": 7, "price": "12.50", "qty": 3, "name": "Lamp"}]}
    assert docs[1] == {"command": "ping", "ok": True, "messages": ["answers"]}
    assert docs[2] == {"command": "add", "ok": False, "error": "no item 9"}
    assert captured.err == "error: no item 9\n"


def test_tsv_output_holds_only_rows(capsys: pytest.CaptureFixture[str]) -> None:
    out = Output("tsv")
    out.table(Table("Items", ("id", "keywords", "feedback"), [(1, ["desk", "lamp"], None)], "none"))
    out.say("Total: 1.00")
    out.table(Table("Items", ("id",), [], "No items found."))
    captured = capsys.readouterr()
    assert captured.out == "id\tkeywords\tfeedback\n1\tdesk,lamp\t-\n"
    assert captured.err == "Total: 1.00\nNo items found.\n"


def completions(text: str) -> list[str]:
    completer = LineCompleter(COMMON | BUYER, lambda: ["42"])
    return [c.text for c in completer.get_completions(Document(text), CompleteEvent())]


def test_a_completed_word_ends_with_a_space() -> None:
    assert completions("search --cat") == ["--category "]
    assert completions("search --category Hea") == ["Health "]
    assert completions("add 4") == ["42 "]
    assert completions("hist") == ["history "]


def test_device_tokens_are_kept_per_account_in_a_file_only_its_owner_reads(tmp_path: Path) -> None:
    path = tmp_path / "devices"
    DeviceTokens(str(path)).put("buyer 127.0.0.1:7001 bob", "t1")
    DeviceTokens(str(path)).put("seller 127.0.0.1:7002 bob", "t2")
    kept = DeviceTokens(str(path))
    assert kept.get("buyer 127.0.0.1:7001 bob") == "t1" and kept.get("seller 127.0.0.1:7002 bob") == "t2"
    assert kept.get("buyer 127.0.0.1:7001 alice") is None
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.write_text("not json")
    assert DeviceTokens(str(path)).get("buyer 127.0.0.1:7001 bob") is None  # unreadable: no token
