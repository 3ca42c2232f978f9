"""Accounts and sessions: the SQL of sign-up, login and logout, and the token check of every call.
Only a token's SHA-256 is stored. A session ends at logout, after `idle_s` without a request, or
`max_s` after login; its last-seen is written at most every `touch_interval_ms`.
"""
from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    FromClause,
    Select,
    bindparam,
    delete,
    insert,
    literal,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError

from wire.errors import ConflictError, ForbiddenError, ProtocolError, UnauthenticatedError

from . import login_throttle
from .database import Database, now_ms
from .engine import LOCK_WAIT_S
from .schema import cart_lines, device_tokens, saved_cart_lines, sessions, suspensions, users
from .unit_of_work import UnitOfWork

log = logging.getLogger("market.sessions")
WRONG_CREDENTIALS = "wrong username or password"
SUSPENDED = "this account is suspended; contact the marketplace's support"
# How long after its end a session's row is kept: a read accepted at the session's last
# moment may run that long (a lock waited for, twice over) before it writes last-seen.
CLEANUP_GRACE_MS = 2 * LOCK_WAIT_S * 1000


@dataclass(frozen=True)
class LiveSession:
    """A session whose token was checked: who is calling."""

    session_id: int
    user_id: int


@dataclass(frozen=True)
class SessionPolicy:
    idle_s: int = 300
    max_s: int = 86400

    @classmethod
    def from_settings(cls, settings: Any) -> SessionPolicy:
        """The policy a server's settings (runtime.config.Settings) ask for."""
        return cls(settings.session_idle_s, settings.session_max_s)

    @property
    def touch_interval_ms(self) -> int:
        """How stale last-seen may get before it is written again."""
        return int(min(5.0, self.idle_s / 10) * 1000)

    def expired(self, now: int, created_ms: int, last_seen_ms: int) -> bool:
        """Whether a session has ended: idle over `idle_s` (and last-seen's lag), or `max_s` old."""
        return (now - last_seen_ms > self.idle_s * 1000 + self.touch_interval_ms
                or now - created_ms > self.max_s * 1000)

    def touch_due(self, now: int, last_seen_ms: int) -> bool:
        """Whether last-seen is stale enough to be written again."""
        return now - last_seen_ms >= self.touch_interval_ms

    def ended_before(self, now: int) -> tuple[int, int]:
        """(last-seen, login) before which a session ended over CLEANUP_GRACE_MS ago."""
        return (now - (self.idle_s * 1000 + self.touch_interval_ms + CLEANUP_GRACE_MS),
                now - (self.max_s * 1000 + CLEANUP_GRACE_MS))


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


MAX_SESSIONS = 20  # live sessions per account (PROTOCOL.md): a login beyond ends the oldest
MAX_DEVICE_TOKENS = 20  # device tokens kept per account: a new one past it forgets the oldest


@dataclass(frozen=True)
class LoginCheck:
    """What a login learns before its password is checked."""

    user_id: int | None  # None: no such account (a hash is checked all the same)
    password_hash: str | None
    trusted: bool  # it presented a device token of this account
    wait_ms: int  # > 0: the account's throttle refused it, without checking its password


def add_user(db: Database, role: str, username: str, name: str, password_hash: str) -> int:
    """A new account's user_id; CONFLICT when the username is taken."""
    row = {"role": role, "username": username, "name": name, "password_hash": password_hash,
           "created_ms": now_ms()}
    try:
        return db.run(lambda tx: int(tx.execute(insert(users).values(row)).lastrowid))
    except IntegrityError:
        raise ConflictError(f"username {username!r} is taken") from None


_DEVICE = (device_tokens.c.user_id == users.c.user_id) & (device_tokens.c.token_hash == bindparam("device"))
_LOGIN = (select(users.c.user_id, users.c.password_hash, device_tokens.c.token_hash)
          .outerjoin(device_tokens, _DEVICE)
          .where(users.c.role == bindparam("role"), users.c.username == bindparam("username")))
# The user's row held shared to the commit: a suspension (operate.admin) locks it before it ends the
# user's sessions, so a login either sees the suspension or made its session before the end.
_SUSPENSION = (select(users.c.user_id, suspensions.c.suspended_ms)
               .outerjoin(suspensions, suspensions.c.user_id == users.c.user_id)
               .where(users.c.user_id == bindparam("user_id")).with_for_update(read=True))


def check_login(tx: Connection, bucket: login_throttle.AccountBucket, role: str, username: str,
                device_token: str | None, lane: int) -> LoginCheck:
    """The account, whether the device token is its own, and (without one) the attempt
    counted by the account's throttle, or the wait it says."""
    row = tx.execute(_LOGIN, {"role": role, "username": username,
                              "device": token_hash(device_token) if device_token else ""}).first()
    trusted = row is not None and row.token_hash is not None
    wait_ms = 0 if trusted else login_throttle.claim(tx, bucket, role, username, lane)
    return LoginCheck(row.user_id if row else None, row.password_hash if row else None, trusted, wait_ms)


def forget_device(tx: Connection, device_token: str) -> None:
    """A device token that came with a wrong password is no longer trusted."""
    tx.execute(delete(device_tokens).where(device_tokens.c.token_hash == token_hash(device_token)))


def open_session(tx: Connection, role: str, username: str, check: LoginCheck, token: str,
                 device_token: str, policy: SessionPolicy) -> None:
    """The session of a right login, ending the account's oldest past MAX_SESSIONS; a device
    token new to the account (not `check.trusted`) is kept."""
    assert check.user_id is not None
    now = now_ms()
    _end_old_sessions(tx, check.user_id, policy, now)  # sessions locked before the user's row
    suspension = tx.execute(_SUSPENSION, {"user_id": check.user_id}).first()
    if suspension is None:  # removed since its password was checked (market admin purge-test-data)
        raise UnauthenticatedError(WRONG_CREDENTIALS)
    if suspension.suspended_ms is not None:
        raise ForbiddenError(SUSPENDED)
    if not check.trusted:
        login_throttle.give_back(tx, role, username)
        _keep_device(tx, check.user_id, device_token, now)
    session_id = int(tx.execute(insert(sessions).values(
        token_hash=token_hash(token), user_id=check.user_id, role=role, created_ms=now, last_seen_ms=now,
    )).lastrowid)
    if role == "buyer":  # at most MAX_CART_LINES: a saved cart is a session's cart saved
        tx.execute(insert(cart_lines).from_select(
            ["session_id", "item_id", "quantity"],
            select(literal(session_id), saved_cart_lines.c.item_id, saved_cart_lines.c.quantity)
            .where(saved_cart_lines.c.buyer_id == check.user_id)))


def _keep_device(tx: Connection, user_id: int, device_token: str, now: int) -> None:
    tx.execute(insert(device_tokens).values(token_hash=token_hash(device_token), user_id=user_id,
                                            created_ms=now))
    oldest = tx.execute(select(device_tokens.c.token_hash).where(device_tokens.c.user_id == user_id)
                        .order_by(device_tokens.c.created_ms.desc(), device_tokens.c.token_hash)
                        .offset(MAX_DEVICE_TOKENS)).scalars().all()
    if oldest:
        tx.execute(delete(device_tokens).where(device_tokens.c.token_hash.in_(oldest)))


def _end_old_sessions(tx: Connection, user_id: int, policy: SessionPolicy, now: int) -> None:
    """End the account's sessions that ended long ago, and its oldest past MAX_SESSIONS - 1: found
    without locks, then locked by key and checked again, so a session just used stays."""
    ended = ended_long_ago(policy, now)
    found = tx.execute(select(sessions.c.session_id, ended.label("ended"))
                       .where(sessions.c.user_id == user_id)
                       .order_by(sessions.c.session_id.desc())).all()
    candidates, over = sessions_to_end(found)
    if candidates:
        end_sessions(tx, sessions.c.session_id.in_(candidates) & (ended | sessions.c.session_id.in_(over)))


def sessions_to_end(found: Sequence[Any]) -> tuple[list[int], list[int]]:
    """Of an account's sessions (session_id, ended), newest first, those a login ends: the ended,
    and the live past the MAX_SESSIONS - 1 newest (also returned alone)."""
    over = [row.session_id for row in found if not row.ended][MAX_SESSIONS - 1:]
    return [row.session_id for row in found if row.ended] + over, over


def ended_long_ago(policy: SessionPolicy, now: int) -> ColumnElement[bool]:
    """Sessions that ended over CLEANUP_GRACE_MS ago, whose rows may go."""
    seen_before, created_before = policy.ended_before(now)
    return (sessions.c.last_seen_ms < seen_before) | (sessions.c.created_ms < created_before)


def end_sessions(tx: Connection, condition: ColumnElement[bool]) -> int:
    """Delete the sessions that meet `condition` with their cart lines (locked in key order); how many."""
    ids = tx.execute(select(sessions.c.session_id).where(condition)
                     .order_by(sessions.c.session_id).with_for_update()).scalars().all()
    if ids:
        _delete_sessions(tx, ids)
    return len(ids)


def _delete_sessions(tx: Any, ids: Sequence[int]) -> None:
    tx.execute(delete(cart_lines).where(cart_lines.c.session_id.in_(ids)))
    tx.execute(delete(sessions).where(sessions.c.session_id.in_(ids)))


def logout(tx: UnitOfWork, session: Session) -> dict[str, Any]:
    """End the session at once; its cart goes with it."""
    _delete_sessions(tx, [session.lock().session_id])  # after any cart change of the session in flight
    return {}


SESSION_COLUMNS = (sessions.c.session_id, sessions.c.user_id.label("session_user_id"),
                   sessions.c.created_ms.label("session_created_ms"),
                   sessions.c.last_seen_ms.label("session_last_seen_ms"))
_TOKEN_MATCHES = (sessions.c.token_hash == bindparam("token_hash")) & (sessions.c.role == bindparam("role"))
_SESSION_BY_TOKEN = select(*SESSION_COLUMNS).where(_TOKEN_MATCHES)
_LOCKED_SESSION_BY_TOKEN = _SESSION_BY_TOKEN.with_for_update()
_TOUCH = (update(sessions).where(sessions.c.session_id == bindparam("id"))
          .values(last_seen_ms=bindparam("now")))


def with_session(*columns: Any, joined: FromClause, on: ColumnElement[bool]) -> Select[Any]:
    """SELECT the caller's session and `columns` FROM sessions JOIN `joined` ON `on`: the token check
    in an op's query (run with Session.check_params, rows to accept_rows). An inner join: with a
    LEFT JOIN MariaDB sorted instead of reading an index in ORDER BY order up to the LIMIT."""
    return (select(*SESSION_COLUMNS, *columns)
            .select_from(sessions.join(joined, on)).where(_TOKEN_MATCHES))


class Session:
    """The caller of a private op, as its token says; checked once per transaction, at the first
    use of `user_id` or `session_id` (one query), or in the op's own query (with_session)."""

    def __init__(self, tx: UnitOfWork, role: str, token: str, policy: SessionPolicy, touch: bool) -> None:
        self._tx, self._policy, self._touch = tx, policy, touch
        self.check_params = {"token_hash": token_hash(token), "role": role}
        self.live: LiveSession | None = None
        self.stale = False  # last-seen is due to be written (a write does, in its transaction)

    @property
    def user_id(self) -> int:
        return self.require().user_id

    @property
    def session_id(self) -> int:
        return self.require().session_id

    def require(self) -> LiveSession:
        """The live session, checking the token now if no query has yet; else UNAUTHENTICATED."""
        if self.live is None:
            return self.accept(self._tx.execute(_SESSION_BY_TOKEN, self.check_params).first())
        return self.live

    def lock(self) -> LiveSession:
        """The live session, its row locked to the transaction's end, so that writes that change its
        cart or end it take turns; locked first, before the buyer's row and the items'."""
        assert self.live is None, "lock the session before any other use of it"
        return self.accept(self._tx.execute(_LOCKED_SESSION_BY_TOKEN, self.check_params).first())

    def accept_rows(self, rows: Sequence[Any]) -> Sequence[Any]:
        """The rows of a with_session query, once its session columns passed the check (no rows:
        no such session or no such data, so the token is checked alone)."""
        if rows:
            self.accept(rows[0])
        else:
            self.require()
        return rows

    def accept(self, row: Any | None) -> LiveSession:
        """Check the SESSION_COLUMNS of a row found by the token (None: not found)."""
        if row is None:
            raise UnauthenticatedError("unknown or logged-out session; log in again")
        now = now_ms()
        if self._policy.expired(now, row.session_created_ms, row.session_last_seen_ms):
            raise UnauthenticatedError("session expired; log in again")
        self.stale = self._policy.touch_due(now, row.session_last_seen_ms)
        self.live = LiveSession(row.session_id, row.session_user_id)
        if self.stale and self._touch:
            touch_session(self._tx, self.live.session_id)
        return self.live


def touch_session(tx: UnitOfWork, session_id: int) -> None:
    tx.execute(_TOUCH, {"id": session_id, "now": now_ms()})


class SessionGate:
    """Runs a private op: the token check and the op in one transaction."""

    def __init__(self, db: Database, role: str, policy: SessionPolicy) -> None:
        self.db, self.role, self.policy = db, role, policy

    def run(self, token: str, write: bool, work: Callable[[UnitOfWork, Session], Any]) -> Any:
        """`work(tx, session)` for the token's live session, else UNAUTHENTICATED, before every other
        error: no answer leaves before the token was checked. A write also writes last-seen."""
        sessions_seen: list[Session] = []

        def transaction(tx: UnitOfWork) -> Any:
            session = Session(tx, self.role, token, self.policy, touch=write)
            sessions_seen.append(session)
            try:
                result = work(tx, session)
            except ProtocolError:
                session.require()
                raise
            session.require()
            return result

        try:
            result: Any = self.db.run(transaction, write=write)
        except ProtocolError:  # activity too; a write's own touch was rolled back with it
            self._touch_if_due(sessions_seen)
            raise
        if not write:  # a write touched it in its transaction
            self._touch_if_due(sessions_seen)
        return result

    def _touch_if_due(self, sessions_seen: list[Session]) -> None:
        """Write last-seen in a transaction of its own, if due. Best effort: should it fail, the
        request's answer stands, and the session's next request tries again."""
        if not sessions_seen or not sessions_seen[-1].stale:  # stale: its token passed
            return
        session_id = sessions_seen[-1].session_id
        try:
            self.db.run(lambda tx: touch_session(tx, session_id))
        except ProtocolError as exc:
            log.warning("could not record a session's activity: %s", exc)
