"""Request ids and OpenTelemetry spans, with the SDK's own in-memory exporter: a span per
request (its op, client and answer code) holding a span per SQL statement; the server's
request id, the trace id, in the answer of a server fault and in its log line."""
from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from support import PASSWORD, Market, ServerProcess, unique_name

from observe import tracing
from wire.errors import InternalError, NotFoundError


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install("buyer", provider)
    try:
        yield exporter
    finally:
        tracing.install("buyer")  # no endpoint set: request ids in the logs, no spans


def test_each_request_is_a_span_holding_its_statements(market: Market, spans: InMemorySpanExporter) -> None:
    buyer = market.user("buyer")
    spans.clear()
    buyer.call("display_cart")
    with pytest.raises(NotFoundError):
        buyer.call("add_to_cart", {"item_id": 10**9, "quantity": 1})
    finished = spans.get_finished_spans()
    requests = [span for span in finished if span.kind == SpanKind.SERVER]
    assert [span.name for span in requests] == ["display_cart", "add_to_cart"]
    assert [span.attributes["market.code"] for span in requests] == ["OK", "NOT_FOUND"]
    assert all(span.status.status_code == StatusCode.UNSET for span in requests)  # no server fault
    assert {span.attributes["client.address"] for span in requests} == {"127.0.0.1"}
    ids = [span.attributes["market.request_id"] for span in requests]
    assert ids == [format(span.context.trace_id, "032x") for span in requests] and len(set(ids)) == 2
    for request in requests:
        inside = [span for span in finished if span.parent is not None
                  and span.parent.span_id == request.context.span_id]
        assert [span.name for span in inside] == ["transaction"]  # the op's one transaction
        assert all(span.context.trace_id == request.context.trace_id for span in inside)


def test_without_an_endpoint_tracing_is_off(market: Market) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install("buyer", provider)
    tracing.install("buyer")  # no OTEL_EXPORTER_OTLP_ENDPOINT: off again
    market.user("buyer").call("display_cart")
    assert exporter.get_finished_spans() == ()


def test_a_server_with_an_endpoint_sends_its_spans_over_otlp(tmp_path: Path) -> None:
    received: list[ExportTraceServiceRequest] = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802  (http.server's name)
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append(ExportTraceServiceRequest.FromString(body))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    collector = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    try:
        server = ServerProcess("buyer", f"sqlite:///{tmp_path / 'market.db'}",
                               OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{collector.server_port}",
                               OTEL_BSP_SCHEDULE_DELAY="100").wait_ready()
        with server.connect() as conn:
            conn.call("ping")
        assert server.stop() == 0  # a stop sends what is left
    finally:
        collector.shutdown()
    spans = [(resource.resource, span) for request in received for resource in request.resource_spans
             for scope in resource.scope_spans for span in scope.spans]
    assert [span.name for _, span in spans] == ["ping"]
    assert {"market-buyer"} == {attribute.value.string_value for resource, _ in spans
                                for attribute in resource.attributes if attribute.key == "service.name"}


def test_a_server_fault_names_its_request_id_in_the_answer_and_the_log(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'market.db'}"
    server = ServerProcess("buyer", url, MARKET_LOG_FORMAT="json").wait_ready()
    name = unique_name()
    with server.connect() as conn:
        conn.call("create_account", {"username": name, "password": PASSWORD, "name": name})
        conn.token = conn.call("login", {"username": name, "password": PASSWORD})["token"]
        with sqlite3.connect(tmp_path / "market.db") as broken:
            broken.execute("DROP TABLE cart_lines")  # a bug's effect: the op's table is gone
        with pytest.raises(InternalError) as fault:
            conn.call("display_cart")
    assert server.stop() == 0
    request_id = fault.value.message.rsplit("(request ", 1)[1].rstrip(")")
    assert len(request_id) == 16 and "details are in the server log" in fault.value.message
    logged = [json.loads(line) for line in server.stderr().splitlines() if line.startswith("{")]
    line = next(line for line in logged if line["level"] == "ERROR")
    assert line["request_id"] == request_id and line["op"] == "display_cart" and "exception" in line
