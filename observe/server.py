"""The server loop's observer: metrics, the request context of log lines, the sampled access
log, security events of the loop and tracing, in one object: a request pays one call per hook.

Label children are looked up in dicts made once per (op, code): an answer costs a few dict
lookups, a counter increment and a histogram observation.
"""
from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

from wire.observer import ServerObserver

from . import metrics
from .logs import REQUEST, access, security
from .trace import TraceFile


class MarketObserver(ServerObserver):
    """Observes one server (buyer or seller) serving `ops`."""

    def __init__(self, server: str, ops: Iterable[str], *, access_sample: float = 0.0,
                 trace: TraceFile | None = None) -> None:
        self.server = server
        self.ops = frozenset(ops)
        self.access_sample = access_sample
        self.trace = trace
        self._counts: dict[tuple[str, str], Any] = {}
        self._durations: dict[str, Any] = {}
        self._open = metrics.CONNECTIONS_OPEN.labels(server)
        self._busy = metrics.THREADS_BUSY.labels(server)
        self._queued = metrics.REQUESTS_QUEUED.labels(server)

    def connection_opened(self, peer: str) -> None:
        self._open.inc()

    def connection_closed(self, peer: str) -> None:
        self._open.dec()

    def connection_refused(self, peer: str, reason: str) -> None:
        metrics.CONNECTIONS_REFUSED.labels(self.server, reason).inc()
        security.warning("connection refused", extra={"client": peer, "reason": reason})

    def requests_read(self, count: int) -> None:
        self._queued.inc(count)

    def threads_busy(self, delta: int) -> None:
        self._busy.inc(delta)

    def answering(self, peer: str, message: dict[str, Any] | Exception) -> None:
        self._queued.dec()
        if isinstance(message, dict):
            REQUEST.set({"request_id": message.get("id"), "op": self._op(message), "client": peer})

    def answer_sent(self, peer: str, message: dict[str, Any] | Exception, response: dict[str, Any],
                    marks: tuple[int, int, int]) -> None:
        read_ns, _, answered = marks
        error = response.get("error")
        code = error.get("code", "INTERNAL") if error else "OK"
        op = self._op(message) if isinstance(message, dict) else metrics.FRAME_ERROR_OP
        self._count(op, code).inc()
        self._duration(op).observe((answered - read_ns) / 1e9)
        REQUEST.set(None)
        if not isinstance(message, dict):
            security.warning("frame rejected", extra={"client": peer, "code": code,
                                                      "reason": error.get("message") if error else None})
            return
        if self.access_sample and (self.access_sample >= 1.0 or random.random() < self.access_sample):
            self._access(peer, message, op, code, (answered - read_ns) / 1e6)
        if self.trace is not None:
            self.trace.records.append(("S", message.get("id"), op, *marks))

    def _op(self, message: dict[str, Any]) -> str:
        op = message.get("op")
        return op if op in self.ops else metrics.UNKNOWN_OP  # type: ignore[return-value]

    def _count(self, op: str, code: str) -> Any:
        child = self._counts.get((op, code))
        if child is None:
            child = self._counts[op, code] = metrics.REQUESTS.labels(self.server, op, code)
        return child

    def _duration(self, op: str) -> Any:
        child = self._durations.get(op)
        if child is None:
            child = self._durations[op] = metrics.DURATION.labels(self.server, op)
        return child

    def _access(self, peer: str, message: dict[str, Any], op: str, code: str, duration_ms: float) -> None:
        access.info("%s %s %.2f ms", op, code, duration_ms,
                    extra={"request_id": message.get("id"), "op": op, "code": code,
                           "duration_ms": round(duration_ms, 3), "client": peer})

