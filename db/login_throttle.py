"""Login backoff per account against password guessing from many addresses, kept in the
database so that every server process sees the same count (db.address_limits slows down
each address first).

After `free_failures` consecutive failed logins for one username (existing or not,
so the answer reveals nothing), each further attempt from an address that failed for it
before must wait 1, 2, 4, ... seconds after the last failure, up to `max_delay_s`; until
then even the right password is refused, without checking it. Every attempt counts as a
failure before its password is checked (so that attempts made at once take turns); a
successful login clears the count. Nobody is locked out for longer than `max_delay_s`
after their last failed attempt.
"""
from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, bindparam, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from wire.errors import UnauthenticatedError

from .database import RetryTransaction, now_ms
from .schema import login_failures as lf


@dataclass(frozen=True)
class ThrottlePolicy:
    """How failed logins slow down the next ones."""

    free_failures: int = 5
    max_delay_s: float = 900.0

    def delay_ms(self, failures: int) -> int:
        """How long after the last failure the next attempt must wait."""
        if failures < self.free_failures:
            return 0
        doublings = min(failures - self.free_failures, 64)  # 2.0 ** 1024 is an OverflowError
        return int(min(self.max_delay_s, 2.0 ** doublings) * 1000)


_FAILURES = select(lf.c.failures, lf.c.last_failure_ms).where(
    lf.c.role == bindparam("role"), lf.c.username == bindparam("username")).with_for_update()


def claim_attempt(tx: Connection, policy: ThrottlePolicy, role: str, username: str,
                  enforce: bool = True) -> None:
    """Count this attempt as a failure before its password is checked (a successful login
    clears the count), or UNAUTHENTICATED, with the wait, while the username must wait and
    `enforce` says to (an attempt from an address with no failures for it is let through).

    Counted first, under the row's lock, so that attempts made at once take turns: checked
    first and counted after the hash, a hundred guesses sent together all passed the check.
    The price: an attempt in flight counts, so past the free failures a right login made at
    the same moment as another may be told to wait.
    """
    key = {"role": role, "username": username}
    row = tx.execute(_FAILURES, key).first()
    now = now_ms()
    if row is None:
        try:
            tx.execute(insert(lf).values(**key, failures=1, last_failure_ms=now))
        except IntegrityError:
            raise RetryTransaction from None  # another attempt counted itself at the same moment
        return
    wait_ms = row.last_failure_ms + policy.delay_ms(row.failures) - now
    if wait_ms > 0 and enforce:
        raise UnauthenticatedError("too many login attempts for this username; "
                                   f"try again in {max(1, round(wait_ms / 1000))} s")
    tx.execute(update(lf).where((lf.c.role == role) & (lf.c.username == username))
               .values(failures=lf.c.failures + 1, last_failure_ms=now))


def clear_failures(tx: Connection, role: str, username: str) -> None:
    """Forget failed logins after a successful one."""
    tx.execute(delete(lf).where((lf.c.role == role) & (lf.c.username == username)))
