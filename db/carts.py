"""Carts: the session's cart, a copy of the buyer's saved cart at login (db.accounts) gone at
logout, and the saved cart, which `save_cart` makes of it. Lines show the item's current name
and price and how many are on sale.
"""
from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, delete, func, insert, select, update

from wire.errors import ConflictError, NotFoundError
from wire.values import format_money

from .accounts import Session, with_session
from .schema import cart_lines, items, saved_cart_lines, sessions, users
from .unit_of_work import Answer, UnitOfWork

_SESSION = cart_lines.c.session_id == bindparam("session_id")
_LINE = _SESSION & (cart_lines.c.item_id == bindparam("item_id"))
_CART = (select(cart_lines.c.item_id, items.c.name, items.c.price_cents, cart_lines.c.quantity,
                items.c.quantity.label("available"))
         .join_from(cart_lines, items, items.c.item_id == cart_lines.c.item_id)
         .where(_SESSION).order_by(cart_lines.c.item_id))
# The same with the token check folded in (no rows: an empty cart, or no such session)
_CART_OF_TOKEN = (with_session(*_CART.selected_columns,
                               joined=cart_lines.join(items, items.c.item_id == cart_lines.c.item_id),
                               on=cart_lines.c.session_id == sessions.c.session_id)
                  .order_by(cart_lines.c.item_id))
# How many of the item the cart holds, with the token check (no rows: none, or no session).
# FOR UPDATE here and below: the session's row stays locked to the COMMIT, so one session's
# requests on several connections change its cart one after the other (else a write is lost).
_IN_CART = with_session(cart_lines.c.quantity.label("held"), joined=cart_lines,
                        on=(cart_lines.c.session_id == sessions.c.session_id)
                        & (cart_lines.c.item_id == bindparam("item_id"))).with_for_update()
_SET_LINE = update(cart_lines).where(_LINE).values(quantity=bindparam("quantity"))
_ADD_LINE = insert(cart_lines)
_DROP_LINE = delete(cart_lines).where(_LINE)
_EMPTY = delete(cart_lines).where(_SESSION)
# The buyer's row locked first: two sessions of one buyer saving at once take turns (at READ
# COMMITTED a DELETE of the saved lines locks no gap, so both INSERTs went in: a saved cart
# mixed of two). items_sold = items_sold changes nothing and touches no key.
_LOCK_BUYER = (update(users).where(users.c.user_id == bindparam("buyer_id"))
               .values(items_sold=users.c.items_sold))
_FORGET_SAVED = delete(saved_cart_lines).where(saved_cart_lines.c.buyer_id == bindparam("buyer_id"))
_SAVE = (insert(saved_cart_lines).from_select(
    ["buyer_id", "item_id", "quantity"],
    select(bindparam("buyer_id"), cart_lines.c.item_id, cart_lines.c.quantity).where(_SESSION)))
MAX_CART_LINES = 100  # different items: a cart or receipt stays far under the 1 MiB frame
_LINES = cart_lines.alias("lines")
_STOCK_AND_HELD = (
    with_session(items.c.quantity, cart_lines.c.quantity.label("held"),
                 select(func.count()).where(_LINES.c.session_id == sessions.c.session_id)
                 .scalar_subquery().label("lines"),
                 joined=items, on=items.c.item_id == bindparam("item_id"))
    .outerjoin(cart_lines, (cart_lines.c.session_id == sessions.c.session_id)
               & (cart_lines.c.item_id == items.c.item_id)).with_for_update())


def display_cart(tx: UnitOfWork, session: Session) -> dict[str, Any]:
    """The session's cart, read with the token check (an empty cart's token is then checked alone)."""
    return cart_object(list(session.accept_rows(tx.execute(_CART_OF_TOKEN, session.check_params).all())))


def _cart_answer(tx: UnitOfWork, session: Session) -> Answer[dict[str, Any]]:
    """The cart a write leaves, read last (with the COMMIT)."""
    return tx.answer(_CART, {"session_id": session.session_id}, cart_object)


def cart_object(rows: list[Any]) -> dict[str, Any]:
    lines = [{"item_id": r.item_id, "name": r.name, "price": format_money(r.price_cents),
              "quantity": r.quantity, "available": r.available} for r in rows]
    return {"cart": {"items": lines, "total": format_money(sum(r.price_cents * r.quantity for r in rows))}}


def add_to_cart(tx: UnitOfWork, session: Session, item_id: int, quantity: int) -> Answer[dict[str, Any]]:
    """Add units of an item; CONFLICT when the cart would hold more than is on sale."""
    params = {**session.check_params, "item_id": item_id}
    rows = session.accept_rows(tx.execute(_STOCK_AND_HELD, params).all())
    if not rows:
        raise NotFoundError(f"no item {item_id}")
    held = rows[0].held or 0
    line = {"session_id": session.session_id, "item_id": item_id,
            "quantity": line_after_add(item_id, quantity, held, rows[0].quantity, rows[0].lines)}
    tx.execute(_SET_LINE if held else _ADD_LINE, line)
    return _cart_answer(tx, session)


def line_after_add(item_id: int, quantity: int, held: int, available: int, lines: int) -> int:
    """The units of the item in a cart of `lines` lines (`held` of them) once `quantity` are added;
    CONFLICT over the stock, or for a new line past MAX_CART_LINES."""
    if held + quantity > available:
        raise ConflictError(f"item {item_id}: only {available} left"
                            + (f", {held} already in your cart" if held else ""))
    if not held and lines >= MAX_CART_LINES:
        raise ConflictError(f"your cart holds {MAX_CART_LINES} different items, the most it may;"
                            " buy or remove some first")
    return held + quantity


def remove_from_cart(tx: UnitOfWork, session: Session, item_id: int, quantity: int) -> Answer[dict[str, Any]]:
    """Take units out of the cart; removing all or more removes the line."""
    rows = session.accept_rows(tx.execute(_IN_CART, {**session.check_params, "item_id": item_id}).all())
    held = int(rows[0].held) if rows else 0
    line = {"session_id": session.session_id, "item_id": item_id, "quantity": held - quantity}
    if held > quantity:
        tx.execute(_SET_LINE, line)
    elif held:
        tx.execute(_DROP_LINE, line)
    return _cart_answer(tx, session)


def clear_cart(tx: UnitOfWork, session: Session) -> dict[str, Any]:
    """Empty the session's cart (the saved cart stays)."""
    tx.execute(_EMPTY, {"session_id": session.lock().session_id})
    return cart_object([])


def save_cart(tx: UnitOfWork, session: Session) -> Answer[dict[str, Any]]:
    live = session.lock()  # a logout in flight cannot empty the cart under the copy
    who = {"buyer_id": live.user_id, "session_id": live.session_id}
    tx.execute(_LOCK_BUYER, who)
    tx.execute(_FORGET_SAVED, who)
    tx.execute(_SAVE, who)
    return _cart_answer(tx, session)
