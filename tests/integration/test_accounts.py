"""Accounts and sessions over TCP, on SQLite and MariaDB."""
from __future__ import annotations

import sqlite3
import threading
import time
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import select
from support import CARD, PASSWORD, Market, race, running_market, unique_name

from db import Database, accounts
from db.accounts import token_hash
from db.engine import SqliteLimits
from db.migrations import make_current
from db.schema import (
    cart_lines,
    device_tokens,
    feedback,
    item_keyword_pairs,
    item_keywords,
    items,
    login_failures,
    orders,
    saved_cart_lines,
    sessions,
    users,
)
from runtime.config import Settings
from wire import Connection
from wire.errors import BadRequestError, ConflictError, NotFoundError, UnauthenticatedError


def test_ping_names_the_server(market: Market) -> None:
    assert market.connect("buyer").call("ping")["server"] == "buyer"
    assert market.connect("seller").call("ping")["server"] == "seller"


def test_create_account_then_login_and_logout(market: Market) -> None:
    conn = market.connect("buyer")
    name = unique_name()
    user_id = conn.call("create_account", {"username": name, "password": PASSWORD, "name": "Zoë"})["user_id"]
    login = conn.call("login", {"username": name, "password": PASSWORD})
    assert login["user_id"] == user_id and login["idle_timeout_s"] == 300
    assert len(login["token"]) >= 22
    assert conn.call("display_cart", token=login["token"])["cart"] == {"items": [], "total": "0.00"}
    assert conn.call("logout", token=login["token"]) == {}
    with pytest.raises(UnauthenticatedError):
        conn.call("display_cart", token=login["token"])


def test_a_login_outside_the_value_rules_names_the_field(market: Market) -> None:
    conn = market.connect("buyer")
    for args, field in (({"username": "ab", "password": PASSWORD}, "username"),
                        ({"username": unique_name(), "password": "short"}, "password")):
        with pytest.raises(BadRequestError, match=f"^{field}: "):
            conn.call("login", args)


def test_a_taken_username_is_a_conflict_but_case_matters(market: Market) -> None:
    conn = market.connect("seller")
    name = unique_name("Case")
    conn.call("create_account", {"username": name, "password": PASSWORD, "name": "a"})
    with pytest.raises(ConflictError, match="taken"):
        conn.call("create_account", {"username": name, "password": PASSWORD, "name": "b"})
    other = conn.call("create_account", {"username": name.lower(), "password": PASSWORD, "name": "c"})
    assert other["user_id"] > 0
    with pytest.raises(UnauthenticatedError):
        conn.call("login", {"username": name.upper(), "password": PASSWORD})


def test_wrong_username_and_wrong_password_say_the_same(market: Market) -> None:
    conn = market.connect("buyer")
    name = unique_name()
    conn.call("create_account", {"username": name, "password": PASSWORD, "name": "n"})
    messages = []
    for username, password in ((name, "wrong password"), (unique_name(), PASSWORD)):
        with pytest.raises(UnauthenticatedError) as caught:
            conn.call("login", {"username": username, "password": password})
        messages.append(caught.value.message)
    assert messages[0] == messages[1]


def test_buyer_and_seller_accounts_are_separate(market: Market) -> None:
    seller = market.user("seller")
    buyer_conn = market.connect("buyer")
    with pytest.raises(UnauthenticatedError):
        buyer_conn.call("display_cart", token=seller.token)


def test_account_values_are_checked(market: Market) -> None:
    conn = market.connect("buyer")
    cases = [({"username": "ab", "password": PASSWORD, "name": "n"}, "username"),
             ({"username": unique_name(), "password": "short", "name": "n"}, "password"),
             ({"username": unique_name(), "password": PASSWORD, "name": ""}, "name"),
             ({"username": unique_name(), "password": PASSWORD}, "name")]
    for args, field in cases:
        with pytest.raises(BadRequestError, match=f"^{field}: "):
            conn.call("create_account", args)


def test_unicode_names_come_back_exactly(market: Market) -> None:
    seller = market.user("seller")
    name = "Ünïcødé 😀 שלום"
    item_id = market.item(seller, name=name, keywords=["café", "😀"])
    item = market.user("buyer").call("get_item", {"item_id": item_id})
    assert item["name"] == name and item["keywords"] == ["café", "😀"]


def test_only_the_hash_of_a_token_is_stored(market: Market, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MARKET_TEST_FAST_HASHES", "0")  # the hashes a server makes in production
    buyer = market.user("buyer")
    stored = market.db.run(lambda tx: tx.execute(select(sessions.c.token_hash)).scalars().all())
    assert buyer.token not in stored and token_hash(buyer.token) in stored
    hashes = market.db.run(lambda tx: tx.execute(select(users.c.password_hash)).scalars().all())
    assert all(h.startswith("$argon2id$v=19$m=19456,t=2,p=1$") for h in hashes)


def test_a_login_answers_a_device_token_kept_only_as_its_hash(market: Market) -> None:
    conn = market.connect("buyer")
    name = new_account(conn)
    device = conn.call("login", {"username": name, "password": PASSWORD})["device_token"]
    assert len(device) >= 22  # at least 128 bits
    stored = market.db.run(lambda tx: tx.execute(select(device_tokens.c.token_hash)).scalars().all())
    assert device not in stored and token_hash(device) in stored
    again = conn.call("login", {"username": name, "password": PASSWORD, "device_token": device})
    assert again["device_token"] == device  # the same client keeps its token
    other = new_account(conn)  # another account's token is not this one's: a new one
    assert conn.call("login", {"username": other, "password": PASSWORD, "device_token": device}
                     )["device_token"] != device


def test_an_account_keeps_at_most_20_sessions_and_the_oldest_ends(market: Market) -> None:
    """Before, every login made a session with a copy of the saved cart, without end: 311
    logins in 20 s made 31,100 cart lines."""
    seller, buyer = market.user("seller"), market.user("buyer")
    for _ in range(3):
        buyer.call("add_to_cart", {"item_id": market.item(seller), "quantity": 1})
    buyer.call("save_cart")
    buyer.call("logout")
    login = {"username": buyer.username, "password": PASSWORD}  # type: ignore[attr-defined]
    tokens = [buyer.call("login", login)["token"] for _ in range(accounts.MAX_SESSIONS + 5)]
    owned = sessions.c.user_id == buyer.user_id  # type: ignore[attr-defined]
    live = market.db.run(lambda tx: tx.execute(select(sessions.c.session_id).where(owned)).scalars().all())
    in_live = cart_lines.c.session_id.in_(live)
    lines = market.db.run(lambda tx: tx.execute(select(cart_lines).where(in_live)).all())
    assert len(live) == accounts.MAX_SESSIONS and len(lines) == 3 * accounts.MAX_SESSIONS
    with pytest.raises(UnauthenticatedError):
        buyer.call("display_cart", token=tokens[0])
    assert len(buyer.call("display_cart", token=tokens[5])["cart"]["items"]) == 3


def test_an_idle_session_expires_and_any_request_keeps_it_alive(database: Database) -> None:
    """PROTOCOL.md: a session ends after idle_timeout_s without a request. A request that fails
    is activity too (before, a write that failed rolled its last-seen back, and a read that
    failed never wrote it). Each session's requests follow one another at once for longer than
    the idle limit (2 s, so that a slow machine's request still comes well within it)."""
    with running_market(database, Settings(role="buyer", session_idle_s=2)) as market:
        seller, writer, reader, buyer = (market.user(role) for role in ("seller", "buyer", "buyer", "buyer"))
        item_id = market.item(seller, quantity=1)
        active_until = time.monotonic() + 3
        while time.monotonic() < active_until:
            buyer.call("display_cart")
            with pytest.raises(ConflictError):
                writer.call("add_to_cart", {"item_id": item_id, "quantity": 2})
            with pytest.raises(NotFoundError):
                reader.call("get_item", {"item_id": item_id + 1000})
            time.sleep(0.05)
        for conn in (buyer, writer, reader):
            assert conn.call("display_cart")["cart"]["items"] == []
        time.sleep(2.5)  # idle past the limit (2 s and the 0.2 s between last-seen writes)
        for conn in (buyer, writer, reader):
            with pytest.raises(UnauthenticatedError, match="expired"):
                conn.call("display_cart")


def test_a_session_ends_at_its_absolute_limit(database: Database) -> None:
    """Counted from login, not from the last request: a session in use (its idle limit far
    off) ends at 2 s, however long each request takes."""
    with running_market(database, Settings(role="buyer", session_idle_s=60, session_max_s=2)) as market:
        before_login = time.monotonic()
        buyer = market.user("buyer")
        logged_in = last_accepted = time.monotonic()
        with pytest.raises(UnauthenticatedError, match="expired"):
            while time.monotonic() - logged_in < 10:
                started = time.monotonic()
                buyer.call("display_cart")
                last_accepted = started
                time.sleep(0.1)
        assert time.monotonic() - before_login >= 1.99  # not refused before its 2 s
        assert last_accepted - logged_in <= 2.05  # nor accepted after them


@pytest.mark.parametrize("db_url", ["mariadb"], indirect=True)  # SQLite's writers take turns already
def test_a_login_leaves_alone_a_session_whose_request_is_in_flight(database: Database) -> None:
    """A login ends its user's expired sessions. One of them, at its idle limit, has a request
    in flight (here a transaction holding its row and writing its last-seen, as a request's
    does): before, the login read it as expired without a lock and deleted it once the
    request had committed."""
    with running_market(database, Settings(role="buyer", session_idle_s=1)) as market:
        buyer = market.user("buyer")
        with database.engine.connect() as conn:
            session_id = conn.execute(select(sessions.c.session_id)
                                      .where(sessions.c.token_hash == token_hash(buyer.token))).scalar_one()
        time.sleep(1.3)  # past the idle limit (1 s and the 0.1 s between last-seen writes)
        logins: list[dict] = []
        with database.engine.connect() as request:
            with request.begin():
                request.execute(select(sessions.c.session_id).where(sessions.c.session_id == session_id)
                                .with_for_update())
                request.execute(sessions.update().where(sessions.c.session_id == session_id)
                                .values(last_seen_ms=int(time.time() * 1000)))
                other = market.connect("buyer")
                login = threading.Thread(target=lambda: logins.append(
                    other.call("login", {"username": buyer.username, "password": PASSWORD})))
                login.start()
                time.sleep(0.5)  # the login waits for the row (before: for its DELETE of it)
        login.join(30)
        assert logins, "the login did not finish"
        with database.engine.connect() as conn:
            left = conn.execute(select(sessions.c.session_id)
                                .where(sessions.c.session_id == session_id)).all()
        assert left, "the login ended a session whose request had just renewed it"
        buyer.call("display_cart")  # and it still serves


def test_a_login_deletes_sessions_only_well_after_their_end(database: Database) -> None:
    """A read accepted at its session's last moment writes last-seen after its answer: a
    login of the same user in between deleted the session (found by a race of 30 sessions
    and four logins: 3-5 answered OK, then 'unknown or logged-out session' ms later)."""
    with running_market(database, Settings(role="buyer", session_idle_s=1)) as market:
        buyer, seller = market.user("buyer"), market.user("seller")
        item_id = market.item(seller)
        just_ended, long_gone = market.connect("buyer"), market.connect("buyer")
        for conn in (just_ended, long_gone):
            conn.token = conn.call("login", {"username": buyer.username, "password": PASSWORD})["token"]
        long_gone.call("add_to_cart", {"item_id": item_id, "quantity": 1})
        now = int(time.time() * 1000)
        for conn, idle_ms in ((just_ended, 1_500), (long_gone, 1_100 + accounts.CLEANUP_GRACE_MS + 1_000)):
            database.run(lambda tx, conn=conn, idle_ms=idle_ms: tx.execute(
                sessions.update().where(sessions.c.token_hash == token_hash(conn.token))
                .values(last_seen_ms=now - idle_ms, created_ms=now - idle_ms)))
        market.connect("buyer").call("login", {"username": buyer.username, "password": PASSWORD})
        left = database.run(lambda tx: tx.execute(select(sessions.c.token_hash)).scalars().all())
        assert token_hash(just_ended.token) in left  # ended 0.4 s ago: a read may still be on it
        assert token_hash(long_gone.token) not in left  # and its cart with it
        assert database.run(lambda tx: tx.execute(select(cart_lines.c.session_id)).all()) == []
        with pytest.raises(UnauthenticatedError, match="expired"):
            just_ended.call("display_cart")  # kept, but ended all the same


def new_account(conn: Connection) -> str:
    """A new buyer account's username (not logged in)."""
    name = unique_name()
    conn.call("create_account", {"username": name, "password": PASSWORD, "name": name})
    return name


def fail_login(conn: Connection, name: str, password: str = "guess guess") -> None:
    with pytest.raises(UnauthenticatedError, match="wrong username or password"):
        conn.call("login", {"username": name, "password": password})


def test_failed_logins_are_slowed_down_but_never_lock_out_for_good(database: Database) -> None:
    settings = Settings(role="buyer", login_free_failures=3, login_max_delay_s=2,
                        login_account_free_failures=100)
    with running_market(database, settings) as market:
        conn = market.connect("buyer")
        name = new_account(conn)
        for _ in range(3):
            fail_login(conn, name)
        # the next attempt must wait, even with the right password, and says so
        with pytest.raises(UnauthenticatedError, match="too many login attempts"):
            conn.call("login", {"username": name, "password": PASSWORD})
        time.sleep(1.1)
        fail_login(conn, name, "guess again")
        with pytest.raises(UnauthenticatedError, match="too many login attempts"):
            conn.call("login", {"username": name, "password": PASSWORD})
        time.sleep(2.1)  # the wait never exceeds login_max_delay_s
        assert conn.call("login", {"username": name, "password": PASSWORD})["token"]
        for _ in range(3):  # a success clears the count
            fail_login(conn, name)


def test_thousands_of_failed_logins_still_wait_at_most_a_few_steps(database: Database) -> None:
    # before: from 1,029 failures on, 2.0 ** 1024 raised OverflowError: INTERNAL for good
    settings = Settings(role="buyer", login_free_failures=5, login_max_delay_s=1, login_account_step_s=0.3)
    with running_market(database, settings) as market:
        conn = market.connect("buyer")
        name = new_account(conn)
        fail_login(conn, name)
        with database.engine.begin() as tx:  # as if a guesser had kept at it for weeks
            tx.execute(login_failures.update().where(login_failures.c.username == name).values(failures=5000))
        with pytest.raises(UnauthenticatedError, match="too many login attempts.* 1 s"):
            conn.call("login", {"username": name, "password": PASSWORD})
        time.sleep(1.1)
        assert conn.call("login", {"username": name, "password": PASSWORD})["token"]


def test_unknown_usernames_are_throttled_the_same_way(database: Database) -> None:
    settings = Settings(role="buyer", login_free_failures=2, login_max_delay_s=60)
    with running_market(database, settings) as market:
        conn = market.connect("buyer")
        ghost = unique_name("ghost")
        for _ in range(2):
            with pytest.raises(UnauthenticatedError, match="wrong username or password"):
                conn.call("login", {"username": ghost, "password": PASSWORD})
        with pytest.raises(UnauthenticatedError, match="too many login attempts"):
            conn.call("login", {"username": ghost, "password": PASSWORD})
        other = market.user("buyer")  # other usernames are not affected
        assert other.call("display_cart")["cart"]["items"] == []


# Reads fold the token check into their own query (db.accounts.with_session); these pin
# that the answer is still the same as with a separate check, whatever else is wrong.
FOLDED_READS = [
    ("buyer", "get_item", {"item_id": 10**9}), ("buyer", "search_items", {"keywords": ["nothing"]}),
    ("buyer", "search_items", {}), ("buyer", "search_items", {"category": 3}),
    ("buyer", "get_seller_rating", {"seller_id": 10**9}), ("seller", "get_seller_rating", {}),
    ("seller", "display_items", {}),
]


@pytest.mark.parametrize(("role", "op", "args"), FOLDED_READS)
def test_a_folded_read_says_unauthenticated_before_anything_else(market: Market, role: str, op: str,
                                                               args: dict[str, object]) -> None:
    user = market.user(role)
    user.call("logout")
    with pytest.raises(UnauthenticatedError, match="log in again"):
        user.call(op, args)
    with pytest.raises(UnauthenticatedError):  # bad arguments too: the token is checked first
        user.call(op, {**args, "limit": -1})


def test_guesses_sent_at_once_take_turns_with_the_backoff(database: Database) -> None:
    """Before: every guess in flight passed the check before any was counted, so twenty sent
    together all had their password checked; now each counts itself first. (A queue for
    all twenty hashes: past the queue, a guess is BUSY before it is counted.)"""
    settings = Settings(role="buyer", login_free_failures=2, hash_queue=20, hash_queue_per_address=20)
    with running_market(database, settings) as market:
        name = new_account(market.connect("buyer"))
        guessers = [market.connect("buyer") for _ in range(20)]
        results = race([lambda c=c: c.call("login", {"username": name, "password": "guess guess"})
                        for c in guessers])
        messages = Counter(r.message for r in results)
        checked = messages["wrong username or password"]
        assert 2 <= checked <= 3 and checked + sum(
            n for m, n in messages.items() if m.startswith("too many login attempts")) == 20, messages


def test_right_logins_sent_at_once_are_never_told_of_failures(database: Database) -> None:
    """Attempts in flight count against the free ones (a right password looks like a guess
    until its hash is checked): past them, a right login is told to wait, not that logins
    failed (six right logins at once, with none failed, got 'too many failed logins'). The
    account's bucket is set out of the way: whether six at once reach it depends on their pace."""
    settings = Settings(role="buyer", login_free_failures=2, login_account_free_failures=100,
                        hash_queue=6, hash_queue_per_address=6)
    with running_market(database, settings) as market:
        name = new_account(market.connect("buyer"))
        users = [market.connect("buyer") for _ in range(6)]
        results = race([lambda c=c: c.call("login", {"username": name, "password": PASSWORD})
                        for c in users])
        answers = Counter("ok" if isinstance(r, dict) else r.message for r in results)
        assert answers["ok"] >= 2 and set(answers) <= {
            "ok", "too many login attempts for this username; try again in 1 s"}, answers
        time.sleep(1.1)
        assert "token" in users[0].call("login", {"username": name, "password": PASSWORD})


def test_a_bad_envelope_on_a_private_op_comes_after_the_token_check(market: Market) -> None:
    """PROTOCOL.md orders UNAUTHENTICATED before BAD_REQUEST, for the envelope's fields too."""
    buyer = market.user("buyer")
    conn = market.connect("buyer")
    bad = [{"args": []}, {"id": True}, {"arg": {}}]
    for fields in bad:
        conn.send({"op": "display_cart", "token": buyer.token, **fields})
        error = conn.receive()["error"]
        assert error["code"] == "BAD_REQUEST" and error["message"].startswith(next(iter(fields))), error
    buyer.call("logout")
    for fields in bad:
        conn.send({"op": "display_cart", "token": buyer.token, **fields})
        assert conn.receive()["error"]["code"] == "UNAUTHENTICATED", fields


def test_a_folded_read_answers_for_the_caller_and_finds_what_exists(market: Market) -> None:
    seller, other, buyer = market.user("seller"), market.user("seller"), market.user("buyer")
    assert seller.call("display_items") == {"items": [], "next_cursor": None}
    assert seller.call("get_seller_rating")["seller_id"] == seller.user_id  # type: ignore[attr-defined]
    item = market.item(other, keywords=["folded"])
    assert [i["item_id"] for i in other.call("display_items")["items"]] == [item]
    assert seller.call("display_items")["items"] == []
    assert buyer.call("get_item", {"item_id": item})["seller_id"] == other.user_id  # type: ignore[attr-defined]
    assert [i["item_id"] for i in buyer.call("search_items", {"keywords": ["folded"]})["items"]] == [item]
    with pytest.raises(NotFoundError):
        buyer.call("get_item", {"item_id": item + 1000})
    with pytest.raises(NotFoundError):
        buyer.call("get_seller_rating", {"seller_id": buyer.user_id})  # type: ignore[attr-defined]


@pytest.mark.parametrize(("role", "op"), [("buyer", "get_item"), ("buyer", "search_items"),
                                         ("buyer", "get_seller_rating"), ("seller", "display_items"),
                                         ("seller", "get_seller_rating")])
def test_a_folded_read_sees_an_expired_session(database: Database, role: str, op: str) -> None:
    with running_market(database, Settings(role=role, session_max_s=2)) as market:
        seller = market.user("seller")  # the set-up before the session that expires, whatever its pace
        if role == "seller":
            user, logged_in = seller, time.monotonic()
        item = market.item(seller, keywords=["expiry"])
        if role == "buyer":
            user, logged_in = market.user("buyer"), time.monotonic()
        args = {"get_item": {"item_id": item}, "search_items": {"keywords": ["expiry"]},
                "get_seller_rating": {"seller_id": seller.user_id} if role == "buyer" else {},  # type: ignore[attr-defined]
                "display_items": {}}[op]
        assert user.call(op, args)  # the data is found: the check runs on the op's own row
        time.sleep(max(0.0, logged_in + 2.2 - time.monotonic()))
        with pytest.raises(UnauthenticatedError, match="expired"):
            user.call(op, args)


WRITES = [  # (role, op, args); ITEM is replaced by a real item of another seller's
    ("seller", "put_item", {"name": "Lamp", "category": 1, "keywords": ["x"], "condition": "new",
                            "price": "1.00", "quantity": 1}),
    ("seller", "change_price", {"item_id": "ITEM", "price": "2.00"}),
    ("seller", "remove_item", {"item_id": "ITEM", "quantity": 1}),
    ("buyer", "add_to_cart", {"item_id": "ITEM", "quantity": 1}),
    ("buyer", "remove_from_cart", {"item_id": "ITEM", "quantity": 1}),
    ("buyer", "make_purchase", CARD), ("buyer", "provide_feedback", {"item_id": "ITEM", "vote": "up"}),
    ("buyer", "save_cart", {}), ("buyer", "clear_cart", {}),
]


@pytest.mark.parametrize(("role", "op", "args"), WRITES)
def test_a_write_with_a_dead_token_is_unauthenticated_and_changes_nothing(
        market: Market, role: str, op: str, args: dict[str, object]) -> None:
    seller = market.user("seller")
    item = market.item(seller, quantity=3)
    shopper = market.user("buyer")
    shopper.call("add_to_cart", {"item_id": item, "quantity": 1})
    caller = seller if role == "seller" else shopper
    caller.call("logout")
    before = _snapshot(market)
    with pytest.raises(UnauthenticatedError):
        caller.call(op, {k: item if v == "ITEM" else v for k, v in args.items()})
    assert _snapshot(market) == before


def _snapshot(market: Market) -> list[object]:
    tables = (items, item_keywords, item_keyword_pairs, cart_lines, saved_cart_lines, orders, feedback,
              sessions)
    return market.db.run(lambda tx: [sorted(map(tuple, tx.execute(select(t)).all())) for t in tables],
                         write=False)


def test_a_read_is_answered_when_its_session_activity_cannot_be_written(tmp_path: Any) -> None:
    """A read whose last-seen is due writes it after the read; that write waiting out its
    lock wait (another process holding SQLite's write lock) answered the read BUSY, its
    result thrown away. Now the answer stands and the next request writes last-seen."""
    path = tmp_path / "busy.db"
    database = Database(f"sqlite:///{path}", pool_size=2,
                        sqlite_limits=SqliteLimits(poll_lock_s=0.05, busy_timeout_ms=200))
    make_current(database)
    with running_market(database, Settings(role="buyer", session_idle_s=5)) as market:
        buyer = market.user("buyer")
        time.sleep(0.6)  # last-seen is due (written at most every 0.5 s here)
        holder = sqlite3.connect(path, isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")
            assert buyer.call("display_cart")["cart"]["items"] == []  # before: BUSY
            holder.execute("ROLLBACK")
            buyer.call("display_cart")
        finally:
            holder.close()
        with database.engine.connect() as conn:
            seen = conn.execute(select(sessions.c.last_seen_ms)
                                .where(sessions.c.token_hash == token_hash(buyer.token))).scalar_one()
        assert time.time() * 1000 - seen < 500  # written by the request after
    database.close()
