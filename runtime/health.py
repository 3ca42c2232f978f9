"""Health checks of `--workers N`: the supervisor pings each worker through its serving loop
(over a socket pair made before the fork, served as a client) and kills, through a pidfd,
one that does not answer in time, as gunicorn's worker timeout does.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from collections.abc import Callable
from typing import Any

from wire.framing import FrameDecoder, encode_frame

log = logging.getLogger("market.runner")


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
        try:
            ours.settimeout(self.timeout_s)
            self._ping_until_silent(ours, pidfd, pid)
        except OSError:  # the worker ended (its end closed)
            pass
        finally:
            self._ours.discard(ours)
            ours.close()
            os.close(pidfd)

    def _ping_until_silent(self, ours: socket.socket, pidfd: int, pid: int) -> None:
        decoder, sent = FrameDecoder(), 0
        while True:
            sent += 1
            ours.sendall(encode_frame({"op": "ping", "id": sent}))
            try:
                _read_answer(ours, decoder)
            except TimeoutError:
                if not self.stopping():  # a stopping worker reads nothing more, rightly
                    log.error("worker %d did not answer a health check within %.0f s; killing it",
                              pid, self.timeout_s)
                    _kill(pidfd)
                return
            threading.Event().wait(self.interval_s)


def _read_answer(sock: socket.socket, decoder: FrameDecoder) -> dict[str, Any]:
    while (message := decoder.next_message()) is None:
        data = sock.recv(65536)
        if not data:
            raise ConnectionResetError("the worker closed its health check connection")
        decoder.feed(data)
    return message


def _kill(pidfd: int) -> None:
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)  # SIGTERM would wait for a stuck process
    except ProcessLookupError:
        pass
