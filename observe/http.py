"""The metrics port's HTTP server, at bounded cost: one thread and a selector, at most
`max_connections` open (the oldest gives way), TIME_LIMIT_S each, an 8 KiB head, one GET or
HEAD per connection.
"""
from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("market.observe")
TIME_LIMIT_S = 5.0
_MAX_HEAD = 8192
Route = Callable[[], tuple[int, str, bytes]]  # status, content type, body
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            431: "Request Header Fields Too Large", 503: "Service Unavailable"}


@dataclass
class _Exchange:
    sock: socket.socket
    deadline: float
    received: bytearray = field(default_factory=bytearray)
    answer: bytes = b""


class HttpServer:
    """Serves `routes` (path -> Route) on host:port from one thread until `close`."""

    def __init__(self, host: str, port: int, routes: dict[str, Route], max_connections: int) -> None:
        self.routes, self.max_connections = routes, max_connections
        self._listener = socket.create_server((host, port), backlog=64)
        self._listener.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._exchanges: dict[socket.socket, _Exchange] = {}  # in the order they connected
        self._stopping = False
        self._thread = threading.Thread(target=self._serve, name="market-metrics", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        """The port actually bound."""
        return int(self._listener.getsockname()[1])

    def close(self) -> None:
        """Stop serving and close every connection."""
        self._stopping = True
        self._thread.join()

    def close_in_child(self) -> None:
        """In a forked process: let go of the sockets the parent serves."""
        for sock in [self._listener, *self._exchanges]:
            sock.close()
        self._selector.close()

    def _serve(self) -> None:
        while not self._stopping:
            for key, events in self._selector.select(timeout=0.25):
                if key.fileobj is self._listener:
                    self._accept()
                elif events & selectors.EVENT_WRITE:
                    self._write(self._exchanges[key.fileobj])  # type: ignore[index]
                else:
                    self._read(self._exchanges[key.fileobj])  # type: ignore[index]
            now = time.monotonic()
            for exchange in [e for e in self._exchanges.values() if e.deadline < now]:
                self._end(exchange)
        for exchange in list(self._exchanges.values()):
            self._end(exchange)
        self._selector.close()
        self._listener.close()

    def _accept(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except OSError:  # gone already, or out of descriptors: the client waits in the backlog
            return
        if len(self._exchanges) >= self.max_connections:
            self._end(next(iter(self._exchanges.values())))  # the oldest gives way
        sock.setblocking(False)
        self._exchanges[sock] = _Exchange(sock, time.monotonic() + TIME_LIMIT_S)
        self._selector.register(sock, selectors.EVENT_READ)

    def _read(self, exchange: _Exchange) -> None:
        try:
            data = exchange.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._end(exchange)
            return
        exchange.received += data
        if b"\r\n\r\n" in exchange.received or b"\n\n" in exchange.received:
            self._answer(exchange, *self._route(bytes(exchange.received)))
        elif len(exchange.received) > _MAX_HEAD:
            self._answer(exchange, 431, "text/plain", b"request too large\n")

    def _route(self, head: bytes) -> tuple[int, str, bytes]:
        parts = head.split(b"\n", 1)[0].split()
        if len(parts) != 3:
            return 400, "text/plain", b"bad request\n"
        method, target = parts[0], parts[1].split(b"?", 1)[0].decode("latin-1")
        route = self.routes.get(target)
        if route is None:
            return 404, "text/plain", b"not found\n"
        if method not in (b"GET", b"HEAD"):
            return 405, "text/plain", b"GET only\n"
        try:
            status, kind, body = route()
        except Exception:
            log.exception("serving %s failed", target)
            return 503, "text/plain", b"failed\n"
        return status, kind, b"" if method == b"HEAD" else body

    def _answer(self, exchange: _Exchange, status: int, kind: str, body: bytes) -> None:
        head = (f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\nContent-Type: {kind}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
        exchange.answer = head.encode() + body
        self._selector.modify(exchange.sock, selectors.EVENT_WRITE)
        self._write(exchange)

    def _write(self, exchange: _Exchange) -> None:
        try:
            sent = exchange.sock.send(exchange.answer)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            sent = len(exchange.answer)
        exchange.answer = exchange.answer[sent:]
        if not exchange.answer:
            self._end(exchange)

    def _end(self, exchange: _Exchange) -> None:
        self._selector.unregister(exchange.sock)
        del self._exchanges[exchange.sock]
        exchange.sock.close()
