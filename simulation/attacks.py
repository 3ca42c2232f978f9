"""One client taking everyone else's share, measured: `python -m simulation.attacks`.

Against running servers, a normal client on 127.0.0.1 calls in a loop while attackers on other
loopback addresses (127.0.0.2 ...) do one of these; its latency (p50, p99, max) is printed:
- searches: 3 connections each keep 8 long searches in flight (`search_items` of 8 words that
  every item of the catalogue holds; `--seed N` first lists N such items through --seller);
- metrics: 3,000 idle connections to the metrics port (--metrics), then 2,000 closed at once;
- idle: 5 addresses x 200 idle connections to the market port, filling the table of a server
  with the default limits; then new clients from another address: how long until answered.
"""
from __future__ import annotations

import argparse
import resource
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from wire import Connection, ProtocolError
from wire.framing import FrameDecoder, encode_frame

from .servers import Address, parse_address
from .stats import percentile

WORDS = "a b c d e f g h"
PASSWORD = "attack-password-1"


def _account(address: Address, source: str = "127.0.0.1") -> str:
    """A new account's session token."""
    name = f"attack{secrets.token_hex(6)}"
    with Connection(*address, timeout=60, source=source) as conn:
        conn.call("create_account", {"username": name, "password": PASSWORD, "name": name})
        return str(conn.call("login", {"username": name, "password": PASSWORD})["token"])


def seed(seller: Address, items: int, sellers: int = 20) -> None:
    """List `items` items whose names hold every word of WORDS, spread over `sellers` sellers."""
    tokens = [_account(seller) for _ in range(sellers)]  # one at a time: sign-ups are limited per address

    def one(n: int) -> None:
        token = tokens[n]
        with Connection(*seller, timeout=60) as conn:
            for k in range(items // sellers):
                conn.call("put_item", {"name": f"{WORDS} {n} {k}", "category": 1, "keywords": ["attack"],
                                       "condition": "new", "price": "1.00", "quantity": 1}, token=token)

    threads = [threading.Thread(target=one, args=(n,)) for n in range(sellers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


@contextmanager
def normal_client(buyer: Address) -> Iterator[list[float]]:
    """A client calling a cheap search in a loop meanwhile; the list fills with its latencies (s)."""
    token, latencies, done = _account(buyer), list[float](), threading.Event()

    def loop() -> None:
        with Connection(*buyer, timeout=120) as conn:
            while not done.is_set():
                started = time.perf_counter()
                try:
                    conn.call("search_items", {"query": "zzzz"}, token=token)
                except ProtocolError:
                    pass  # BUSY, say: it took its time all the same
                latencies.append(time.perf_counter() - started)
                time.sleep(0.02)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield latencies
    finally:
        done.set()
        thread.join(130)


def expensive_searches(buyer: Address, duration_s: float, connections: int = 3, depth: int = 8) -> int:
    """`connections` from 127.0.0.2 keep `depth` long searches each in flight; searches answered."""
    token, answered, until = _account(buyer, "127.0.0.2"), [0], time.monotonic() + duration_s
    frame = encode_frame({"op": "search_items", "token": token, "args": {"query": WORDS}})

    def one(_: int) -> None:
        with socket.create_connection(buyer, timeout=120, source_address=("127.0.0.2", 0)) as sock:
            sock.sendall(frame * depth)
            decoder, owed = FrameDecoder(strict=False), depth
            while owed:
                data = sock.recv(65536)
                if not data:
                    return
                decoder.feed(data)
                for _answer in decoder.messages():
                    answered[0] += 1
                    owed -= 1
                    if time.monotonic() < until:
                        sock.sendall(frame)
                        owed += 1

    _threads(one, connections)
    return answered[0]


def metrics_flood(metrics: Address, duration_s: float, count: int = 3000, closed: int = 2000) -> int:
    """`count` idle connections to the metrics port, then `closed` of them closed at once; how
    many connected."""
    socks = []
    for n in range(count):
        try:
            source = (f"127.0.0.{2 + n % 4}", 0)
            socks.append(socket.create_connection(metrics, timeout=5, source_address=source))
        except OSError:
            pass
    time.sleep(duration_s / 2)
    for sock in socks[:closed]:
        sock.close()
    time.sleep(duration_s / 2)
    for sock in socks[closed:]:
        sock.close()
    return len(socks)


def idle_table(buyer: Address, duration_s: float, addresses: int = 5, each: int = 200) -> list[float]:
    """`addresses` x `each` idle connections (each pinged once), then a new client from another
    address every second: how long each took to get a ping answered (inf: BUSY or no answer)."""
    waits = []
    with ExitStack() as held:
        for n in range(addresses * each):
            try:
                source = f"127.0.0.{2 + n % addresses}"
                conn = held.enter_context(Connection(*buyer, timeout=10, source=source))
                conn.call("ping")
            except (OSError, ProtocolError):
                pass
        until = time.monotonic() + duration_s
        while time.monotonic() < until:
            started = time.perf_counter()
            try:
                with Connection(*buyer, timeout=10, source="127.0.0.20", retry_busy=False) as new:
                    new.call("ping")
                waits.append(time.perf_counter() - started)
            except (OSError, ProtocolError) as exc:
                print(f"a new client was not answered: {exc!r}", flush=True)
                waits.append(float("inf"))
            time.sleep(1.0)
    return waits


def _threads(work: Callable[[int], None], count: int) -> None:
    threads = [threading.Thread(target=work, args=(n,), daemon=True) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _figures(seconds: list[float]) -> str:
    values = sorted(seconds)
    if not values:
        return "no calls"
    return (f"{len(values)} calls, p50 {percentile(values, 50) * 1000:.1f} ms, "
            f"p99 {percentile(values, 99) * 1000:.1f} ms, max {values[-1] * 1000:.1f} ms")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Each attack asked for, with the normal client's figures during it."""
    out: dict[str, Any] = {}
    for attack in args.attack:
        with normal_client(args.buyer) as latencies:
            time.sleep(1.0)  # a baseline second
            if attack == "searches":
                detail = f"{expensive_searches(args.buyer, args.duration)} long searches answered"
            elif attack == "metrics":
                detail = f"{metrics_flood(args.metrics, args.duration)} metrics connections opened"
            else:
                waits = idle_table(args.buyer, args.duration)
                answered = [w for w in waits if w != float("inf")]
                detail = (f"new clients answered {len(answered)} of {len(waits)}, slowest "
                          f"{max(answered, default=float('nan')) * 1000:.0f} ms")
        out[attack] = f"{detail}; normal client: {_figures(latencies)}"
        print(f"{attack}: {out[attack]}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulation.attacks", description=__doc__.split("\n")[0])
    parser.add_argument("--buyer", type=parse_address, required=True, help="HOST:PORT of a buyer server")
    parser.add_argument("--seller", type=parse_address, help="HOST:PORT of its seller server (for --seed)")
    parser.add_argument("--metrics", type=parse_address, help="HOST:PORT of the buyer's metrics port")
    parser.add_argument("--seed", type=int, default=0, help="list this many items first (needs --seller)")
    parser.add_argument("--attack", action="append", choices=("searches", "metrics", "idle"))
    parser.add_argument("--duration", type=float, default=20.0, help="seconds each attack lasts")
    args = parser.parse_args(argv)
    args.attack = args.attack or ["searches"]
    if args.seed and not args.seller:
        parser.error("--seed needs --seller")
    if "metrics" in args.attack and not args.metrics:
        parser.error("the metrics attack needs --metrics")
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # thousands of sockets
    if args.seed:
        seed(args.seller, args.seed)
        print(f"listed {args.seed} items named {WORDS!r} ...", flush=True)
    run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
