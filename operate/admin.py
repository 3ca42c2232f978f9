"""The operator's actions (`market admin`), each one transaction that also writes its row of
admin_actions, so the log holds exactly the actions that happened. Accounts are named by role
and username; a bad name is NOT_FOUND.
"""
from __future__ import annotations

import getpass
import json
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, bindparam, delete, func, insert, select, update

from db.accounts import end_sessions
from db.catalog import unlist
from db.database import now_ms
from db.schema import (
    admin_actions,
    cart_lines,
    items,
    login_failures,
    order_lines,
    orders,
    saved_cart_lines,
    sessions,
    suspensions,
    users,
)
from wire.errors import ConflictError, NotFoundError
from wire.values import CATEGORY_NAMES, format_money, format_time


@dataclass(frozen=True)
class Operator:
    """Who runs an action, from where, and why (the reason is optional)."""

    os_user: str
    host: str
    reason: str | None = None

    @classmethod
    def here(cls, reason: str | None = None) -> Operator:
        """The operating-system user and host of this process (cut to fit the log's columns)."""
        try:
            os_user = getpass.getuser()
        except (KeyError, OSError):  # no login name and no passwd entry (a bare container)
            os_user = f"uid {os.getuid()}"
        return cls(os_user[:64], socket.gethostname()[:255], reason[:500] if reason else None)


# Compiled without its values (db.unit_of_work): each column a bound parameter, but the key.
_RECORD = insert(admin_actions).values({c.name: bindparam(c.name) for c in admin_actions.c
                                        if c.name != "action_id"})


def record(tx: Connection, operator: Operator, action: str, target: str, outcome: str) -> str:
    """Write the action's row of the log; its outcome, to show."""
    tx.execute(_RECORD, {"at_ms": now_ms(), "os_user": operator.os_user, "host": operator.host,
                         "action": action, "target": target[:100], "outcome": outcome[:500],
                         "reason": operator.reason})
    return outcome


def find_user(tx: Connection, role: str, username: str, lock: bool = False) -> Any:
    """The users row of `role` `username` (locked FOR UPDATE if `lock`), or NOT_FOUND."""
    query = select(users).where(users.c.role == role, users.c.username == username)
    row = tx.execute(query.with_for_update() if lock else query).first()
    if row is None:
        raise NotFoundError(f"no {role} named {username!r}")
    return row


def _name(user: Any) -> str:
    return f"{user.role} {user.username} (user {user.user_id})"


def plural(count: int, what: str) -> str:
    return f"{count} {what}{'s' * (count != 1)}"


def suspend(tx: Connection, operator: Operator, role: str, username: str, off_sale: bool = False) -> str:
    """Suspend an account (its sessions end; with `off_sale`, its items go off sale too).

    Locks in the order every write keeps: sessions, items, user. Sessions are ended again
    once the user's row is held: a login holds it shared while opening its session."""
    user = find_user(tx, role, username)
    ended = end_sessions(tx, sessions.c.user_id == user.user_id)
    withdrawn = withdraw(tx, items.c.seller_id == user.user_id) if off_sale else []
    user = find_user(tx, role, username, lock=True)
    if tx.execute(select(suspensions.c.user_id).where(suspensions.c.user_id == user.user_id)).first():
        raise ConflictError(f"{_name(user)} is suspended already")
    tx.execute(insert(suspensions), {"user_id": user.user_id, "suspended_ms": now_ms(),
                                     "reason": operator.reason})
    ended += end_sessions(tx, sessions.c.user_id == user.user_id)
    outcome = f"suspended {_name(user)}; ended {plural(ended, 'session')}"
    if off_sale:
        outcome += f"; took {plural(len(withdrawn), 'item')} off sale"
    return record(tx, operator, "suspend", _name(user), outcome)


def reinstate(tx: Connection, operator: Operator, role: str, username: str) -> str:
    """Lift a suspension: the account may log in again."""
    user = find_user(tx, role, username, lock=True)
    if tx.execute(delete(suspensions).where(suspensions.c.user_id == user.user_id)).rowcount != 1:
        raise ConflictError(f"{_name(user)} is not suspended")
    return record(tx, operator, "reinstate", _name(user), f"reinstated {_name(user)}; it may log in again")


def end_user_sessions(tx: Connection, operator: Operator, role: str, username: str) -> str:
    """End every session of an account (its carts go with them; the saved cart stays)."""
    user = find_user(tx, role, username)
    ended = end_sessions(tx, sessions.c.user_id == user.user_id)
    return record(tx, operator, "end-sessions", _name(user),
                   f"ended {plural(ended, 'session')} of {_name(user)}")


def clear_throttle(tx: Connection, operator: Operator, role: str, username: str) -> str:
    """Forget the failed logins counted for a username (existing or not, as the count is kept)."""
    named = (login_failures.c.role == role, login_failures.c.username == username)
    failures = tx.execute(select(login_failures.c.failures).where(*named).with_for_update()).scalar()
    target = f"{role} {username}"
    if failures is None:
        return record(tx, operator, "clear-throttle", target, f"no failed logins were counted for {target}")
    tx.execute(delete(login_failures).where(*named))
    return record(tx, operator, "clear-throttle", target,
                  f"forgot {plural(failures, 'failed login')} of {target}")


def withdraw(tx: Connection, which: Any) -> Sequence[Any]:
    """Take every unit of the items `which` selects off sale (locked in item order, counted as
    removed); the rows as they were."""
    found = tx.execute(select(items.c.item_id, items.c.name, items.c.quantity)
                       .where(which, items.c.quantity > 0).order_by(items.c.item_id).with_for_update()).all()
    for item in found:
        tx.execute(update(items).where(items.c.item_id == item.item_id)
                   .values(quantity=0, removed=items.c.removed + item.quantity))
    unlist(tx, [item.item_id for item in found])  # type: ignore[arg-type]
    return found


def take_off_sale(tx: Connection, operator: Operator, item_id: int) -> str:
    withdrawn = withdraw(tx, items.c.item_id == item_id)
    if not withdrawn:
        if tx.execute(select(items.c.item_id).where(items.c.item_id == item_id)).first() is None:
            raise NotFoundError(f"no item {item_id}")
        raise ConflictError(f"item {item_id} is not on sale (quantity 0)")
    item = withdrawn[0]
    return record(tx, operator, "take-off-sale", f"item {item_id}",
                   f"took item {item_id} ({item.name}) off sale: {item.quantity} units removed")


def count(tx: Connection, table: Any, *where: Any, column: Any = None) -> int:
    """The rows of `table` that `where` selects, or the sum of their `column`."""
    total = func.count() if column is None else func.coalesce(func.sum(column), 0)
    return int(tx.execute(select(total).select_from(table).where(*where)).scalar_one())


def show_user(tx: Connection, role: str, username: str) -> dict[str, Any]:
    """A user's account, state and counters, by label, as people read them."""
    user = find_user(tx, role, username)
    suspended = tx.execute(select(suspensions).where(suspensions.c.user_id == user.user_id)).first()
    shown: dict[str, Any] = {
        "user id": user.user_id, "role": user.role, "username": user.username, "name": user.name,
        "created": format_time(user.created_ms / 1000),
        "state": "suspended" if suspended else "active",
        "suspended": format_time(suspended.suspended_ms / 1000) if suspended else None,
        "suspension reason": suspended.reason if suspended else None,
        "sessions": count(tx, sessions, sessions.c.user_id == user.user_id),
        "failed logins": count(tx, login_failures, login_failures.c.role == role,
                               login_failures.c.username == username, column=login_failures.c.failures),
    }
    if role == "seller":
        shown.update({
            "items": count(tx, items, items.c.seller_id == user.user_id),
            "items on sale": count(tx, items, items.c.seller_id == user.user_id, items.c.quantity > 0),
            "items sold": user.items_sold, "thumbs up": user.thumbs_up, "thumbs down": user.thumbs_down})
    else:
        shown.update({
            "orders": count(tx, orders, orders.c.buyer_id == user.user_id),
            "units bought": count(tx, order_lines, order_lines.c.buyer_id == user.user_id,
                                   column=order_lines.c.quantity),
            "saved cart lines": count(tx, saved_cart_lines, saved_cart_lines.c.buyer_id == user.user_id)})
    return shown


def show_item(tx: Connection, item_id: int) -> dict[str, Any]:
    """An item with its counters and its seller, by label, as people read them."""
    row = tx.execute(select(items, users.c.username, suspensions.c.user_id.label("suspended"))
                     .join(users, users.c.user_id == items.c.seller_id)
                     .outerjoin(suspensions, suspensions.c.user_id == items.c.seller_id)
                     .where(items.c.item_id == item_id)).first()
    if row is None:
        raise NotFoundError(f"no item {item_id}")
    seller = f"{row.username} (user {row.seller_id}{', suspended' if row.suspended else ''})"
    return {
        "item id": row.item_id, "name": row.name, "seller": seller,
        "category": f"{row.category} {CATEGORY_NAMES[row.category]}",
        "keywords": ", ".join(json.loads(row.keywords)) or "-", "condition": row.item_condition,
        "price": format_money(row.price_cents), "on sale": row.quantity, "listed": row.listed,
        "sold": row.sold, "removed": row.removed, "thumbs up": row.thumbs_up,
        "thumbs down": row.thumbs_down, "created": format_time(row.created_ms / 1000),
        "in carts": count(tx, cart_lines, cart_lines.c.item_id == item_id),
        "in saved carts": count(tx, saved_cart_lines, saved_cart_lines.c.item_id == item_id),
    }


def action_log(tx: Connection, limit: int = 50) -> list[Any]:
    return list(tx.execute(select(admin_actions).order_by(admin_actions.c.action_id.desc()).limit(limit)))
