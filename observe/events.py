"""Events of the data layer and the ops worth a count or a log line, one function each."""
from __future__ import annotations

from . import metrics, tracing
from .logs import Bursts, business, security

# Refusals that cost the server nothing (no hash) come in floods: a line a second of each
# reason, counting what it stands for. A wrong password cost a hash: each has its line.
_bursts = Bursts()
_LOGIN_MESSAGES = {"wrong_credentials": "login failed", "throttled": "login throttled",
                   "address_throttled": "login throttled", "busy": "login refused",
                   "address_busy": "login refused"}


def login_refused(reason: str, username: str) -> None:
    """A login refused, for `reason` (a key of _LOGIN_MESSAGES)."""
    metrics.LOGINS_REFUSED.labels(metrics.server, reason).inc()
    events = 1 if reason == "wrong_credentials" else _bursts.due(f"login {reason}")
    if events:
        security.warning(_LOGIN_MESSAGES.get(reason, "login refused"),
                         extra={"username": username[:64], "reason": reason, "events": events})


def signup_refused(reason: str, username: str) -> None:
    """A sign-up refused: "address_limit", "busy" or "address_busy"."""
    metrics.SIGNUPS_REFUSED.labels(metrics.server, reason).inc()
    if events := _bursts.due(f"sign-up {reason}"):
        security.warning("sign-up refused", extra={"username": username[:64], "reason": reason,
                                                   "events": events})


def transaction_retried(cause: str) -> None:
    """A transaction given another go ("deadlock", "reconnect", "conflict", "commit_lost") or
    given up on a lock wait ("lock_wait")."""
    metrics.DB_RETRIES.labels(metrics.server, cause).inc()


def payment(outcome: str, order_id: int, buyer_id: int, amount_cents: int) -> None:
    """A card authorised for an order: "approved", "declined" or "error" (no card data is logged)."""
    metrics.PAYMENTS.labels(metrics.server, outcome).inc()
    business.info("payment %s", outcome, extra={"outcome": outcome, "order_id": order_id,
                                                "user_id": buyer_id, "amount_cents": amount_cents})


def signed_up(username: str, user_id: int) -> None:
    """A new account."""
    business.info("signed up", extra={"username": username[:64], "user_id": user_id})


def logged_in(username: str, user_id: int) -> None:
    """A new session."""
    business.info("logged in", extra={"username": username[:64], "user_id": user_id})


def purchased(order_id: int, buyer_id: int) -> None:
    """An order paid and complete."""
    business.info("purchase completed", extra={"order_id": order_id, "user_id": buyer_id})


def db_connections_in_use(delta: int) -> None:
    """A database connection was taken (+1) for a transaction or given back (-1)."""
    if metrics.served:
        metrics.DB_CONNECTIONS_IN_USE.labels(metrics.server).inc(delta)
    tracing.transaction(delta)


def settlement_due(orders: int) -> None:
    """The settler's pass found `orders` orders pending past their time."""
    metrics.SETTLEMENT_DUE.labels(metrics.server).set(orders)
