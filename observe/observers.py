"""The server loop's observers: LogObserver (the loop's security events, the
sampled access log, trace records) and MarketObserver, which adds the metrics when served.
"""
from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

from wire import ERROR_CLASSES
from wire.app import UNKNOWN_OP, op_label
from wire.observer import SUPERVISOR, ServerObserver

from . import metrics
from .logs import Bursts, access, security
from .trace import TraceFile

Message = dict[str, Any] | Exception


def _loggable(request_id: Any) -> Any:
    """The client's request id as a log field: a number, or at most 64 printable characters."""
    if request_id is None or isinstance(request_id, int) and not isinstance(request_id, bool):
        return request_id
    text = request_id if isinstance(request_id, str) else repr(request_id)
    text = text if text.isprintable() else repr(text)
    return text if len(text) <= 64 else text[:63] + "…"


class LogObserver(ServerObserver):
    """Logs what the loop sees of one server (buyer or seller) serving `ops`."""

    def __init__(self, server: str, ops: Iterable[str], *, access_sample: float = 0.0,
                 trace: TraceFile | None = None) -> None:
        self.server = server
        self.ops = frozenset(ops)
        self.access_sample = access_sample
        self.trace = trace
        self._bursts = Bursts()

    def connection_refused(self, address: str, reason: str) -> None:
        if events := self._bursts.due(f"refused {reason}"):
            message = {"memory": "connection paused", "idle_evicted": "idle connection closed for a new one"
                       }.get(reason, "connection refused")
            security.warning(message, extra={"client": address, "reason": reason, "events": events})

    def answer_sent(self, address: str, message: Message, response: dict[str, Any],
                    marks: tuple[int, int, int]) -> None:
        if not isinstance(message, dict):
            if events := self._bursts.due("frame rejected"):
                error = response.get("error") or {}
                security.warning("frame rejected", extra={"client": address, "code": error.get("code"),
                                                          "reason": error.get("message"), "events": events})
            return
        if self.access_sample and (self.access_sample >= 1.0 or random.random() < self.access_sample):
            op, code, duration_ms = op_label(message, self.ops), _code(response), (marks[2] - marks[0]) / 1e6
            access.info("%s %s %.2f ms", op, code, duration_ms,
                        extra={"request_id": _loggable(message.get("id")), "op": op, "code": code,
                               "duration_ms": round(duration_ms, 3), "client": address})
        if self.trace is not None:
            self.trace.records.append(("S", message.get("id"), op_label(message, self.ops), *marks))


class MarketObserver(LogObserver):
    """LogObserver plus the loop's metrics (observe.metrics), each op's series made at 0 (every
    op name the server does not serve is UNKNOWN_OP: a client cannot grow the labels)."""

    def __init__(self, server: str, ops: Iterable[str], *, access_sample: float = 0.0,
                 trace: TraceFile | None = None) -> None:
        super().__init__(server, ops, access_sample=access_sample, trace=trace)
        labels = [*self.ops, UNKNOWN_OP, metrics.FRAME_ERROR_OP]
        self._counts = {(op, code): metrics.REQUESTS.labels(server, op, code)
                        for op in labels for code in ("OK", *ERROR_CLASSES)}
        self._durations = {op: metrics.DURATION.labels(server, op) for op in labels}
        self._open = metrics.CONNECTIONS_OPEN.labels(server)
        self._busy = metrics.THREADS_BUSY.labels(server)
        self._queued = metrics.REQUESTS_QUEUED.labels(server)

    # The supervisor's health checks (a ping every few seconds per worker) are no client's:
    # their connections and answers are not counted (their queueing and threads are).
    def connection_opened(self, address: str) -> None:
        if address != SUPERVISOR:
            self._open.inc()

    def connection_closed(self, address: str) -> None:
        if address != SUPERVISOR:
            self._open.dec()

    def connection_refused(self, address: str, reason: str) -> None:
        metrics.CONNECTIONS_REFUSED.labels(self.server, reason).inc()
        super().connection_refused(address, reason)

    def requests_read(self, count: int) -> None:
        self._queued.inc(count)

    def threads_busy(self, delta: int) -> None:
        self._busy.inc(delta)

    def answering(self, address: str, message: Message) -> None:
        self._queued.dec()

    def answer_sent(self, address: str, message: Message, response: dict[str, Any],
                    marks: tuple[int, int, int]) -> None:
        if address != SUPERVISOR:
            op = op_label(message, self.ops) if isinstance(message, dict) else metrics.FRAME_ERROR_OP
            self._counts[op, _code(response)].inc()
            self._durations[op].observe((marks[2] - marks[0]) / 1e9)
        super().answer_sent(address, message, response, marks)


def _code(response: dict[str, Any]) -> str:
    error = response.get("error")
    return str(error.get("code", "INTERNAL")) if error else "OK"
