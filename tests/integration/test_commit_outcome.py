"""A transaction whose COMMIT lost its answer is never simply run again (db.commit_tokens).

A TCP proxy between the servers' engine and MariaDB cuts the connection at the query that
carries the COMMIT: once the server has answered it (it committed; the answer is dropped),
before the server gets it (nothing committed), or while the server is still running it (it
waits for a lock another connection holds). Each time the change is made exactly once, and
the caller hears success when it was made.
"""
from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import closing
from typing import Any

import pytest
from sqlalchemy import bindparam, create_engine, func, insert, select, text, update
from sqlalchemy.engine import make_url
from support import CARD, Link, Relay, fresh_mysql_database, running_market

from db import Database
from db.accounts import SessionPolicy
from db.commit_tokens import KEEP_MS, committed, forget_old_tokens, new_token
from db.database import now_ms
from db.housekeeping import sweep
from db.ledger import AUTHORISED, CAPTURED, Ledger
from db.migrations import make_current
from db.schema import commit_tokens, login_failures
from wire.errors import UnavailableError

_NEW = insert(login_failures).values(role="buyer", username=bindparam("username"), failures=0,
                                     last_failure_ms=0)
_BUMP = (update(login_failures).where(login_failures.c.username == bindparam("username"))
         .values(failures=login_failures.c.failures + 1))
_FAILURES = select(login_failures.c.failures).where(login_failures.c.username == bindparam("username"))
_WHERE = {"username": "counted"}


class CommitCutter(Relay):
    """A relay to MariaDB that cuts a connection at the next query carrying COMMIT, once armed:
    "answered" forwards it and drops the server's answer, "unsent" drops the query itself,
    "running" forwards it and cuts at once, before the server can have answered. With
    `down_after_cut`, every connection after the cut is closed at once (the database away).
    With `away_after_check`, the database goes away (every connection cut, new ones refused)
    once a question whether a commit was made, a commit token written alone, was answered."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.mode, self.cuts, self.down_after_cut, self.away_after_check = "", 0, False, False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        super().__init__(target, self._request, self._answer, lambda: self.down_after_cut and self.cuts > 0)
        self.port = self.address[1]

    def arm(self, mode: str) -> None:
        """Cut at the next COMMIT (the next one only)."""
        self.mode = mode

    def link(self, client: socket.socket, server: socket.socket) -> None:
        self._sockets += [client, server]
        super().link(client, server)

    def _request(self, data: bytes, link: Link) -> tuple[bytes, bool]:
        mode = self._take_mode() if b"COMMIT" in data else ""
        link["cutting"] = link.get("cutting") or mode == "answered"  # set before the answer can come
        if self.away_after_check and b"INSERT INTO commit_tokens" in data and b"COMMIT" not in data:
            link["checked"] = True  # the question; away once its transaction ended
        link["ending"] = link.get("checked") and data[4:5] == b"\x03" and b"ROLLBACK" in data.upper()
        return (b"" if mode == "unsent" else data), mode in ("unsent", "running")

    def _answer(self, data: bytes, link: Link) -> tuple[bytes, bool]:
        """A cut answer is dropped whole: the link is cut once its last packet arrived, so the
        server ran every statement of the query (it may not, if it saw the cut midway)."""
        if link.get("ending"):
            self.go_away(but=link["sockets"])  # this one cut once its answer went through
            return data, True
        if not link.get("cutting"):
            return data, False
        link["answer"] = link.get("answer", b"") + data
        return b"", _answered_whole(link["answer"])

    def go_away(self, but: tuple[socket.socket, ...] = ()) -> None:
        """Every connection cut (`but` these), new ones refused until `down_after_cut` is cleared."""
        self.away_after_check, self.down_after_cut, self.cuts = False, True, max(self.cuts, 1)
        for sock in set(self._sockets) - set(but):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _take_mode(self) -> str:
        with self._lock:
            mode, self.mode = self.mode, ""
            self.cuts += bool(mode)
            return mode


_MORE_RESULTS = 0x0008  # a status flag of MySQL's protocol: another result follows


def _answered_whole(answer: bytes) -> bool:
    """Whether `answer` (MySQL protocol packets) ends with its query's last packet: an error,
    or an OK or EOF packet whose status does not say that more results follow."""
    while len(answer) >= 4 and len(answer) >= 4 + (size := int.from_bytes(answer[:3], "little")):
        payload, answer = answer[4:4 + size], answer[4 + size:]
        if payload[:1] == b"\xff":
            return True
        if payload[:1] == b"\xfe" and size == 5:  # EOF: warnings, then status
            status = int.from_bytes(payload[3:5], "little")
        elif payload[:1] in (b"\x00", b"\xfe") and size < 0xFFFFFF:  # OK: two numbers, then status
            at = 1
            for _ in range(2):
                at += {0xFC: 3, 0xFD: 4, 0xFE: 9}.get(payload[at], 1)
            status = int.from_bytes(payload[at:at + 2], "little")
        else:
            continue
        if not status & _MORE_RESULTS and not answer:
            return True
    return False


@pytest.fixture
def mariadb_url(mysql_server: str) -> Iterator[str]:
    """A fresh MariaDB database at head (reached directly)."""
    for url in fresh_mysql_database(mysql_server):
        make_current(url)
        yield url


@pytest.fixture
def cutter(mariadb_url: str) -> Iterator[CommitCutter]:
    direct = make_url(mariadb_url)
    proxy = CommitCutter((direct.host or "127.0.0.1", direct.port or 3306))
    yield proxy
    proxy.close()


@pytest.fixture
def proxied(mariadb_url: str, cutter: CommitCutter) -> Iterator[Database]:
    """The data layer over the same database, through the proxy."""
    url = make_url(mariadb_url).set(host="127.0.0.1", port=cutter.port).render_as_string(hide_password=False)
    with closing(Database(url, pool_size=2)) as database:
        database.run(lambda tx: tx.execute(_NEW, _WHERE))
        yield database


def _counted(database: Database) -> int:
    return int(database.run(lambda tx: tx.execute(_FAILURES, _WHERE).scalar_one(), write=False))


def _bump_and_cut(cutter: CommitCutter, mode: str) -> Any:
    """A write held and sent with START TRANSACTION and COMMIT: one query, cut as `mode` says."""
    runs = []

    def work(tx: Any) -> str:
        tx.execute(_BUMP, _WHERE)
        if not runs:  # the first run only: a run again gets its answer
            cutter.arm(mode)
        runs.append(1)
        return "bumped"
    return work


def test_a_commit_whose_answer_is_lost_is_not_made_twice(proxied: Database, cutter: CommitCutter) -> None:
    assert proxied.run(_bump_and_cut(cutter, "answered")) == "bumped"
    assert cutter.cuts == 1
    assert _counted(proxied) == 1  # it committed once, and the caller was told so


def test_a_commit_never_sent_is_made_on_a_fresh_connection(proxied: Database, cutter: CommitCutter) -> None:
    assert proxied.run(_bump_and_cut(cutter, "unsent")) == "bumped"
    assert cutter.cuts == 1
    assert _counted(proxied) == 1


def test_a_commit_cut_while_it_waits_for_a_lock_is_made_once(proxied: Database, cutter: CommitCutter,
                                                            mariadb_url: str) -> None:
    """The server still runs the query when the connection is cut: asking about its token
    waits for it to end, then says it committed (or, had the question come first, the
    transaction could not commit and runs again). Either way: once."""
    other = create_engine(mariadb_url.replace("mysql://", "mysql+mysqlconnector://"))
    with other.connect() as holder:
        holder.execute(text("UPDATE login_failures SET failures = failures WHERE username = 'counted'"))
        releaser = threading.Timer(1.0, holder.rollback)  # the row locked until then
        releaser.start()
        started = time.monotonic()
        assert proxied.run(_bump_and_cut(cutter, "running")) == "bumped"
        releaser.join()
    other.dispose()
    assert time.monotonic() - started >= 0.9  # it did wait for the lock
    assert cutter.cuts == 1
    assert _counted(proxied) == 1


def test_the_cart_answers_once_and_holds_once_after_a_lost_commit(proxied: Database,
                                                                 cutter: CommitCutter) -> None:
    """add_to_cart's COMMIT (in the query that reads the cart, its answer) loses its answer:
    the cart is read again once the token says it committed, the buyer hears it, and the cart
    holds the quantity once."""
    with running_market(proxied) as market:
        seller, buyer = market.user("seller"), market.user("buyer")
        item_id = market.item(seller, quantity=10)
        cutter.arm("answered")
        cart = buyer.call("add_to_cart", {"item_id": item_id, "quantity": 3})["cart"]
        assert cutter.cuts == 1
        assert [line["quantity"] for line in cart["items"]] == [3]
        assert [line["quantity"] for line in buyer.call("display_cart")["cart"]["items"]] == [3]


def test_a_purchase_whose_commit_lost_its_answer_is_bought_once(proxied: Database,
                                                               cutter: CommitCutter) -> None:
    """The order's transaction (the stock taken) loses its COMMIT's answer: the purchase goes
    on to its payment, the receipt is the answer, and the stock is taken once."""
    with running_market(proxied) as market:
        seller, buyer = market.user("seller"), market.user("buyer")
        item_id = market.item(seller, quantity=10)
        buyer.call("add_to_cart", {"item_id": item_id, "quantity": 2})
        cutter.arm("answered")
        receipt = buyer.call("make_purchase", CARD)
        assert cutter.cuts == 1
        assert [line["quantity"] for line in receipt["lines"]] == [2]
        assert buyer.call("get_item", {"item_id": item_id})["quantity"] == 8
        history = buyer.call("get_purchase_history")["purchases"]
        assert [p["order_id"] for p in history] == [receipt["order_id"]]


@pytest.mark.parametrize("mode", ["answered", "unsent"])
def test_a_ledger_call_cut_at_its_commit_is_made_again_and_counts_once(
        proxied: Database, cutter: CommitCutter, mode: str) -> None:
    """The payment ledger's calls are idempotent per key, so they write no commit token: one
    whose COMMIT is cut runs again on a fresh connection, and the key's entry says what
    happened once (one authorisation, one capture)."""
    ledger = Ledger(proxied)
    ledger.create_table()
    tokens = select(func.count()).select_from(commit_tokens)
    before = proxied.run(lambda tx: tx.execute(tokens).scalar_one(), write=False)
    cutter.arm(mode)
    assert ledger.record("key", 7, 125, AUTHORISED).state == AUTHORISED
    cutter.arm(mode)
    assert ledger.move("key", AUTHORISED, CAPTURED) == CAPTURED
    assert cutter.cuts == 2
    assert [(p.state, p.captures, p.amount_cents) for p in ledger.entries()] == [(CAPTURED, 1, 125)]
    assert proxied.run(lambda tx: tx.execute(tokens).scalar_one(), write=False) == before


def test_a_ledger_capture_cut_while_it_waits_for_a_lock_captures_once(proxied: Database, cutter: CommitCutter,
                                                                      mariadb_url: str) -> None:
    """The capture's UPDATE waits for the entry's row lock when its connection is cut: the call
    made again waits too, then finds the entry captured or captures it; either way once."""
    ledger = Ledger(proxied)
    ledger.create_table()
    ledger.record("key", 7, 125, AUTHORISED)
    other = create_engine(mariadb_url.replace("mysql://", "mysql+mysqlconnector://"))
    with other.connect() as holder:
        holder.execute(text("UPDATE payments SET updated_ms = updated_ms WHERE payment_key = 'key'"))
        releaser = threading.Timer(1.0, holder.rollback)
        releaser.start()
        cutter.arm("running")
        assert ledger.move("key", AUTHORISED, CAPTURED) == CAPTURED
        releaser.join()
    other.dispose()
    assert cutter.cuts == 1
    assert [(p.state, p.captures) for p in ledger.entries()] == [(CAPTURED, 1)]


def test_a_ledger_call_cut_while_the_database_stays_away_says_it_may_be_made(
        proxied: Database, cutter: CommitCutter, mariadb_url: str) -> None:
    """Made, its answer lost, and no connection to be had after: tried again for a while, then
    UNAVAILABLE saying the change may have been made (it was: the entry is there, once)."""
    proxied.away_s = 0.5
    ledger = Ledger(proxied)
    ledger.create_table()
    cutter.down_after_cut = True
    cutter.arm("answered")
    started = time.monotonic()
    with pytest.raises(UnavailableError, match="may have gone away after making the change"):
        ledger.record("key", 7, 125, AUTHORISED)
    assert time.monotonic() - started >= 0.3  # it did try again before giving up
    with closing(Database(mariadb_url, pool_size=1)) as direct:
        assert [(p.state, p.amount_cents) for p in Ledger(direct).entries()] == [(AUTHORISED, 125)]


def test_a_commit_unanswered_while_the_database_stays_away_says_so(proxied: Database, cutter: CommitCutter,
                                                                   mariadb_url: str) -> None:
    """Whether it committed cannot be asked: UNAVAILABLE, saying that it is not known (it
    was made, here), and it is not made again."""
    proxied.away_s = 0.5  # the test need not wait 6.5 s
    cutter.down_after_cut = True
    with pytest.raises(UnavailableError, match="whether it was made") as unknown:
        proxied.run(_bump_and_cut(cutter, "answered"))
    assert unknown.value.to_wire()["retryable"] is False  # it may be made: not safe to send again
    with closing(Database(mariadb_url, pool_size=1)) as direct:
        assert _counted(direct) == 1


def _away_once_the_token_says_made(cutter: CommitCutter, back_after_s: float | None = None) -> None:
    """The database goes away (every connection cut) as soon as the question whether the
    COMMIT was made was answered; back after `back_after_s`, if given."""
    cutter.away_after_check = True
    if back_after_s is not None:
        def back() -> None:
            while not cutter.down_after_cut:  # not gone yet
                time.sleep(0.01)
            time.sleep(back_after_s)
            cutter.down_after_cut = False
        threading.Thread(target=back, daemon=True).start()


def _bump_answered_and_cut(cutter: CommitCutter, runs: list[int]) -> Any:
    """A held write and the answer's read, sent with the COMMIT, the first run's query cut once
    the server answered; `runs` counts the runs."""
    def work(tx: Any) -> Any:
        tx.execute(_BUMP, _WHERE)
        if not runs:
            cutter.arm("answered")
        runs.append(1)
        return tx.answer(_FAILURES, _WHERE, lambda rows: rows[0].failures)
    return work


def test_an_answer_that_cannot_be_read_again_says_the_change_was_made(
        proxied: Database, cutter: CommitCutter, mariadb_url: str) -> None:
    """The answer's read travelled with the COMMIT, whose answer was lost; the token says it
    committed, and then the database goes away before the read is made again: UNAVAILABLE
    saying the change was made, not "nothing was changed", and it is not made again."""
    proxied.away_s = 0.5
    _away_once_the_token_says_made(cutter)
    runs: list[int] = []
    started = time.monotonic()
    with pytest.raises(UnavailableError, match="^the change was made, but") as made:
        proxied.run(_bump_answered_and_cut(cutter, runs))
    assert made.value.to_wire()["retryable"] is False
    assert time.monotonic() - started >= 0.3  # it did try again before giving up
    assert runs == [1]
    with closing(Database(mariadb_url, pool_size=1)) as direct:
        assert _counted(direct) == 1


def test_an_answer_read_again_once_the_database_is_back_is_handed_back(
        proxied: Database, cutter: CommitCutter) -> None:
    """As above, but the database comes back while the read is tried again: the caller gets
    the answer, the change made once."""
    _away_once_the_token_says_made(cutter, back_after_s=0.5)
    runs: list[int] = []
    started = time.monotonic()
    assert proxied.run(_bump_answered_and_cut(cutter, runs)) == 1
    assert time.monotonic() - started >= 0.4 and runs == [1]


def test_a_token_written_again_says_whether_its_transaction_committed(mariadb_url: str) -> None:
    with closing(Database(mariadb_url, pool_size=1)) as database:
        mine = new_token()
        database.run(lambda tx: tx.execute(insert(commit_tokens), mine))
        assert committed(database.engine, mine) is True
        never = new_token()
        assert committed(database.engine, never) is False
        assert committed(database.engine, never) is True  # fenced: now it is there


def test_a_write_leaves_a_token_on_mariadb_only_and_a_read_none(database: Database) -> None:
    """On SQLite (in the process) a COMMIT's answer cannot be lost: no token there."""
    count = select(func.count()).select_from(commit_tokens)
    before = database.run(lambda tx: tx.execute(count).scalar_one(), write=False)
    database.run(lambda tx: tx.execute(_NEW, _WHERE))
    database.run(lambda tx: tx.execute(_FAILURES, _WHERE).all(), write=False)
    after = database.run(lambda tx: tx.execute(count).scalar_one(), write=False)
    assert after - before == (0 if database.is_sqlite else 1)


def test_the_housekeeping_forgets_old_tokens_only(database: Database) -> None:
    now = now_ms()
    old = [{"created_ms": now - KEEP_MS - 1000 - n, "nonce": n} for n in range(5)]
    fresh = {"created_ms": now - 1000, "nonce": 99}
    database.run(lambda tx: tx.execute(insert(commit_tokens), [*old, fresh]))
    assert database.run(lambda tx: forget_old_tokens(tx, now, batch=2)) == 2  # a batch at a time
    sweep(database, SessionPolicy())
    left = database.run(lambda tx: tx.execute(select(commit_tokens.c.nonce)).scalars().all(), write=False)
    assert 99 in left and not set(left) & set(range(5))

