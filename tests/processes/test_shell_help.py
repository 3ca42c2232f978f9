"""What a shopper expects of the shells, driven through a pseudo-terminal (pexpect) and as
scripts against real servers over an SQLite file: categories by name, answers checked as they
are typed, carts that are not lost, a session kept alive, output that fits and scripts can read.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest
from support import (
    CARD,
    MARKET,
    PASSWORD,
    PROMPT_TIMEOUT,
    Market,
    answer,
    keys,
    port_of,
    run,
    running_market,
    script,
    shell_env,
    spawn,
    unique_name,
    wait,
)

from client.buyer_commands import search_request
from client.registry import UsageError
from db import Database
from db.migrations import make_current
from runtime.config import Settings

SPACED_CARD = " ".join(CARD["card_number"][i:i + 4] for i in range(0, len(CARD["card_number"]), 4))


@pytest.fixture(scope="module")
def market(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Market]:
    """Both servers over one SQLite file, with sessions of the default idle limit: questions
    answered one by one on a loaded machine may take seconds."""
    db = Database(f"sqlite:///{tmp_path_factory.mktemp('shells') / 'market.db'}", pool_size=4)
    make_current(db)
    with running_market(db) as m:
        yield m
    db.close()


@pytest.fixture(scope="module")
def idle_market(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Market]:
    """Both servers with sessions that idle out after 2 s (the keepalive tests)."""
    db = Database(f"sqlite:///{tmp_path_factory.mktemp('idle') / 'market.db'}", pool_size=4)
    make_current(db)
    with running_market(db, Settings(role="buyer", session_idle_s=2)) as m:
        yield m
    db.close()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A home folder of its own, so that history files do not leak between tests."""
    return tmp_path


def buyer_logged_in(market: Market, home: Path, **env: str) -> tuple[pexpect.spawn, str, str]:
    """A buyer shell at the prompt of a new account; the shell, its prompt and the username."""
    buyer = spawn("buyer", port_of(market, "buyer"), home, **env)
    name = unique_name("shopper")
    run(buyer, f"signup {name} --name S -p '{PASSWORD}'", f"{name}@buyer> ")
    return buyer, f"{name}@buyer> ", name


def saved_cart(market: Market, home: Path, name: str) -> str:
    """What a new session of `name` finds in its cart (its saved cart)."""
    done = script("buyer", port_of(market, "buyer"), home, f"login {name}", "cart",
                  MARKET_PASSWORD=PASSWORD)
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr  # its rows, or the sentence saying it is empty


def test_categories_are_shown_and_accepted_by_name(market: Market, home: Path) -> None:
    seller = spawn("seller", port_of(market, "seller"), home)
    name = unique_name("cats")
    me = f"{name}@seller> "
    run(seller, f"signup {name} --name C -p '{PASSWORD}'", me)
    assert "Listed item" in run(seller, "sell Rake --category garden --condition new --price 3 --qty 1", me)
    seller.sendline("sell Kite --condition used --price 4 --qty 1")
    answer(seller, "category: ", "Toy")  # the start of a name is enough when only one fits
    answer(seller, "keywords (Enter: none): ", "")
    assert "Listed item" in wait(seller, me)
    listing = run(seller, "items", me)
    assert "Garden" in listing and "Toys" in listing
    seller.sendline("sell Mug --category Kitchen --condition new --price 1 --qty 1")
    assert "'Kitchen' is not a category; one of Other, Books, Home" in wait(seller, "Ctrl-C cancels)")
    answer(seller, "category: ", "")
    assert "missing category" in wait(seller, me)
    seller.sendline("quit")
    seller.expect(pexpect.EOF)
    found = script("buyer", port_of(market, "buyer"), home, f"signup {unique_name()} --name B",
                   "search --category Garden", MARKET_PASSWORD=PASSWORD)
    assert "Rake\tGarden\t" in found.stdout, found.stderr


def test_a_wrong_answer_at_a_prompt_is_said_and_asked_again(market: Market, home: Path) -> None:
    seller = spawn("seller", port_of(market, "seller"), home)
    name = unique_name("asks")
    me = f"{name}@seller> "
    run(seller, f"signup {name} --name A -p '{PASSWORD}'", me)
    seller.sendline("sell Teapot")
    for question, wrong, problem, right in [
            ("category: ", "Kitchen", "'Kitchen' is not a category", "Home"),
            ("keywords (Enter: none): ", "teapotlids", "'teapotlids' is longer than 8", "tea,pot"),
            ("condition: ", "broken", "must be new or used", "new"),
            ("price: ", "-3", "-3 is not a price: a price is from 0.01 to 1000000.00", "2.50"),
            ("quantity: ", "0", "must be from 1 to 1000000", "4")]:
        answer(seller, question, wrong)
        assert problem in wait(seller, "try again")
        answer(seller, question, right)  # the same question again
    assert "Teapot, 4 at 2.50" in wait(seller, me)
    seller.sendline("quit")
    seller.expect(pexpect.EOF)


def test_help_lists_the_ranges_of_sell_and_buy(market: Market, home: Path) -> None:
    sell = script("seller", port_of(market, "seller"), home, "help sell")
    assert "--price PRICE: 0.01 to 1000000.00, at most two decimals" in sell.stderr
    assert "--category CATEGORY: Other, Books, Home, Electronics" in sell.stderr
    assert "--qty QUANTITY: a whole number from 1 to 1000000" in sell.stderr
    buy = script("buyer", port_of(market, "buyer"), home, "help buy")
    assert "--card-number CARD_NUMBER: 12 to 19 digits, spaces or dashes allowed" in buy.stderr
    assert "--expiry CARD_EXPIRY: MM/YY" in buy.stderr


def test_buy_looks_at_the_cart_before_asking_for_a_card(market: Market, home: Path) -> None:
    buyer, me, _name = buyer_logged_in(market, home)
    out = run(buyer, "buy", me)  # before: card name, number and expiry were asked, then CONFLICT
    assert "your cart is empty: `add ITEM_ID` first" in out and "card name" not in out
    lamp = market.item(market.user("seller"), quantity=3)
    assert f"Item {lamp} (Lamp): 3 in stock, 2 in your cart." in run(buyer, f"add {lamp} 2", me)
    buyer.sendline("buy")
    answer(buyer, "card name: ", "S Buyer")
    answer(buyer, "card number: ", "4111 1111 1111 1112")
    assert "card number: fails the Luhn check" in wait(buyer, "try again")
    answer(buyer, "card number: ", SPACED_CARD)  # typed as printed on the card
    answer(buyer, "card expiry: ", "13/39")
    assert "13 is not a month (01 to 12)" in wait(buyer, "try again")
    answer(buyer, "card expiry: ", CARD["card_expiry"])
    assert "Bought: order" in wait(buyer, me)
    buyer.sendline("quit")  # the cart was bought: nothing to save, no question
    buyer.expect(pexpect.EOF)


def test_a_card_number_with_dashes_is_accepted_in_a_script(market: Market, home: Path) -> None:
    lamp = market.item(market.user("seller"))
    dashed = SPACED_CARD.replace(" ", "-")
    done = script("buyer", port_of(market, "buyer"), home, f"signup {unique_name()} --name D",
                  f"add {lamp}", f"buy --card-name D --card-number {dashed} --expiry {CARD['card_expiry']}",
                  MARKET_PASSWORD=PASSWORD)
    assert done.returncode == 0 and "Bought: order" in done.stderr, done.stderr


@pytest.mark.parametrize("leave", ["quit", "logout", "ctrl-d", "ctrl-c"])
def test_leaving_with_an_unsaved_cart_asks_to_save_it(market: Market, home: Path, leave: str) -> None:
    buyer, me, name = buyer_logged_in(market, home)
    lamp = market.item(market.user("seller"))
    run(buyer, f"add {lamp} 2", me)
    if leave == "ctrl-d":
        keys(buyer, "\x04")
    elif leave == "ctrl-c":
        keys(buyer, "\x03")
        buyer.expect_exact("Ctrl-C again")
        keys(buyer, "\x03")
    else:
        buyer.sendline(leave)
    answer(buyer, "Save your cart? [Y/n] ", "")  # yes by default
    if leave == "logout":
        assert "Cart saved: 1 item(s)" in wait(buyer, "buyer> ")
        buyer.sendline("quit")
    buyer.expect(pexpect.EOF)
    assert f"{lamp}\tLamp\t12.50\t2\t" in saved_cart(market, home, name)


def test_an_unsaved_cart_the_person_declines_to_save_is_dropped(market: Market, home: Path) -> None:
    buyer, me, name = buyer_logged_in(market, home)
    run(buyer, f"add {market.item(market.user('seller'))}", me)
    buyer.sendline("logout")
    answer(buyer, "Save your cart? [Y/n] ", "n")
    assert f"Logged out {name}." in wait(buyer, "buyer> ")
    buyer.sendline("quit")  # logged out: no cart, no question
    buyer.expect(pexpect.EOF)
    assert "Your cart is empty." in saved_cart(market, home, name)


def test_a_script_drops_an_unsaved_cart_unless_told_to_save_it(market: Market, home: Path) -> None:
    lamp = market.item(market.user("seller"))
    names = [unique_name("script"), unique_name("script")]
    for name, flags in zip(names, ([], ["--save-on-exit"]), strict=True):
        done = subprocess.run([MARKET, "buyer", "--port", str(port_of(market, "buyer")), *flags,
                               "-c", f"signup {name} --name S; add {lamp}"], capture_output=True,
                              text=True, timeout=60, env=shell_env(home, MARKET_PASSWORD=PASSWORD))
        assert done.returncode == 0, done.stderr
    assert "Your cart is empty." in saved_cart(market, home, names[0])
    assert f"{lamp}\tLamp" in saved_cart(market, home, names[1])


@pytest.mark.slow
def test_an_open_shell_keeps_its_session_alive(idle_market: Market, home: Path) -> None:
    buyer, me, _name = buyer_logged_in(idle_market, home, MARKET_KEEPALIVE_S="0.5")
    lamp = idle_market.item(idle_market.user("seller"))
    run(buyer, f"add {lamp}", me)
    time.sleep(4)  # twice the server's idle limit of sessions, quietly at the prompt
    out = run(buyer, "cart", me)
    assert "Lamp" in out and "expired" not in out
    buyer.sendline("quit")
    answer(buyer, "Save your cart? [Y/n] ", "n")
    buyer.expect(pexpect.EOF)


@pytest.mark.slow
def test_an_expired_session_says_what_the_cart_held_and_puts_it_back(idle_market: Market, home: Path) -> None:
    buyer, me, name = buyer_logged_in(idle_market, home, MARKET_KEEPALIVE_S="0")  # no keepalive
    lamp = idle_market.item(idle_market.user("seller"))
    run(buyer, f"add {lamp} 2", me)
    time.sleep(4)
    buyer.sendline("cart")
    out = wait(buyer, "put the cart back? [Y/n] ")
    assert "your session has expired or ended; your cart held 2 x Lamp" in out
    buyer.sendline("")
    answer(buyer, "password: ", PASSWORD)
    out = wait(buyer, me)
    assert f"Logged in as {name}" in out and "2 in your cart" in out
    assert "Lamp" in run(buyer, "cart", me)
    buyer.sendline("quit")
    answer(buyer, "Save your cart? [Y/n] ", "n")
    buyer.expect(pexpect.EOF)


def test_options_categories_and_listed_item_ids_complete_with_tab(market: Market, home: Path) -> None:
    lamp = market.item(market.user("seller"), name="Tabbed", category=8)  # alone in Health
    buyer, me, _name = buyer_logged_in(market, home)
    keys(buyer, "search --cat", "\t", " Heal", "\t", " --lim", "\t", " 500\r")
    assert "Tabbed" in wait(buyer, me)
    keys(buyer, f"add {str(lamp)[:-1]}", "\t", "\r")  # the ids of the last list
    assert f"Item {lamp} (Tabbed)" in wait(buyer, me)
    buyer.sendline("quit")
    answer(buyer, "Save your cart? [Y/n] ", "n")
    buyer.expect(pexpect.EOF)


def test_json_gives_one_document_per_command_that_json_tool_reads(market: Market, home: Path) -> None:
    # before: every value a string ("qty": "3"), and sentences and tables as separate documents
    lamp = market.item(market.user("seller"), name="Jsonlamp", category=3, quantity=3)
    args = [MARKET, "buyer", "--port", str(port_of(market, "buyer")), "--format", "json", "-c",
            f"signup {unique_name()} --name J; search --category Electronics --limit 500; add {lamp} 2; "
            "item 999999"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60,
                          env=shell_env(home, MARKET_PASSWORD=PASSWORD))
    assert done.returncode == 1, done.stderr
    docs = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(doc["command"], doc["ok"]) for doc in docs] == [
        ("signup", True), ("search", True), ("add", True), ("item", False)]
    assert any(line.startswith("Logged in as") for line in docs[0]["messages"])
    row = next(row for row in docs[1]["rows"] if row["id"] == lamp)
    assert row["name"] == "Jsonlamp" and row["category"] == "Electronics" and row["qty"] == 3
    assert row["price"] == "12.50" and isinstance(row["keywords"], list)
    assert docs[2]["total"] == "25.00" and docs[2]["rows"][0]["qty"] == 2
    assert docs[3]["error"].startswith("no item 999999") and "NOT_FOUND" not in docs[3]["error"]
    tool = subprocess.run([sys.executable, "-m", "json.tool", "--json-lines"], input=done.stdout,
                          capture_output=True, text=True, timeout=60)
    assert tool.returncode == 0 and tool.stderr == ""
    usage = subprocess.run([MARKET, "buyer", "-h"], capture_output=True, text=True, timeout=60,
                           env=shell_env(home, COLUMNS="400"))
    assert "json (JSON Lines: one object per command" in usage.stdout
    assert "`python -m json.tool --json-lines`" in usage.stdout


def test_tsv_holds_only_rows(market: Market, home: Path) -> None:
    lamp = market.item(market.user("seller"), quantity=3)
    done = script("buyer", port_of(market, "buyer"), home, f"signup {unique_name()} --name T",
                  f"add {lamp} 2", "cart", MARKET_PASSWORD=PASSWORD)
    assert done.returncode == 0, done.stderr
    rows = [line.split("\t") for line in done.stdout.splitlines()]
    assert rows[0] == ["item", "name", "price", "qty", "available", "subtotal"] == rows[2]
    assert rows[1] == rows[3] == [str(lamp), "Lamp", "12.50", "2", "3", "25.00"] and len(rows) == 4
    assert "Total: 25.00" in done.stderr


def test_tables_fit_80_columns_without_cutting_a_price(market: Market, home: Path) -> None:
    seller = market.user("seller")
    long_name = "An uncommonly long name of a lamp"[:32]
    market.item(seller, name=long_name, keywords=["verylong", "keywords", "here"], price="999999.99",
                quantity=999999, category=9)
    child = pexpect.spawn(MARKET, ["buyer", "--port", str(port_of(market, "buyer"))],
                          env=shell_env(home, COLUMNS="80"), encoding="utf-8", dimensions=(50, 80),
                          timeout=PROMPT_TIMEOUT)
    child.expect_exact("buyer> ")
    name = unique_name()
    run(child, f"signup {name} --name W -p '{PASSWORD}'", f"{name}@buyer> ")
    out = run(child, "search --category Collectibles --limit 500", f"{name}@buyer> ")
    lines = out.splitlines()[1:]
    assert all(len(line.rstrip("\r")) <= 80 for line in lines), out
    assert "999999.99" in out and "999999 " in out and "verylon…" in out, out
    assert "An uncommonly" in out  # wrapped, not dropped
    child.sendline("quit")
    child.expect(pexpect.EOF)


def test_search_words_are_a_query_and_keywords_stay_exact() -> None:
    args = {"words": ["desk", "lamp"], "keywords": [], "category": 2, "limit": 20}
    assert search_request(args) == {"category": 2, "limit": 20, "query": "desk lamp"}
    exact = {**args, "words": [], "keywords": ["desk"]}
    assert search_request(exact) == {"category": 2, "limit": 20, "keywords": ["desk"]}
    with pytest.raises(UsageError, match="not both"):
        search_request({**args, "keywords": ["desk"]})


def test_the_shell_module_does_not_import_the_command_modules() -> None:
    code = ("import sys, client.shell; "
            "print(sorted(m for m in sys.modules if m.startswith('client.') and m.endswith('_commands')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stderr


def test_a_bad_card_given_on_the_line_is_refused_before_the_cart_is_looked_at(market: Market,
                                                                             home: Path) -> None:
    done = script("buyer", port_of(market, "buyer"), home, f"signup {unique_name()} --name E",
                  "buy --card-name E --card-number 1234 --expiry 12/39", MARKET_PASSWORD=PASSWORD)
    assert done.returncode == 1
    assert "card number: must be 12 to 19 digits" in done.stderr and "cart is empty" not in done.stderr
