"""`python -m simulation.idle`: hold many idle client connections open against running
servers, to measure what they cost everyone else (run market-sim alongside).

Each connection pings once, so the server has really accepted it, then stays silent
until the given time is up (or Ctrl-C). Connections are spread over the addresses.
"""
from __future__ import annotations

import argparse
import sys
import time

from wire import Connection

from .servers import parse_address


def open_idle(addresses: list[tuple[str, int]], count: int) -> list[Connection]:
    """`count` connections, round-robin over the addresses, each having pinged once."""
    held = []
    for n in range(count):
        host, port = addresses[n % len(addresses)]
        conn = Connection(host, port, timeout=10, source=_client_address(host, n))
        conn.call("ping")
        held.append(conn)
    return held


def _client_address(server_host: str, n: int) -> str | None:
    """On loopback, each idle connection from an address of its own, as idle clients are
    (the servers limit connections per address); elsewhere the system's choice."""
    return f"127.1.{n // 250}.{n % 250 + 1}" if server_host.startswith("127.") else None


def hold(addresses: list[tuple[str, int]], count: int, seconds: float) -> int:
    """Open `count` connections round-robin, keep them for `seconds`; returns how many opened."""
    held = open_idle(addresses, count)
    print(f"holding {len(held)} idle connections for {seconds:.0f} s", flush=True)
    try:
        time.sleep(seconds)
    except KeyboardInterrupt:
        pass
    for conn in held:
        conn.close()
    return len(held)


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(prog="python -m simulation.idle", description=__doc__)
    parser.add_argument("addresses", nargs="+", help="HOST:PORT of each server")
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=600)
    args = parser.parse_args(argv)
    hold([parse_address(a) for a in args.addresses], args.count, args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
