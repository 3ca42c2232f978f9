"""Commit tokens: whether a MySQL/MariaDB transaction whose COMMIT lost its answer committed.
Each write transaction writes a row of its own (a token) first; `committed` writes it again: a
duplicate key means it committed; if the write goes in, the transaction did not, and never can
(its own write would now fail). Should it still be running, the write waits for its row lock.
"""
from __future__ import annotations

import secrets
import time

from sqlalchemy import Connection, Engine, Integer, bindparam, delete, insert, select
from sqlalchemy.exc import IntegrityError

from .schema import commit_tokens

KEEP_MS = 5 * 60 * 1000  # a token is asked about within seconds of its COMMIT
TABLE = commit_tokens.name
BATCH = 2000  # tokens deleted per housekeeping transaction: one range of the primary key
WRITE_TOKEN = insert(commit_tokens).values(created_ms=bindparam("created_ms"), nonce=bindparam("nonce"))
_OLDEST = (select(commit_tokens.c.created_ms).where(commit_tokens.c.created_ms < bindparam("before"))
           .order_by(commit_tokens.c.created_ms).offset(bindparam("batch", type_=Integer)).limit(1))
_FORGET = delete(commit_tokens).where(commit_tokens.c.created_ms < bindparam("before"))


CommitToken = dict[str, int]  # WRITE_TOKEN's values


def new_token() -> CommitToken:
    """A transaction's token: when it began, and 63 random bits."""
    return {"created_ms": int(time.time() * 1000), "nonce": secrets.randbits(63)}


def committed(engine: Engine, token: CommitToken) -> bool:
    """Whether the transaction that wrote `token` committed; after this it never will if it
    has not. The database's errors are the caller's."""
    with engine.connect() as conn:
        try:
            with conn.begin():
                conn.execute(WRITE_TOKEN, token)
        except IntegrityError:
            return True
    return False


def forget_old_tokens(tx: Connection, now_ms: int, batch: int = BATCH) -> int:
    """Delete up to `batch` tokens older than KEEP_MS: a range at the start of the primary key
    (fewer when several share the millisecond at its end)."""
    before = now_ms - KEEP_MS
    bound = tx.execute(_OLDEST, {"before": before, "batch": batch}).scalar()
    return int(tx.execute(_FORGET, {"before": before if bound is None else bound}).rowcount)
