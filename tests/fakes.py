"""Fakes of the project's ports for the unit tests: each keeps the contract of the real one in
memory, and tests/integration/test_payments.py checks that they agree on a real database."""
from __future__ import annotations

from dataclasses import replace

from db.ledger import CAPTURED, Payment


class FakeLedger:
    """db.ledger.Ledger in a dict: a key's first entry stays, a move changes a state only from
    the one it names, and a move to captured counts a capture."""

    def __init__(self) -> None:
        self.payments: dict[str, Payment] = {}

    def record(self, key: str, buyer_id: int, amount_cents: int, state: str) -> Payment:
        return self.payments.setdefault(key, Payment(key, buyer_id, amount_cents, state, 0, 0, 0))

    def move(self, key: str, from_state: str, to_state: str) -> str | None:
        entry = self.payments.get(key)
        if entry is not None and entry.state == from_state:
            entry = self.payments[key] = replace(entry, state=to_state,
                                                 captures=entry.captures + (to_state == CAPTURED))
        return None if entry is None else entry.state

    def lookup(self, key: str) -> Payment | None:
        return self.payments.get(key)

    def entries(self) -> list[Payment]:
        return [self.payments[key] for key in sorted(self.payments)]
