"""Limits per client address over TCP: 127.0.0.2 stands for another client than 127.0.0.1.
A stranger's failed logins slow the stranger down, never the right password from elsewhere;
sign-ups are limited per address."""
from __future__ import annotations

import time

import pytest
from support import PASSWORD, Market, running_market, unique_name

from db import Database
from runtime.config import Settings
from wire import Connection
from wire.errors import BusyError, UnauthenticatedError

STRANGER = "127.0.0.2"


def _connect(market: Market, source: str, role: str = "buyer") -> Connection:
    server = market.buyer_server if role == "buyer" else market.seller_server
    conn = Connection(*server.address, timeout=30, source=source, retry_busy=False)
    market.connections.append(conn)
    return conn


def _sign_up(conn: Connection) -> str:
    name = unique_name()
    conn.call("create_account", {"username": name, "password": PASSWORD, "name": "N"})
    return name


def _guess_for(conn: Connection, name: str, seconds: float) -> list[str]:
    """Wrong logins as fast as the server answers them, for a while; the messages heard."""
    heard, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        with pytest.raises(UnauthenticatedError) as refused:
            conn.call("login", {"username": name, "password": "guess guess"})
        heard.append(refused.value.message)
    return heard


def _logs_in_at_once(conn: Connection, name: str) -> None:
    started = time.monotonic()
    assert conn.call("login", {"username": name, "password": PASSWORD})["token"]
    assert time.monotonic() - started < 2  # one hash, not a wait of the backoff's


@pytest.mark.slow
def test_a_strangers_failed_logins_never_keep_the_right_password_out(database: Database) -> None:
    """Before, a stranger failing for a user's name kept even the right password out, from
    any address, for as long as he went on (1, 2, 4, ... up to 900 s)."""
    settings = Settings(role="buyer")
    with running_market(database, settings) as market:
        name = _sign_up(market.connect("buyer"))
        heard = _guess_for(_connect(market, STRANGER), name, seconds=3)
        checked = heard.count("wrong username or password")  # 5 free, then after 1 s, 2 s, ...
        assert settings.login_free_failures <= checked <= settings.login_free_failures + 2, heard
        assert heard.count("too many login attempts for this username; try again in 1 s") > 10, heard
        _logs_in_at_once(_connect(market, "127.0.0.1"), name)


def test_the_account_count_slows_an_address_that_failed_for_it(database: Database) -> None:
    settings = Settings(role="buyer", login_free_failures=100, login_account_free_failures=3)
    with running_market(database, settings) as market:
        name = _sign_up(market.connect("buyer"))
        stranger = _connect(market, STRANGER)
        assert len(_guess_for(stranger, name, seconds=0.01)) == 1  # a first failure on record
        assert _guess_for(stranger, name, seconds=0.5)[-1].startswith("too many login attempts"), \
            "past the account's free failures its guesser waits"
        _logs_in_at_once(_connect(market, "127.0.0.1"), name)


def test_failures_for_many_usernames_slow_their_address_down(database: Database) -> None:
    settings = Settings(role="buyer", login_address_free_failures=3)
    with running_market(database, settings) as market:
        stranger = _connect(market, STRANGER)
        for _ in range(3):
            assert _guess_for(stranger, unique_name("ghost"), 0.01) == ["wrong username or password"]
        refused = _guess_for(stranger, unique_name("ghost"), 0.01)
        assert refused[0].startswith("too many login attempts from your address; try again in 1 s")
        name = _sign_up(market.connect("buyer"))
        _logs_in_at_once(_connect(market, "127.0.0.1"), name)


def test_sign_ups_are_limited_per_address(database: Database) -> None:
    settings = Settings(role="buyer", signups_per_address_hour=3)
    with running_market(database, settings) as market:
        stranger = _connect(market, STRANGER)
        for _ in range(3):
            _sign_up(stranger)
        with pytest.raises(BusyError, match=r"too many new accounts from your address; try again in \d+ s"):
            _sign_up(stranger)
        assert _sign_up(market.connect("buyer"))  # another address is not affected


def test_the_default_sign_up_limit_lets_the_simulators_set_up_through(database: Database) -> None:
    assert Settings(role="buyer").signups_per_address_hour >= 100  # 100 buyers or sellers per server
