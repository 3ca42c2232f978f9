"""Observing a server process: logging set up first, /metrics served (by the process, or by
the supervisor of `--workers N` summing its workers through prometheus_client's
multiprocess mode), and the loop's observer made for the App.

`prepare` must run before anything imports prometheus_client: the library picks its
multiprocess mode once, from PROMETHEUS_MULTIPROC_DIR, at import.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import logs
from .http import HttpServer

log = logging.getLogger("market.observe")
MULTIPROC_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
_made_folder: str | None = None  # the multiprocess folder this process made (removed at stop)
_http: HttpServer | None = None  # the metrics port's server of this process


def prepare(settings: Any) -> None:
    """Set up logging, the multiprocess folder (metrics on, several workers) and metrics.served."""
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
    from . import metrics  # once the folder is known

    metrics.served = settings.metrics_port is not None


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
    try:
        _http = HttpServer(settings.metrics_host, settings.metrics_port, routes, settings.metrics_connections)
    except OSError as exc:
        raise OSError(f"cannot serve metrics on {settings.metrics_host}:{settings.metrics_port}: "
                      f"{exc.strerror or exc}") from None
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
    from .server import LogObserver, MarketObserver
    from .trace import trace_file

    kind = LogObserver if settings.metrics_port is None else MarketObserver
    return kind(settings.role, getattr(app, "specs", ()), access_sample=settings.access_log,
                trace=trace_file())
