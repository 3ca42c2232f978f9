"""The built-in payment processor's ledger answered from memory: what its writes cost.

Python imports this module at start when its folder is on PYTHONPATH, so every process
started with that PYTHONPATH, the servers that market-sim starts included, keeps the
simulated processor's ledger in a dict of its own instead of the database:

    PYTHONPATH=simulation/studies/ledger_from_memory:. market-sim -n 100 -k 200 -r 1 \\
        --db-url mysql://root@127.0.0.1:3306/nomoney

Run it from the checkout's root (the paths are relative): each process says "payment ledger
answered from memory" on stderr, and market-sim's audit fails, as it must; without that line
and with a passing audit, the module was not loaded. A measurement only (docs/benchmarks.md,
"Deferred writes"): nothing of the payments is kept, and the processes do not share it.
"""
from __future__ import annotations

import dataclasses
import sys
import threading

from db import ledger

_book: dict[str, ledger.Payment] = {}
_lock = threading.Lock()


def _record(self: ledger.Ledger, key: str, buyer_id: int, amount_cents: int, state: str) -> ledger.Payment:
    with _lock:
        return _book.setdefault(key, ledger.Payment(key, buyer_id, amount_cents, state, 0, 0, 0))


def _move(self: ledger.Ledger, key: str, from_state: str, to_state: str) -> str | None:
    with _lock:
        entry = _book.get(key)
        if entry is None:
            return None
        if entry.state == from_state:
            captures = entry.captures + (to_state == ledger.CAPTURED)
            _book[key] = entry = dataclasses.replace(entry, state=to_state, captures=captures)
        return entry.state


def _lookup(self: ledger.Ledger, key: str) -> ledger.Payment | None:
    with _lock:
        return _book.get(key)


ledger.Ledger.record, ledger.Ledger.move, ledger.Ledger.lookup = (  # type: ignore[method-assign]
    _record, _move, _lookup)
print("payment ledger answered from memory (simulation/studies/ledger_from_memory)", file=sys.stderr)
