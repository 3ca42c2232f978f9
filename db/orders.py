"""Purchase history and feedback: both read completed orders only (a purchase in progress, or
one undone, is not in the history and gives no right to vote). The purchase is db.purchases.
"""
from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, Integer, String, and_, bindparam, insert, select, update
from sqlalchemy.exc import IntegrityError

from wire.errors import ConflictError, ForbiddenError
from wire.values import decode_cursor, encode_cursor, format_money, format_time

from .accounts import Session, with_session
from .catalog import item_for_session, split_page
from .database import now_ms
from .purchases import is_completed
from .schema import feedback, items, order_lines, orders, sessions, users
from .unit_of_work import UnitOfWork

# The vote, if the buyer bought the item (no row inserted otherwise): the check and the
# INSERT in one statement.
_VOTE_OF_BUYER = (select(order_lines.c.buyer_id, order_lines.c.item_id, bindparam("vote", type_=String),
                         bindparam("now", type_=BigInteger))
                  .join(orders, orders.c.order_id == order_lines.c.order_id)
                  .where(order_lines.c.buyer_id == bindparam("buyer_id"),
                         order_lines.c.item_id == bindparam("item_id"), is_completed(orders.c.status))
                  .limit(1))
_VOTE_IF_BOUGHT = insert(feedback).from_select(["buyer_id", "item_id", "vote", "created_ms"], _VOTE_OF_BUYER)
# +1 on the item's and on its seller's thumbs_up or thumbs_down
_COUNT_VOTE = {
    vote: (update(items).where(items.c.item_id == bindparam("item_id")).values({c: items.c[c] + 1}),
           update(users).where(users.c.user_id == bindparam("seller_id")).values({c: users.c[c] + 1}))
    for vote, c in (("up", "thumbs_up"), ("down", "thumbs_down"))}
_FIRST_PAGE = (2**62, 0)  # a cursor before every (order_id, item_id)
# The buyer's lines with the token check folded in (no rows: none, or no such session)
_HISTORY = (
    with_session(order_lines.c.order_id, order_lines.c.item_id, order_lines.c.name, order_lines.c.quantity,
                 order_lines.c.price_cents, orders.c.created_ms, feedback.c.vote,
                 joined=order_lines.join(orders, orders.c.order_id == order_lines.c.order_id)
                 .outerjoin(feedback, and_(feedback.c.buyer_id == order_lines.c.buyer_id,
                                           feedback.c.item_id == order_lines.c.item_id)),
                 on=order_lines.c.buyer_id == sessions.c.user_id)
    .where(is_completed(orders.c.status),
           (order_lines.c.order_id < bindparam("last_order"))
           | ((order_lines.c.order_id == bindparam("last_order"))
              & (order_lines.c.item_id > bindparam("last_item"))))
    .order_by(order_lines.c.order_id.desc(), order_lines.c.item_id)
    .limit(bindparam("limit", type_=Integer)))


def provide_feedback(tx: UnitOfWork, session: Session, item_id: int, vote: str) -> dict[str, Any]:
    """One vote per item bought, counted for the item and its seller."""
    # The item's row locked first, as a purchase locks it: else the vote's insert holds it
    # shared (its foreign key) and the count's update then waits behind a purchase waiting
    # for it, a deadlock, retried and under a race retried out (BUSY).
    item = item_for_session(tx, session, item_id, lock=True)
    who = {"buyer_id": session.user_id, "item_id": item_id, "vote": vote, "now": now_ms(),
           "seller_id": item.seller_id}
    try:
        voted = tx.execute(_VOTE_IF_BOUGHT, who).rowcount
    except IntegrityError:
        raise ConflictError(f"you have already rated item {item_id}") from None
    if voted != 1:
        raise ForbiddenError(f"you have not bought item {item_id}")
    for statement in _COUNT_VOTE[vote]:
        tx.execute(statement, who)  # with the COMMIT
    return {}


def get_purchase_history(tx: UnitOfWork, session: Session, limit: int,
                         cursor: str | None) -> dict[str, Any]:
    """The buyer's purchased lines, newest order first, read with the token check."""
    last_order, last_item = decode_cursor(cursor, 2) if cursor else _FIRST_PAGE
    params = {**session.check_params, "last_order": last_order, "last_item": last_item, "limit": limit + 1}
    rows, next_cursor = split_page(session.accept_rows(tx.execute(_HISTORY, params).all()), limit,
                                   lambda r: encode_cursor(r.order_id, r.item_id))
    lines = [{"order_id": r.order_id, "item_id": r.item_id, "name": r.name, "quantity": r.quantity,
              "price": format_money(r.price_cents), "purchased_at": format_time(r.created_ms / 1000),
              "feedback": r.vote} for r in rows]
    return {"purchases": lines, "next_cursor": next_cursor}
