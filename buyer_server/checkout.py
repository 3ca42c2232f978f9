"""make_purchase in steps, and the settler that finishes what a crash cut off.

The steps (db.purchases): open the order, pending, with the stock taken; authorise the
total under the order's payment key, outside any transaction; mark the order paid and
empty the carts; capture. A decline undoes the order (stock back, cart as it was). Any
step may be cut off: the settler of every buyer server finishes pending orders by the
same conditional transactions, and the processor's calls are idempotent per key, so a
purchase thread and settlers racing each other act once between them.
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

from .payments import Card, PaymentProcessor

log = logging.getLogger("market.checkout")
# Where MARKET_TEST_KILL_AT may stop the process (SIGKILL), for the crash tests.
KILL_POINTS = ("before_authorise", "after_authorise", "after_order_commit", "after_capture")
_CAPTURE_TRIES = 3
_READ_BACK_TRIES = 6  # about 6 s of asking whether a COMMIT that failed went through
_REPLAY_WAIT_S = 10.0  # how long a request waits for the purchase of the same key to settle
# A pending order this old, whose key is sent again, was cut off (its steps take
# milliseconds): the new request undoes it rather than wait for the settler.
_TAKE_OVER_AFTER_MS = 3000
FirstStep = Callable[[Callable[[Any, Any, dict[str, Any]], Any]], Any]


class Checkout:
    """The buyer server's make_purchase and its settler, over one database and processor."""

    def __init__(self, db: Database, processor: PaymentProcessor, kill_at: str | None = None) -> None:
        if kill_at and kill_at not in KILL_POINTS:
            raise ValueError(f"MARKET_TEST_KILL_AT={kill_at}: one of {', '.join(KILL_POINTS)}")
        self.db, self.processor, self.kill_at = db, processor, kill_at

    def make_purchase(self, first_step: FirstStep) -> dict[str, Any]:
        """Buy the whole cart or nothing; success means the total was captured once."""
        opened, card = self._open_or_replay(first_step)
        if not isinstance(opened, OpenOrder):
            return dict(opened)  # the replay of a completed order
        self._crash_point("before_authorise")
        self._authorise(opened, card)
        self._crash_point("after_authorise")
        if not self._mark_paid(opened):
            raise UnavailableError("the purchase took too long and was undone; nothing was charged")
        self._crash_point("after_order_commit")
        self._capture(opened.order_id, opened.payment_key)
        return opened.receipt

    def _open_or_replay(self, first_step: FirstStep) -> tuple[OpenOrder | dict[str, Any], Card]:
        """Step one; a request whose key's purchase is still running waits for it to settle
        (outside any transaction), then replays its answer, or buys if it was undone."""
        deadline = time.monotonic() + _REPLAY_WAIT_S
        while True:
            try:
                return first_step(lambda tx, session, args: (  # type: ignore[no-any-return]
                    purchases.open_order(tx, session, args.get("idempotency_key")),
                    Card(args["card_name"], args["card_number"], args["card_expiry"])))
            except OrderInProgressError as running:
                if time.monotonic() > deadline:
                    raise
                if running.order.status != PENDING or running.age_ms > _TAKE_OVER_AFTER_MS:
                    self._settle_or_leave(running.order)  # a capture to confirm, or cut off
                time.sleep(0.02)

    def _authorise(self, order: OpenOrder, card: Card) -> None:
        """Authorise the total; on a decline or a failure, undo the order before answering."""
        try:
            self.processor.authorise(order.payment_key, order.buyer_id, order.total_cents, card)
            events.payment("approved")
        except PaymentDeclinedError:
            events.payment("declined")
            self._settle_or_leave(DueOrder(order.order_id, order.payment_key, PENDING))
            raise
        except Exception:
            events.payment("error")
            log.exception("order %d: the payment could not be authorised", order.order_id)
            self._settle_or_leave(DueOrder(order.order_id, order.payment_key, PENDING))
            raise UnavailableError("the payment could not be authorised; nothing was charged") from None

    def _settle_or_leave(self, order: DueOrder) -> None:
        """Settle now; if the database or the processor fails, the settler does it later."""
        try:
            self.settle(order)
        except Exception:
            log.exception("order %d: left to the settler", order.order_id)

    def _mark_paid(self, order: OpenOrder) -> bool:
        """Step three. Should the database fail at its COMMIT (a lost connection), whether it
        committed is read back before answering: the answer must say what happened."""
        try:
            if self.db.run(lambda tx: purchases.mark_paid(tx, order)):
                return True
            # Not pending (undone by a settler), or not known: this very step committed, but
            # its COMMIT's answer was lost (Database.run found its commit token).
            return self._status_when_known(order.order_id) in purchases.COMPLETED
        except UnavailableError:
            status = self._status_when_known(order.order_id)
            if status in purchases.COMPLETED:
                return True
            if status == PENDING:  # it did not commit: undo now, as the answer will say
                self._settle_or_leave(DueOrder(order.order_id, order.payment_key, PENDING))
            raise

    def _status_when_known(self, order_id: int) -> str | None:
        """The order's status, asked for a few seconds while the database is away; None if
        it stays away (then the settler finishes the order, and its key replays the end)."""
        for attempt in range(_READ_BACK_TRIES):
            try:
                return str(self.db.run(lambda tx: purchases.status_of(tx, order_id), write=False))
            except ProtocolError:
                time.sleep(0.1 * 2**attempt)
        return None

    def _capture(self, order_id: int, key: str) -> None:
        """Capture, and mark the order paid; a failure here is the settler's to finish (the
        order is committed as bought and the amount authorised: it will be captured)."""
        for attempt in range(_CAPTURE_TRIES):
            try:
                self.processor.capture(key)
                self._crash_point("after_capture")
                self.db.run(lambda tx: purchases.finish(tx, order_id, PAID))
                return
            except (ProtocolError, OSError) as exc:
                log.warning("order %d: capture or its record failed (%s); try %d", order_id, exc, attempt + 1)
                time.sleep(0.1 * 2**attempt)
        log.error("order %d: paid, its capture left to the settler", order_id)

    def settle(self, order: DueOrder) -> None:
        """Finish one order by its status: pending -> undone and voided; capturing -> captured."""
        if order.status == PENDING:
            if not self.db.run(lambda tx: purchases.start_undo(tx, order.order_id)):
                return  # another settler or the purchase itself moved it: theirs to finish
            order = DueOrder(order.order_id, order.payment_key, purchases.VOIDING)
        if order.status == purchases.VOIDING:
            self.processor.void(order.payment_key)
            self.db.run(lambda tx: purchases.finish(tx, order.order_id, VOID))
        elif order.status == purchases.CAPTURING:
            self.processor.capture(order.payment_key)
            self.db.run(lambda tx: purchases.finish(tx, order.order_id, PAID))

    def settle_due(self, pending_for_s: float) -> int:
        """Settle every order due now (pending for over `pending_for_s`); how many were."""
        due = self.db.run(lambda tx: purchases.due_orders(tx, now_ms() - int(pending_for_s * 1000)),
                          write=False)
        for order in due:
            try:
                self.settle(order)
            except Exception:
                log.exception("order %d: could not settle it now; will try again", order.order_id)
        return len(due)

    def _crash_point(self, name: str) -> None:
        """The test hook: die here, at once, as a kill -9 would."""
        if self.kill_at == name:
            os.kill(os.getpid(), signal.SIGKILL)


class Settler:
    """A thread settling due orders every `period_s`, from the server's start."""

    def __init__(self, checkout: Checkout, period_s: float, pending_for_s: float) -> None:
        self.checkout, self.period_s, self.pending_for_s = checkout, period_s, pending_for_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="market-settler", daemon=True)

    def start(self) -> None:
        """Start settling (the first pass at once)."""
        self._thread.start()

    def stop(self) -> None:
        """Stop after the pass in progress."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                settled = self.checkout.settle_due(self.pending_for_s)
                if settled:
                    log.info("settled %d orders", settled)
            except Exception as exc:  # the database away, say: the next pass tries again
                log.warning("settling failed: %s", exc)
            self._stop.wait(self.period_s)
