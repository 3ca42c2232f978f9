"""What `python -m buyer_server` and `python -m seller_server` share: settings, logging,
the database, the App and the server loop, from one call; with `--workers N` the parent
binds the port and supervises N forked workers (runtime.supervisor).
"""
from __future__ import annotations

import contextlib
import functools
import gc
import importlib
import logging
import os
import socket
import ssl
import sys
from collections.abc import Callable, Iterator
from dataclasses import fields
from typing import Any

from wire.app import App, Background
from wire.tls import server_context

from .admission import listen
from .config import Settings, server_settings
from .server import Server, ServerLimits
from .signals import StopRequested, StopSignals
from .supervisor import Supervisor, WorkerFailed

log = logging.getLogger("market.runner")
BuildApp = Callable[[Settings, Any], App]


class CannotStart(Exception):
    """The server cannot start as set up (its database, TLS files or address): one line for the user."""


@contextlib.contextmanager
def _cannot_start(what: str) -> Iterator[None]:
    """An OSError in the block as CannotStart, saying `what` could not be done."""
    try:
        yield
    except OSError as exc:
        raise CannotStart(f"{what}: {exc.strerror or exc}") from None


def _serve_metrics(settings: Settings, draining: Callable[[], bool]) -> None:
    """The metrics port, if set (observe.serving). /readyz's question: "" when the process serves
    and its database answers at the schema this code needs; else why not (a connection of its
    own per check: no pool to fork)."""
    from observe import serving

    def reason() -> str:
        if draining():
            return "draining"
        from db import Database
        from db.migrations import check_current

        database = Database(settings.db_url, pool_size=1)
        try:
            check_current(database)
        except Exception as exc:  # unreachable, or a schema this code cannot use: not ready
            return f"database: {exc}"
        finally:
            database.close()
        return ""

    with _cannot_start(f"cannot serve metrics on {settings.metrics_host}:{settings.metrics_port}"):
        serving.serve_metrics(settings, reason)


def main(role: str, build_app: BuildApp | None = None, argv: list[str] | None = None) -> int:
    """Parse settings, prepare the database, and serve until stopped. `build_app` defaults to
    ROLE_server.ops.build_app, imported once a signal stops the start cleanly (it takes most of it)."""
    stops = StopSignals()  # from here on SIGTERM and Ctrl-C stop the server cleanly, even mid-start
    try:
        settings = server_settings(role, argv)
        from observe import serving  # before anything imports prometheus_client (see observe.serving)
    except StopRequested:  # before logging is set up: nothing to say
        return 0
    try:
        serving.prepare(settings)
        # every series at 0, named by role
        importlib.import_module("observe.metrics").start(role, serve=settings.metrics_port is not None)
        importlib.import_module("observe.tracing").install(role)  # request ids; spans if configured
        # the migrations library logs each plugin and step; db.migrations says what it did in one line
        logging.getLogger("alembic").setLevel(logging.WARNING)
        if build_app is None:
            build_app = importlib.import_module(f"{role}_server.ops").build_app
        return _start(build_app, settings, stops)
    except StopRequested:
        log.info("stopped before serving")
        return 0
    except (CannotStart, WorkerFailed) as exc:
        print(f"error: {role} server: {exc}", file=sys.stderr)
        return 2
    finally:
        serving.stopped()


def _start(build_app: BuildApp, settings: Settings, stops: StopSignals) -> int:
    from db import Database, DatabaseUnusable
    from db.migrations import check_current, upgrade

    schema_db = Database(settings.db_url, pool_size=1)
    try:
        if settings.upgrade_schema:
            upgrade(schema_db)
        else:
            check_current(schema_db)
    except DatabaseUnusable as exc:
        raise CannotStart(str(exc)) from None
    finally:
        with stops.held():
            schema_db.close()
    tls = None
    if settings.tls_cert and settings.tls_key:
        with _cannot_start(f"cannot use the TLS certificate {settings.tls_cert} and key {settings.tls_key}"):
            tls = server_context(settings.tls_cert, settings.tls_key)  # ssl.SSLError is an OSError
    if settings.workers <= 1:
        _serve(settings, build_app, tls, stops, announce)
        return 0
    return _supervise(settings, build_app, tls)


def announce(server: Server) -> None:
    """Say the server listens (on stdout, where scripts and tests wait for it)."""
    host, port = server.address
    log.info("serving %s", "TLS" if server.tls else "plaintext")
    if os.environ.get("MARKET_TEST_FAST_HASHES") == "1":
        log.warning("MARKET_TEST_FAST_HASHES=1: new password hashes are weak; for tests only")
    print(f"listening on {host}:{port}", flush=True)


def _serve(settings: Settings, build_app: BuildApp, tls: ssl.SSLContext | None, stops: StopSignals,
           ready: Callable[[Server], None], listener: socket.socket | None = None) -> None:
    """One server process: its own database pool, App and loop."""
    from db import Database
    from observe import serving

    from .housekeeping import Housekeeper

    stops.hold()  # threads start from here: a signal must not cut that short
    database = Database(settings.db_url, pool_size=settings.threads,
                        sqlite_synchronous=settings.sqlite_synchronous)
    try:
        app = build_app(settings, database)
        observer = serving.observer_for(settings, app)
        limits = ServerLimits(**{f.name: getattr(settings, f.name) for f in fields(ServerLimits)
                                 if hasattr(settings, f.name)})  # the settings of the same names
        with _cannot_start(f"cannot listen on {settings.host}:{settings.port}"):
            server = Server(app, settings.host, settings.port, limits, listener, tls, observer)
        if listener is None:  # one process: it serves its own /metrics (workers: the supervisor)
            _serve_metrics(settings, lambda: server.stopping)
        # Everything made so far (modules, SQLAlchemy's metadata and engine, the App) lives as
        # long as the process: keep it out of the collector's full passes, which scanned it all.
        gc.freeze()
        tasks: list[Background] = [Housekeeper.for_settings(database, settings), *app.background]
        for task in tasks:
            task.start()
        try:
            stops.serve(server, ready)
        finally:
            for task in tasks:
                task.stop()
    finally:
        database.close()


def _supervise(settings: Settings, build_app: BuildApp, tls: ssl.SSLContext | None) -> int:
    """Bind the port, fork the workers that serve it, restart any that dies (runtime.supervisor)."""
    with _cannot_start(f"cannot listen on {settings.host}:{settings.port}"):
        listener = listen(settings.host, settings.port)
    supervisor = Supervisor(settings.workers, settings.worker_timeout_s, listener,
                            functools.partial(_serve, settings, build_app, tls, listener=listener))
    _serve_metrics(settings, supervisor.draining)
    return supervisor.run()
