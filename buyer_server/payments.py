"""Payment processors. The built-in one is simulated: it approves every valid card,
or declines a configured fraction at random (MARKET_PAYMENT_DECLINE_RATE). A real
processor only has to provide the same `charge` call.
"""
from __future__ import annotations

import random
from typing import Protocol

from observe import events
from wire.errors import PaymentDeclinedError


class PaymentProcessor(Protocol):
    """Charges a card or raises PaymentDeclinedError."""

    def charge(self, amount_cents: int, card_name: str, card_number: str, card_expiry: str,
               idempotency_key: str | None) -> None: ...


class SimulatedProcessor:
    """Approves valid cards, declining `decline_rate` of them at random."""

    def __init__(self, decline_rate: float = 0.0) -> None:
        if not 0.0 <= decline_rate <= 1.0:
            raise ValueError("the payment decline rate must be from 0 to 1")
        self.decline_rate = decline_rate

    def charge(self, amount_cents: int, card_name: str, card_number: str, card_expiry: str,
               idempotency_key: str | None) -> None:
        """Approve, or decline at the configured rate."""
        if self.decline_rate and random.random() < self.decline_rate:
            raise PaymentDeclinedError(f"the card ending {card_number[-4:]} was declined")


class CountedProcessor:
    """A processor whose charges are counted by outcome (market_payments_total)."""

    def __init__(self, processor: PaymentProcessor) -> None:
        self.processor = processor

    def charge(self, amount_cents: int, card_name: str, card_number: str, card_expiry: str,
               idempotency_key: str | None) -> None:
        """The processor's charge, its outcome counted: approved, declined or error."""
        try:
            self.processor.charge(amount_cents, card_name, card_number, card_expiry, idempotency_key)
        except PaymentDeclinedError:
            events.payment("declined")
            raise
        except Exception:
            events.payment("error")
            raise
        events.payment("approved")
