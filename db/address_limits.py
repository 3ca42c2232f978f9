"""Limits per client address, kept in this process's memory: sign-ups per address, and
failed logins per address and username and per address alone.

In memory, not in the database: they are checked on every sign-up and login before any
query, and an address's count only needs to slow that address down. With `--workers N`
each worker counts on its own, so an address gets up to N times the allowance.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from wire.errors import BusyError, UnauthenticatedError

from .login_throttle import ThrottlePolicy
from .passwords import HashingQueue

_MAX_KEYS = 100_000  # past this many addresses on record, those whose wait ran out are forgotten


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


class Backoff:
    """Failed attempts per key: past the free ones, the next must wait 1, 2, 4, ... s after
    the last. Each attempt counts itself before its password is checked, so attempts sent at
    once take turns; `succeeded` takes it back (or clears the key). `reason` names its
    refusals in the metrics and the security log."""

    def __init__(self, policy: ThrottlePolicy, message: str, reason: str) -> None:
        self._policy, self._message, self.reason = policy, message, reason
        self._lock = threading.Lock()
        self._counts: dict[Hashable, tuple[int, int]] = {}  # key: (failures, last attempt, ms)

    def claim(self, key: Hashable) -> int:
        """Count this attempt; the failures on record before it. UNAUTHENTICATED while it must wait."""
        now = _now_ms()
        with self._lock:
            failures, last_ms = self._counts.get(key, (0, now))
            wait_ms = last_ms + self._policy.delay_ms(failures) - now
            if wait_ms > 0:
                raise UnauthenticatedError(f"{self._message}; try again in {max(1, round(wait_ms / 1000))} s")
            if len(self._counts) >= _MAX_KEYS:
                self._forget_expired(now)
            self._counts[key] = (failures + 1, now)
        return failures

    def succeeded(self, key: Hashable, clear: bool) -> None:
        """A claimed attempt was right: clear the key's count, or take this attempt back."""
        with self._lock:
            failures, last_ms = self._counts.pop(key, (1, 0))
            if not clear and failures > 1:
                self._counts[key] = (failures - 1, last_ms)

    def _forget_expired(self, now: int) -> None:
        longest_ms = self._policy.max_delay_s * 1000
        self._counts = {key: value for key, value in self._counts.items() if value[1] > now - longest_ms}


class SignupLimit:
    """Sign-ups per address: `per_hour` at once, then one more each 3600 / per_hour s (a token
    bucket); BUSY past it. 0: no limit."""

    def __init__(self, per_hour: int) -> None:
        self.per_hour = per_hour
        self._lock = threading.Lock()
        self._buckets: dict[str | None, tuple[float, float]] = {}  # address: (tokens, when, s)

    def take(self, address: str | None) -> None:
        """One sign-up from the address, or BUSY saying how long to wait."""
        if self.per_hour <= 0:
            return
        now, rate = time.monotonic(), self.per_hour / 3600
        with self._lock:
            tokens, then = self._buckets.get(address, (float(self.per_hour), now))
            tokens = min(float(self.per_hour), tokens + (now - then) * rate)
            if tokens < 1:
                raise BusyError("too many new accounts from your address; "
                                f"try again in {max(1, round((1 - tokens) / rate))} s")
            if len(self._buckets) >= _MAX_KEYS:  # full buckets hold nothing worth keeping
                self._buckets = {a: b for a, b in self._buckets.items()
                                 if b[0] + (now - b[1]) * rate < self.per_hour}
            self._buckets[address] = (tokens - 1, now)


@dataclass(frozen=True)
class AccountGuards:
    """What stands before a sign-up's or a login's hash: its queue and the limits per address."""

    hashing: HashingQueue
    signups: SignupLimit
    by_username: Backoff  # failed logins per (address, role, username)
    by_address: Backoff  # failed logins per address, whatever the username

    @classmethod
    def for_settings(cls, settings: Any) -> AccountGuards:
        """The guards a server's settings (runtime.config.Settings) ask for."""
        return cls(HashingQueue.for_settings(settings), SignupLimit(settings.signups_per_address_hour),
                   Backoff(ThrottlePolicy(settings.login_free_failures, settings.login_max_delay_s),
                           "too many login attempts for this username", "throttled"),
                   Backoff(ThrottlePolicy(settings.login_address_free_failures, settings.login_max_delay_s),
                           "too many login attempts from your address", "address_throttled"))
