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
from pathlib import Path
from typing import Any

from . import logs

log = logging.getLogger("market.observe")
MULTIPROC_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
_made_folder: str | None = None  # the multiprocess folder this process made (removed at stop)
_http: Any = None  # the /metrics server of this process


def prepare(settings: Any) -> None:
    """Set up logging; with metrics on and several workers, an empty multiprocess folder;
    metrics.served, so that the per-call gauges are kept only when /metrics is served."""
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


def serve_metrics(settings: Any) -> None:
    """Serve /metrics on --metrics-port, if set: this process's metrics, or all workers' summed."""
    global _http
    if settings.metrics_port is None:
        return
    from prometheus_client import REGISTRY, CollectorRegistry, start_http_server

    registry = REGISTRY
    if os.environ.get(MULTIPROC_VARIABLE):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    try:
        _http, _ = start_http_server(settings.metrics_port, settings.metrics_host, registry=registry)
    except OSError as exc:
        raise OSError(f"cannot serve metrics on {settings.metrics_host}:{settings.metrics_port}: "
                      f"{exc.strerror or exc}") from None
    log.info("metrics at http://%s:%d/metrics", settings.metrics_host, settings.metrics_port)


def in_worker() -> None:
    """In a forked worker: close the supervisor's /metrics socket (it serves, not the worker)."""
    if _http is not None:
        _http.socket.close()


def worker_ended(pid: int) -> None:
    """A worker exited: its gauges (connections open, threads busy) leave the sums; its
    counters stay, so the totals neither drop nor double when it is replaced."""
    if os.environ.get(MULTIPROC_VARIABLE):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)


def stopped() -> None:
    """The server (or supervisor) stops: stop serving /metrics, remove the folder made for it."""
    if _http is not None:
        _http.shutdown()
        _http.server_close()
    if _made_folder is not None:
        shutil.rmtree(_made_folder, ignore_errors=True)


def observer_for(settings: Any, app: Any) -> Any:
    """The server loop's observer for this App (a wire.observer.ServerObserver): with the
    metrics when they are served, else the logs' alone."""
    from .server import LogObserver, MarketObserver
    from .trace import trace_file

    kind = LogObserver if settings.metrics_port is None else MarketObserver
    return kind(settings.role, getattr(app, "specs", ()), access_sample=settings.access_log,
                trace=trace_file())
