"""Per-request timestamps for the tail analysis (simulation/tail.py), on when MARKET_TRACE_DIR is set.

Every traced process writes its records to $MARKET_TRACE_DIR/PID.tsv at exit: client lines
`C id op start sending first_byte done`, server lines `S id op read answering answered`, all
in perf_counter nanoseconds (CLOCK_MONOTONIC, the same clock in every process on Linux).
"""
from __future__ import annotations

import atexit
import os
from pathlib import Path
from typing import Any

from wire.observer import ClientObserver, now_ns

VARIABLE = "MARKET_TRACE_DIR"


class TraceFile(ClientObserver):
    """Records kept in memory (appending is cheap on the request's path), written at exit; as
    the clients' observer, it gives each call an id unique across processes."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)
        self.records: list[tuple[Any, ...]] = []
        atexit.register(self.write)

    def write(self) -> None:
        """Write this process's records to FOLDER/PID.tsv."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / f"{os.getpid()}.tsv", "w") as out:
            for record in self.records:
                out.write("\t".join(map(str, record)) + "\n")

    def request_id(self, number: int) -> Any:
        return f"{os.getpid()}-{now_ns()}-{number}"

    def call_done(self, request_id: Any, op: str, start_ns: int, sending_ns: int,
                  first_byte_ns: int, done_ns: int) -> None:
        self.records.append(("C", request_id, op, start_ns, sending_ns, first_byte_ns, done_ns))


def trace_file() -> TraceFile | None:
    """This process's trace file if MARKET_TRACE_DIR is set (made once), else None."""
    global _trace
    folder = os.environ.get(VARIABLE)
    if folder and _trace is None:
        _trace = TraceFile(folder)
    return _trace


def trace_clients() -> None:
    """Trace every client Connection of this process when MARKET_TRACE_DIR is set."""
    from wire.client import Connection

    if (trace := trace_file()) is not None:
        Connection.observer = trace


_trace: TraceFile | None = None
