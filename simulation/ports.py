"""Free ports for programs to bind later: the one helper the measuring tools and the tests
share (a server started with `--port 0` needs none)."""
from __future__ import annotations

import random
import socket


def free_port(count: int = 1) -> int:
    """The first of `count` consecutive ports nothing uses right now, for programs to bind
    later (galera.sh's cluster takes 34): below the kernel's range for ports it hands out
    itself, so no outgoing connection and no `--port 0` server takes one meanwhile (one did,
    once: HAProxy could not bind its frontend in CI)."""
    low = _ephemeral_ports_start()
    if low - count <= 10_000:  # a widened range (say 1024-65535) leaves no room below it:
        if count == 1:
            return _port_the_kernel_picks()  # the kernel's choice, which it may hand out again
        low = 65_536
    for _ in range(100):
        base = random.randrange(10_000, low - count)
        if all(_bindable(port) for port in range(base, base + count)):
            return base
    raise RuntimeError(f"no {count} free ports in a row from 10000 to {low}")


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _port_the_kernel_picks() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ephemeral_ports_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
            return int(ports.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default
