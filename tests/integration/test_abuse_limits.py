"""Limits per client address over TCP: 127.0.0.2 stands for another client than 127.0.0.1.
A stranger's failed logins slow the stranger down, never the right password from elsewhere;
sign-ups are limited per address."""
from __future__ import annotations

import re
import threading
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


def _guesses(conn: Connection, name: str, count: int) -> list[str]:
    """`count` wrong logins, each as soon as the last is answered; the messages heard."""
    heard = []
    for _ in range(count):
        with pytest.raises(UnauthenticatedError) as refused:
            conn.call("login", {"username": name, "password": "guess guess"})
        heard.append(refused.value.message)
    return heard


def _logs_in_at_once(conn: Connection, name: str) -> None:
    """The right password is let in at its first try: a throttled login is refused with the
    time to wait (UnauthenticatedError), never held, so no clock is needed to tell."""
    assert conn.call("login", {"username": name, "password": PASSWORD})["token"]
    assert conn.busy_retries == 0 and conn.resends == 0


@pytest.mark.slow
def test_a_strangers_failed_logins_never_keep_the_right_password_out(database: Database) -> None:
    """Before, a stranger failing for a user's name kept even the right password out, from
    any address, for as long as he went on (1, 2, 4, ... up to 900 s)."""
    settings = Settings(role="buyer", login_account_step_s=60)  # no refill during the test
    with running_market(database, settings) as market:
        name = _sign_up(market.connect("buyer"))
        heard = _guesses(_connect(market, STRANGER), name, 12)
        checked = heard.count("wrong username or password")  # the account's bucket, less its reserve
        assert 2 <= checked <= settings.login_account_free_failures + 3, heard
        assert any(m.startswith("too many login attempts for this") for m in heard), heard
        _logs_in_at_once(_connect(market, "127.0.0.1"), name)


def _guesses_from(market: Market, name: str, addresses: list[str], rounds: int) -> list[str]:
    """One wrong login from each address in turn, `rounds` times; the messages heard."""
    conns = [_connect(market, address) for address in addresses]
    heard = []
    for _ in range(rounds):
        for conn in conns:
            with pytest.raises(UnauthenticatedError) as refused:
                conn.call("login", {"username": name, "password": "guess guess"})
            heard.append(refused.value.message)
    return heard


@pytest.mark.slow
def test_guesses_from_many_addresses_are_slowed_per_account(database: Database) -> None:
    """Before, 1,500 addresses with one guess each had all 1,500 checked; now the account's
    bucket lets `burst` through, then one a step, whatever the number of addresses."""
    settings = Settings(role="buyer", login_account_free_failures=5, login_account_step_s=0.5)
    addresses = [f"127.0.1.{n}" for n in range(1, 61)]
    with running_market(database, settings) as market:
        name = _sign_up(market.connect("buyer"))
        started = time.monotonic()
        heard = _guesses_from(market, name, addresses, rounds=2)
        elapsed = time.monotonic() - started
    checked = heard.count("wrong username or password")
    assert checked <= 5 + elapsed / 0.5 + 1, (checked, elapsed)
    assert sum(m.startswith("too many login attempts for this account; try again in") for m in heard) \
        == len(heard) - checked


def test_the_owner_gets_in_during_an_attack(database: Database) -> None:
    """With the device token of an earlier login: at once, whatever the bucket holds; from a
    new client with no failure for the account: at once too (the bucket's reserve); from an
    address that failed for it: told to wait ((reserve + 1) steps at most)."""
    settings = Settings(role="buyer", login_free_failures=100, login_account_free_failures=5,
                        login_account_step_s=60)
    with running_market(database, settings) as market:
        owner = market.connect("buyer")
        name = _sign_up(owner)
        device = owner.call("login", {"username": name, "password": PASSWORD})["device_token"]
        heard = _guesses_from(market, name, ["127.0.2.1", "127.0.2.2"], rounds=5)
        assert heard.count("wrong username or password") == 3, heard  # then they must leave 2
        again = owner.call("login", {"username": name, "password": PASSWORD, "device_token": device})
        assert again["device_token"] == device
        assert _connect(market, "127.0.2.200").call("login", {"username": name, "password": PASSWORD})
        with pytest.raises(UnauthenticatedError, match="for this account; try again in"):
            _connect(market, "127.0.2.1").call("login", {"username": name, "password": PASSWORD})


def test_a_new_client_told_to_wait_gets_in_when_it_comes_back(database: Database) -> None:
    """Guesses from new addresses (one each) leave the bucket's last place to clients that
    come back when told: the owner on a new client is told to wait a second or two at most,
    and gets in when he comes back, though new addresses guess meanwhile."""
    settings = Settings(role="buyer", login_account_free_failures=5, login_account_step_s=1)
    fresh = (f"127.0.{5 + n // 250}.{1 + n % 250}" for n in range(1000))
    with running_market(database, settings) as market:
        name = _sign_up(market.connect("buyer"))
        owner = _connect(market, "127.0.9.1")
        for _ in range(3):
            _guesses_from(market, name, [next(fresh) for _ in range(10)], rounds=1)  # the bucket full
            try:
                assert owner.call("login", {"username": name, "password": PASSWORD})["token"]
                return
            except UnauthenticatedError as exc:
                told = re.fullmatch(r"too many login attempts for this account; try again in (\d) s",
                                    exc.message)
                assert told and int(told[1]) <= 2, exc.message
                time.sleep(int(told[1]))
        pytest.fail("the owner did not get in when he came back")


def test_a_device_token_sent_with_a_wrong_password_is_no_longer_trusted(database: Database) -> None:
    settings = Settings(role="buyer", login_account_free_failures=3, login_account_step_s=60)
    with running_market(database, settings) as market:
        owner = _connect(market, "127.0.3.1")
        name = _sign_up(owner)
        device = owner.call("login", {"username": name, "password": PASSWORD})["device_token"]
        other = _connect(market, "127.0.3.2")
        other_device = other.call("login", {"username": name, "password": PASSWORD})["device_token"]
        with pytest.raises(UnauthenticatedError, match="wrong username or password"):
            owner.call("login", {"username": name, "password": "guess guess", "device_token": device})
        _guesses_from(market, name, ["127.0.3.3"], rounds=3)  # the bucket full
        with pytest.raises(UnauthenticatedError, match="for this account"):  # a stranger's now
            owner.call("login", {"username": name, "password": PASSWORD, "device_token": device})
        assert other.call("login", {"username": name, "password": PASSWORD, "device_token": other_device})
        with pytest.raises(UnauthenticatedError, match="for this account"):  # not another account's
            owner.call("login", {"username": name, "password": PASSWORD, "device_token": "x" * 43})


def test_right_logins_from_two_addresses_leave_turns_to_a_third(database: Database) -> None:
    """Before, two addresses logging in as fast as they could held the hashing queue's two
    places, and a third address's logins were answered BUSY 53 times out of 53."""
    settings = Settings(role="buyer", signups_per_address_hour=0)
    with running_market(database, settings) as market:
        names = [_sign_up(market.connect("buyer")) for _ in range(3)]
        stop = threading.Event()

        def flood(source: str, name: str) -> None:
            with Connection(*market.buyer_server.address, timeout=30, source=source, retry_busy=False) as c:
                while not stop.is_set():
                    try:
                        c.call("login", {"username": name, "password": PASSWORD})
                    except BusyError:
                        pass

        floods = [threading.Thread(target=flood, args=(f"127.0.4.{n}", names[n]), daemon=True)
                  for n in (1, 2) for _ in range(4)]
        for thread in floods:
            thread.start()
        try:
            third = _connect(market, "127.0.4.3")
            third.retry_busy = True  # as every client does: a BUSY login is tried again
            answers = [third.call("login", {"username": names[0], "password": PASSWORD})["token"]
                       for _ in range(10)]
        finally:
            stop.set()
            for thread in floods:
                thread.join(timeout=30)
    assert len(answers) == 10


def test_the_account_count_slows_an_address_that_failed_for_it(database: Database) -> None:
    settings = Settings(role="buyer", login_free_failures=100, login_account_free_failures=3,
                        login_account_step_s=60)  # no refill during the test
    with running_market(database, settings) as market:
        name = _sign_up(market.connect("buyer"))
        stranger = _connect(market, STRANGER)
        assert _guesses(stranger, name, 1) == ["wrong username or password"]  # a first failure on record
        assert _guesses(stranger, name, 6)[-1].startswith("too many login attempts"), \
            "past the account's free failures its guesser waits"
        _logs_in_at_once(_connect(market, "127.0.0.1"), name)


def test_failures_for_many_usernames_slow_their_address_down(database: Database) -> None:
    settings = Settings(role="buyer", login_address_free_failures=3)
    with running_market(database, settings) as market:
        stranger = _connect(market, STRANGER)
        for _ in range(3):
            assert _guesses(stranger, unique_name("ghost"), 1) == ["wrong username or password"]
        refused = _guesses(stranger, unique_name("ghost"), 1)
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
