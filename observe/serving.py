"""Observing a server process: logging set up first, the loop's observer, and the metrics
port (/metrics, summed over `--workers N` by prometheus_client's multiprocess mode; /healthz;
/readyz) on one thread (an asyncio loop), at most MAX_CONNECTIONS open (the oldest gives
way), MARKET_METRICS_TIMEOUT_S each, an 8 KiB head, one GET or HEAD per connection.

`prepare` must run before anything imports prometheus_client: the library picks its
multiprocess mode once, from PROMETHEUS_MULTIPROC_DIR, at import.
"""
from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path
from typing import Any

from . import logs

log = logging.getLogger("market.observe")
MULTIPROC_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
MAX_CONNECTIONS = 16  # open at once (the oldest gives way)
_MAX_HEAD = 8192
Route = Callable[[], tuple[int, str, bytes]]  # status, content type, body
_made_folder: str | None = None  # the multiprocess folder this process made (removed at stop)
_http: HttpServer | None = None  # the metrics port's server of this process


def prepare(settings: Any) -> None:
    """Set up logging and the multiprocess folder (metrics on, several workers)."""
    global _made_folder
    logs.configure(settings.role, settings.log_level, settings.log_format)
    if settings.metrics_port is not None and settings.workers > 1:
        folder = os.environ.get(MULTIPROC_VARIABLE)
        if folder:  # the operator's: left over files of an earlier run would be summed too
            for stale in Path(folder).glob("*.db"):
                stale.unlink()
        else:
            folder = _made_folder = tempfile.mkdtemp(prefix="market-metrics-")
            os.environ[MULTIPROC_VARIABLE] = folder


def serve_metrics(settings: Any, ready: Callable[[], str]) -> None:
    """Serve /metrics (this process's metrics, or all workers' summed), /healthz (200 while the
    process serves HTTP) and /readyz (200 when `ready` says "", else 503 and its reason) on
    --metrics-port, if set."""
    global _http
    if settings.metrics_port is None:
        return
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

    registry = REGISTRY
    if os.environ.get(MULTIPROC_VARIABLE):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)

    def readiness() -> tuple[int, str, bytes]:
        reason = ready()
        return (503, "text/plain", f"not ready: {reason}\n".encode()) if reason else \
            (200, "text/plain", b"ready\n")

    routes = {"/metrics": lambda: (200, CONTENT_TYPE_LATEST, generate_latest(registry)),
              "/healthz": lambda: (200, "text/plain", b"ok\n"), "/readyz": readiness}
    _http = HttpServer(settings.metrics_host, settings.metrics_port, routes, settings.metrics_timeout_s)
    log.info("metrics at http://%s:%d/metrics", settings.metrics_host, settings.metrics_port)


def in_worker() -> None:
    """In a forked worker: close the supervisor's metrics sockets (it serves, not the worker)."""
    if _http is not None:
        _http.close_in_child()


def worker_ended(pid: int) -> None:
    """A worker exited: its gauges leave the sums (its counters stay)."""
    if os.environ.get(MULTIPROC_VARIABLE):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)


def stopped() -> None:
    """The server (or supervisor) stops: stop serving /metrics, remove the folder made for it."""
    if _http is not None:
        _http.close()
    if _made_folder is not None:
        shutil.rmtree(_made_folder, ignore_errors=True)


def observer_for(settings: Any, app: Any) -> Any:
    """The server loop's observer for this App: with the metrics when served, else the logs'."""
    from .observers import LogObserver, MarketObserver
    from .trace import trace_file

    kind = LogObserver if settings.metrics_port is None else MarketObserver
    return kind(settings.role, getattr(app, "specs", ()), access_sample=settings.access_log,
                trace=trace_file())


class HttpServer:
    """Serves `routes` (path -> Route) on host:port from one thread until `close`, each
    connection for at most `time_limit_s`."""

    def __init__(self, host: str, port: int, routes: dict[str, Route], time_limit_s: float) -> None:
        self.routes, self.time_limit_s = routes, time_limit_s
        self._listener = socket.create_server((host, port), backlog=64)
        self._exchanges: dict[asyncio.Task[None], asyncio.StreamWriter] = {}  # in the order they connected
        self._loop = asyncio.new_event_loop()
        self._stopping = asyncio.Event()
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._serve(),),
                                        name="market-metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving and close every connection."""
        self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join()
        self._loop.close()

    def close_in_child(self) -> None:
        """In a forked process: let go of the sockets the parent serves."""
        self._listener.close()
        for writer in self._exchanges.values():
            os.close(writer.get_extra_info("socket").fileno())

    async def _serve(self) -> None:
        server = await asyncio.start_server(self._exchange, sock=self._listener, limit=_MAX_HEAD)
        await self._stopping.wait()
        server.close()
        for writer in self._exchanges.values():
            writer.transport.abort()
        await asyncio.gather(*self._exchanges)

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._exchanges) >= MAX_CONNECTIONS:  # the oldest gives way
            self._exchanges.pop(next(iter(self._exchanges))).transport.abort()
        task = asyncio.current_task()
        assert task is not None
        self._exchanges[task] = writer
        try:
            async with asyncio.timeout(self.time_limit_s):
                status, kind, body = await self._answer(reader)
                writer.write(f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: {kind}\r\n"
                             f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
                writer.transport.set_write_buffer_limits(0)  # drain() waits for all of it
                await writer.drain()
        except (TimeoutError, OSError, asyncio.IncompleteReadError):
            pass  # out of time, gone, or closed before its head ended: no answer
        finally:
            self._exchanges.pop(task, None)
            writer.transport.abort()

    async def _answer(self, reader: asyncio.StreamReader) -> tuple[int, str, bytes]:
        """Read the head (up to an empty line) and route its request line."""
        head = b""
        try:
            while not head.endswith((b"\n\n", b"\n\r\n")):
                head += await reader.readuntil(b"\n")
                if len(head) > _MAX_HEAD:
                    raise asyncio.LimitOverrunError("the head is too large", len(head))
        except asyncio.LimitOverrunError:  # the head, or one of its lines, over _MAX_HEAD
            return 431, "text/plain", b"request too large\n"
        return self._route(head)

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
