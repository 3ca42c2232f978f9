"""Logins as an attacker makes them, from many loopback addresses: `python -m simulation.guessing`.

`guessing`: wrong passwords for one account, at --rate a second for --seconds, each from the
next of --addresses source addresses (127.2.0.1 ...; 1,500 addresses at 50 a second is one
guess each), while its owner logs in every 2 s with the device token of an earlier login and
every 5 s from a new client (a new address, no device token, trying again when told to
wait). Prints the wrong passwords checked and the owner's login times.

`fair-hashing`: two addresses log in with the right password as fast as their connections
are answered, while a third logs in --logins times one after the other, as the client does
(a BUSY login tried again after a pause). Prints how many of the third's logins succeeded.

Against a fresh buyer server over a fresh SQLite database (or --db-url), with the default
settings, or a running one (--buyer HOST:PORT).
"""
from __future__ import annotations

import argparse
import itertools
import re
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from runtime.config import positive_int
from wire import Connection, ProtocolError
from wire.errors import BusyError, UnauthenticatedError

from .attacks import normal_client
from .servers import Address, parse_address, start_server, stop_process
from .stats import percentile

PASSWORD = "the owner's password"
WRONG = "wrong username or password"


def addresses(first: int) -> Iterator[str]:
    """Loopback addresses 127.2.0.1, 127.2.0.2, ... from the `first`-th on (none of them 127.0.0.1)."""
    for n in itertools.count(first):
        yield f"127.2.{n // 250}.{1 + n % 250}"


def call(address: Address, source: str, op: str, args: dict[str, Any], retry_busy: bool = False) -> str:
    """One call on a new connection from `source`: "ok", or the error's message."""
    try:
        with Connection(*address, timeout=30, source=source, retry_busy=retry_busy) as conn:
            conn.call(op, args)
        return "ok"
    except ProtocolError as exc:
        return exc.message


def sign_up(address: Address, username: str) -> None:
    with Connection(*address, timeout=30, source="127.0.0.1") as conn:
        conn.call("create_account", {"username": username, "password": PASSWORD, "name": "Owner"})


def paced(rate: float, seconds: float, work: Callable[[int], None], threads: int = 16) -> None:
    """work(n) for n = 0, 1, ... at `rate` a second for `seconds`, on a few threads."""
    start, counter, lock = time.monotonic(), itertools.count(), threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                n = next(counter)
            due = start + n / rate
            if due > start + seconds:
                return
            time.sleep(max(0.0, due - time.monotonic()))
            work(n)

    pool = [threading.Thread(target=worker, daemon=True) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()


def owner_login(address: Address, username: str, source: str, device: str | None) -> tuple[float, bool]:
    """Seconds until the owner got in (trying again when told to wait, up to 30 s), and whether it did."""
    started = time.monotonic()
    args = {"username": username, "password": PASSWORD, **({"device_token": device} if device else {})}
    while time.monotonic() - started < 30:
        answer = call(address, source, "login", args, retry_busy=True)
        if answer == "ok":
            return time.monotonic() - started, True
        wait = re.search(r"try again in (\d+) s", answer)
        time.sleep(int(wait.group(1)) if wait else 0.5)
    return time.monotonic() - started, False


def guessing(address: Address, args: argparse.Namespace) -> None:
    username = f"owner{int(time.time() * 1000) % 10**9}"
    sign_up(address, username)
    with Connection(*address, timeout=30, source="127.0.0.1") as conn:
        device = conn.call("login", {"username": username, "password": PASSWORD}).get("device_token")
    sources = itertools.cycle(list(itertools.islice(addresses(0), args.addresses)))
    heard, lock, fresh = Counter[str](), threading.Lock(), addresses(10_000)
    known: list[tuple[float, bool]] = []
    new: list[tuple[float, bool]] = []

    def guess(_n: int) -> None:
        with lock:
            source = next(sources)
        answer = call(address, source, "login", {"username": username, "password": "not the password"})
        with lock:
            kind = "checked" if answer == WRONG else "refused" if "for this account" in answer else answer
            heard[kind] += 1

    def owner() -> None:
        end = time.monotonic() + args.seconds
        for tick in itertools.count():
            if time.monotonic() >= end:
                return
            known.append(owner_login(address, username, "127.0.0.1", device))
            if tick % 3 == 2:
                new.append(owner_login(address, username, next(fresh), None))
            time.sleep(2)

    watcher = threading.Thread(target=owner, daemon=True)
    watcher.start()
    started = time.monotonic()
    paced(args.rate, args.seconds, guess)
    elapsed = time.monotonic() - started
    watcher.join()
    sent = sum(heard.values())
    print(f"guessing: {sent} wrong logins from {min(sent, args.addresses)} addresses in {elapsed:.1f} s "
          f"({args.rate:.0f}/s): {heard['checked']} passwords checked, "
          f"{heard['refused']} refused by the account's throttle, "
          f"other answers {({k: v for k, v in heard.items() if k not in ('checked', 'refused')})}")
    _owner_line("owner with the device token", known, device is not None)
    _owner_line("owner from a new client", new, True)


def _owner_line(who: str, tries: list[tuple[float, bool]], applies: bool) -> None:
    if not applies:
        print(f"{who}: the server gave no device token")
        return
    times = [t for t, ok in tries if ok]
    print(f"{who}: {len(times)} of {len(tries)} logins in; seconds to get in: "
          + (f"median {statistics.median(times):.2f}, max {max(times):.2f}" if times else "-"))


def fair_hashing(address: Address, args: argparse.Namespace) -> None:
    names = [f"hasher{n}{int(time.time() * 1000) % 10**9}" for n in range(3)]
    for name in names:
        sign_up(address, name)
    stop, flooded = threading.Event(), Counter[str]()

    def flood(source: str, name: str) -> None:
        with Connection(*address, timeout=30, source=source, retry_busy=False) as conn:
            while not stop.is_set():
                try:
                    conn.call("login", {"username": name, "password": PASSWORD})
                    flooded["ok"] += 1
                except BusyError:
                    flooded["busy"] += 1

    with normal_client(address) as normal:  # a shopper's cheap search meanwhile, from 127.0.0.1
        pool = [threading.Thread(target=flood, args=(f"127.3.0.{n + 1}", names[n]), daemon=True)
                for n in (0, 1) for _ in range(args.connections)]
        for thread in pool:
            thread.start()
        time.sleep(1)
        times, outcomes = [], Counter[str]()
        try:
            with Connection(*address, timeout=30, source="127.3.0.3") as third:
                for _ in range(args.logins):
                    started = time.monotonic()
                    try:
                        third.call("login", {"username": names[2], "password": PASSWORD})
                        outcomes["ok"] += 1
                        times.append(time.monotonic() - started)
                    except (BusyError, UnauthenticatedError) as exc:
                        outcomes[exc.code] += 1
        finally:
            stop.set()
            for thread in pool:
                thread.join(timeout=30)
    print(f"fair-hashing: 2 addresses x {args.connections} connections flooding right logins "
          f"({flooded['ok']} in, {flooded['busy']} BUSY); the third address: {outcomes['ok']} of "
          f"{args.logins} logins in ({dict(outcomes)}); seconds per login: "
          + (f"median {statistics.median(times):.3f}, max {max(times):.3f}" if times else "-")
          + f"; a normal client's search meanwhile: {len(normal)} calls, p50 "
          f"{percentile(sorted(normal), 50) * 1000:.1f} ms, p99 "
          f"{percentile(sorted(normal), 99) * 1000:.1f} ms")


@contextmanager
def server(args: argparse.Namespace) -> Iterator[Address]:
    if args.buyer:
        yield args.buyer
        return
    with tempfile.TemporaryDirectory(prefix="guessing-") as folder:
        db_url = args.db_url or f"sqlite:///{Path(folder) / 'market.db'}"
        from db.migrations import make_current
        make_current(db_url)
        process, address = start_server("buyer", db_url, Path(folder) / "buyer_server.log")
        try:
            yield address
        finally:
            stop_process(process)


ATTACKS = {"guessing": guessing, "fair-hashing": fair_hashing}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulation.guessing", description=__doc__.split("\n")[0])
    parser.add_argument("--attack", action="append", choices=list(ATTACKS), help="only these (default: both)")
    parser.add_argument("--addresses", type=positive_int, default=1500, help="guessing: source addresses")
    parser.add_argument("--rate", type=float, default=50.0, help="guessing: wrong logins a second")
    parser.add_argument("--seconds", type=float, default=30.0, help="guessing: how long")
    parser.add_argument("--connections", type=positive_int, default=4,
                        help="fair-hashing: connections per flooding address")
    parser.add_argument("--logins", type=positive_int, default=53, help="fair-hashing: the third's logins")
    parser.add_argument("--buyer", type=parse_address, help="HOST:PORT of a running buyer server")
    parser.add_argument("--db-url", help="the database of the server started (default: a fresh SQLite file)")
    args = parser.parse_args(argv)
    for name in args.attack or ATTACKS:
        with server(args) as address:
            ATTACKS[name](address, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
