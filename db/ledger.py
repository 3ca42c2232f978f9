"""The simulated payment processor's ledger: one row per payment key (buyer, amount, state,
times), in a table of its own that the marketplace's transactions never touch.

Every call is its own committed transaction on the ledger's Database (by default the
marketplace's database, through a connection of its own; MARKET_PAYMENTS_URL moves it),
so what the processor did survives a kill -9 of any server. Calls are idempotent per
key, and each state change is a conditional UPDATE, so racing callers cannot both act.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from sqlalchemy import BigInteger, Column, Connection, MetaData, String, Table, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.schema import CreateTable

from .database import Database, now_ms

T = TypeVar("T")
AUTHORISED, CAPTURED, VOIDED, DECLINED = "authorised", "captured", "voided", "declined"
ledger_metadata = MetaData()  # apart from the marketplace's: the processor's own storage

payments = Table(
    "payments", ledger_metadata,
    Column("payment_key", String(64), primary_key=True),
    Column("buyer_id", BigInteger, nullable=False),
    Column("amount_cents", BigInteger, nullable=False),
    Column("state", String(10), nullable=False),
    Column("captures", BigInteger, nullable=False, default=0),  # a second capture would show here
    Column("created_ms", BigInteger, nullable=False),
    Column("updated_ms", BigInteger, nullable=False),
    mysql_engine="InnoDB", mysql_charset="utf8mb4", mysql_collate="utf8mb4_bin",
)


@dataclass(frozen=True)
class Payment:
    """One key's entry in the ledger."""

    payment_key: str
    buyer_id: int
    amount_cents: int
    state: str
    captures: int
    created_ms: int
    updated_ms: int


class Ledger:
    """The processor's record of every key: each method one committed transaction."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self._created = False  # made at start, or else at the first call

    def create_table(self) -> None:
        """Make the ledger's table unless it exists (IF NOT EXISTS: threads and servers may
        all do it at once). A server does it at start: a transaction of MariaDB whose snapshot
        is older than the table cannot read it (error 1412), and the audit reads it."""
        self.database.run(lambda tx: tx.execute(CreateTable(payments, if_not_exists=True)))
        self._created = True

    def _run(self, work: Callable[[Connection], T], write: bool = True) -> T:
        if not self._created:
            self.create_table()
        return self.database.run(work, write=write)

    def record(self, key: str, buyer_id: int, amount_cents: int, state: str) -> Payment:
        """A new entry for `key` in `state`, or the entry the key has already (never two)."""
        def insert_once(tx: Connection) -> None:
            now = now_ms()
            tx.execute(insert(payments).values(payment_key=key, buyer_id=buyer_id, amount_cents=amount_cents,
                                               state=state, captures=0, created_ms=now, updated_ms=now))
        try:
            self._run(insert_once)
        except IntegrityError:
            pass  # the key has its entry: the call was made before
        found = self.lookup(key)
        assert found is not None
        return found

    def move(self, key: str, from_state: str, to_state: str) -> Payment | None:
        """The entry after moving it from `from_state` to `to_state` (if it was there); None for
        an unknown key."""
        def conditional(tx: Connection) -> None:
            captured = payments.c.captures + (1 if to_state == CAPTURED else 0)
            tx.execute(update(payments).where(payments.c.payment_key == key, payments.c.state == from_state)
                       .values(state=to_state, captures=captured, updated_ms=now_ms()))
        self._run(conditional)
        return self.lookup(key)

    def lookup(self, key: str) -> Payment | None:
        """The key's entry, or None."""
        row = self._run(lambda tx: tx.execute(select(payments).where(payments.c.payment_key == key)).first(),
                        write=False)
        return None if row is None else Payment(**row._asdict())

    def entries(self) -> list[Payment]:
        """Every entry, by key (for the audit)."""
        every = select(payments).order_by(payments.c.payment_key)
        rows = self._run(lambda tx: tx.execute(every).all(), write=False)
        return [Payment(**row._asdict()) for row in rows]
