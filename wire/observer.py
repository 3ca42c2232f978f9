"""Hooks the server loop and the client connection call for metrics, logs and tracing (the
package `observe` implements them): on the hot path, so cheap and never raising.
"""
from __future__ import annotations

import time
from typing import Any

now_ns = time.perf_counter_ns  # one clock (CLOCK_MONOTONIC) for every process on the machine
SUPERVISOR = "supervisor"  # the address of the supervisor's health checks (Server.adopt), no client's


class ServerObserver:
    """Hooks the server loop calls; override the ones you need (each is a no-op here)."""

    def connection_opened(self, address: str) -> None:
        """A client connected from `address`, its IP address (SUPERVISOR for a health check)."""

    def connection_closed(self, address: str) -> None:
        """A connection opened earlier was closed, by either side."""

    def connection_refused(self, address: str, reason: str) -> None:
        """A connection was turned away, or a client went unheard for a while; `reason` is one
        of observe.metrics' CONNECTIONS_REFUSED values, or "idle_evicted"."""

    def requests_read(self, count: int) -> None:
        """`count` requests were queued for an answer (negative: dropped unanswered)."""

    def answering(self, address: str, message: dict[str, Any] | Exception) -> None:
        """A thread takes up a queued request; what it logs until answer_sent is about this one."""

    def answer_sent(self, address: str, message: dict[str, Any] | Exception, response: dict[str, Any],
                    marks: tuple[int, int, int]) -> None:
        """An answer was handed to the socket; marks are the now_ns() of the request's reading,
        of a thread taking it up and of the answer going out (`message`: an exception for a bad frame)."""

    def threads_busy(self, delta: int) -> None:
        """A thread of the pool started (+1) or finished (-1) answering a connection's queue."""


class ClientObserver:
    """Hooks a client Connection calls around each call; a no-op here."""

    def request_id(self, number: int) -> Any:
        """The id of the connection's `number`th request (a tracer makes it unique across processes)."""
        return number

    def call_done(self, request_id: Any, op: str, start_ns: int, sending_ns: int,
                  first_byte_ns: int, done_ns: int) -> None:
        """One call finished: when it started, began sending, got its first answer byte, ended."""


NO_SERVER_OBSERVER = ServerObserver()
NO_CLIENT_OBSERVER = ClientObserver()
