"""Housekeeping's SQL (run by runtime.housekeeping): expired sessions with their cart lines,
failed-login counts long past and old commit tokens go, in small batches: a batch's rows are
found without locks, then deleted by key only if they still qualify, so any number of processes
may sweep at once. Saved carts stay: they are the buyer's.
"""
from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Connection, delete, select, tuple_

from . import commit_tokens
from .accounts import SessionPolicy, end_sessions, ended_long_ago
from .database import Database, now_ms
from .schema import login_failures as lf
from .schema import sessions

BATCH = 200  # rows per transaction: a statement of bounded size and a lock held briefly
# A failed-login count untouched this long is forgotten (its wait ran out long before).
FORGET_FAILURES_AFTER_MS = 24 * 3600 * 1000


def end_expired_sessions(tx: Connection, policy: SessionPolicy, batch: int = BATCH) -> int:
    """Delete up to `batch` sessions that ended long ago, with their cart lines."""
    ended = ended_long_ago(policy, now_ms())
    # found without locks (a locking scan would wait on every live session a cart write holds)
    found = tx.execute(select(sessions.c.session_id).where(ended).order_by(sessions.c.session_id)
                       .limit(batch)).scalars().all()
    return end_sessions(tx, sessions.c.session_id.in_(found) & ended) if found else 0


def forget_old_failures(tx: Connection, batch: int = BATCH) -> int:
    """Delete up to `batch` failed-login counts untouched for FORGET_FAILURES_AFTER_MS."""
    old = lf.c.last_failure_ms < now_ms() - FORGET_FAILURES_AFTER_MS
    keys = tx.execute(select(lf.c.role, lf.c.username).where(old)
                      .order_by(lf.c.role, lf.c.username).limit(batch)).all()
    if not keys:
        return 0
    # by primary key, and only if still old: a failure meanwhile keeps its count
    return tx.execute(delete(lf).where(tuple_(lf.c.role, lf.c.username).in_([tuple(k) for k in keys]),
                                       old)).rowcount


def sweep(db: Database, policy: SessionPolicy, batch: int = BATCH,
          stop: Callable[[], bool] = lambda: False) -> int:
    """Every sweep, batch after batch until one deletes less than a full batch (another
    housekeeper took the rest, or none is left); the rows deleted."""
    deleted = 0
    token_batch = max(batch, commit_tokens.BATCH)  # one range of the key: cheap to delete
    for step, size in ((lambda tx: end_expired_sessions(tx, policy, batch), batch),
                       (lambda tx: forget_old_failures(tx, batch), batch),
                       (lambda tx: commit_tokens.forget_old_tokens(tx, now_ms(), token_batch), token_batch)):
        while not stop():
            count = db.run(step)
            deleted += count
            if count < size:
                break
    return deleted
