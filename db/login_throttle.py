"""The account's throttle against password guessing from many addresses (docs/design.md,
"Passwords and logins"), in the database so that every server process sees the same level: a
leaky bucket per (role, username), existing or not, which each login without a device token of
the account fills by one before its password is checked, and a right password empties by one.
"""
from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, bindparam, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from .database import RetryTransaction, now_ms
from .schema import login_failures as lf


@dataclass(frozen=True)
class AccountBucket:
    """The account's bucket: `burst` places, one drained every `step_s`."""

    burst: int = 5
    step_s: float = 1.25

    def kept(self, lane: int) -> int:
        """The places a login of the lane leaves: none coming back when told, a fifth from an
        address new to the username, about three fifths from one whose password was wrong."""
        return (0, self.burst // 5, (self.burst - 1) * 3 // 5)[lane]

    def level(self, units: int, last_ms: int, now: int) -> int:
        """The units left in the bucket at `now` of `units` put in by `last_ms`."""
        return max(0, min(self.burst, units) - (now - last_ms) // self.step_ms)

    @property
    def step_ms(self) -> int:
        return max(1, int(self.step_s * 1000))

    def wait_ms(self, units: int, last_ms: int, now: int, lane: int) -> int:
        """0 when one more unit fits now; else how long until it does."""
        over = self.level(units, last_ms, now) + 1 + self.kept(lane) - self.burst
        if over <= 0:
            return 0
        return over * self.step_ms - (now - last_ms) % self.step_ms

    def claim(self, units: int, last_ms: int, now: int, lane: int) -> tuple[int, int]:
        """(0, the units with this attempt's) when it fits now; else (how long to wait, `units`)."""
        wait_ms = self.wait_ms(units, last_ms, now, lane)
        return (wait_ms, units) if wait_ms else (0, self.level(units, last_ms, now) + 1)


_FAILURES = select(lf.c.failures, lf.c.last_failure_ms).where(
    lf.c.role == bindparam("role"), lf.c.username == bindparam("username")).with_for_update()


COMING_BACK, NEW, FAILED = 0, 1, 2  # the lanes


def claim(tx: Connection, bucket: AccountBucket, role: str, username: str, lane: int) -> int:
    """Put this attempt's unit in the account's bucket, under its row's lock (attempts made
    at once take turns); 0, or how many ms to wait when there is no room for it."""
    key = {"role": role, "username": username}
    row = tx.execute(_FAILURES, key).first()
    now = now_ms()
    if row is None:
        try:
            tx.execute(insert(lf).values(**key, failures=1, last_failure_ms=now))
        except IntegrityError:
            raise RetryTransaction from None  # another attempt counted itself at the same moment
        return 0
    wait_ms, units = bucket.claim(row.failures, row.last_failure_ms, now, lane)
    if wait_ms == 0:
        tx.execute(update(lf).where((lf.c.role == role) & (lf.c.username == username))
                   .values(failures=units, last_failure_ms=now))
    return wait_ms


def give_back(tx: Connection, role: str, username: str) -> None:
    """Take a right login's unit back out of the account's bucket (the row goes with the last)."""
    key = (lf.c.role == role) & (lf.c.username == username)
    if not tx.execute(delete(lf).where(key & (lf.c.failures <= 1))).rowcount:
        tx.execute(update(lf).where(key).values(failures=lf.c.failures - 1))
