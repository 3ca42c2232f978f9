"""Payment processors: authorise an amount under a key, capture it, void it (Stripe's
PaymentIntents with manual capture: docs/design.md, "Money").

The built-in one is simulated: it approves every valid card, or declines a configured
fraction at random (MARKET_PAYMENT_DECLINE_RATE), and keeps its ledger (db.ledger) apart
from the marketplace's transactions. Every call is idempotent per key.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol

from db.ledger import AUTHORISED, CAPTURED, DECLINED, VOIDED, Ledger
from wire.errors import PaymentDeclinedError


class PaymentRefusedError(Exception):
    """The processor refused a capture or a void (the key is in a state that forbids it)."""


@dataclass(frozen=True)
class Card:
    """The card a purchase is paid with (checked for form by the op's arguments)."""

    name: str
    number: str
    expiry: str


class PaymentProcessor(Protocol):
    """What the marketplace asks of a processor; every call idempotent per key."""

    def authorise(self, key: str, buyer_id: int, amount_cents: int, card: Card) -> None:
        """Hold the amount on the card under `key`, or raise PaymentDeclinedError."""

    def capture(self, key: str) -> None:
        """Take the amount authorised under `key` (once, however often asked)."""

    def void(self, key: str) -> None:
        """Release the authorisation under `key`; a key never authorised can no longer be."""


class SimulatedProcessor:
    """Approves valid cards, declining `decline_rate` of them at random; keeps a ledger."""

    def __init__(self, ledger: Ledger, decline_rate: float = 0.0) -> None:
        if not 0.0 <= decline_rate <= 1.0:
            raise ValueError("the payment decline rate must be from 0 to 1")
        self.ledger, self.decline_rate = ledger, decline_rate

    def authorise(self, key: str, buyer_id: int, amount_cents: int, card: Card) -> None:
        """Authorise, or decline at the configured rate; asked again, the first answer."""
        declined = bool(self.decline_rate) and random.random() < self.decline_rate
        entry = self.ledger.record(key, buyer_id, amount_cents, DECLINED if declined else AUTHORISED)
        if entry.state in (DECLINED, VOIDED):
            raise PaymentDeclinedError(f"the card ending {card.number[-4:]} was declined")

    def capture(self, key: str) -> None:
        """Capture an authorisation; a captured key stays captured once."""
        state = self.ledger.move(key, AUTHORISED, CAPTURED)
        if state != CAPTURED:
            raise PaymentRefusedError(f"payment {key}: cannot capture ({state or 'unknown key'})")

    def void(self, key: str) -> None:
        """Void an authorisation, or mark an unknown key void so it can never be authorised."""
        state: str | None = self.ledger.record(key, 0, 0, VOIDED).state
        if state == AUTHORISED:
            state = self.ledger.move(key, AUTHORISED, VOIDED)
        if state == CAPTURED:
            raise PaymentRefusedError(f"payment {key}: captured already, cannot void")
