"""The server loop's own cost: a buyer server started from a checkout (this one by default, or
another given by path, run with its own .venv) on an empty SQLite file, N clients sending K
requests each that are answered before any database work (an op the server does not have), and
the server's CPU per request read from /proc (Linux), user and system apart.

    python -m simulation.loop_cost [--checkout ../other] [-n 100] [-k 200]
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from wire.framing import encode_frame

from .servers import start_server, stop_process
from .stats import process_cpu_s

HERE = Path(__file__).resolve().parent.parent


def _client(port: int, k: int, start: threading.Barrier) -> None:
    frame = encode_frame({"id": 1, "op": "no_such_op", "args": {}})
    with socket.create_connection(("127.0.0.1", port)) as sock:
        start.wait()
        for _ in range(k):
            sock.sendall(frame)
            size = int.from_bytes(sock.recv(4, socket.MSG_WAITALL), "big")
            sock.recv(size, socket.MSG_WAITALL)


def measure(checkout: Path, n: int, k: int) -> str:
    """One line: requests, requests a second, the server's CPU a request (user, system)."""
    env = {**os.environ, "MARKET_MAX_CONNECTIONS_PER_ADDRESS": str(n + 10),
           "MARKET_NEW_CONNECTIONS_PER_S_PER_ADDRESS": "10000"}
    with tempfile.TemporaryDirectory() as state:
        url = f"sqlite:///{state}/m.db"  # made current first: an older checkout refuses an empty one
        subprocess.run([str(checkout / ".venv" / "bin" / "market"), "db", "upgrade", "--db-url", url],
                       cwd=checkout, check=True, capture_output=True, timeout=120)
        server, (_, port) = start_server("buyer", url, Path(state) / "buyer_server.log", env=env,
                                         checkout=checkout)
        try:
            start = threading.Barrier(n + 1)
            clients = [threading.Thread(target=_client, args=(port, k, start)) for _ in range(n)]
            for client in clients:
                client.start()
            start.wait()
            (user0, sys0), began = process_cpu_s(server.pid), time.monotonic()
            for client in clients:
                client.join()
            (user1, sys1), took = process_cpu_s(server.pid), time.monotonic() - began
        finally:
            stop_process(server)
    calls = n * k
    return (f"{checkout}: {calls} requests, {calls / took:,.0f}/s, server CPU "
            f"{1e6 * (user1 - user0 + sys1 - sys0) / calls:.0f} µs a request "
            f"(user {1e6 * (user1 - user0) / calls:.0f}, system {1e6 * (sys1 - sys0) / calls:.0f})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulation.loop_cost",
                                     description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--checkout", type=Path, action="append",
                        help="a checkout with its .venv (repeat to take turns; default: this one)")
    parser.add_argument("-n", type=int, default=100, help="clients (default 100)")
    parser.add_argument("-k", type=int, default=200, help="requests per client (default 200)")
    args = parser.parse_args(argv)
    for checkout in args.checkout or [HERE]:
        print(measure(checkout.resolve(), args.n, args.k), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
