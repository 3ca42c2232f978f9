"""make_purchase in steps, and the settler that finishes what a crash cut off.

The steps (db.purchases): open the order, pending, with the stock taken; authorise and
capture the total under the order's key outside any transaction; mark the order paid. The
processor's ledger is the truth: the settler voids a cut-off order's key, and completes the
order if that is refused because captured, else undoes it; conditional status changes and
idempotent processor calls make a purchase and settlers racing each other act once.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from db import Database, purchases
from db.database import now_ms
from db.purchases import PAID, PENDING, VOID, DueOrder, OpenOrder, OrderInProgressError
from observe import events
from wire.errors import PaymentDeclinedError, ProtocolError, UnavailableError

from .payments import Card, PaymentProcessor, PaymentRefusedError

log = logging.getLogger("market.checkout")
# Where MARKET_TEST_KILL_AT may stop the process (SIGKILL), for the crash tests.
KILL_POINTS = ("before_authorise", "after_authorise", "after_capture", "after_order_commit")
_PROCESSOR_TRIES = 3  # a capture or a void the processor did not answer: asked again
_REPLAY_WAIT_S = 10.0  # how long a request waits for the purchase of the same key to settle
# A pending order this old, whose key is sent again, was cut off (its steps take
# milliseconds): the new request settles it rather than wait for the settler.
_TAKE_OVER_AFTER_MS = 3000
FirstStep = Callable[[Callable[[Any, Any, dict[str, Any]], Any]], Any]


class Checkout:
    """The buyer server's make_purchase and its settler, over one database and processor."""

    def __init__(self, db: Database, processor: PaymentProcessor, kill_at: str | None = None) -> None:
        if kill_at and kill_at not in KILL_POINTS:
            raise ValueError(f"MARKET_TEST_KILL_AT={kill_at}: one of {', '.join(KILL_POINTS)}")
        self.db, self.processor, self.kill_at = db, processor, kill_at
        # tries at completing a captured order while the database is away, 0.1 s after the
        # first and twice as long after each (6: about 6.3 s; tests lower it)
        self.database_tries = 6

    def make_purchase(self, first_step: FirstStep) -> dict[str, Any]:
        """Buy the whole cart or nothing; success means the total was captured once."""
        opened, card = self._open_or_replay(first_step)
        if not isinstance(opened, OpenOrder):
            return dict(opened)  # the replay of a completed order
        self._crash_point("before_authorise")
        self._authorise(opened, card)
        self._crash_point("after_authorise")
        self._capture(opened)
        self._crash_point("after_capture")
        self._complete(opened)
        self._crash_point("after_order_commit")
        return opened.receipt

    def _open_or_replay(self, first_step: FirstStep) -> tuple[OpenOrder | dict[str, Any], Card]:
        """Step one; a request whose key's purchase is still running waits for it to settle
        (outside any transaction), then replays its answer, or buys if it was undone."""
        deadline = time.monotonic() + _REPLAY_WAIT_S
        while True:
            try:
                return first_step(lambda tx, session, args: (  # type: ignore[no-any-return]
                    purchases.open_order(tx, session, args["idempotency_key"], args.get("expected_total")),
                    Card(args["card_name"], args["card_number"], args["card_expiry"])))
            except OrderInProgressError as running:
                if time.monotonic() > deadline:
                    raise
                if running.order.status != PENDING or running.age_ms > _TAKE_OVER_AFTER_MS:
                    self._settle_or_leave(running.order)  # cut off: settle it by the ledger
                time.sleep(0.02)

    def _authorise(self, order: OpenOrder, card: Card) -> None:
        """Authorise the total; on a decline or a failure, undo the order before answering.
        Nothing was captured, and nothing will be: only this thread captures a pending order."""
        facts = order.order_id, order.buyer_id, order.total_cents
        try:
            self.processor.authorise(order.payment_key, order.buyer_id, order.total_cents, card)
            events.payment("approved", *facts)
        except PaymentDeclinedError:
            events.payment("declined", *facts)
            self._undo_or_leave(order.order_id, order.payment_key)
            raise
        except Exception:
            events.payment("error", *facts)
            log.exception("order %d: the payment could not be authorised", order.order_id)
            self._undo_or_leave(order.order_id, order.payment_key)
            raise UnavailableError("the payment could not be authorised; nothing was charged") from None

    def _capture(self, order: OpenOrder) -> None:
        """Capture the total, or undo the order and say why. A capture refused (a settler voided
        the key) or not answered leaves it to the void: refused, the capture went through."""
        if self._ask("capture", order.payment_key):
            return
        voided = self._ask("void", order.payment_key)
        if voided is False:
            return
        if voided is None:  # the one answer that does not say what happened: see design.md
            log.error("order %d: the processor answers neither capture nor void; left to the settler",
                      order.order_id)
            raise UnavailableError("the payment processor did not answer; the purchase is settled within "
                                   "60 s, and its idempotency key then replays how it ended")
        try:
            self.db.run(lambda tx: purchases.undo(tx, order.order_id, VOID))
        except Exception:
            log.exception("order %d: voided; its undoing is left to the settler", order.order_id)
        raise UnavailableError("the payment could not be captured; nothing was charged")

    def _ask(self, call: str, key: str) -> bool | None:
        """The processor's `call` ("capture" or "void") on `key`, asked again when it does not
        answer: True done, False refused, None never answered."""
        for attempt in range(_PROCESSOR_TRIES):
            try:
                getattr(self.processor, call)(key)
                return True
            except PaymentRefusedError:
                return False
            except Exception as exc:  # unreachable, or its answer lost
                log.warning("payment %s: %s failed (%s); try %d", key, call, exc, attempt + 1)
                time.sleep(0.1 * 2**attempt)
        return None

    def _complete(self, purchase: purchases.Purchase) -> None:
        """Mark the captured order paid and empty the carts. The payment was captured: the
        purchase is made, so a database away for a few seconds leaves it to the settler."""
        for attempt in range(self.database_tries):
            try:
                # not moved: completed already, by a settler or by this very step run again
                # after its COMMIT landed and the answer was lost (never undone: captured)
                self.db.run(lambda tx: purchases.complete(tx, purchase))
                events.purchased(purchase.order_id, purchase.buyer_id)
                return
            except ProtocolError as exc:  # the database away, or busy
                log.warning("order %d: captured, not yet marked paid (%s)", purchase.order_id, exc)
                time.sleep(0.1 * 2**attempt)
        log.error("order %d: captured; its completion is left to the settler", purchase.order_id)

    def _undo_or_leave(self, order_id: int, key: str) -> None:
        """Undo an order whose payment was never captured, then void it; what fails here,
        the settler does later."""
        try:
            if self.db.run(lambda tx: purchases.undo(tx, order_id, purchases.VOIDING)):
                self.settle(DueOrder(order_id, key, purchases.VOIDING))
        except Exception:
            log.exception("order %d: left to the settler", order_id)

    def _settle_or_leave(self, order: DueOrder) -> None:
        """Settle now; if the database or the processor fails, the settler tries again later."""
        try:
            self.settle(order)
        except Exception:
            log.exception("order %d: not settled now; the settler tries again", order.order_id)

    def settle(self, order: DueOrder) -> None:
        """Finish one order by its status: voiding -> voided; pending by the ledger, voiding the
        key first: refused because captured, the order is completed; voided, it is undone (unless
        another settler did), and a capture its purchase's thread may still send is refused."""
        if order.status == PENDING:
            try:
                self.processor.void(order.payment_key)
            except PaymentRefusedError:  # captured: the purchase is made
                self._complete(self.db.run(lambda tx: purchases.purchase_in(tx, order.order_id), write=False))
                return
            self.db.run(lambda tx: purchases.undo(tx, order.order_id, VOID))
        elif order.status == purchases.VOIDING:
            self.processor.void(order.payment_key)
            self.db.run(lambda tx: purchases.finish(tx, order.order_id, VOID))
        elif order.status == purchases.CAPTURING:  # made before revision 0007
            self.processor.capture(order.payment_key)
            self.db.run(lambda tx: purchases.finish(tx, order.order_id, PAID))

    def settle_due(self, pending_for_s: float) -> int:
        """Settle every order due now (pending for over `pending_for_s`); how many were."""
        due = self.db.run(lambda tx: purchases.due_orders(tx, now_ms() - int(pending_for_s * 1000)),
                          write=False)
        events.settlement_due(len(due))
        for order in due:
            self._settle_or_leave(order)
        return len(due)

    def _crash_point(self, name: str) -> None:
        """The test hook: die here, at once, as a kill -9 would."""
        if self.kill_at == name:
            os.kill(os.getpid(), signal.SIGKILL)


class Settler(threading.Thread):
    """A thread settling due orders every `period_s`, from the server's start (the first pass
    at once)."""

    def __init__(self, checkout: Checkout, period_s: float, pending_for_s: float) -> None:
        super().__init__(name="market-settler", daemon=True)
        self.checkout, self.period_s, self.pending_for_s = checkout, period_s, pending_for_s
        self._stopping = threading.Event()

    def stop(self) -> None:
        """Stop after the pass in progress."""
        self._stopping.set()
        if self.is_alive():
            self.join(timeout=30)

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                settled = self.checkout.settle_due(self.pending_for_s)
                if settled:
                    log.info("settled %d orders", settled)
            except Exception as exc:  # the database away, say: the next pass tries again
                log.warning("settling failed: %s", exc)
            self._stopping.wait(self.period_s)
