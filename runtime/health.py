"""Health checks of `--workers N`: the supervisor pings each worker through its serving loop
and kills one that does not answer in time, as gunicorn's worker timeout does.

A worker connects to the supervisor's private loopback port, says its pid, and hands the
socket to its own server, which serves it as any client: the answer to a ping proves the
loop, a request thread and the process all run (a process stopped by SIGSTOP, or a loop
whose leader cannot run, answers nothing). The supervisor's side needs no event loop: a
thread per worker, asleep between pings.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import ssl
import struct
import threading
from collections.abc import Callable
from typing import Any

from wire.framing import FrameDecoder, encode_frame

log = logging.getLogger("market.runner")
_PID = struct.Struct("!I")


def join_health_checks(adopt: Callable[[socket.socket], None], port: int) -> None:
    """Worker side: connect to the supervisor's port, say our pid, and let our server serve it."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(_PID.pack(os.getpid()))
    adopt(sock)


class HealthWatch:
    """Supervisor side: kills a worker that leaves a ping unanswered for `timeout_s`."""

    def __init__(self, timeout_s: float, tls: bool, stopping: Callable[[], bool]) -> None:
        self.timeout_s, self.stopping = timeout_s, stopping
        self.interval_s = min(5.0, timeout_s / 3)
        self._tls = _unverified_client_context() if tls else None  # a socket to our own child
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, name="market-health", daemon=True).start()

    def close(self) -> None:
        """Stop accepting workers (their checks end with their connections)."""
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._check, args=(sock,), name="market-health-check",
                             daemon=True).start()

    def _check(self, sock: socket.socket) -> None:
        try:
            sock.settimeout(self.timeout_s)
            pid = _PID.unpack(_read_exactly(sock, _PID.size))[0]
            stream: Any = self._tls.wrap_socket(sock) if self._tls else sock
            self._ping_until_silent(stream, pid)
        except OSError:  # the worker ended (its connection closed), or it never said its pid
            pass
        finally:
            sock.close()

    def _ping_until_silent(self, stream: Any, pid: int) -> None:
        decoder, sent = FrameDecoder(), 0
        while True:
            sent += 1
            stream.sendall(encode_frame({"op": "ping", "id": sent}))
            try:
                _read_answer(stream, decoder)
            except TimeoutError:
                if not self.stopping():  # a stopping worker reads nothing more, rightly
                    log.error("worker %d did not answer a health check within %.0f s; killing it",
                              pid, self.timeout_s)
                    _kill(pid)
                return
            threading.Event().wait(self.interval_s)


def _read_answer(stream: Any, decoder: FrameDecoder) -> dict[str, Any]:
    while (message := decoder.next_message()) is None:
        data = stream.recv(65536)
        if not data:
            raise ConnectionResetError("the worker closed its health check connection")
        decoder.feed(data)
    return message


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionResetError("closed before its pid")
        data += chunk
    return data


def _unverified_client_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)  # SIGTERM would wait for a stopped or stuck process
    except ProcessLookupError:
        pass
