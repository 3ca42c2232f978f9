"""TLS contexts: the servers' (a certificate and its key) and the clients' (a CA to trust).
The server loop's TLS channel is runtime.connection's."""
from __future__ import annotations

import ssl


def server_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A TLS 1.2+ server context for a certificate chain and its key."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    return context


def client_context(ca_file: str | None) -> ssl.SSLContext:
    """A client context trusting `ca_file` (else the system's CAs), checking host names."""
    context = ssl.create_default_context(cafile=ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def optional_client_context(ca_file: str | None, enabled: bool = False) -> ssl.SSLContext | None:
    """TLS for a client when a CA file is given or TLS is asked for; else None (plaintext)."""
    return client_context(ca_file) if ca_file or enabled else None
