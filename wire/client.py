"""A blocking client connection: request in, result out, error codes as exceptions.

It reconnects at the next call after the server went away. A call failing in flight is
repeated only when that is safe (a read-only op, or one with an idempotency key), and not
after a timeout; anything else raises ConnectionLostError.
"""
from __future__ import annotations

import random
import select
import socket
import ssl
import time
from typing import Any

from .envelope import make_request
from .errors import BusyError, error_from_wire
from .framing import FrameDecoder, encode_frame
from .observer import NO_CLIENT_OBSERVER, ClientObserver, now_ns
from .ops import READ_ONLY_OPS

# pauses before a repeatable request is tried again: a balancer needs a moment to see a dead instance
_RETRY_PAUSES = (0.05, 0.25, 1.0)
# A hashing op answered BUSY did nothing: tried again after about these pauses (each drawn
# from its upper half, so clients refused together do not return together), about 7 s in all.
_HASHING_OPS = frozenset({"login", "create_account"})
_BUSY_PAUSES = (0.02, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0)


class ConnectionLostError(OSError):
    """The connection broke while a request that is unsafe to repeat was in flight."""


class Connection:
    """One persistent connection to a buyer or seller server."""

    observer: ClientObserver = NO_CLIENT_OBSERVER  # set on the class to trace every connection

    def __init__(self, host: str, port: int, *, timeout: float = 30.0, tls: ssl.SSLContext | None = None,
                 source: str | None = None, retry_busy: bool = True) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self.retry_busy = retry_busy  # try a login or sign-up answered BUSY again, a few times
        self.source = source  # the local address to connect from (the system's choice if None)
        self.tls = tls
        self.token: str | None = None
        self.reconnects = 0  # new sockets opened after the first
        self.resends = 0  # requests tried again after their connection failed (in flight or at connect)
        self.busy_retries = 0  # logins and sign-ups tried again after a BUSY answer
        self._sock: socket.socket | None = None
        self._decoder = FrameDecoder(strict=False)
        self._next_id = 0
        self._used = False  # connected before: a new socket counts as a reconnect
        self._sending = self._first_byte = 0  # now_ns() marks of the last call, for the observer

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self) -> None:
        """Open the socket if it is not open (or if the server has closed it since)."""
        if self._sock is not None and _closed_by_peer(self._sock):
            self.close()
        if self._sock is None:
            sock = socket.create_connection((self.host, self.port), timeout=self.timeout,
                                            source_address=(self.source, 0) if self.source else None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.tls is not None:
                sock = self.tls.wrap_socket(sock, server_hostname=self.host)
            self._sock, self._decoder = sock, FrameDecoder(strict=False)
            self.reconnects += self._used
            self._used = True

    @property
    def is_open(self) -> bool:
        """Whether a socket is open (closed after a failed call, or never opened yet)."""
        return self._sock is not None

    def close(self) -> None:
        """Close the socket; the next call opens a new one."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def call(self, op: str, args: dict[str, Any] | None = None, *,
             token: str | None = None) -> dict[str, Any]:
        """Send one request and return its result, raising the error code's exception."""
        busy_pauses = iter(_BUSY_PAUSES if op in _HASHING_OPS and self.retry_busy else ())
        while True:
            self._next_id += 1
            start = now_ns()
            message = make_request(op, args, token or self.token, self.observer.request_id(self._next_id))
            response = self._round_trip(message, _safe_to_repeat(op, args))
            self.observer.call_done(message["id"], op, start, self._sending, self._first_byte, now_ns())
            if response.get("ok"):
                return dict(response.get("result") or {})
            error = error_from_wire(response.get("error"))
            pause = next(busy_pauses, None) if isinstance(error, BusyError) else None
            if pause is None:
                raise error
            self.busy_retries += 1
            time.sleep(random.uniform(pause / 2, pause))

    def send(self, message: dict[str, Any]) -> None:
        """Send one raw message (for pipelining and tests)."""
        self.connect()
        assert self._sock is not None
        frame = encode_frame(message)
        self._sending = now_ns()
        self._sock.sendall(frame)

    def receive(self) -> dict[str, Any]:
        """Read one raw response message."""
        assert self._sock is not None
        while (message := self._decoder.next_message()) is None:
            data = self._sock.recv(65536)
            self._first_byte = now_ns()
            if not data:
                raise ConnectionResetError("the server closed the connection")
            self._decoder.feed(data)
        return message

    def _round_trip(self, message: dict[str, Any], repeatable: bool) -> dict[str, Any]:
        pauses = iter(_RETRY_PAUSES if repeatable else ())
        while True:
            try:
                self.send(message)  # a failure to connect sent nothing (and leaves no socket)
                return self.receive()
            except OSError as exc:
                sent = self._sock is not None
                self.close()
                if sent and not repeatable:
                    raise ConnectionLostError(
                        f"connection lost during {message['op']}; it may or may not have been applied"
                    ) from exc
                pause = next(pauses, None)
                if pause is None or isinstance(exc, TimeoutError):
                    raise  # a server that took the whole timeout would likely take it again
                self.resends += 1
                time.sleep(pause)  # behind a balancer, give it time to see the instance is gone


def _closed_by_peer(sock: socket.socket) -> bool:
    """True when the server has hung up (an idle timeout or a restart) since the last call."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    if not poller.poll(0):
        return False
    try:  # peek at the raw bytes, under TLS too
        return socket.socket.recv(sock, 1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def _safe_to_repeat(op: str, args: dict[str, Any] | None) -> bool:
    return op in READ_ONLY_OPS or bool(args and args.get("idempotency_key"))
