"""The simulated payment processor's ledger: one row per payment key, in a table of its own
(MARKET_PAYMENTS_URL may move it elsewhere). Each call is its own committed transaction,
idempotent per key (each state change a conditional UPDATE), so a call whose connection is
lost, even at its COMMIT, is simply made again (no commit token).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from sqlalchemy import BigInteger, Column, MetaData, String, Table, bindparam, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.schema import CreateTable

from .database import Database, now_ms
from .schema import MYSQL_OPTIONS

T = TypeVar("T")
AUTHORISED, CAPTURED, VOIDED, DECLINED = "authorised", "captured", "voided", "declined"

payments = Table(
    "payments", MetaData(),  # apart from the marketplace's: the processor's own storage
    Column("payment_key", String(64), primary_key=True),
    Column("buyer_id", BigInteger, nullable=False),
    Column("amount_cents", BigInteger, nullable=False),
    Column("state", String(10), nullable=False),
    Column("captures", BigInteger, nullable=False, default=0),  # a second capture would show here
    Column("created_ms", BigInteger, nullable=False),
    Column("updated_ms", BigInteger, nullable=False),
    **MYSQL_OPTIONS,
)


@dataclass(frozen=True)
class Payment:
    payment_key: str
    buyer_id: int
    amount_cents: int
    state: str
    captures: int
    created_ms: int
    updated_ms: int


_NEW_ENTRY = insert(payments)
_MOVE = (update(payments)
         .where(payments.c.payment_key == bindparam("key"), payments.c.state == bindparam("from_state"))
         .values(state=bindparam("to_state"), captures=payments.c.captures + bindparam("captures"),
                 updated_ms=bindparam("now")))
_BY_KEY = select(payments).where(payments.c.payment_key == bindparam("key"))


class Ledger:
    """The processor's record of every key: each method one committed transaction."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self._created = False  # made at start, or else at the first call

    def create_table(self) -> None:
        """Make the ledger's table unless it exists (servers may all do it at once). A server
        does it at start: a MariaDB transaction whose snapshot is older than the table cannot
        read it (error 1412)."""
        self.database.run(lambda tx: tx.execute(CreateTable(payments, if_not_exists=True)))
        self._created = True

    def _run(self, work: Callable[[Any], T], write: bool = True) -> T:
        if not self._created:
            self.create_table()
        return self.database.run(work, write=write, idempotent=True)

    def record(self, key: str, buyer_id: int, amount_cents: int, state: str) -> Payment:
        """A new entry for `key` in `state`, or the entry the key has already (never two)."""
        now = now_ms()
        entry = Payment(key, buyer_id, amount_cents, state, 0, now, now)
        try:  # one round trip: the INSERT goes with its COMMIT, and is not read back
            self._run(lambda tx: tx.execute(_NEW_ENTRY, asdict(entry)))
            return entry
        except IntegrityError:  # the key has its entry: the call was made before
            found = self.lookup(key)
            assert found is not None
            return found

    def move(self, key: str, from_state: str, to_state: str) -> str | None:
        """The key's state after moving it from `from_state` to `to_state` (if it was there);
        None for an unknown key."""
        change = {"key": key, "from_state": from_state, "to_state": to_state,
                  "captures": int(to_state == CAPTURED), "now": now_ms()}
        moved = self._run(lambda tx: tx.execute(_MOVE, change))
        if moved.rowcount == 1:  # read after the COMMIT, which carried the UPDATE
            return to_state
        found = self.lookup(key)
        return None if found is None else found.state

    def lookup(self, key: str) -> Payment | None:
        row = self._run(lambda tx: tx.execute(_BY_KEY, {"key": key}).first(), write=False)
        return None if row is None else Payment(**row._asdict())

    def entries(self) -> list[Payment]:
        """Every entry, by key (for the audit)."""
        every = select(payments).order_by(payments.c.payment_key)
        rows = self._run(lambda tx: tx.execute(every).all(), write=False)
        return [Payment(**row._asdict()) for row in rows]
