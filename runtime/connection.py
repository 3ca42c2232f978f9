"""One client's connection as the server loop keeps it: its socket, decoder, queue of requests
read and not yet answered, and what its socket would not take yet.

TLS runs over memory buffers (ssl.MemoryBIO): the leader decrypts without blocking, the
answering thread encrypts; records leave in the order TLS made them, through the outbox.
"""
from __future__ import annotations

import collections
import logging
import socket
import ssl
import threading
import time
from typing import Any

from wire.errors import BadFrameError, ProtocolError
from wire.framing import FrameDecoder

log = logging.getLogger("market.server")
READ_SIZE = 65536


class Outbox:
    """A plaintext channel (TlsChannel encrypts): what the socket would not take yet. One lock
    orders the bytes; sends never wait (MSG_DONTWAIT), so holding it while sending is brief."""

    handshake_done = True

    def __init__(self) -> None:
        self._state = threading.Lock()  # the outbox (and a TLS channel's SSL object)
        self._outbox = bytearray()

    def _encode(self, data: bytes) -> bytes:
        """What goes on the wire for `data` (called holding `_state`)."""
        return data

    def send_nowait(self, sock: socket.socket, data: bytes) -> bool:
        """Send what the socket takes now; False if some is left in the outbox."""
        with self._state:
            data = self._encode(data)
            if not self._outbox:  # the usual case: straight to the socket, no copy
                try:
                    sent = sock.send(data, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    sent = 0
                if sent == len(data):
                    return True
                data = data[sent:]
            self._outbox += data
            return self._send_queued(sock)

    def flush_nowait(self, sock: socket.socket) -> bool:
        """Send what is queued without waiting; False if the socket would not take it all."""
        with self._state:
            return self._send_queued(sock)

    def _send_queued(self, sock: socket.socket) -> bool:
        """Send the outbox (holding `_state`); False if the socket would not take it all."""
        while self._outbox:
            try:
                sent = sock.send(self._outbox, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return False
            del self._outbox[:sent]
        return True


class TlsChannel(Outbox):
    """One server-side TLS connection; see the module docstring."""

    def __init__(self, context: ssl.SSLContext) -> None:
        super().__init__()
        self._incoming, self._outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self.handshake_done = False

    def receive(self, data: bytes) -> bytes:
        """Feed received ciphertext; the plaintext it completes. Raises ssl.SSLError."""
        chunks = []
        with self._state:
            self._incoming.write(data)
            try:
                if not self.handshake_done:
                    self._tls.do_handshake()
                    self.handshake_done = True
                while chunk := self._tls.read(65536):
                    chunks.append(chunk)
            except (ssl.SSLWantReadError, ssl.SSLZeroReturnError):  # wants more, or closed cleanly
                pass
            self._outbox += self._outgoing.read()
        return b"".join(chunks)

    def _encode(self, data: bytes) -> bytes:
        self._tls.write(data)
        return self._outgoing.read()


class Connection:
    """One client's socket, decoder and queue of requests awaiting an answer."""

    def __init__(self, sock: socket.socket, decoder: FrameDecoder, address: str, channel: Outbox) -> None:
        self.sock = sock
        self.address = address     # the client's IP address: its limits, the App's and the logs'
        self.decoder = decoder
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
        self.channel = channel
        self.blocked_since: float | None = None  # an answer is waiting for the socket
        self.writing = False       # ... and the leader watches the socket for it
        self.events = 0            # what the selector watches the socket for

    def idle(self) -> bool:
        """Nothing under way: no request queued or answered, no answer or frame unfinished."""
        return not (self.busy or self.writing or self.closing) and self.frame_started is None

    def decode(self, frame: bytes | ProtocolError) -> dict[str, Any] | ProtocolError:
        """A queued frame as its message, or the error to answer it with."""
        if isinstance(frame, ProtocolError):
            return frame
        try:
            return self.decoder.decode(frame)
        except ProtocolError as exc:
            return exc
        except Exception:  # a bug in decoding one client's bytes costs that connection only
            log.exception("could not decode a frame; answering BAD_FRAME and closing")
            return BadFrameError("frame could not be decoded")

    def discard_unread(self) -> None:
        """Read away what the client sent that will not be answered (at stop): a socket closed
        with unread bytes sends a reset, and the answers on their way to the client are lost."""
        try:
            for _ in range(64):
                if not self.sock.recv(READ_SIZE, socket.MSG_DONTWAIT):
                    return
        except OSError:  # nothing more now (BlockingIOError), or the connection is gone
            return
