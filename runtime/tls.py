"""TLS for the server loop over memory buffers (ssl.MemoryBIO): the leader decrypts without
blocking, the answering thread encrypts; records leave in the order TLS made them (the
outbox of runtime.connection).
"""
from __future__ import annotations

import ssl

from .connection import Outbox


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
