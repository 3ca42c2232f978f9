"""TLS for the server loop over memory buffers (ssl.MemoryBIO): the leader decrypts without
blocking, the answering thread encrypts. Records leave in the order TLS made them: one
outbox, one flusher at a time (`_sending`), the rest sent when the socket is writable.
"""
from __future__ import annotations

import socket
import ssl
import threading


class TlsChannel:
    """One server-side TLS connection; see the module docstring."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self._incoming, self._outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self._state = threading.Lock()    # the SSL object and the outbox
        self._sending = threading.Lock()  # one flusher at a time, in outbox order
        self._outbox = bytearray()
        self.handshake_done = False

    def receive(self, data: bytes) -> bytes:
        """Feed received ciphertext; the plaintext it completes. Raises ssl.SSLError."""
        with self._state:
            self._incoming.write(data)
            plaintext = self._advance()
            self._outbox += self._outgoing.read()
        return plaintext

    def _advance(self) -> bytes:
        if not self.handshake_done:
            try:
                self._tls.do_handshake()
            except ssl.SSLWantReadError:
                return b""
            self.handshake_done = True
        chunks = []
        while True:
            try:
                chunk = self._tls.read(65536)
            except (ssl.SSLWantReadError, ssl.SSLZeroReturnError):
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)

    def send_nowait(self, sock: socket.socket, data: bytes) -> bool:
        """Encrypt and send what the socket takes now; False if some is left in the outbox."""
        with self._state:
            self._tls.write(data)
            self._outbox += self._outgoing.read()
        return self.flush_nowait(sock)

    def flush_nowait(self, sock: socket.socket) -> bool:
        """Send what is queued without waiting; False if the socket would not take it all."""
        if not self._sending.acquire(blocking=False):
            return True  # another thread is sending: it will send this too
        try:
            return self._flush(sock)
        finally:
            self._sending.release()

    def _flush(self, sock: socket.socket) -> bool:
        while True:
            with self._state:
                chunk = bytes(self._outbox)
                self._outbox.clear()
            if not chunk:
                return True
            try:
                sent = sock.send(chunk, socket.MSG_DONTWAIT)
            except BlockingIOError:
                sent = 0
            if sent < len(chunk):
                with self._state:
                    self._outbox[:0] = chunk[sent:]
                return False
