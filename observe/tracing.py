"""Request ids and OpenTelemetry traces of a server process.

Every request gets an id (its log lines' `request_id`, named in INTERNAL and UNAVAILABLE
answers). With an OTLP endpoint set (the SDK's OTEL_* variables) each request is also a span
with a child per database transaction, and its id is the trace id.
"""
from __future__ import annotations

import contextvars
import itertools
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from wire.app import SERVER_FAULTS, App, RequestScope
from wire.errors import ProtocolError

from .logs import REQUEST

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


class LoggedScope(RequestScope):
    """The request's id, made here, in the log context while it is answered."""

    def request(self, op: str, peer: str | None) -> AbstractContextManager[str]:
        return Logged(f"{_prefix}{next(_count) & 0xFFFFFFFF:08x}", op, peer)


def _draw_ids() -> None:
    """Request ids: 8 random hex digits of this process, then its count of requests (cheaper
    than random bits for each); a forked worker draws its own digits."""
    global _prefix, _count
    _prefix, _count = os.urandom(4).hex(), itertools.count()


_prefix, _count = "", itertools.count()
_draw_ids()
os.register_at_fork(after_in_child=_draw_ids)


class Logged:
    """One request's log context: (its id, op, client address) while it is answered."""

    __slots__ = ("fields", "token")

    def __init__(self, request_id: str, op: str, peer: str | None) -> None:
        self.fields = (request_id, op, peer or "")

    def __enter__(self) -> str:
        self.token = REQUEST.set(self.fields)
        return self.fields[0]

    def __exit__(self, *_: object) -> None:
        REQUEST.reset(self.token)


class TracedScope(RequestScope):
    """A span per request, its trace id the request's id."""

    def __init__(self, tracer: Any) -> None:
        self.tracer = tracer

    @contextmanager
    def request(self, op: str, peer: str | None) -> Iterator[str]:
        from opentelemetry.trace import SpanKind, Status, StatusCode

        attributes = {"market.op": op, "client.address": peer or ""}
        with self.tracer.start_as_current_span(op, kind=SpanKind.SERVER, attributes=attributes,
                                               record_exception=False, set_status_on_exception=False) as span:
            request_id = format(span.get_span_context().trace_id, "032x")
            span.set_attribute("market.request_id", request_id)
            try:
                with Logged(request_id, op, peer):
                    yield request_id
            except ProtocolError as exc:
                span.set_attribute("market.code", exc.code)
                if exc.code in SERVER_FAULTS:
                    span.set_status(Status(StatusCode.ERROR, exc.code))
                raise
            span.set_attribute("market.code", "OK")


def install(server: str, provider: Any = None) -> None:
    """Give every App of this process its request ids and, with an OTLP endpoint set (or a
    TracerProvider given: a test's), its spans and its transactions'."""
    if provider is None and not any(os.environ.get(name) for name in ENDPOINT_VARIABLES):
        App.scope = LoggedScope()
        _tracer.clear()
        return
    if provider is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        name = os.environ.get("OTEL_SERVICE_NAME") or f"market-{server}"
        provider = TracerProvider(resource=Resource.create({"service.name": name}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    tracer = provider.get_tracer("market")
    App.scope = TracedScope(tracer)
    _tracer[:] = [tracer]


_tracer: list[Any] = []  # the transactions' spans are made by it while tracing is on
# the transactions open on this thread, each a span made current until it ends
_open: contextvars.ContextVar[tuple[tuple[Any, Any] | None, ...]] = contextvars.ContextVar("market_tx",
                                                                                          default=())


def transaction(delta: int) -> None:
    """A transaction took a database connection (+1) or gave it back (-1): with tracing on,
    a span from one to the other, inside the request's."""
    if not _tracer:
        return
    from opentelemetry import context, trace

    if delta > 0:
        if not trace.get_current_span().is_recording():  # housekeeping's, say: in no request
            _open.set((*_open.get(), None))
            return
        span = _tracer[0].start_span("transaction", kind=trace.SpanKind.CLIENT)
        _open.set((*_open.get(), (span, context.attach(trace.set_span_in_context(span)))))
    elif opened := _open.get():
        _open.set(opened[:-1])
        if opened[-1] is not None:
            span, token = opened[-1]
            context.detach(token)
            span.end()
