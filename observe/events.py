"""Events of the data layer and the ops worth a count or a security log line: refused logins,
transactions run again, card charges, database connections in use. One function each, so
the code that sees the event spends one line on it.
"""
from __future__ import annotations

from . import metrics
from .logs import security


def login_refused(reason: str, username: str) -> None:
    """A login refused: "wrong_credentials" or "throttled" (the client's address comes from
    the request's log context)."""
    metrics.LOGINS_REFUSED.labels(reason).inc()
    security.warning("login throttled" if reason == "throttled" else "login failed",
                     extra={"username": username[:64], "reason": reason})


def transaction_retried(cause: str) -> None:
    """A transaction given another go ("deadlock", "reconnect", "conflict") or given up on a
    lock wait ("lock_wait")."""
    metrics.DB_RETRIES.labels(cause).inc()


def payment(outcome: str) -> None:
    """A card charge's outcome: "approved", "declined" or "error"."""
    metrics.PAYMENTS.labels(outcome).inc()


def db_connections_in_use(delta: int) -> None:
    """A database connection was taken (+1) for a transaction or given back (-1)."""
    metrics.DB_CONNECTIONS_IN_USE.inc(delta)
