"""`market admin`: suspend and reinstate, end sessions, clear a login throttle, take an item off
sale, show a user or an item, and the log of every action, on SQLite and MariaDB, against
servers running on the same database."""
from __future__ import annotations

import contextlib
import getpass
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert, select, text
from support import CARD, PASSWORD, Market, running_market, unique_name

from client.main import main
from db import Database
from db.migrations import head, make_current, revision_of
from db.schema import admin_actions, sessions, suspensions, users
from operate.audit import audit
from runtime.config import Settings
from wire import Connection
from wire.errors import ConflictError, ForbiddenError, ProtocolError, UnauthenticatedError

MARKET = str(Path(sys.executable).with_name("market"))
Capsys = pytest.CaptureFixture[str]


def admin(capsys: Capsys, db_url: str, *argv: str) -> tuple[int, str, str]:
    """`market admin --db-url URL --format json ARGV` in this process: status, stdout, stderr."""
    capsys.readouterr()
    status = main(["admin", "--db-url", db_url, "--format", "json", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def shown(out: str) -> dict[str, str]:
    """The fields of a show-user or show-item table printed as JSON."""
    return {row["field"]: row["value"] for row in json.loads(out)["rows"]}


def login(market: Market, role: str, username: str, password: str = PASSWORD) -> Connection:
    conn = market.connect(role)
    conn.token = conn.call("login", {"username": username, "password": password})["token"]
    return conn


def test_a_suspended_buyer_is_logged_out_everywhere_and_refused_with_a_clear_message(
        market: Market, capsys: Capsys) -> None:
    buyer = market.user("buyer")
    with running_market(market.db) as other:  # a second buyer server on the same database
        elsewhere = login(other, "buyer", buyer.username)
        elsewhere.call("display_cart")
        status, out, err = admin(capsys, market.db.url, "suspend", "buyer", buyer.username,
                                 "--reason", "fraud")
        assert status == 0, err
        assert f"suspended buyer {buyer.username} (user {buyer.user_id}); ended 2 sessions" in err
        for conn in (buyer, elsewhere):
            with pytest.raises(UnauthenticatedError):
                conn.call("display_cart")
    with pytest.raises(ForbiddenError, match="this account is suspended"):
        login(market, "buyer", buyer.username)
    with pytest.raises(UnauthenticatedError, match="wrong username or password"):
        login(market, "buyer", buyer.username, "a wrong password")  # tells a guesser nothing
    assert admin(capsys, market.db.url, "reinstate", "buyer", buyer.username)[0] == 0
    login(market, "buyer", buyer.username).call("display_cart")


def test_suspending_twice_or_reinstating_an_active_account_is_refused_in_one_line(
        market: Market, capsys: Capsys) -> None:
    seller = market.user("seller")
    assert admin(capsys, market.db.url, "suspend", "seller", seller.username)[0] == 0
    status, out, err = admin(capsys, market.db.url, "suspend", "seller", seller.username)
    assert (status, out) == (1, "")
    assert err == f"market admin: seller {seller.username} (user {seller.user_id}) is suspended already\n"
    assert admin(capsys, market.db.url, "reinstate", "seller", seller.username)[0] == 0
    status, _, err = admin(capsys, market.db.url, "reinstate", "seller", seller.username)
    assert status == 1 and err.endswith("is not suspended\n")


def test_a_suspended_sellers_items_stay_on_sale_unless_taken_off_with_it(market: Market, capsys: Capsys
                                                                          ) -> None:
    first, second, buyer = market.user("seller"), market.user("seller"), market.user("buyer")
    kept = market.item(first, keywords=["lamp"])
    gone = [market.item(second, keywords=["lamp"]), market.item(second, keywords=["lamp"], quantity=1)]
    buyer.call("add_to_cart", {"item_id": gone[1], "quantity": 1})
    buyer.call("make_purchase", CARD)  # sold out already: not counted again
    assert admin(capsys, market.db.url, "suspend", "seller", first.username)[0] == 0
    status, _, err = admin(capsys, market.db.url, "suspend", "seller", second.username, "--off-sale")
    assert status == 0 and err.endswith("ended 1 session; took 1 item off sale\n")
    found = buyer.call("search_items", {"keywords": ["lamp"]})["items"]
    assert [item["item_id"] for item in found] == [kept]
    assert admin(capsys, market.db.url, "reinstate", "seller", second.username)[0] == 0
    assert [item["item_id"] for item in buyer.call("search_items", {"keywords": ["lamp"]})["items"]] == [kept]
    assert audit(market.db) == []


def test_a_bad_name_or_id_exits_1_with_one_line(market: Market, capsys: Capsys) -> None:
    buyer = market.user("buyer")
    for argv, message in ((("suspend", "seller", buyer.username), f"no seller named {buyer.username!r}"),
                          (("show-user", "buyer", "nobody-here"), "no buyer named 'nobody-here'"),
                          (("take-off-sale", "999999"), "no item 999999"),
                          (("show-item", "999999"), "no item 999999")):
        status, out, err = admin(capsys, market.db.url, *argv)
        assert (status, out, err) == (1, "", f"market admin: {message}\n")
    assert admin(capsys, market.db.url, "log")[1] == json.dumps(
        {"table": "operator's actions, newest first", "rows": []}) + "\n"  # nothing happened


def test_logins_racing_a_suspension_leave_no_live_session(market: Market, capsys: Capsys
                                                          ) -> None:
    buyer = market.user("buyer")
    tokens: list[str] = []
    refused: list[str] = []
    stop = threading.Event()

    def keep_logging_in() -> None:
        with Connection(*market.buyer_server.address, timeout=30) as conn:
            while not stop.is_set():
                try:
                    answer = conn.call("login", {"username": buyer.username, "password": PASSWORD})
                    tokens.append(answer["token"])
                except ForbiddenError:
                    refused.append("suspended")
                    return
                except ProtocolError:  # BUSY hashing queue, or told to wait a moment: try again
                    continue

    threads = [threading.Thread(target=keep_logging_in) for _ in range(6)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while len(tokens) < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        assert admin(capsys, market.db.url, "suspend", "buyer", buyer.username)[0] == 0
    finally:
        for thread in threads:
            thread.join(timeout=20)
        stop.set()
    assert len(refused) == 6  # every thread went on until its login was refused
    with Connection(*market.buyer_server.address, timeout=30) as conn:
        for token in tokens:
            with pytest.raises(UnauthenticatedError):
                conn.call("display_cart", token=token)
    assert market.db.run(lambda tx: tx.execute(select(sessions.c.session_id)
                                               .where(sessions.c.user_id == buyer.user_id)).all()) == []


def test_ending_a_users_sessions_keeps_the_saved_cart(market: Market, capsys: Capsys) -> None:
    seller, buyer = market.user("seller"), market.user("buyer")
    lamp = market.item(seller)
    buyer.call("add_to_cart", {"item_id": lamp, "quantity": 2})
    buyer.call("save_cart")
    second = login(market, "buyer", buyer.username)
    status, _, err = admin(capsys, market.db.url, "end-sessions", "buyer", buyer.username)
    assert status == 0 and f"ended 2 sessions of buyer {buyer.username}" in err
    for conn in (buyer, second):
        with pytest.raises(UnauthenticatedError):
            conn.call("display_cart")
    cart = login(market, "buyer", buyer.username).call("display_cart")["cart"]
    assert [(line["item_id"], line["quantity"]) for line in cart["items"]] == [(lamp, 2)]


def test_clearing_a_throttle_lets_the_right_password_in_at_once(
        database: Database, capsys: Capsys) -> None:
    settings = Settings(role="buyer", login_free_failures=1000, login_account_free_failures=2)
    with running_market(database, settings) as market:
        buyer = market.user("buyer")
        for _ in range(2):
            with pytest.raises(UnauthenticatedError, match="wrong username or password"):
                login(market, "buyer", buyer.username, "a wrong password")
        with pytest.raises(UnauthenticatedError, match="too many login attempts"):
            login(market, "buyer", buyer.username)
        status, _, err = admin(capsys, database.url, "clear-throttle", "buyer", buyer.username)
        assert status == 0 and f"forgot 2 failed logins of buyer {buyer.username}" in err
        login(market, "buyer", buyer.username).call("display_cart")
        status, _, err = admin(capsys, database.url, "clear-throttle", "buyer", buyer.username)
        assert status == 0 and "no failed logins were counted" in err


def test_an_item_taken_off_sale_leaves_search_and_the_books_balance(
        market: Market, capsys: Capsys) -> None:
    seller, buyer = market.user("seller"), market.user("buyer")
    lamp = market.item(seller, keywords=["lamp"], quantity=5)
    buyer.call("add_to_cart", {"item_id": lamp, "quantity": 2})
    buyer.call("make_purchase", CARD)
    buyer.call("add_to_cart", {"item_id": lamp, "quantity": 1})
    status, _, err = admin(capsys, market.db.url, "take-off-sale", str(lamp), "--reason", "counterfeit")
    assert status == 0 and f"took item {lamp} (Lamp) off sale: 3 units removed" in err
    assert buyer.call("search_items", {"keywords": ["lamp"]})["items"] == []
    assert buyer.call("get_item", {"item_id": lamp})["quantity"] == 0
    with pytest.raises(ConflictError):
        buyer.call("make_purchase", CARD)
    assert audit(market.db) == []
    status, _, err = admin(capsys, market.db.url, "take-off-sale", str(lamp))
    assert (status, err) == (1, f"market admin: item {lamp} is not on sale (quantity 0)\n")
    status, out, _ = admin(capsys, market.db.url, "show-item", str(lamp))
    fields = shown(out)
    assert (fields["on sale"], fields["listed"], fields["sold"], fields["removed"], fields["in carts"]) == (
        "0", "5", "2", "3", "1")
    assert fields["seller"] == f"{seller.username} (user {seller.user_id})"
    assert (fields["price"], fields["category"], fields["keywords"]) == ("12.50", "2 Home", "lamp")


def test_show_user_gives_the_state_and_counters(market: Market, capsys: Capsys) -> None:
    seller, buyer = market.user("seller"), market.user("buyer")
    lamp = market.item(seller, quantity=3)
    buyer.call("add_to_cart", {"item_id": lamp, "quantity": 3})
    buyer.call("make_purchase", CARD)
    buyer.call("provide_feedback", {"item_id": lamp, "vote": "up"})
    market.item(seller)
    admin(capsys, market.db.url, "suspend", "seller", seller.username, "--reason", "late shipping")
    fields = shown(admin(capsys, market.db.url, "show-user", "seller", seller.username)[1])
    assert (fields["state"], fields["suspension reason"], fields["sessions"]) == (
        "suspended", "late shipping", "0")
    assert (fields["items"], fields["items on sale"], fields["items sold"], fields["thumbs up"]) == (
        "2", "1", "3", "1")
    fields = shown(admin(capsys, market.db.url, "show-user", "buyer", buyer.username)[1])
    assert (fields["state"], fields["suspended"], fields["sessions"]) == ("active", "-", "1")
    assert (fields["orders"], fields["units bought"]) == ("1", "3")


def test_the_log_says_who_did_what_from_where_and_why(market: Market, capsys: Capsys) -> None:
    buyer, seller = market.user("buyer"), market.user("seller")
    lamp = market.item(seller)
    admin(capsys, market.db.url, "suspend", "buyer", buyer.username, "--reason", "chargebacks")
    admin(capsys, market.db.url, "reinstate", "buyer", buyer.username)
    admin(capsys, market.db.url, "take-off-sale", str(lamp))
    admin(capsys, market.db.url, "take-off-sale", str(lamp))  # refused: not logged
    admin(capsys, market.db.url, "show-user", "buyer", buyer.username)  # a look: not logged
    rows = json.loads(admin(capsys, market.db.url, "log")[1])["rows"]
    who = f"{getpass.getuser()}@{socket.gethostname()}"
    assert [(r["who"], r["action"], r["target"], r["reason"]) for r in rows] == [
        (who, "take-off-sale", f"item {lamp}", "-"),
        (who, "reinstate", f"buyer {buyer.username} (user {buyer.user_id})", "-"),
        (who, "suspend", f"buyer {buyer.username} (user {buyer.user_id})", "chargebacks")]
    assert rows[2]["outcome"].endswith("ended 1 session") and rows[0]["when"].endswith("Z")
    assert len(json.loads(admin(capsys, market.db.url, "log", "--limit", "1")[1])["rows"]) == 1


def test_a_database_of_version_3_upgrades_cleanly(database: Database, capsys: Capsys) -> None:
    def as_version_3(conn: Any) -> None:
        for table in (admin_actions, suspensions):
            table.drop(conn)
        conn.execute(text("UPDATE alembic_version SET version_num = '0005_item_words'"))

    database.run(lambda tx: tx.execute(insert(users).values(
        role="buyer", username="old-buyer", name="Old", password_hash="x", created_ms=0)))
    with database.engine.begin() as conn:
        as_version_3(conn)
    status, _, err = admin(capsys, database.url, "show-user", "buyer", "old-buyer")
    assert (status, err) == (2, "market admin: the database is at revision 0005_item_words, this code's "
                                f"is {head()}: run `market db upgrade --db-url URL` first\n")
    make_current(database)
    assert revision_of(database).is_head
    assert admin(capsys, database.url, "suspend", "buyer", "old-buyer")[0] == 0
    assert shown(admin(capsys, database.url, "show-user", "buyer", "old-buyer")[1])["state"] == "suspended"
    assert audit(database) == []


@contextlib.contextmanager
def buyer_server_processes(db_url: str, count: int) -> Iterator[list[tuple[str, int]]]:
    """`count` real buyer server processes on the database; their addresses."""
    command = [sys.executable, "-m", "buyer_server", "--port", "0", "--db-url", db_url, "--threads", "2"]
    procs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
             for _ in range(count)]
    try:
        lines = [proc.stdout.readline().split() for proc in procs if proc.stdout]
        host_ports = [line[-1].rpartition(":") for line in lines]
        yield [(host, int(port)) for host, _, port in host_ports]
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)


@pytest.mark.slow
def test_a_suspension_ends_a_session_on_every_server_process(market: Market) -> None:
    name = unique_name("buyer")
    market.user("buyer", name)
    with buyer_server_processes(market.db.url, 2) as addresses:
        first, second = (Connection(*address, timeout=10) for address in addresses)
        token = first.call("login", {"username": name, "password": PASSWORD})["token"]
        for conn in (first, second):
            conn.call("display_cart", token=token)
        result = subprocess.run([MARKET, "admin", "--db-url", market.db.url, "suspend", "buyer", name],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        for conn in (second, first):
            with pytest.raises(UnauthenticatedError):
                conn.call("display_cart", token=token)
        with pytest.raises(ForbiddenError, match="this account is suspended"):
            second.call("login", {"username": name, "password": PASSWORD})
        first.close()
        second.close()


def test_market_admin_runs_as_the_installed_program(market: Market) -> None:
    name = unique_name("buyer")
    market.user("buyer", name)
    result = subprocess.run([MARKET, "admin", "--db-url", market.db.url, "show-user", "buyer", name],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert f"username\t{name}" in result.stdout.splitlines()  # tab-separated when not a terminal
    result = subprocess.run([MARKET, "admin", "--db-url", market.db.url, "show-user", "buyer", "x" + name],
                            capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == f"market admin: no buyer named 'x{name}'\n"
    result = subprocess.run([MARKET, "admin", "--db-url", market.db.url, "suspend", "buyer", name,
                             "--reason", "fraud report 7"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "MARKET_LOG_FORMAT": "json"})
    assert result.returncode == 0, result.stderr
    logged = [json.loads(line) for line in result.stderr.splitlines()]
    assert [(line["logger"], line["level"], line["action"], line["target"], line["reason"]) for line in logged
            ] == [("market.business", "INFO", "suspend", f"buyer {name} False", "fraud report 7")]


def test_purging_test_data_gives_back_what_the_load_tools_took_and_the_books_balance(
        market: Market, capsys: Capsys) -> None:
    real_seller, real_buyer = market.user("seller"), market.user("buyer")
    lamp = market.item(real_seller, keywords=["lamp"], quantity=5)
    desk = market.item(real_seller, keywords=["desk", "oak"], quantity=2)
    kept_seller = market.user("seller", unique_name("loadtest-"))
    gone_seller = market.user("seller", unique_name("loadtest-"))
    bought_by_both, never_bought = market.item(kept_seller, keywords=["x"]), market.item(kept_seller)
    market.item(gone_seller)
    load_buyer = market.user("buyer", unique_name("loadtest-"))
    for item_id, quantity in ((lamp, 2), (desk, 2), (bought_by_both, 1)):
        load_buyer.call("add_to_cart", {"item_id": item_id, "quantity": quantity})
    load_buyer.call("make_purchase", CARD)
    load_buyer.call("provide_feedback", {"item_id": lamp, "vote": "up"})
    load_buyer.call("add_to_cart", {"item_id": never_bought, "quantity": 1})
    real_buyer.call("add_to_cart", {"item_id": bought_by_both, "quantity": 1})
    real_buyer.call("make_purchase", CARD)
    real_buyer.call("provide_feedback", {"item_id": bought_by_both, "vote": "down"})
    real_buyer.call("add_to_cart", {"item_id": never_bought, "quantity": 1})
    real_buyer.call("save_cart")

    said = ("1 test buyer, 1 order, 1 test seller, 2 items; kept 1 test seller whose items real buyers "
            f"bought ({kept_seller.username})")
    status, _, err = admin(capsys, market.db.url, "purge-test-data")
    assert (status, err) == (0, f"would remove {said} (accounts named loadtest-...); run again with --yes "
                                "to do it\n")
    assert audit(market.db) == [] and load_buyer.call("display_cart")  # nothing changed yet
    status, _, err = admin(capsys, market.db.url, "purge-test-data", "--yes", "--reason", "after a test")
    assert status == 0, err
    assert err == f"removed {said}\n"
    assert audit(market.db) == []
    assert real_buyer.call("get_item", {"item_id": lamp})["quantity"] == 5
    assert [i["item_id"] for i in real_buyer.call("search_items", {"keywords": ["oak"]})["items"]] == [desk]
    rating = real_buyer.call("get_seller_rating", {"seller_id": real_seller.user_id})
    assert (rating["items_sold"], rating["thumbs_up"]) == (0, 0)
    history = real_buyer.call("get_purchase_history")["purchases"]
    assert [(p["item_id"], p["feedback"]) for p in history] == [(bought_by_both, "down")]
    assert real_buyer.call("get_item", {"item_id": bought_by_both})["quantity"] == 0
    assert real_buyer.call("display_cart")["cart"]["items"] == []  # the purged item left the cart
    with pytest.raises(UnauthenticatedError):
        login(market, "buyer", load_buyer.username)
    with pytest.raises(UnauthenticatedError):
        login(market, "seller", gone_seller.username)
    rows = json.loads(admin(capsys, market.db.url, "log")[1])["rows"]
    assert [(r["action"], r["reason"]) for r in rows] == [("purge-test-data", "after a test")]
    status, _, err = admin(capsys, market.db.url, "purge-test-data", "--yes")  # again: nothing more
    assert (status, err) == (0, f"removed nothing; kept 1 test seller whose items real buyers bought "
                                f"({kept_seller.username})\n")
    assert audit(market.db) == []


def test_logins_racing_a_purge_are_refused_as_wrong_and_leave_nothing_behind(market: Market, capsys: Capsys
                                                                             ) -> None:
    buyer = market.user("buyer", unique_name("loadtest-"))
    answers: list[str] = []

    def keep_logging_in() -> None:
        with Connection(*market.buyer_server.address, timeout=30) as conn:
            give_up = time.monotonic() + 20
            while time.monotonic() < give_up:
                try:
                    conn.call("login", {"username": buyer.username, "password": PASSWORD})
                    answers.append("ok")
                except ProtocolError as exc:
                    answers.append(f"{exc.code}: {exc.message}")
                    if exc.message == "wrong username or password":
                        return
                    time.sleep(0.005)  # BUSY: the hashing queue is full

    threads = [threading.Thread(target=keep_logging_in) for _ in range(6)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while answers.count("ok") < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        status, _, err = admin(capsys, market.db.url, "purge-test-data", "--yes")
        assert (status, err) == (0, "removed 1 test buyer\n")
    finally:
        for thread in threads:
            thread.join(timeout=30)
    assert [a for a in answers if a.startswith("INTERNAL")] == []
    assert answers.count("UNAUTHENTICATED: wrong username or password") == 6
    assert market.db.run(lambda tx: tx.execute(select(sessions.c.session_id)).all()) == []
    assert audit(market.db) == []
