"""What `python -m buyer_server` and `python -m seller_server` share: settings,
logging, the database, the App and the server loop, from one call.

With `--workers N` (N > 1) the process forks N workers that each bind the same
port with SO_REUSEPORT, so the kernel spreads connections over N processes and
Python gets past one core; the parent only supervises (restarts a worker that
dies, passes SIGTERM on). The servers keep no state, so workers need no sharing.
Logs, metrics and tracing are the package `observe`'s; it and `db` are imported once the
settings are read (see `main`).
"""
from __future__ import annotations

import ctypes
import gc
import importlib
import logging
import os
import signal
import socket
import ssl
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from wire.app import App
from wire.server import Server, ServerLimits, StopRequested, StopSignals, reserve_port
from wire.tls import server_context

from .config import Settings, database_pool_size, server_settings
from .health import HealthWatch, join_health_checks

log = logging.getLogger("market.runner")
BuildApp = Callable[[Settings, Any], App]
T = TypeVar("T")
_PR_SET_PDEATHSIG = 1
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}
_FIRST_PAUSE_S, _LONGEST_PAUSE_S = 0.5, 30.0  # before restarting a worker that died
_HEALTHY_AFTER_S = 10.0  # a worker that lived this long: the next pause is the first again
_GIVE_UP_AFTER = 5  # workers started in a row that died before they listened
_SIGNAL_CHECK_S = 0.1  # how often the supervisor looks for a signal to handle, while it waits


class CannotListen(OSError):
    """The server's address cannot be bound (in use, or not this machine's): one line for the user."""


class WorkerFailed(Exception):
    """A worker process of `--workers N` died before it listened (it logged why)."""


def _bound(host: str, port: int, bind: Callable[[], T]) -> T:
    """bind(), with its OSError as CannotListen naming the address."""
    try:
        return bind()
    except OSError as exc:
        raise CannotListen(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def _serve_metrics(serving: Any, settings: Settings) -> None:
    """/metrics served if asked for, or CannotListen saying why not."""
    try:
        serving.serve_metrics(settings)
    except OSError as exc:
        raise CannotListen(str(exc)) from None


def limits_of(settings: Settings) -> ServerLimits:
    """The server loop's limits from settings."""
    return ServerLimits(max_connections=settings.max_connections, max_frame=settings.max_frame,
                        idle_timeout_s=settings.idle_timeout_s,
                        frame_deadline_s=settings.frame_deadline_s, threads=settings.threads,
                        aside_threads=settings.purchase_threads,
                        max_connections_per_address=settings.max_connections_per_address,
                        new_connections_per_s_per_address=settings.new_connections_per_s_per_address,
                        max_queued_bytes_per_connection=settings.max_queued_bytes_per_connection,
                        max_queued_bytes=settings.max_queued_bytes)


def main(role: str, build_app: BuildApp | None = None, argv: list[str] | None = None) -> int:
    """Parse settings, prepare the database, and serve until stopped.

    `build_app` defaults to ROLE_server.ops.build_app, imported only once SIGTERM and Ctrl-C
    stop the server cleanly: that import (SQLAlchemy and the ops) takes most of a start."""
    stops = StopSignals()  # from here on SIGTERM and Ctrl-C stop the server cleanly, even mid-start
    try:
        settings = server_settings(role, argv)
        from observe import serving  # before anything imports prometheus_client (see observe.serving)
    except StopRequested:  # before logging is set up: nothing to say
        return 0
    try:
        serving.prepare(settings)
        # the migrations library logs each plugin and step; db.migrations says what it did in one line
        logging.getLogger("alembic").setLevel(logging.WARNING)
        if build_app is None:
            build_app = importlib.import_module(f"{role}_server.ops").build_app
        return _start(role, build_app, settings, stops)
    except StopRequested:
        log.info("stopped before serving")
        return 0
    finally:
        serving.stopped()


def _start(role: str, build_app: BuildApp, settings: Settings, stops: StopSignals) -> int:
    from db import Database, DatabaseUnusable
    from db.cache import CacheUnusable
    from db.migrations import check_current, upgrade

    schema_db = Database(settings.db_url, pool_size=1)
    try:
        if settings.upgrade_schema:
            upgrade(schema_db)
        else:
            check_current(schema_db)
    except DatabaseUnusable as exc:
        print(f"error: {role} server: {exc}", file=sys.stderr)
        return 2
    finally:
        with stops.held():
            schema_db.close()
    try:
        tls = server_context(settings.tls_cert, settings.tls_key) if settings.tls_cert and settings.tls_key \
            else None
    except OSError as exc:  # ssl.SSLError among them
        print(f"error: {role} server: cannot use the TLS certificate {settings.tls_cert} and key "
              f"{settings.tls_key}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    try:
        if settings.workers <= 1:
            _serve(settings, build_app, settings.port, tls, stops, ready=_announce)
            return 0
        return _supervise(settings, build_app, tls)
    except (CannotListen, WorkerFailed, CacheUnusable) as exc:
        print(f"error: {role} server: {exc}", file=sys.stderr)
        return 2


def _announce(server: Server) -> None:
    host, port = server.address
    log.info("serving %s", "TLS" if server.tls else "plaintext")
    print(f"listening on {host}:{port}", flush=True)


def _serve(settings: Settings, build_app: BuildApp, port: int, tls: ssl.SSLContext | None,
           stops: StopSignals, ready: Callable[[Server], None], reuse_port: bool = False) -> None:
    """One server process: its own database pool, App and loop."""
    from db import Database
    from observe import serving

    from .housekeeping import Housekeeper

    stops.hold()  # threads start from here: a signal must not cut that short
    database = Database(settings.db_url, pool_size=database_pool_size(settings),
                        sqlite_synchronous=settings.sqlite_synchronous)
    housekeeper = Housekeeper.for_settings(database, settings)
    try:
        app = build_app(settings, database)
        housekeeper.start()
        observer = serving.observer_for(settings, app)
        server = _bound(settings.host, port, lambda: Server(
            app, settings.host, port, limits_of(settings), reuse_port=reuse_port, tls=tls, observer=observer))
        if not reuse_port:  # one process: it serves its own /metrics (workers: the supervisor)
            _serve_metrics(serving, settings)
        # Everything made so far (modules, SQLAlchemy's metadata and engine, the App) lives as
        # long as the process: keep it out of the collector's full passes, which scanned it all.
        gc.freeze()
        for task in app.background:  # the buyer server's settler
            task.start()
        try:
            stops.serve(server, ready)
        finally:
            for task in app.background:
                task.stop()
    finally:
        housekeeper.close()
        database.close()


def _supervise(settings: Settings, build_app: BuildApp, tls: ssl.SSLContext | None) -> int:
    """Fork the workers, announce the port once they listen, restart any that dies."""
    return _Supervisor(settings, build_app, tls).run()


class _Supervisor:
    """The parent of `--workers N`: forks the workers, passes SIGTERM on, kills a worker that
    leaves a health check unanswered (runtime.health), and restarts a worker that dies,
    pausing longer after each quick death (0.5 s, doubling up to 30 s), and giving up
    (exit 2) when five started in a row died before they listened. It holds the port all
    its life, so nothing else takes it while a worker is being replaced."""

    def __init__(self, settings: Settings, build_app: BuildApp, tls: ssl.SSLContext | None) -> None:
        from observe import serving

        self.settings, self.build_app, self.tls = settings, build_app, tls
        host, port = settings.host, settings.port
        self.reserved = _bound(host, port, lambda: reserve_port(host, port))
        self.observe = serving
        _serve_metrics(serving, settings)
        self.port = self.reserved.getsockname()[1]
        self.workers: dict[int, float] = {}  # pid: when it started
        self.stopping = False
        self.ended_before_stop: set[int] = set()
        self.pause_s = _FIRST_PAUSE_S
        self.failed_starts = 0  # in a row
        self.health = HealthWatch(settings.worker_timeout_s, tls is not None, lambda: self.stopping)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.stop)  # before the first worker listens
        signal.signal(signal.SIGINT, self.stop)
        try:
            started = [self.start_worker() for _ in range(self.settings.workers) if not self.stopping]
            if not self.stopping and not all(started):
                raise WorkerFailed("a worker process could not start (its error is above)")
            if not self.stopping:
                log.info("%d worker processes share the port", self.settings.workers)
                print(f"listening on {self.settings.host}:{self.port}", flush=True)
            return self.watch()
        except WorkerFailed:
            _stop_all(set(self.workers))
            raise
        finally:
            self.health.close()
            self.reserved.close()

    def stop(self, signum: int, _frame: Any) -> None:
        if not self.stopping:
            log.info("signal %d: stopping %d workers", signum, len(self.workers))
            # ended already, not yet waited for (a replacement was starting): no failure of the stop
            self.ended_before_stop = {pid for pid in self.workers if _has_ended(pid)}
        self.stopping = True
        for pid in self.workers:
            _signal(pid, signal.SIGTERM)

    def start_worker(self) -> bool:
        pid, listening = _fork_worker(self.settings, self.build_app, self.port, self.tls, self.reserved,
                                      self.health)
        self.workers[pid] = time.monotonic()
        if self.stopping:  # the signal came while it started: it was not among those told
            _signal(pid, signal.SIGTERM)
        return listening

    def watch(self) -> int:
        """Wait for the workers; replace those that die, until stopped."""
        failed = False
        while self.workers:
            pid, status = _next_ended()
            lived = time.monotonic() - self.workers.pop(pid)
            self.observe.worker_ended(pid)
            if self.stopping:
                ended_badly = os.waitstatus_to_exitcode(status) != 0
                failed = failed or (ended_badly and pid not in self.ended_before_stop)
            elif not self.replace(pid, status, lived):
                raise WorkerFailed(f"{_GIVE_UP_AFTER} workers started in a row died before they listened "
                                   "(their errors are above)")
        return 1 if failed else 0

    def replace(self, pid: int, status: int, lived: float) -> bool:
        """Start another worker after a pause; False when too many in a row could not listen."""
        if lived >= _HEALTHY_AFTER_S:
            self.pause_s = _FIRST_PAUSE_S
        pause, self.pause_s = self.pause_s, min(2 * self.pause_s, _LONGEST_PAUSE_S)
        log.error("worker %d %s after %.1f s; starting another in %.1f s", pid, _how_it_ended(status),
                  lived, pause)
        until = time.monotonic() + pause
        while not self.stopping and time.monotonic() < until:
            time.sleep(0.05)
        if self.stopping:
            return True
        self.failed_starts = 0 if self.start_worker() else self.failed_starts + 1
        return self.failed_starts < _GIVE_UP_AFTER


def _next_ended() -> tuple[int, int]:
    """The pid and wait status of the next child to end, waited for in short naps.

    Not a blocking os.wait(): Python runs signal handlers on the main thread between its own
    steps, so a SIGTERM that came just before the wait began, or that the kernel handed to
    another thread (a health check's), would be handled only once a worker ended, and none
    would: the supervisor never stopped."""
    while True:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid:
            return pid, status
        time.sleep(_SIGNAL_CHECK_S)


def _has_ended(pid: int) -> bool:
    """Whether the child has ended, leaving it to be waited for (WNOWAIT), or is ending: on
    Linux, its main thread a zombie already while its other threads finish dying (a few ms
    after a SIGKILL, when no wait finds it yet). A worker's main thread ends last of its
    threads unless the process dies."""
    try:
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return True
    except ChildProcessError:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[0] in (b"Z", b"X")
    except (OSError, IndexError):
        return False  # no /proc, or gone meanwhile


def _how_it_ended(status: int) -> str:
    """'exited with status 1', 'was killed by SIGKILL': a wait status in words."""
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        return f"exited with status {code}"
    try:
        return f"was killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"was killed by signal {-code}"


def _fork_worker(settings: Settings, build_app: BuildApp, port: int, tls: ssl.SSLContext | None,
                 reserved: socket.socket, health: HealthWatch) -> tuple[int, bool]:
    """A worker process serving `port`, and whether it listens: returns once it does, or has died."""
    ready_r, ready_w = os.pipe()
    parent = os.getpid()
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)  # none reaches the child before its handlers
    try:
        pid = os.fork()
    except OSError as exc:  # EAGAIN: a limit on processes
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
        for fd in (ready_r, ready_w):
            os.close(fd)
        raise WorkerFailed(f"cannot start a worker process: {exc.strerror or exc}") from None
    if pid == 0:
        os.close(ready_r)
        reserved.close()  # the supervisor's
        health.close()
        importlib.import_module("observe.serving").in_worker()
        _run_worker(settings, build_app, port, tls, parent, ready_w, health.port)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    os.close(ready_w)
    listening = os.read(ready_r, 1) == b"1"  # b"": it exited first (or was stopped while starting)
    os.close(ready_r)
    return pid, listening


def _run_worker(settings: Settings, build_app: BuildApp, port: int, tls: ssl.SSLContext | None,
                parent: int, ready_w: int, health_port: int) -> NoReturn:
    """The forked worker's whole life."""
    code = 0
    try:
        stops = StopSignals()  # its own handlers, not the supervisor's copied ones
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
        die_with_parent(parent)
        def ready(server: Server) -> None:
            _signal_ready(ready_w)
            try:
                join_health_checks(server.adopt, health_port)
            except OSError as exc:  # serve all the same; the supervisor restarts what dies
                log.warning("cannot join the supervisor's health checks: %s", exc)

        _serve(settings, build_app, port, tls, stops, reuse_port=True, ready=ready)
    except StopRequested:
        pass
    except BaseException:
        log.exception("worker failed")
        code = 1
    finally:
        os._exit(code)


def _stop_all(pids: set[int]) -> None:
    """SIGTERM these workers and wait for them."""
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    for pid in pids:
        os.waitpid(pid, 0)


def die_with_parent(parent: int) -> None:
    """SIGTERM this process when its parent (the supervisor) dies, even by SIGKILL (Linux prctl)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the supervisor's SIGTERM still reaches us
        return
    if os.getppid() != parent:  # it died before prctl took effect
        os._exit(0)


def _signal_ready(fd: int) -> None:
    """Tell the supervisor this worker is listening."""
    os.write(fd, b"1")
    os.close(fd)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass
