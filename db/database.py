"""Running transactions: retries on deadlocks and lock timeouts, and database errors turned into
the protocol's UNAVAILABLE / BUSY in one place. A transaction is a function of a unit of work,
run again when the database asks for a retry, so it does all its work through `tx`; one whose
connection is lost at its COMMIT is not simply run again (db.commit_tokens).
"""
from __future__ import annotations

import logging
import random
import sqlite3
import time
from collections.abc import Callable
from typing import Any, TypeVar, overload

from sqlalchemy import inspect
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from observe import events
from wire.errors import BusyError, ProtocolError, UnavailableError

from . import commit_tokens
from .commit_tokens import CommitToken, new_token
from .connections import DriverConnection
from .engine import LOCK_WAIT_S, SqliteLimits, WalKeeper, connect_timeout_s, is_sqlite, make_engine
from .unit_of_work import Answer, CommitUnanswered, ReplayUnheld, UnitOfWork

T = TypeVar("T")
ALL_IN_USE = "every database connection is in use; try again"
log = logging.getLogger("market.db")
MAX_ATTEMPTS = 8
_DEADLOCK_ERRNOS = {1213}  # retried (Galera's certification failures arrive as these too)
_LOCK_WAIT_ERRNOS = {1205}  # waited LOCK_WAIT_S already: BUSY, not another wait
# Cannot connect or lost the connection; two from a Galera node outside its cluster's
# primary component: 1047 (not ready for clients) and 1180 (a commit it could not replicate,
# rolled back); and a server in read-only mode (1290: a replica, say, during a failover).
_UNAVAILABLE_ERRNOS = {1040, 1047, 1053, 1180, 1290, 2002, 2003, 2005, 2006, 2013, 2055}
# At start: no server at that address, no such host, no answer within the connect timeout
# (2013), access denied, no such database, no right to write (1142), a read-only server (1290)
_UNUSABLE_ERRNOS = {1044, 1045, 1049, 1142, 1290, 1698, 2002, 2003, 2005, 2013}
# SQLite: the disk is full, the file cannot be read, written or opened (SQLite has rolled
# the transaction back: nothing was changed)
_SQLITE_UNAVAILABLE = {sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_READONLY,
                       sqlite3.SQLITE_CANTOPEN}
_LOCK_WAITED = f"waited {LOCK_WAIT_S} s for a lock another request held; nothing was changed; try again"
_OUTCOME_UNKNOWN = ("the database went away while the change was being committed, and has not come back "
                    "to say whether it was made: look before making it again")
_MADE_UNREAD = ("the change was made, but the database went away before its result could be read: "
                "look before making it again")
_MAYBE_MADE = ("the database cannot be reached, and may have gone away after making the change: "
               "look before making it again")


class RetryTransaction(Exception):
    """Raised inside a transaction to roll it back and run it again."""


class DatabaseUnusable(RuntimeError):
    """The database cannot be used at all (found at start): the message says why, in one line."""


def now_ms() -> int:
    return int(time.time() * 1000)


class Database:
    def __init__(self, url: str, pool_size: int = 16, sqlite_synchronous: str = "NORMAL",
                 sqlite_limits: SqliteLimits = SqliteLimits()) -> None:
        self.url = url
        # How long a call waits out a database that went away (tests shorten it): a restart
        # takes a few seconds, and the answer must reach the client within its 30 s.
        self.away_s = 6.5
        self.engine = make_engine(url, pool_size, sqlite_synchronous, sqlite_limits)
        self.is_sqlite = is_sqlite(self.engine)
        path = self.engine.url.database or ":memory:"  # a WAL keeper for a file named by its plain path
        plain_file = self.is_sqlite and path != ":memory:" and not path.startswith("file:")
        self._wal = WalKeeper(path, sqlite_limits) if plain_file else None
        self._has_tokens: bool | None = None  # the commit_tokens table exists (None: not looked yet)

    def close(self) -> None:
        if self._wal is not None:
            self._wal.close()
        self.engine.dispose()

    @overload
    def run(self, work: Callable[[Any], Answer[T]], *, write: bool = True, idempotent: bool = False) -> T: ...

    @overload
    def run(self, work: Callable[[Any], T], *, write: bool = True, idempotent: bool = False) -> T: ...

    def run(self, work: Callable[[Any], Any], *, write: bool = True, idempotent: bool = False) -> Any:
        """Run `work(tx)` (tx a UnitOfWork) in one transaction; a function that returns
        `tx.answer(...)` gets back that answer's shaped rows. `idempotent` (running it twice ends
        as running it once): no commit token; while the database is away it runs again, for up
        to `away_s`, then UNAVAILABLE saying that whether it was made is not known."""
        if idempotent and not self.is_sqlite:  # SQLite: in the process, nothing to lose on the way
            returned = _while_away(lambda: self._run(work, write, tokened=False), _MAYBE_MADE,
                                   time.monotonic() + self.away_s,
                                   away=lambda exc: isinstance(exc, UnavailableError) or (
                                       isinstance(exc, DBAPIError) and exc.connection_invalidated),
                                   retrying=lambda: events.transaction_retried("reconnect"))
        else:
            returned = self._run(work, write, tokened=write)
        # an Answer's rows shaped once committed, outside the retries: nothing runs twice
        return returned.shape(returned.result.all()) if isinstance(returned, Answer) else returned

    def _run(self, work: Callable[[Any], T], write: bool, tokened: bool) -> T:
        hold = True  # the unit of work holds writes back, until one fails (ReplayUnheld)
        for attempt in range(MAX_ATTEMPTS):
            progress = [0]  # statements that reached the database in this attempt
            try:
                return self._run_once(work, write, tokened, hold, progress)
            except ReplayUnheld:
                hold = False
            except CommitUnanswered as unanswered:
                asked_until = time.monotonic() + self.away_s  # the question and any answer read again
                if self._committed(unanswered.token, asked_until):
                    if isinstance(unanswered.result, Answer) and not unanswered.result.result.filled:
                        self._read_again(unanswered.result, asked_until)
                    return unanswered.result  # type: ignore[no-any-return]
                events.transaction_retried("commit_lost")  # it did not commit, and never will: again
            except RetryTransaction:
                events.transaction_retried("conflict")
            except IntegrityError:
                raise
            except PoolTimeoutError:
                raise BusyError(ALL_IN_USE) from None
            except DBAPIError as exc:
                if exc.connection_invalidated:  # the database restarted, most likely: all died
                    self.engine.dispose(close=False)
                    if progress[0] == 0 and attempt == 0:
                        events.transaction_retried("reconnect")
                        continue  # nothing ran yet: run it on a fresh connection
                if _is_unavailable(exc):
                    log.warning("database unavailable: %s", exc.orig)
                    raise UnavailableError("the database cannot be reached; nothing was changed") from None
                if _is_lock_wait_timeout(exc):
                    events.transaction_retried("lock_wait")
                    log.warning("waited %d s for a lock: %s", LOCK_WAIT_S, exc.orig)
                    raise BusyError(_LOCK_WAITED) from None
                if not _is_deadlock(exc):
                    raise
                events.transaction_retried("deadlock")
            time.sleep(random.uniform(0, 0.002 * 2**attempt))
        raise BusyError("the database is too busy to finish this; nothing was changed")

    def _run_once(self, work: Callable[[Any], T], write: bool, tokened: bool, hold: bool,
                  sent: list[int]) -> T:
        token = new_token() if tokened and self._writes_tokens() else None
        conn = DriverConnection(self.engine)
        events.db_connections_in_use(1)
        tx = UnitOfWork(conn, write, hold, token)
        try:
            return _transaction(tx, work)
        except DBAPIError as exc:
            if _is_unavailable(exc) and conn.usable:  # say, a node out of its cluster: connect anew
                conn.usable = False
                conn.proxied.invalidate()
            raise
        finally:
            sent[0] = tx.sent
            conn.give_back()
            events.db_connections_in_use(-1)

    def _read_again(self, answer: Answer[Any], until: float) -> None:
        """Fill an answer whose COMMIT, found made, lost its rows, by making its read again until
        `until` (then UNAVAILABLE saying that the change was made)."""
        def read() -> list[Any]:
            return self._run(lambda tx: tx.execute(answer.statement, answer.params).all(), False, False)

        rows = _while_away(read, _MADE_UNREAD, until,
                           away=lambda exc: isinstance(exc, ProtocolError | DBAPIError),
                           noticed="could not read the answer of a commit made", retryable=False)
        answer.result.fill(rows, len(rows), None)

    def _writes_tokens(self) -> bool:
        """Whether write transactions write a commit token: on MySQL/MariaDB (SQLite's COMMIT runs
        in the process), once the database has the table (the ledger's own database has not)."""
        if self._has_tokens is None:
            self._has_tokens = not self.is_sqlite and inspect(self.engine).has_table(commit_tokens.TABLE)
        return self._has_tokens

    def _committed(self, token: CommitToken, until: float) -> bool:
        """Whether the transaction that wrote `token` committed, asked on a fresh connection while
        the database is away (until `until`); then UNAVAILABLE saying that it is not known."""
        self.engine.dispose(close=False)  # the lost connection's siblings are suspect too
        return _while_away(lambda: commit_tokens.committed(self.engine, token), _OUTCOME_UNKNOWN, until,
                           away=lambda exc: isinstance(exc, DBAPIError | PoolTimeoutError),
                           noticed="could not ask whether a commit went through", retryable=False)

    def schema_changed(self) -> None:
        """The schema was upgraded: look again for the tables this class uses."""
        self._has_tokens = None

    @property
    def where(self) -> str:
        """The database's URL as the user wrote it, without its password."""
        return make_url(self.url).render_as_string(hide_password=True)

    def unusable_reason(self, exc: DBAPIError) -> str | None:
        """One line on why the database cannot be used at all (at start), or None if it can."""
        if _errno(exc) not in _UNUSABLE_ERRNOS and _sqlite_error(exc) not in _SQLITE_UNAVAILABLE:
            return None
        reason = " ".join(str(exc.orig).split())
        if _errno(exc) == 2013:
            reason += f" (no answer within the {connect_timeout_s(self.engine.url)} s connect timeout)"
        if _errno(exc) == 1049:
            reason += (f"; create it first: CREATE DATABASE {self.engine.url.database} "
                       "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        return f"cannot use the database {self.where}: {reason}"


def _while_away(call: Callable[[], T], gave_up: str, until: float, away: Callable[[Exception], bool],
                noticed: str | None = None, retrying: Callable[[], None] = lambda: None,
                retryable: bool = True) -> T:
    """`call()`, made again after pauses (0.1 s, doubling) while it fails as `away` says the
    database is, until `until`; then UNAVAILABLE saying `gave_up`."""
    pause = 0.1
    while True:
        try:
            return call()
        except Exception as exc:
            if not away(exc):
                raise
            if noticed:
                log.warning("%s: %s", noticed, getattr(exc, "orig", exc))
        if time.monotonic() + pause > until:
            raise UnavailableError(gave_up, retryable=retryable) from None
        retrying()
        time.sleep(pause)
        pause *= 2


def _transaction(tx: UnitOfWork, work: Callable[[Any], T]) -> T:
    """BEGIN, `work(tx)`, COMMIT; a failure rolls back (a lost COMMIT keeps what the work
    returned, which stands should its token say it committed)."""
    try:
        tx.begin()
        result = work(tx)
        tx.commit()
        return result
    except BaseException as failure:
        try:
            tx.rollback()
        except DBAPIError as exc:  # a connection that died meanwhile is the first error's story
            log.debug("rollback failed: %s", exc.orig)
        if isinstance(failure, CommitUnanswered):
            failure.result = result
        raise


def _errno(exc: DBAPIError) -> int | None:
    return getattr(exc.orig, "errno", None)


def _is_deadlock(exc: DBAPIError) -> bool:
    return _errno(exc) in _DEADLOCK_ERRNOS or "deadlock" in str(exc.orig).lower()


def _is_lock_wait_timeout(exc: DBAPIError) -> bool:
    """MySQL's lock wait timeout, or SQLite's 'database is locked' once its busy timeout ran out."""
    return _errno(exc) in _LOCK_WAIT_ERRNOS or "database is locked" in str(exc.orig)


def _sqlite_error(exc: DBAPIError) -> int | None:
    """SQLite's primary result code (SQLITE_IOERR for all its extended ones), if SQLite's."""
    code = getattr(exc.orig, "sqlite_errorcode", None)
    return None if code is None else code & 0xFF


def _is_unavailable(exc: DBAPIError) -> bool:
    return exc.connection_invalidated or _errno(exc) in _UNAVAILABLE_ERRNOS or \
        _sqlite_error(exc) in _SQLITE_UNAVAILABLE
