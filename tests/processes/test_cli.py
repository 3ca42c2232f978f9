"""The buyer and seller shells, driven as people use them: through a pseudo-terminal (pexpect)
and as scripts (-c and standard input), against real servers over an SQLite file.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pexpect
import pytest
from sqlalchemy import text
from support import (
    CARD,
    MARKET,
    PASSWORD,
    PROMPT_TIMEOUT,
    Market,
    answer,
    free_port,
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

from client.main import build_parser
from db import Database
from db.migrations import make_current
from runtime.config import Settings


@pytest.fixture(scope="module")
def market(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Market]:
    """Both servers over one SQLite file, shared by this module's tests."""
    db = Database(f"sqlite:///{tmp_path_factory.mktemp('cli') / 'market.db'}", pool_size=8)
    make_current(db)
    with running_market(db) as m:
        yield m
    db.close()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A home folder of its own, so that history files do not leak between tests."""
    return tmp_path


def test_a_seller_signs_up_lists_items_and_changes_a_price(market: Market, home: Path) -> None:
    seller = spawn("seller", port_of(market, "seller"), home)
    name = unique_name("sam")
    seller.sendline(f"signup {name}")
    answer(seller, "name: ", "Sam Seller")
    answer(seller, "password: ", PASSWORD)
    answer(seller, "password again: ", PASSWORD)
    assert f"Logged in as {name}" in wait(seller, f"{name}@seller> ")
    assert "You have no items on sale." in run(seller, "items", f"{name}@seller> ")
    out = run(seller, 'sell "Desk lamp" --category 2 --keywords desk,light --condition used '
                      '--price 12.5 --qty 5', f"{name}@seller> ")
    item_id = int(re.search(r"Listed item (\d+): Desk lamp, 5 at 12\.50", out).group(1))
    seller.sendline("sell Chair")
    for question, reply in [("category: ", "3"), ("keywords (Enter: none): ", "seat, wooden"),
                            ("condition: ", "new"), ("price: ", "30"), ("quantity: ", "2")]:
        answer(seller, question, reply)
    assert "Chair, 2 at 30.00" in wait(seller, f"{name}@seller> ")
    assert "now costs 9.99" in run(seller, f"price {item_id} 9.99", f"{name}@seller> ")
    listing = run(seller, "items", f"{name}@seller> ")
    assert re.search(rf"{item_id} .*Desk lamp.*9\.99 .*5 ", listing)
    assert re.search(r"Chair .*seat,wo", listing)  # keywords asked for, not typed as the condition
    assert "1 left on sale" in run(seller, f"remove {item_id + 1} 1", f"{name}@seller> ")
    # bad input at each step: one line naming the problem, the value asked for again, and the
    # shell carries on
    seller.sendline(f"price {item_id} 12.345")
    assert "price: has at most two decimals (cents), like 12.50; try again" in wait(seller, "Ctrl-C cancels)")
    answer(seller, "price: ", "")
    assert "missing price" in wait(seller, f"{name}@seller> ")
    out = run(seller, "price 999999 1.00", f"{name}@seller> ")
    assert "error: no item 999999: check the number (a list such as `items` shows them)" in out
    seller.sendline("sell Mug --category two --condition new --price 1 --qty 1")
    assert "category: 'two' is not a category; one of Other, Books" in wait(seller, "Ctrl-C cancels)")
    answer(seller, "category: ", "Books")
    assert "Listed item" in wait(seller, f"{name}@seller> ")
    seller.sendline("sell Mug --category 1 --condition broken --price 1 --qty 1")
    assert "condition: must be new or used" in wait(seller, "Ctrl-C cancels)")
    answer(seller, "condition: ", "")
    assert "missing condition" in wait(seller, f"{name}@seller> ")
    out = run(seller, f"remove {item_id} 6", f"{name}@seller> ")
    assert "error: item " in out and "only 5 on sale, cannot remove 6" in out and "CONFLICT" not in out
    assert "unrecognized arguments: --colour" in run(seller, "sell Mug --colour red",
                                                      f"{name}@seller> ")
    assert "0 thumbs up, 0 thumbs down, 0 items sold" in run(seller, "rating", f"{name}@seller> ")
    assert "Logged out" in run(seller, "logout", "seller> ")
    seller.sendline("quit")
    seller.expect(pexpect.EOF)


def test_a_buyer_searches_saves_a_cart_buys_rates_and_sees_history(market: Market, home: Path) -> None:
    seller = market.user("seller")
    lamp = market.item(seller, name="Desk lamp", quantity=3, price="12.50")
    buyer = spawn("buyer", port_of(market, "buyer"), home)
    name = unique_name("bob")
    me = f"{name}@buyer> "
    assert "you are not logged in" in run(buyer, "cart", "buyer> ")
    buyer.sendline(f"signup {name} --name Bob")
    answer(buyer, "password: ", PASSWORD)
    answer(buyer, "password again: ", PASSWORD)
    assert f"Logged in as {name}" in wait(buyer, me)
    found = run(buyer, "search --category 2 desk", me)
    assert re.search(rf"{lamp} .*Desk lamp.*12\.50", found)
    assert "No items found." in run(buyer, "search --category 9 nothing", me)
    assert f"error: item {lamp}: only 3 left" in run(buyer, f"add {lamp} 4", me)
    assert "Total: 25.00" in run(buyer, f"add {lamp} 2", me)
    assert "Cart saved: 1 item(s), total 25.00" in run(buyer, "save", me)
    assert "Logged out" in run(buyer, "logout", "buyer> ")
    buyer.sendline(f"login {name}")
    answer(buyer, "password: ", "wrong password")
    out = wait(buyer, "buyer> ")
    assert "error: wrong username or password; buyer and seller accounts are apart" in out
    buyer.sendline(f"login {name}")
    answer(buyer, "password: ", PASSWORD)
    wait(buyer, me)
    assert "Total: 25.00" in run(buyer, "cart", me)
    buyer.sendline("buy --card-name Bob --card-number 4111111111111112 --expiry 12/39")
    out = wait(buyer, "Ctrl-C cancels)")
    assert "Your cart: 2 x Desk lamp" in out and "total 25.00" in out and "fails the Luhn check" in out
    answer(buyer, "card number: ", "")  # asked again, without echo
    assert "missing card number" in wait(buyer, me)
    bought = run(buyer, f"buy --card-name Bob --card-number {CARD['card_number']} --expiry 12/39", me)
    order_id = int(re.search(r"Bought: order (\d+), total 25\.00", bought).group(1))
    with market.db.engine.connect() as conn:  # the purchase went out under a fresh key
        key = conn.execute(text("SELECT idempotency_key FROM orders WHERE order_id = :o"),
                           {"o": order_id}).scalar_one()
    assert uuid.UUID(key).version == 4
    assert "Your cart is empty." in run(buyer, "cart", me)
    assert "error: your cart is empty" in run(buyer, f"buy --card-name Bob --card-number "
                                                     f"{CARD['card_number']} --expiry 12/39", me)
    assert re.search(rf"{lamp} .*Desk lamp.*2 .*12\.50 .*-", run(buyer, "history", me))
    buyer.sendline(f"rate {lamp} sideways")
    assert "vote: must be up or down" in wait(buyer, "Ctrl-C cancels)")
    answer(buyer, "vote: ", "up")
    assert "Thanks: thumbs up" in wait(buyer, me)
    assert f"error: you have already rated item {lamp}" in run(buyer, f"rate {lamp} down", me)
    assert re.search(rf"{lamp} .*Desk lamp.*up", run(buyer, "history", me))
    rating = run(buyer, f"rating {seller.user_id}", me)  # type: ignore[attr-defined]
    assert "1 thumbs up, 0 thumbs down, 2 items sold" in rating
    assert "error: no seller 999999" in run(buyer, "rating 999999", me)
    buyer.sendline("quit")
    buyer.expect(pexpect.EOF)


def test_bad_command_lines_get_one_line_and_the_shell_carries_on(market: Market, home: Path) -> None:
    buyer = spawn("buyer", port_of(market, "buyer"), home)
    assert "unknown command 'fly'" in run(buyer, "fly away", "buyer> ")
    assert "cannot read the line" in run(buyer, 'search "unclosed', "buyer> ")
    buyer.sendline(f"signup {unique_name()} --name B -p '{PASSWORD}'")
    buyer.expect_exact("@buyer> ")
    for line, problem in [("add 1 2 3", "unrecognized arguments: 3"),
                          ("item 999999", "error: no item 999999: check the number"),
                          ("history --limit", "expected one argument")]:
        out = run(buyer, line, "@buyer> ")
        assert problem in out and "Traceback" not in out
    buyer.sendline("add one")
    assert "item id: 'one' is not a whole number" in wait(buyer, "Ctrl-C cancels)")
    answer(buyer, "item id: ", "")
    assert "missing item id" in wait(buyer, "@buyer> ")
    buyer.sendline("search --category 12")
    assert "category: must be from 0 to 9" in wait(buyer, "Ctrl-C cancels)")
    answer(buyer, "category (Enter: none): ", "")  # an optional value: none, then
    wait(buyer, "@buyer> ")
    buyer.sendline("add")
    answer(buyer, "item id: ", "")
    assert "missing item id" in wait(buyer, "@buyer> ")
    keys(buyer, "search", "\x03", "ping\r")  # Ctrl-C at the prompt drops the line typed so far
    buyer.expect("The buyer server .* answers")
    buyer.sendeof()
    buyer.expect(pexpect.EOF)


def test_help_is_generated_from_the_registry(market: Market, home: Path) -> None:
    seller = spawn("seller", port_of(market, "seller"), home)
    listing = run(seller, "help", "seller> ")
    for usage in ("sell NAME --category CATEGORY", "price ITEM_ID PRICE", "login USERNAME",
                  "more", "quit"):
        assert usage in listing
    assert "search" not in listing
    assert "cart" not in listing  # a seller has none: login and logout say nothing of it
    assert "also: put_item" in run(seller, "help sell", "seller> ")
    assert "unknown command 'buy'" in run(seller, "help buy", "seller> ")
    seller.sendline("quit")
    seller.expect(pexpect.EOF)


def test_a_buyers_login_and_logout_say_what_they_do_to_the_cart(market: Market, home: Path) -> None:
    done = script("buyer", port_of(market, "buyer"), home, "help login", "help logout")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""  # sentences, not rows: on stderr
    assert "usage: login USERNAME [--password PASSWORD]" in done.stderr
    assert "your session's cart starts as your saved cart" in done.stderr
    assert "asking whether to save an unsaved cart" in done.stderr


def test_command_names_complete_with_tab(market: Market, home: Path) -> None:
    buyer = spawn("buyer", port_of(market, "buyer"), home)
    keys(buyer, "his", "\t", "\r")
    buyer.expect("error: you are not logged in; `history` needs")
    buyer.sendline("quit")
    buyer.expect(pexpect.EOF)


def test_passwords_are_not_echoed_and_history_persists_without_them(market: Market, home: Path) -> None:
    secret = "not-echoed-secret"
    name = unique_name()
    buyer = spawn("buyer", port_of(market, "buyer"), home)
    buyer.sendline(f"signup {name} --name X")
    answer(buyer, "password: ", secret)
    answer(buyer, "password again: ", secret)
    assert secret not in wait(buyer, f"{name}@buyer> ")
    run(buyer, f"login {name} -p {secret}", f"{name}@buyer> ")
    run(buyer, "ping", f"{name}@buyer> ")
    buyer.sendline("quit")
    buyer.expect(pexpect.EOF)
    history = (home / "history").read_text()
    assert "+ping" in history and f"signup {name}" in history and secret not in history
    again = spawn("buyer", port_of(market, "buyer"), home)
    keys(again, "\x10", "\x10", "\r")  # Ctrl-P twice: the last session's line before `quit`
    again.expect("The buyer server .* answers")
    again.sendline("quit")
    again.expect(pexpect.EOF)


def test_a_line_the_shell_did_not_understand_stays_out_of_the_history(market: Market, home: Path) -> None:
    # a password typed where no word was expected, or after an abbreviated flag: before,
    # the line was in the history file as typed
    buyer = spawn("buyer", port_of(market, "buyer"), home)
    for line in ("login bob hunter2hunter2", "login bob --pass hunter3hunter3"):
        assert "usage:" in run(buyer, line, "buyer> ")
    assert "not logged in" in run(buyer, 'buy "Bob" 4111111111111111', "buyer> ")  # its words unread
    run(buyer, "ping", "buyer> ")
    run(buyer, "search lamp; nosuchcommand", "buyer> ")
    buyer.sendline("quit")
    buyer.expect(pexpect.EOF)
    history = (home / "history").read_text()
    assert "+ping" in history and "+quit" in history
    for secret in ("hunter2hunter2", "hunter3hunter3", "4111111111111111", "nosuchcommand"):
        assert secret not in history


def test_a_history_file_under_the_home_folder_may_be_written_with_a_tilde(market: Market, home: Path) -> None:
    # as .env.example shows it; python-dotenv leaves the ~ as it is
    buyer = spawn("buyer", port_of(market, "buyer"), home, MARKET_HISTORY_FILE="~/.market_history")
    run(buyer, "ping", "buyer> ")
    buyer.sendline("quit")
    buyer.expect(pexpect.EOF)
    assert "+ping" in (home / ".market_history").read_text()


@pytest.mark.parametrize(("line", "secret"), [
    ("login bob -p hunter2", True), ("login bob -phunter2", True), ("login bob --password=hunter2", True),
    (r"login bob \--password hunter2", True), (r"login bob -\p hunter2", True),
    ('login bob -"p" hunter2', True),
    (r"buy --card-name B \--card-number 4111", True), ("login bob 'unterminated", True),
    ("login bob", False), ("sell Lamp --price 3", False), ("search -- -x", False),
])
def test_a_line_with_a_password_or_card_flag_is_found_however_it_is_quoted(line: str, secret: bool) -> None:
    from client.lines import carries_a_secret
    assert carries_a_secret(line) is secret  # such a line is never written to the history file


@pytest.mark.parametrize(("line", "commands"), [
    ("add 1 2   # item 1, two of them", [["add", "1", "2"]]),
    ("search c# --category 1", [["search", "c#", "--category", "1"]]),
    ('sell "Lamp #2"; items # mine', [["sell", "Lamp #2"], ["items"]]),
    (r"search \#tag 'a # b'", [["search", "#tag", "a # b"]]),
    ("cart;# the rest", [["cart"]]),
    ("   # only a comment", []),
    (r"sell Lamp\ #2 --qty 1", [["sell", "Lamp #2", "--qty", "1"]]),  # an escaped space ends no word
    ("ping;;ping", [["ping"], ["ping"]]),  # shlex reads `;;` as one word
    ("cart ;;; ping;", [["cart"], ["ping"]]),
    (r"ping; \q", [["ping"], ["\\q"]]),  # shlex alone makes it `q`
    (r"  \q", [["\\q"]]),
    (r"search \q '\q' ';\q'", [["search", "q", "\\q", ";\\q"]]),  # only a command keeps it
    ('search ";" x; ping', [["search", ";", "x"], ["ping"]]),  # a quoted `;` is a word, as in sh
    ("search a\x0b#b", [["search", "a\x0b#b"]]),  # a vertical tab ends no word (for shlex either)
    (r"search a\;b;ping", [["search", "a;b"], ["ping"]]),
])
def test_a_comment_begins_at_a_hash_that_begins_a_word(line: str, commands: list[list[str]]) -> None:
    from client.lines import split_commands

    assert split_commands(line) == commands


def test_a_script_line_may_end_with_a_comment(market: Market, home: Path) -> None:
    command = [MARKET, "buyer", "--port", str(port_of(market, "buyer")), "-c", "ping  # is it up?"]
    done = subprocess.run(command, capture_output=True, text=True, env=shell_env(home), timeout=60)
    assert done.returncode == 0, done.stderr
    assert "The buyer server" in done.stderr


@contextlib.contextmanager
def market_with_short_sessions(tmp_path: Path) -> Iterator[Market]:
    """Servers whose sessions end after 1 s without a request."""
    db = Database(f"sqlite:///{tmp_path / 'expiry.db'}", pool_size=4)
    make_current(db)
    try:
        with running_market(db, Settings(role="buyer", session_idle_s=1)) as short:
            yield short
    finally:
        db.close()


def test_an_expired_session_says_so_and_asks_to_log_in_again(tmp_path: Path, home: Path) -> None:
    with market_with_short_sessions(tmp_path) as short:
        buyer = spawn("buyer", short.buyer_server.address[1], home)
        name = unique_name()
        run(buyer, f"signup {name} --name X -p '{PASSWORD}'", f"{name}@buyer> ")
        time.sleep(2.5)  # past the idle timeout of 1 s
        out = run(buyer, "cart", "buyer> ")
        assert "session has expired" in out and f"log in again: login {name}" in out
        buyer.sendline(f"login {name}")
        answer(buyer, "password: ", PASSWORD)
        assert f"Logged in as {name}" in wait(buyer, f"{name}@buyer> ")
        assert "Your cart is empty." in run(buyer, "cart", f"{name}@buyer> ")
        buyer.sendline("quit")
        buyer.expect(pexpect.EOF)


def test_script_mode_prints_plain_text_and_stops_at_the_first_error(market: Market, home: Path) -> None:
    name = unique_name("scripted")
    port = port_of(market, "seller")
    done = script("seller", port, home, f"signup {name} --name S",
                  "sell Kettle --category 4 --keywords tea --condition new --price 20 --qty 2",
                  "items", MARKET_PASSWORD=PASSWORD)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-2].split("\t")[:3] == ["id", "name", "category"]
    assert "20.00" in done.stdout.splitlines()[-1] and "┃" not in done.stdout
    failed = script("seller", port, home, f"login {name}", "price 999999 1", "items",
                    MARKET_PASSWORD=PASSWORD)
    assert failed.returncode == 1
    errors = [line for line in failed.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: no item 999999: check the number (a list such as `items` shows them)"]
    assert "Kettle" not in failed.stdout  # `items` never ran


def test_script_mode_reads_standard_input_and_never_prompts(market: Market, home: Path) -> None:
    name = unique_name("piped")
    port = port_of(market, "buyer")
    lines = f"# a comment\nsignup {name} --name P -p '{PASSWORD}'\nsearch --category 8\ncart\n"
    done = script("buyer", port, home, stdin=lines)
    assert done.returncode == 0, done.stderr
    assert "No items found." in done.stderr and "Your cart is empty." in done.stderr
    missing = script("buyer", port, home, f"login {name}")
    assert missing.returncode == 1 and "missing password" in missing.stderr
    assert "password:" not in missing.stdout
    wrong = script("buyer", port, home, f"login {name}", "cart", MARKET_PASSWORD="wrong password")
    assert wrong.returncode == 1
    assert "error: wrong username or password (the password in MARKET_PASSWORD);" in wrong.stderr
    assert "UNAUTHENTICATED" not in wrong.stderr and "cart" not in wrong.stdout


def test_search_words_find_names_by_text_and_keywords_stay_exact(market: Market, home: Path) -> None:
    seller = market.user("seller")
    lamp = market.item(seller, name="Brass Café Lamp", category=6, keywords=["vintage"])
    both = market.item(seller, name="Lamp café", category=6, keywords=["brass"])
    done = script("buyer", port_of(market, "buyer"), home, f"signup {unique_name()} --name M",
                  "search cafe BRASS --category toys", "search --keywords cafe --category 6",
                  MARKET_PASSWORD=PASSWORD)
    assert done.returncode == 0, done.stderr
    found = re.findall(r"^(\d+)\t", done.stdout, re.MULTILINE)
    assert found == [str(lamp), str(both)], done.stdout  # both words each; then by item_id
    assert "No items found." in done.stderr  # no item has the keyword "cafe"


def test_more_pages_through_a_long_list(market: Market, home: Path) -> None:
    seller = market.user("seller")
    for n in range(5):
        market.item(seller, name=f"Page {n}", category=7, keywords=["paging"])
    done = script("buyer", port_of(market, "buyer"), home, f"signup {unique_name()} --name M",
                  "search paging --category 7 --limit 2", "more", "more", "more",
                  MARKET_PASSWORD=PASSWORD)
    assert done.returncode == 0, done.stderr
    shown = re.findall(r"\tPage (\d)\t", done.stdout)
    assert shown == ["0", "1", "2", "3", "4"]
    assert done.stderr.count("There is more: type `more`.") == 2
    assert done.stderr.rstrip().endswith("Nothing more to show.")


def search_as_a_new_buyer(market: Market, home: Path, search: str,
                          **item: Any) -> subprocess.CompletedProcess[str]:
    """List an item, then sign up a buyer and run `search` in script mode."""
    market.item(market.user("seller"), **item)
    return script("buyer", port_of(market, "buyer"), home, f"signup {unique_name()} --name B", search,
                  MARKET_PASSWORD=PASSWORD)


def test_names_cannot_break_the_output(market: Market, home: Path) -> None:
    # The servers refuse such a name now; a database written before that may still hold one.
    item_id = market.item(market.user("seller"), name="placeholder", category=6, keywords=["odd"])
    market.db.run(lambda tx: tx.execute(text("UPDATE items SET name = :name WHERE item_id = :id"),
                                        {"name": "Tab\there\x1b[2J", "id": item_id}))
    done = script("buyer", port_of(market, "buyer"), home, f"signup {unique_name()} --name B",
                  "search odd --category 6", MARKET_PASSWORD=PASSWORD)
    assert done.returncode == 0, done.stderr
    row = done.stdout.splitlines()[-1].split("\t")
    assert len(row) == 10 and row[1] == "Tab?here?[2J" and "\x1b" not in done.stdout


def start_server(port: int, db_url: str) -> subprocess.Popen[str]:
    """A buyer server process on a fixed port, once it listens."""
    proc = subprocess.Popen([sys.executable, "-m", "buyer_server", "--port", str(port),
                             "--db-url", db_url], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and "listening on" in proc.stdout.readline()
    return proc


def stop_server(proc: subprocess.Popen[str]) -> None:
    """SIGTERM, then wait for the exit."""
    proc.terminate()
    proc.wait(timeout=20)


@dataclass
class OwnServer:
    """A buyer server process of the test's own, on a fixed port, to stop and start again."""

    port: int
    db_url: str
    proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.proc = start_server(self.port, self.db_url)

    def stop(self) -> None:
        if self.proc is not None:
            stop_server(self.proc)
            self.proc = None


@contextlib.contextmanager
def buyer_on_own_server(tmp_path: Path, home: Path) -> Iterator[tuple[OwnServer, pexpect.spawn, str]]:
    """A buyer signed up in a shell, on a server process of its own: (server, shell, prompt)."""
    server = OwnServer(free_port(), f"sqlite:///{tmp_path / 'own.db'}")
    server.start()
    try:
        buyer = spawn("buyer", server.port, home)
        name = unique_name()
        run(buyer, f"signup {name} --name B -p '{PASSWORD}'", f"{name}@buyer> ")
        yield server, buyer, f"{name}@buyer> "
    finally:
        server.stop()


def test_the_shell_reconnects_after_a_server_restart(tmp_path: Path, home: Path) -> None:
    with buyer_on_own_server(tmp_path, home) as (server, buyer, me):
        server.stop()
        server.start()
        out = run(buyer, "cart", me)  # the session lives in the database: still logged in
        assert "reconnected to the buyer server" in out and "Your cart is empty." in out
        server.stop()
        assert f"cannot reach the buyer server at 127.0.0.1:{server.port}" in run(buyer, "cart", me)
        server.start()
        out = run(buyer, "search --category 1", me)
        assert "reconnected" in out and "No items found." in out
        buyer.sendline("quit")
        buyer.expect(pexpect.EOF)


def hang_up_on_every_request(listener: socket.socket) -> None:
    """A peer that reads each request and closes the connection without answering."""
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            conn.recv(65536)


def test_a_write_cut_off_in_flight_is_reported_not_repeated(home: Path) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=hang_up_on_every_request, args=(listener,), daemon=True).start()
    try:
        port = listener.getsockname()[1]
        cut = script("buyer", port, home, "login bob", "ping", MARKET_PASSWORD=PASSWORD)
        assert cut.returncode == 1
        assert cut.stderr == "error: connection lost during login; it may or may not have been applied\n"
        read = script("buyer", port, home, "ping")  # read-only: tried twice, then reported
        assert read.returncode == 1 and "cannot reach the buyer server" in read.stderr
    finally:
        listener.close()


def _serve(tmp_path: Path, buyer_port: int, seller_port: int,
           env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([MARKET, "serve", "--db-url", f"sqlite:///{tmp_path / 'served.db'}",
                             "--buyer-port", str(buyer_port), "--seller-port", str(seller_port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


def _wait_until_both_answer(serve: subprocess.Popen[str], buyer_port: int, seller_port: int) -> None:
    deadline = time.monotonic() + 90  # a loaded machine starts them slowly
    while not (_answers(buyer_port) and _answers(seller_port)):
        if serve.poll() is not None or time.monotonic() >= deadline:
            serve.kill()
            _, err = serve.communicate(timeout=30)
            raise AssertionError(f"market serve exited {serve.returncode} before both servers answered: "
                                 f"{err[-3000:]}")
        time.sleep(0.1)


def test_serve_runs_both_servers_until_ctrl_c_then_stops_both(tmp_path: Path) -> None:
    buyer_port, seller_port = free_port(), free_port()
    serve = _serve(tmp_path, buyer_port, seller_port)
    try:
        _wait_until_both_answer(serve, buyer_port, seller_port)
        serve.send_signal(signal.SIGINT)
        _, err = serve.communicate(timeout=30)
        assert serve.returncode == 0, err[-3000:]  # what the servers said, should it fail again
    finally:
        serve.kill()
    assert not _answers(buyer_port) and not _answers(seller_port)


def test_serve_stops_the_other_server_when_one_cannot_start(tmp_path: Path) -> None:
    seller_port = free_port()
    with socket.create_server(("127.0.0.1", 0)) as taken:
        buyer_port = taken.getsockname()[1]
        serve = _serve(tmp_path, buyer_port, seller_port)
        try:
            _, err = serve.communicate(timeout=60)
        finally:
            serve.kill()
    assert serve.returncode == 2
    assert f"error: buyer server: cannot listen on 127.0.0.1:{buyer_port}: Address already in use" in err
    assert "market.serve: the buyer server stopped (exit status 2); stopping the other" in err
    assert not _answers(seller_port)


def test_serve_and_its_servers_log_json_lines_with_one_setting(tmp_path: Path) -> None:
    json_logs = {"MARKET_LOG_FORMAT": "json"}
    buyer_port, seller_port = free_port(), free_port()
    serve = _serve(tmp_path, buyer_port, seller_port, env=json_logs)
    try:  # both servers started (a server stopped while Python starts has nothing to log)
        _wait_until_both_answer(serve, buyer_port, seller_port)
        serve.send_signal(signal.SIGINT)
        _, err = serve.communicate(timeout=30)
    finally:
        serve.kill()
    logged = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert {(line["server"], line["logger"]) for line in logged} >= {("buyer", "market.runner"),
                                                                     ("seller", "market.runner")}
    with socket.create_server(("127.0.0.1", 0)) as taken:
        serve = _serve(tmp_path, taken.getsockname()[1], seller_port, env=json_logs)
        try:
            _, err = serve.communicate(timeout=60)
        finally:
            serve.kill()
    logged = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    stopped = next(line for line in logged if line["logger"] == "market.serve")
    assert stopped["server"] == "serve" and stopped["level"] == "ERROR"
    assert "the buyer server stopped" in stopped["message"]


def test_serve_fails_when_one_server_stops_cleanly_on_its_own(tmp_path: Path) -> None:
    buyer_port, seller_port = free_port(), free_port()
    serve = _serve(tmp_path, buyer_port, seller_port)
    try:
        _wait_until_both_answer(serve, buyer_port, seller_port)
        children = subprocess.run(["pgrep", "-P", str(serve.pid), "-f", "seller_server"],
                                  capture_output=True, text=True).stdout.split()
        assert len(children) == 1
        os.kill(int(children[0]), signal.SIGTERM)  # the seller server alone, which exits 0
        _, err = serve.communicate(timeout=30)
    finally:
        serve.kill()
    assert serve.returncode == 1  # before: 0, as if all had gone well
    assert "market.serve: the seller server stopped (exit status 0); stopping the other" in err
    assert not _answers(buyer_port)


def test_serve_killed_outright_takes_both_servers_with_it(tmp_path: Path) -> None:
    buyer_port, seller_port = free_port(), free_port()
    serve = _serve(tmp_path, buyer_port, seller_port)
    try:
        _wait_until_both_answer(serve, buyer_port, seller_port)
        serve.kill()  # SIGKILL, or the OOM killer: no chance to stop its servers itself
        serve.wait(timeout=10)
        deadline = time.monotonic() + 20
        while (_answers(buyer_port) or _answers(seller_port)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _answers(buyer_port) and not _answers(seller_port), "a server outlived market serve"
    finally:
        for pattern in (f"--port {buyer_port}", f"--port {seller_port}"):  # if the test failed
            subprocess.run(["pkill", "-f", "--", pattern], check=False)


def test_a_bad_port_setting_is_one_usage_error_and_spares_the_other_commands(
        tmp_path: Path, market: Market) -> None:
    env = {**os.environ, "MARKET_SELLER_PORT": "7002x"}
    serve = subprocess.run([MARKET, "serve", "--db-url", f"sqlite:///{tmp_path / 'x.db'}"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert serve.returncode == 2 and "Traceback" not in serve.stderr
    assert "'7002x' is not a port from 0 to 65535 (flag or MARKET_SELLER_PORT)" in serve.stderr
    assert build_parser().parse_args(["serve", "--buyer-port", "0"]).buyer_port == 0  # a free port, as before
    host, port = market.buyer_server.address
    health = subprocess.run([MARKET, "health", f"{host}:{port}"], env=env, capture_output=True, text=True,
                            timeout=60)
    assert health.returncode == 0, health.stderr  # it reads no port setting: unaffected


def test_the_terminal_output_prints_names_as_typed() -> None:
    # rich turns ":fire:" into an emoji unless told not to; tables (Text) never did, lines did
    from client.render import Output

    out = Output("table")
    with out.console.capture() as captured:
        out.say("Listed item 1: Lamp :fire: [b]x[/b]")
        out.error("keyword ':smile:' is given twice")
    assert captured.get() == "Listed item 1: Lamp :fire: [b]x[/b]\nerror: keyword ':smile:' is given twice\n"


def test_a_history_file_that_cannot_be_written_is_one_warning(market: Market, home: Path) -> None:
    # before: a traceback after the first command, and the session (and its cart) gone
    buyer = spawn("buyer", port_of(market, "buyer"), home, MARKET_HISTORY_FILE=str(home / "no" / "hist"))
    out = run(buyer, "ping", "buyer> ") + run(buyer, "ping", "buyer> ")
    assert out.count("warning: cannot write the history file") == 1 and "Traceback" not in out
    assert out.count("answers") == 2
    buyer.sendline("quit")
    buyer.expect(pexpect.EOF)
    buyer.close()
    assert buyer.exitstatus == 0


@pytest.mark.parametrize("stdin_encoding", ["", "utf-8:strict"])  # the C locale, and a UTF-8 one
def test_a_script_line_that_is_not_utf8_is_one_error(market: Market, home: Path, stdin_encoding: str) -> None:
    lines = f"signup {unique_name()} --name U -p '{PASSWORD}'\nsearch caf\xe9\nping\n".encode("latin-1")
    env = shell_env(home, PYTHONIOENCODING=stdin_encoding) if stdin_encoding else shell_env(home)
    done = subprocess.run([MARKET, "buyer", "--port", str(port_of(market, "buyer"))], input=lines,
                          capture_output=True, timeout=60, env=env)
    assert done.returncode == 1
    assert done.stderr.endswith(b"\nerror: cannot read the line: it is not UTF-8 text (character 11)\n")
    assert b"answers" not in done.stderr  # the script stopped there


@pytest.mark.parametrize("ca", ["/nonexistent", "not PEM"])
def test_a_tls_ca_file_that_cannot_be_used_is_one_line(home: Path, ca: str) -> None:
    if ca == "not PEM":
        (home / "ca.pem").write_text("not a certificate\n")
        ca = str(home / "ca.pem")
    done = subprocess.run([MARKET, "buyer", "-c", "ping"], capture_output=True, text=True, timeout=60,
                          env=shell_env(home, MARKET_TLS_CA=ca))
    assert done.returncode == 2
    assert done.stderr.startswith(f"error: cannot use the TLS CA file {ca}: ")
    assert len(done.stderr.splitlines()) == 1


def test_backslash_q_quits(market: Market, home: Path) -> None:
    port = port_of(market, "buyer")
    done = subprocess.run([MARKET, "buyer", "--port", str(port), "-c", r"ping; \q; ping"],
                          capture_output=True, text=True, timeout=60, env=shell_env(home))
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("answers") == 1
    buyer = spawn("buyer", port, home)
    buyer.sendline("\\q")
    buyer.expect(pexpect.EOF)
    assert "unknown command" not in str(buyer.before)


def test_names_keep_their_spaces_and_joiners_but_not_what_upsets_a_terminal() -> None:
    from client.render import printable

    for name in ("Tea\u00a0set", "東京\u3000タワー", "👩\u200d💻 kit", "ﾒﾆｭｰ\u200c", "Café"):
        assert printable(name) == name
    assert printable("a\u202eb\u2028c\u2029d\u200be\ud800f\x1bg\th\x85i") == "a?b?c?d?e?f?g?h?i"


def test_a_closed_output_pipe_ends_the_shell_quietly(market: Market, home: Path) -> None:
    # the reader goes after one line (as `| head -1` does); the commands after it do not run,
    # and the exit status is 141, as for a command killed by SIGPIPE in sh
    proc = subprocess.Popen([MARKET, "buyer", "--port", str(port_of(market, "buyer"))],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=shell_env(home))
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdin.write("help\n")
    proc.stdin.flush()
    assert proc.stdout.readline() == "usage\thelp\n"
    proc.stdout.close()
    proc.stdin.write("help\nhelp\n")
    proc.stdin.close()
    assert proc.wait(timeout=60) == 141
    assert proc.stderr.read() == ""


def test_the_card_number_asked_for_is_not_echoed_nor_kept(market: Market, home: Path) -> None:
    buyer = spawn("buyer", port_of(market, "buyer"), home)
    name = unique_name()
    run(buyer, f"signup {name} --name C -p '{PASSWORD}'", f"{name}@buyer> ")
    run(buyer, f"add {market.item(market.user('seller'))}", f"{name}@buyer> ")
    buyer.sendline("buy")
    answer(buyer, "card name: ", "C Buyer")
    answer(buyer, "card number: ", "4111111111111111")
    out = wait(buyer, "card expiry: ")
    buyer.sendline("12/39")
    out += wait(buyer, f"{name}@buyer> ")
    assert "Bought: order" in out and "4111111111111111" not in out
    buyer.sendline("quit")
    buyer.expect(pexpect.EOF)
    assert "4111111111111111" not in str(buyer.before) + (home / "history").read_text()


def test_ctrl_c_at_a_question_does_not_drop_the_connection(market: Market, home: Path) -> None:
    buyer = spawn("buyer", port_of(market, "buyer"), home)
    name = unique_name()
    run(buyer, f"signup {name} --name K -p '{PASSWORD}'", f"{name}@buyer> ")
    buyer.sendline("add")
    buyer.expect_exact("item id: ")
    keys(buyer, "\x03")
    assert "error: cancelled" in wait(buyer, f"{name}@buyer> ")
    out = run(buyer, "ping", f"{name}@buyer> ")
    assert "answers" in out and "reconnected" not in out
    buyer.sendline("quit")
    buyer.expect(pexpect.EOF)


def test_words_after_double_dash_are_never_options(market: Market, home: Path) -> None:
    done = script("seller", port_of(market, "seller"), home, f"signup {unique_name()} --name D",
                  "sell --category 1 --condition new --price 1 --qty 1 -- -Dash-", MARKET_PASSWORD=PASSWORD)
    assert done.returncode == 0, done.stderr
    assert "Listed item" in done.stderr and ": -Dash-, 1 at 1.00." in done.stderr


def test_a_stray_word_after_a_secret_command_is_not_repeated(market: Market, home: Path) -> None:
    done = script("buyer", port_of(market, "buyer"), home, "login bob hunter2hunter2 again")
    assert done.returncode == 1
    assert "hunter2hunter2" not in done.stderr and "2 unexpected word(s)" in done.stderr


def test_a_keyword_given_again_in_another_case_is_dropped(market: Market, home: Path) -> None:
    done = search_as_a_new_buyer(market, home, "search --category 5 Twice twice,TWICE", name="Twice",
                                 category=5, keywords=["twice"])
    assert done.returncode == 0, done.stderr
    assert "\tTwice\t" in done.stdout


def test_more_after_the_session_expired_asks_to_log_in_again(tmp_path: Path, home: Path) -> None:
    with market_with_short_sessions(tmp_path) as short:
        seller = short.user("seller")
        for n in range(2):
            short.item(seller, name=f"Paged {n}", category=3, keywords=["paged"])
        buyer = spawn("buyer", short.buyer_server.address[1], home)
        name = unique_name()
        out = run(buyer, f"signup {name} --name X -p '{PASSWORD}'; search paged --limit 1", f"{name}@buyer> ")
        assert "There is more" in out
        time.sleep(2.5)  # past the idle timeout of 1 s
        out = run(buyer, "more", "buyer> ")  # before: still `{name}@buyer> `
        assert "session has expired" in out and f"log in again: login {name}" in out
        assert "you are not logged in" in run(buyer, "cart", "buyer> ")  # logged out here too
        buyer.sendline("quit")
        buyer.expect(pexpect.EOF)


@contextlib.contextmanager
def frozen(server: subprocess.Popen[str]) -> Iterator[None]:
    """The server stopped by SIGSTOP: it holds its connections and answers nothing. kill()
    returns before the process stops (one thread takes the signal and then stops the others),
    so this waits until /proc shows every thread stopped: before, under load, a request sent
    at once was now and then still answered."""
    server.send_signal(signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 10
        while not all_threads_stopped(server.pid):
            assert time.monotonic() < deadline, "SIGSTOP did not stop the server within 10 s"
            time.sleep(0.01)
        yield
    finally:
        server.send_signal(signal.SIGCONT)


def all_threads_stopped(pid: int) -> bool:
    """Every thread of the process in state T (stopped by a signal), as /proc says."""
    states = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that has just ended
            states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
    return bool(states) and all(state == "T" for state in states)


def test_ctrl_c_while_a_write_waits_says_it_may_have_been_done(tmp_path: Path, home: Path) -> None:
    # before: "error: cancelled", though the purchase (here a save) had reached the server and
    # was done there; and the next command said "(reconnected ...)" to a server never gone
    with buyer_on_own_server(tmp_path, home) as (server, buyer, me):
        assert server.proc is not None
        with frozen(server.proc):
            buyer.sendline("save")
            time.sleep(0.5)
            buyer.sendintr()
            out = wait(buyer, me)
        assert "interrupted during save_cart; it may or may not have been applied" in out
        assert "cancelled" not in out
        out = run(buyer, "ping", me)
        assert "answers" in out and "reconnected" not in out
        with frozen(server.proc):  # quitting waits for the logout's answer: Ctrl-C leaves at once
            buyer.sendline("quit")
            time.sleep(0.5)
            buyer.sendintr()
            buyer.expect(pexpect.EOF)
        assert "Traceback" not in str(buyer.before)


def test_a_read_that_times_out_is_not_sent_again(tmp_path: Path) -> None:
    # before: a server that accepted but did not answer held `market buyer -c ping` for two
    # minutes: the 30 s timeout, then three more tries of it
    from wire import Connection

    port, db_url = free_port(), f"sqlite:///{tmp_path / 'slow.db'}"
    server = start_server(port, db_url)
    try:
        conn = Connection("127.0.0.1", port, timeout=0.5)
        conn.call("ping")
        with frozen(server):
            with pytest.raises(TimeoutError):
                conn.call("ping")
        assert conn.resends == 0
    finally:
        stop_server(server)


def test_a_failed_login_leaves_the_session_on_hand(market: Market, home: Path) -> None:
    # before: the shell ended the session (and its unsaved cart) before asking, so a mistyped
    # password logged the user out
    buyer = spawn("buyer", port_of(market, "buyer"), home)
    name = unique_name()
    me = f"{name}@buyer> "
    run(buyer, f"signup {name} --name L -p '{PASSWORD}'", me)
    item_id = market.item(market.user("seller"))
    run(buyer, f"add {item_id} 1", me)
    out = run(buyer, f"login {name} -p 'not the password'", me)
    assert "error: wrong username or password" in out and "expired" not in out
    out = run(buyer, "cart", me)
    assert "Lamp" in out  # the unsaved cart is still there
    buyer.sendline("quit")
    answer(buyer, "Save your cart? [Y/n] ", "n")
    buyer.expect(pexpect.EOF)


def test_a_logout_the_server_did_not_hear_keeps_the_session(tmp_path: Path, home: Path) -> None:
    with buyer_on_own_server(tmp_path, home) as (server, buyer, me):
        name = me.split("@")[0]
        server.stop()
        out = run(buyer, "logout", me)  # before: the prompt said logged out; the server had not heard
        assert f"Still logged in as {name}" in out and "cannot reach the buyer server" in out
        server.start()
        out = run(buyer, "logout", "buyer> ")
        assert f"Logged out {name}." in out
        buyer.sendline("quit")
        buyer.expect(pexpect.EOF)


def test_a_shell_pointed_at_the_other_server_says_so(market: Market, home: Path) -> None:
    # before: it greeted "Connected to the seller server" and then let a seller log in to a
    # buyer shell whose every command was UNKNOWN_OP
    child = pexpect.spawn(MARKET, ["buyer", "--port", str(port_of(market, "seller"))],
                          env=shell_env(home), encoding="utf-8", dimensions=(50, 200),
                          timeout=PROMPT_TIMEOUT)
    child.expect_exact("buyer> ")
    assert "this is the seller server, not the buyer server" in str(child.before)
    child.sendline("quit")
    child.expect(pexpect.EOF)


def test_ctrl_c_in_script_mode_stops_without_a_traceback(market: Market, home: Path) -> None:
    proc = subprocess.Popen([MARKET, "buyer", "--port", str(port_of(market, "buyer"))],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=shell_env(home))
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("help\n")
    proc.stdin.flush()
    assert proc.stdout.readline() == "usage\thelp\n"
    proc.send_signal(signal.SIGINT)  # while it waits for the next line
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "Traceback" not in err, err


def test_item_tables_never_cut_a_number_short() -> None:
    # before: at 80 columns a price of 1000000.00 showed as "100000…"
    from rich.console import Console

    from client.render import Output, items_table

    item = {"item_id": 5, "name": "日本 a rather long name", "category": 5, "keywords": ["本", "日本"],
            "condition": "used", "price": "1000000.00", "quantity": 1000000, "thumbs_up": 12,
            "thumbs_down": 3, "seller_id": 123456}
    output = Output("table")
    output.console = Console(width=80, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    output.table(items_table([item]))
    shown = output.console.export_text()
    assert all(number in shown for number in ("1000000.00", "1000000", "123456")), shown


def test_help_knows_the_backslash_alias_it_lists(market: Market, home: Path) -> None:
    # before: `help quit` listed `\q`, and `help \q` answered "unknown command 'q'"
    done = script("buyer", port_of(market, "buyer"), home, "help \\q")
    assert done.returncode == 0, done.stderr
    assert "quit" in done.stderr and "unknown command" not in done.stderr


def test_a_number_past_pythons_digits_is_refused_in_a_short_line(market: Market, home: Path) -> None:
    # before: "error: item id: '999...' is not a whole number", all 5,000 digits of it
    done = script("buyer", port_of(market, "buyer"), home, f"signup {unique_name()} --name N",
                  "item " + "9" * 5000, MARKET_PASSWORD=PASSWORD)
    problem = done.stderr.splitlines()[-1]
    assert done.returncode == 1 and "far too large" in problem and len(problem) < 200, done.stderr


def test_script_errors_speak_plainly_without_protocol_codes(market: Market, home: Path) -> None:
    # before: "password: must be 8 to 128 characters", 'must be a decimal string like "12.50"',
    # 'must be "MM/YY"', and a seller account in the buyer shell only "wrong username or password"
    seller = unique_name("plain")
    signed = script("seller", port_of(market, "seller"), home, f"signup {seller} --name P",
                    MARKET_PASSWORD=PASSWORD)
    assert signed.returncode == 0, signed.stderr
    cases = [
        ("buyer", f"login {seller}", {"MARKET_PASSWORD": "wrong"},
         "error: password (from MARKET_PASSWORD): wrong password: every password has 8 to 128 "
         "characters, not 5"),
        ("buyer", f"login {seller}", {"MARKET_PASSWORD": PASSWORD},
         "buyer and seller accounts are apart: a seller account logs in with `market seller`"),
        ("seller", f"login {seller}; sell Mug --category 1 --condition new --price -3 --qty 1",
         {"MARKET_PASSWORD": PASSWORD},
         "price: -3 is not a price: a price is from 0.01 to 1000000.00, like 12.50"),
        ("buyer", f"signup {unique_name()} --name A; buy --card-name A --card-number 4111111111111111 "
                  "--expiry 13/27", {"MARKET_PASSWORD": PASSWORD},
         "card expiry: 13 is not a month (01 to 12): write the date MM/YY, like 08/29"),
    ]
    for role, line, env, said in cases:
        done = script(role, port_of(market, role), home, line, **env)
        assert done.returncode == 1 and said in done.stderr, done.stderr
        assert not re.search(r"BAD_REQUEST|UNAUTHENTICATED|CONFLICT|FORBIDDEN", done.stderr), done.stderr


def test_a_password_of_the_wrong_length_is_refused_before_any_request(home: Path) -> None:
    # nothing listens on the port: the refusal came before any connection was tried
    done = script("buyer", free_port(), home, "login bob", MARKET_PASSWORD="short")
    assert done.returncode == 1 and "wrong password" in done.stderr and "cannot reach" not in done.stderr


def test_a_short_password_is_refused_before_it_is_asked_again(market: Market, home: Path) -> None:
    buyer = spawn("buyer", port_of(market, "buyer"), home)
    name = unique_name()
    buyer.sendline(f"signup {name} --name S")
    answer(buyer, "password: ", "short")
    assert "a password has 8 to 128 characters, not 5; try again" in wait(buyer, "Ctrl-C cancels)")
    answer(buyer, "password: ", PASSWORD)  # the first question again; before: "password again: "
    answer(buyer, "password again: ", PASSWORD)
    assert f"Logged in as {name}" in wait(buyer, f"{name}@buyer> ")
    buyer.sendline("quit")
    buyer.expect(pexpect.EOF)


def test_a_wrong_flag_value_is_asked_for_again_in_a_terminal(market: Market, home: Path) -> None:
    # before: the whole command was lost to a name of 40 characters
    seller = spawn("seller", port_of(market, "seller"), home)
    name = unique_name()
    me = f"{name}@seller> "
    run(seller, f"signup {name} --name S -p '{PASSWORD}'", me)
    seller.sendline(f"sell {'A' * 40} --category Home --condition new --price 3 --qty 1")
    assert "name: must be 1 to 32 characters; try again" in wait(seller, "Ctrl-C cancels)")
    answer(seller, "name: ", "Desk lamp")
    assert "Listed item" in wait(seller, me) and "Desk lamp, 1 at 3.00" in str(seller.before)
    seller.sendline("quit")
    seller.expect(pexpect.EOF)


def test_a_total_changed_before_buy_is_asked_about_again(market: Market, home: Path) -> None:
    seller = market.user("seller")
    lamp = market.item(seller, quantity=3)
    buyer = spawn("buyer", port_of(market, "buyer"), home)
    name = unique_name()
    me = f"{name}@buyer> "
    run(buyer, f"signup {name} --name T -p '{PASSWORD}'; add {lamp} 2", me)
    buyer.sendline(f"buy --card-name T --card-number {CARD['card_number']}")
    assert "total 25.00" in wait(buyer, "card expiry: ")  # shown before anything is asked
    seller.call("change_price", {"item_id": lamp, "price": "20.00"})
    buyer.sendline(CARD["card_expiry"])
    out = wait(buyer, "Buy for 40.00? [Y/n] ")
    assert "The total changed: 40.00, not 25.00." in out
    buyer.sendline("y")
    assert "Bought: order" in wait(buyer, me) and "total 40.00" in str(buyer.before)
    buyer.sendline("quit")
    buyer.expect(pexpect.EOF)


def test_a_login_keeps_its_device_token_for_the_next(market: Market, home: Path) -> None:
    name = unique_name("device")
    for line in (f"signup {name} --name D", f"login {name}", f"login {name}"):
        done = script("buyer", port_of(market, "buyer"), home, line, MARKET_PASSWORD=PASSWORD)
        assert done.returncode == 0, done.stderr  # a token sent back is accepted
    from wire import BUYER_OPS

    if "device_token" not in BUYER_OPS["login"].optional:
        assert not (home / ".market_devices").exists()  # a 1.1 server gives none, and is sent none
        return
    kept = json.loads((home / ".market_devices").read_text())
    assert list(kept) == [f"buyer 127.0.0.1:{port_of(market, 'buyer')} {name}"]
    assert (home / ".market_devices").stat().st_mode & 0o777 == 0o600
