"""The ledger's fake (tests/fakes.py), which the unit tests of the processor's rules run on,
keeps the real ledger's contract: the same calls leave the same entries on both."""
from __future__ import annotations

from typing import Any

from fakes import FakeLedger

from buyer_server.payments import Card, SimulatedProcessor
from db import Database
from db.ledger import Ledger

CARD = Card("Ann Lee", "4111111111111111", "12/40")
# Every call the processor makes of a ledger, in each state a key can be in
CALLS = [("authorise", "a", 0.0), ("capture", "a", 0.0), ("capture", "a", 0.0), ("void", "a", 0.0),
         ("authorise", "b", 0.0), ("void", "b", 0.0), ("void", "b", 0.0), ("capture", "b", 0.0),
         ("authorise", "b", 0.0), ("void", "c", 0.0), ("authorise", "c", 0.0), ("capture", "c", 0.0),
         ("authorise", "d", 1.0), ("authorise", "d", 0.0), ("capture", "d", 0.0), ("void", "d", 0.0),
         ("capture", "e", 0.0), ("authorise", "f", 0.0), ("authorise", "f", 1.0)]


def outcomes(ledger: Any) -> tuple[list[str], list[tuple[str, int, int, str, int]]]:
    """What each call answered (its error's class, or ""), and the entries left."""
    answers = []
    for call, key, rate in CALLS:
        processor = SimulatedProcessor(ledger, rate)
        try:
            if call == "authorise":
                processor.authorise(key, 7, 1250, CARD)
            else:
                getattr(processor, call)(key)
            answers.append("")
        except Exception as exc:  # the error's class is the answer compared
            answers.append(type(exc).__name__)
    entries = [(e.payment_key, e.buyer_id, e.amount_cents, e.state, e.captures) for e in ledger.entries()]
    return answers, entries


def test_the_fake_ledger_answers_as_the_real_one(database: Database) -> None:
    real = outcomes(Ledger(database))
    assert outcomes(FakeLedger()) == real
    assert "PaymentRefusedError" in real[0] and "PaymentDeclinedError" in real[0]
