"""Sign-up and login, the ops both servers have, and the guards before a password's hash: a place
in the hashing queue, the limits of the client's address (in this process's memory: each worker
counts its own) and the account's throttle (db.login_throttle), which a device token passes by.
"""
from __future__ import annotations

import math
import secrets
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from db import accounts
from db.database import Database
from db.login_throttle import COMING_BACK, FAILED, NEW, AccountBucket
from observe import events
from wire import __version__
from wire.errors import BusyError, UnauthenticatedError

from .admission import Bucket, forget_full
from .hashing import HashingQueue

_MAX_KEYS = 100_000  # past this many keys on record, those whose wait ran out are forgotten
ADDRESSED_OPS = frozenset({"create_account", "login"})  # handlers called with the client's address


class Backoff:
    """Failed attempts per key: past the free ones, the next must wait 1, 2, 4, ... s after
    the last. Each attempt counts itself before its password is checked, so attempts sent at
    once take turns; `succeeded` takes it back (or clears the key). `reason` names its
    refusals in the metrics and the security log; `clock` is monotonic, in seconds."""

    def __init__(self, free_failures: int, max_delay_s: float, message: str, reason: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._free, self._max_delay_s, self._clock = free_failures, max_delay_s, clock
        self._message, self.reason = message, reason
        self._lock = threading.Lock()
        self._counts: dict[Hashable, tuple[int, int]] = {}  # key: (failures, last attempt, ms)

    def claim(self, key: Hashable, username: str) -> int:
        """Count this attempt; the failures on record before it. UNAUTHENTICATED while it must wait."""
        now = int(self._clock() * 1000)
        with self._lock:
            failures, last_ms = self._counts.get(key, (0, now))
            wait_ms = last_ms + self._delay_ms(failures) - now if failures else 0  # no failure to wait after
            if wait_ms <= 0:
                if len(self._counts) >= _MAX_KEYS:
                    longest_ms = self._max_delay_s * 1000
                    self._counts = {k: v for k, v in self._counts.items() if v[1] > now - longest_ms}
                self._counts[key] = (failures + 1, now)
                return failures
        events.login_refused(self.reason, username)
        raise UnauthenticatedError(f"{self._message}; try again in {max(1, round(wait_ms / 1000))} s")

    def _delay_ms(self, failures: int) -> int:
        """How long after the last failure the next attempt must wait."""
        if failures < self._free:
            return 0
        doublings = min(failures - self._free, 64)  # 2.0 ** 1024 is an OverflowError
        return int(min(self._max_delay_s, 2.0 ** doublings) * 1000)

    def succeeded(self, key: Hashable, clear: bool) -> None:
        """A claimed attempt was right: clear the key's count, or take this attempt back."""
        with self._lock:
            failures, last_ms = self._counts.pop(key, (1, 0))
            if not clear and failures > 1:
                self._counts[key] = (failures - 1, last_ms)


class Waits:
    """When each key was told it may try again, for `ttl_s` after."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl_s, self._lock, self._clock = ttl_s, threading.Lock(), clock
        self._due: dict[Hashable, float] = {}

    def told(self, key: Hashable, wait_s: float) -> None:
        now = self._clock()
        with self._lock:
            if len(self._due) >= _MAX_KEYS:
                self._due = {k: due for k, due in self._due.items() if due > now - self._ttl_s}
            self._due[key] = now + wait_s

    def waited(self, key: Hashable) -> bool:
        """Whether the key was told to wait lately and waited as long as it was told."""
        with self._lock:
            due = self._due.get(key)
        return due is not None and due <= self._clock() < due + self._ttl_s


class SignupLimit:
    """Sign-ups per address: `per_hour` at once, then one more each 3600 / per_hour s (a token
    bucket); BUSY past it. 0: no limit."""

    def __init__(self, per_hour: int) -> None:
        self.per_hour = per_hour
        self._lock = threading.Lock()
        self._buckets: dict[str | None, Bucket] = {}

    def take(self, address: str | None) -> None:
        """One sign-up from the address, or BUSY saying how long to wait."""
        if self.per_hour <= 0:
            return
        with self._lock:
            if len(self._buckets) >= _MAX_KEYS:
                self._buckets = forget_full(self._buckets)
            bucket = self._buckets.get(address)
            if bucket is None:
                bucket = self._buckets[address] = Bucket(self.per_hour / 3600, self.per_hour)
            wait_s = bucket.take()
        if wait_s:
            raise BusyError("too many new accounts from your address; "
                            f"try again in {max(1, round(wait_s))} s")


@dataclass(frozen=True)
class AccountGuards:
    """What stands before a sign-up's or a login's hash."""

    hashing: HashingQueue
    signups: SignupLimit
    by_username: Backoff  # failed logins per (address, role, username)
    by_address: Backoff  # failed logins per address, whatever the username
    account: AccountBucket  # logins without a device token per account, from any address
    told_to_wait: Waits  # (address, role, username) the account's bucket refused lately

    @classmethod
    def for_settings(cls, settings: Any) -> AccountGuards:
        """The guards a server's settings (runtime.config.Settings) ask for."""
        return cls(HashingQueue.for_settings(settings), SignupLimit(settings.signups_per_address_hour),
                   Backoff(settings.login_free_failures, settings.login_max_delay_s,
                           "too many login attempts for this username", "throttled"),
                   Backoff(settings.login_address_free_failures, settings.login_max_delay_s,
                           "too many login attempts from your address", "address_throttled"),
                   AccountBucket(settings.login_account_free_failures, settings.login_account_step_s),
                   Waits(60.0))


def create_account(db: Database, role: str, guards: AccountGuards, peer: str | None, username: str,
                   password: str, name: str) -> dict[str, Any]:
    """A new buyer or seller account from the address `peer`; CONFLICT when the username is taken."""
    with guards.hashing.admitted(peer, on_full=lambda reason: events.signup_refused(reason, username)):
        try:
            guards.signups.take(peer)
        except BusyError:
            events.signup_refused("address_limit", username)
            raise
        password_hash = guards.hashing.hash(password)
    user_id = accounts.add_user(db, role, username, name, password_hash)
    events.signed_up(username, user_id)
    return {"user_id": user_id}


def login(db: Database, role: str, policy: accounts.SessionPolicy, guards: AccountGuards,
          peer: str | None, username: str, password: str, device_token: str | None = None) -> dict[str, Any]:
    """A new session and the client's device token; the same UNAUTHENTICATED message for a
    wrong username or password. Every attempt counts as a failure before its hash (attempts
    sent at once take turns); a right one takes it back."""
    attempt = (peer, role, username)
    with guards.hashing.admitted(peer, on_full=lambda reason: events.login_refused(reason, username)):
        guards.by_address.claim(peer, username)
        failed_here = guards.by_username.claim(attempt, username) > 0
        lane = FAILED if failed_here else COMING_BACK if guards.told_to_wait.waited(attempt) else NEW
        check = db.run(lambda tx: accounts.check_login(tx, guards.account, role, username,
                                                       device_token, lane))
        if check.wait_ms:  # no password checked: not a failure of the address
            guards.by_username.succeeded(attempt, clear=False)
            wait_s = math.ceil(check.wait_ms / 1000)  # one that comes back sooner waits again
            guards.told_to_wait.told(attempt, wait_s)
            events.login_refused("throttled", username)
            raise UnauthenticatedError(f"too many login attempts for this account; try again in {wait_s} s")
        if not guards.hashing.verify(check.password_hash, password) or check.user_id is None:
            events.login_refused("wrong_credentials", username)
            if check.trusted and device_token:
                db.run(lambda tx: accounts.forget_device(tx, device_token))
            raise UnauthenticatedError(accounts.WRONG_CREDENTIALS)
    guards.by_username.succeeded(attempt, clear=True)
    guards.by_address.succeeded(peer, clear=False)  # a right login of one's own clears no guesses
    token = secrets.token_urlsafe(32)
    device = device_token if check.trusted and device_token else secrets.token_urlsafe(32)
    db.run(lambda tx: accounts.open_session(tx, role, username, check, token, device, policy))
    events.logged_in(username, check.user_id)
    return {"token": token, "user_id": check.user_id, "idle_timeout_s": policy.idle_s,
            "device_token": device}


def account_handlers(db: Database, role: str, policy: accounts.SessionPolicy,
                     guards: AccountGuards) -> dict[str, Any]:
    """The ops both servers have: ping, create_account, login, logout."""
    return {
        "ping": lambda: {"server": role, "version": __version__},
        "create_account": lambda peer, **a: create_account(db, role, guards, peer, **a),
        "login": lambda peer, **a: login(db, role, policy, guards, peer, **a),
        "logout": accounts.logout,
    }
