"""One client's connection as the server loop keeps it: its socket, decoder, queue of requests
read and not yet answered, and what its socket would not take yet.
"""
from __future__ import annotations

import collections
import logging
import socket
import threading
import time
from typing import Any

from wire.errors import BadFrameError, ProtocolError
from wire.framing import FrameDecoder

from .tls import TlsChannel

log = logging.getLogger("market.server")
READ_SIZE = 65536


class Connection:
    """One client's socket, decoder and queue of requests awaiting an answer."""

    def __init__(self, sock: socket.socket, max_frame: int, address: str) -> None:
        self.sock = sock
        self.address = address     # the client's IP address: its limits, the App's and the logs'
        self.decoder = FrameDecoder(max_frame)
        # each request's frame (undecoded) with the now_ns() it was read at
        self.pending: collections.deque[tuple[bytes | ProtocolError, int]] = collections.deque()
        self.queued_bytes = 0      # the frames in `pending`
        self.partial_bytes = 0     # of a frame not yet complete, as counted in the process's total
        self.finishing = False     # read while memory is short, to finish the frame it holds
        self.lock = threading.Lock()
        self.busy = False          # its requests wait for a turn, or a thread answers them
        self.closing = False       # close once that thread is done
        self.closed = False
        self.reading = True
        self.last_activity = time.monotonic()
        self.frame_started: float | None = None
        self.tls: TlsChannel | None = None
        self.channel: TlsChannel | Outbox = Outbox()
        self.blocked_since: float | None = None  # an answer is waiting for the socket
        self.writing = False       # ... and the leader watches the socket for it
        self.events = 0            # what the selector watches the socket for

    def idle(self) -> bool:
        """Nothing under way: no request queued or answered, no answer or frame unfinished."""
        return not (self.busy or self.writing or self.closing) and self.frame_started is None


class Outbox:
    """What a plaintext connection's socket would not take yet (the TLS channel's twin)."""

    def __init__(self) -> None:
        self._pending = bytearray()  # touched by one thread at a time: the answering one, or the leader

    def send_nowait(self, sock: socket.socket, data: bytes) -> bool:
        """Send what the socket takes now; False if some is left to send (the socket is full)."""
        if not self._pending:
            try:
                sent = sock.send(data, socket.MSG_DONTWAIT)
            except BlockingIOError:
                sent = 0
            if sent == len(data):
                return True
            data = data[sent:]
        self._pending += data
        return False

    def flush_nowait(self, sock: socket.socket) -> bool:
        """Send what is left without waiting; True once nothing is."""
        while self._pending:
            try:
                sent = sock.send(self._pending, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return False
            del self._pending[:sent]
        return True


def decode(conn: Connection, frame: bytes | ProtocolError) -> dict[str, Any] | ProtocolError:
    """A queued frame as its message, or the error to answer it with."""
    if isinstance(frame, ProtocolError):
        return frame
    try:
        return conn.decoder.decode(frame)
    except ProtocolError as exc:
        return exc
    except Exception:  # a bug in decoding one client's bytes costs that connection only
        log.exception("could not decode a frame; answering BAD_FRAME and closing")
        return BadFrameError("frame could not be decoded")


def discard_unread(sock: socket.socket) -> None:
    """Read away what a client sent that will not be answered (at stop): a socket closed with
    unread bytes sends a reset, and the answers still on their way to the client are lost."""
    try:
        for _ in range(64):
            if not sock.recv(READ_SIZE, socket.MSG_DONTWAIT):
                return
    except OSError:  # nothing more now (BlockingIOError), or the connection is gone
        return
