"""The parent of `--workers N`: it holds the listening socket (clients wait in its backlog
while a worker is replaced), forks the workers that serve it, passes the stop on, and restarts
one that dies. It pings each worker through its serving loop (over a socket pair made before
the fork, served as a client) and kills, through a pidfd, one that does not answer in time, as
gunicorn's worker timeout does.
"""
from __future__ import annotations

import contextlib
import ctypes
import importlib
import itertools
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

from wire.framing import FrameDecoder, encode_frame

from .server import Server
from .signals import STOP_SIGNALS, StopRequested, StopSignals, handle_signals

log = logging.getLogger("market.runner")
# serves the inherited socket in a worker until stopped; calls ready(server) once it listens
ServeInWorker = Callable[[StopSignals, Callable[[Server], None]], None]
_PR_SET_PDEATHSIG = 1
FIRST_PAUSE_S, _LONGEST_PAUSE_S = 0.1, 2.0  # before restarting a worker that died (clients wait)
_HEALTHY_AFTER_S = 10.0  # a worker that lived this long: the next pause is the first again
_GIVE_UP_AFTER = 5  # workers started in a row that died before they listened
_SIGNAL_CHECK_S = 0.1  # how often the supervisor looks for a signal to handle, while it waits


class HealthWatch:
    """Supervisor side: kills a worker that leaves a ping unanswered for `timeout_s`."""

    def __init__(self, timeout_s: float, stopping: Callable[[], bool]) -> None:
        self.timeout_s, self.stopping = timeout_s, stopping
        self.interval_s = min(5.0, timeout_s / 3)
        self._ours: set[socket.socket] = set()  # the supervisor's ends, open while their worker lives

    def channel(self) -> tuple[socket.socket, socket.socket]:
        """A new (supervisor's end, worker's end) pair, made before the worker is forked."""
        ours, theirs = socket.socketpair()
        self._ours.add(ours)
        return ours, theirs

    def watch(self, pid: int, ours: socket.socket) -> None:
        """Ping the worker `pid` (just forked) over our end of its pair until it ends."""
        pidfd = os.pidfd_open(pid)
        threading.Thread(target=self._check, args=(ours, pidfd, pid), name="market-health-check",
                         daemon=True).start()

    def close(self) -> None:
        """In a forked worker: close the supervisor's ends it inherited."""
        for sock in self._ours:
            sock.close()

    def _check(self, ours: socket.socket, pidfd: int, pid: int) -> None:
        decoder = FrameDecoder()
        try:
            ours.settimeout(self.timeout_s)
            for sent in itertools.count(1):
                ours.sendall(encode_frame({"op": "ping", "id": sent}))
                while decoder.next_message() is None:
                    data = ours.recv(65536)
                    if not data:
                        return  # the worker ended
                    decoder.feed(data)
                time.sleep(self.interval_s)
        except TimeoutError:
            if not self.stopping():  # a stopping worker reads nothing more, rightly
                log.error("worker %d did not answer a health check within %.0f s; killing it",
                          pid, self.timeout_s)
                with contextlib.suppress(ProcessLookupError):  # SIGTERM would wait for a stuck one
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except OSError:  # the worker ended (its end closed)
            pass
        finally:
            self._ours.discard(ours)
            ours.close()
            os.close(pidfd)


class WorkerFailed(Exception):
    """A worker process of `--workers N` died before it listened (it logged why)."""


class Supervisor:
    """See the module docstring. A worker that dies is restarted after a pause doubling from
    0.1 s to 2 s; five in a row dying before they listen end it (exit 2)."""

    def __init__(self, workers: int, worker_timeout_s: float, listener: socket.socket,
                 serve: ServeInWorker) -> None:
        self.count, self.listener, self.serve = workers, listener, serve
        self.workers: dict[int, float] = {}  # pid: when it started
        self.stopping = False
        self.ended_before_stop: set[int] = set()
        self.pause_s = FIRST_PAUSE_S
        self.failed_starts = 0  # in a row
        self.health = HealthWatch(worker_timeout_s, lambda: self.stopping)

    def draining(self) -> bool:
        """Stopping, or no worker serves now (/readyz)."""
        return self.stopping or not self.workers

    def run(self) -> int:
        handle_signals(self.stop)  # before the first worker listens
        try:
            started = [self.start_worker() for _ in range(self.count) if not self.stopping]
            if not self.stopping and not all(started):
                raise WorkerFailed("a worker process could not start (its error is above)")
            if not self.stopping:
                host, port = self.listener.getsockname()[:2]
                log.info("%d worker processes share the port", self.count)
                print(f"listening on {host}:{port}", flush=True)
            return self.watch()
        except WorkerFailed:
            for pid in self.workers:
                _terminate(pid)
            for pid in self.workers:
                os.waitpid(pid, 0)
            raise
        finally:
            self.listener.close()

    def stop(self, signum: int, _frame: Any) -> None:
        if not self.stopping:
            log.info("signal %d: stopping %d workers", signum, len(self.workers))
            # ended already, not yet waited for (a replacement was starting): no failure of the stop
            self.ended_before_stop = {pid for pid in self.workers if _has_ended(pid)}
        self.stopping = True
        for pid in self.workers:
            _terminate(pid)

    def start_worker(self) -> bool:
        pid, listening = _fork_worker(self.serve, self.health)
        self.workers[pid] = time.monotonic()
        if self.stopping:  # the signal came while it started: it was not among those told
            _terminate(pid)
        return listening

    def watch(self) -> int:
        """Wait for the workers; replace those that die, until stopped."""
        failed = False
        while self.workers:
            pid, status = _next_ended()
            lived = time.monotonic() - self.workers.pop(pid)
            importlib.import_module("observe.serving").worker_ended(pid)
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
            self.pause_s = FIRST_PAUSE_S
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
    """The pid and wait status of the next child to end, waited for in short naps: in a
    blocking os.wait() a SIGTERM's handler would wait for a worker to end, and none would."""
    while True:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid:
            return pid, status
        time.sleep(_SIGNAL_CHECK_S)


def _has_ended(pid: int) -> bool:
    """Whether the child has ended, left to be waited for (WNOWAIT), or is ending: its main thread
    (which ends last unless the process dies) a zombie while its other threads finish dying."""
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


def _fork_worker(serve: ServeInWorker, health: HealthWatch) -> tuple[int, bool]:
    """A worker process serving, and whether it listens: returns once it does, or has died."""
    ready_r, ready_w = os.pipe()
    ours, theirs = health.channel()
    parent = os.getpid()
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # none reaches the child before its handlers
    try:
        pid = os.fork()
    except OSError as exc:  # EAGAIN: a limit on processes
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        for fd in (ready_r, ready_w):
            os.close(fd)
        ours.close()
        theirs.close()
        raise WorkerFailed(f"cannot start a worker process: {exc.strerror or exc}") from None
    if pid == 0:
        os.close(ready_r)
        health.close()  # the supervisor's ends
        importlib.import_module("observe.serving").in_worker()
        _run_worker(serve, parent, ready_w, theirs)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    os.close(ready_w)
    theirs.close()
    health.watch(pid, ours)
    listening = os.read(ready_r, 1) == b"1"  # b"": it exited first (or was stopped while starting)
    os.close(ready_r)
    return pid, listening


def _run_worker(serve: ServeInWorker, parent: int, ready_w: int, health: socket.socket) -> NoReturn:
    """The forked worker's whole life."""
    code = 0
    try:
        stops = StopSignals()  # its own handlers, not the supervisor's copied ones
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        die_with_parent(parent)

        def ready(server: Server) -> None:  # tell the supervisor, and answer its health checks
            os.write(ready_w, b"1")
            os.close(ready_w)
            server.adopt(health)

        serve(stops, ready)
    except StopRequested:
        pass
    except BaseException:
        log.exception("worker failed")
        code = 1
    finally:
        os._exit(code)


def die_with_parent(parent: int) -> None:
    """SIGTERM this process when its parent (the supervisor) dies, even by SIGKILL (Linux prctl)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the supervisor's SIGTERM still reaches us
        return
    if os.getppid() != parent:  # it died before prctl took effect
        os._exit(0)


def _terminate(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
