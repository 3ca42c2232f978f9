"""A TCP proxy that holds every byte sent to its target for a fixed time: a database a network
hop away, on one machine. The answers come back at once, so each round trip through it takes
the delay longer, as behind a link of that round-trip time.

`python -m simulation.studies.delay_proxy --target HOST:PORT --delay-ms 1` prints
`listening on 127.0.0.1:PORT` and forwards until SIGTERM. It runs as a process of its own, so
the threads of whatever it delays do not compete with it for the interpreter.
"""
from __future__ import annotations

import argparse
import queue
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence

from simulation.servers import parse_address

Address = tuple[str, int]
_CHUNK = 65536


class DelayProxy:
    """Accepts on `listen`; each connection is forwarded to `target`, requests held `delay_s`."""

    def __init__(self, target: Address, delay_s: float, listen: Address = ("127.0.0.1", 0)) -> None:
        self.target, self.delay_s = target, delay_s
        self.listener = socket.create_server(listen, backlog=512)
        self.address: Address = self.listener.getsockname()[:2]

    def serve_forever(self) -> None:
        """Accept until the listening socket is closed."""
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(self.target, timeout=10)
        except OSError:
            client.close()
            return
        server.settimeout(None)
        for sock in (client, server):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        held: queue.SimpleQueue[tuple[float, bytes]] = queue.SimpleQueue()
        threading.Thread(target=_receive, args=(client, held, self.delay_s), daemon=True).start()
        threading.Thread(target=_send_when_due, args=(held, server), daemon=True).start()
        _pipe(server, client)


def _receive(source: socket.socket, held: queue.SimpleQueue[tuple[float, bytes]], delay_s: float) -> None:
    """Each chunk with the moment it may go on: its arrival plus the delay (b"" at the end)."""
    while True:
        try:
            data = source.recv(_CHUNK)
        except OSError:
            data = b""
        held.put((time.monotonic() + delay_s, data))
        if not data:
            return


def _send_when_due(held: queue.SimpleQueue[tuple[float, bytes]], sink: socket.socket) -> None:
    while True:
        due, data = held.get()
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        if not data:
            _close(sink)
            return
        try:
            sink.sendall(data)
        except OSError:
            return


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    """Forward at once until either side ends."""
    while True:
        try:
            data = source.recv(_CHUNK)
            if not data:
                break
            sink.sendall(data)
        except OSError:
            break
    _close(source)
    _close(sink)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulation.studies.delay_proxy", description=__doc__)
    parser.add_argument("--target", type=parse_address, required=True, help="HOST:PORT to forward to")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="added to each round trip (default 0)")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (default: a free one)")
    args = parser.parse_args(argv)
    proxy = DelayProxy(args.target, args.delay_ms / 1000, ("127.0.0.1", args.port))
    signal.signal(signal.SIGTERM, lambda *_: proxy.listener.close())
    print(f"listening on {proxy.address[0]}:{proxy.address[1]}", flush=True)
    proxy.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
