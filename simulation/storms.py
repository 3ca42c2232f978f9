"""Storms against the servers while normal users shop: `python -m simulation.storms`.

Each storm gets fresh servers over a fresh SQLite database (or the servers given), the
simulator's users of one mix running meanwhile, and attackers from other loopback
addresses (127.0.0.2 ...). It prints, per storm: the users' p99, the server's peak RSS,
the attackers' failures (no answer or INTERNAL; BUSY and refusals of bad input are
answers), and whether the server stayed up: answers a ping, stops on SIGTERM in time.
"""
from __future__ import annotations

import argparse
import random
import resource
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from runtime.config import positive_int
from wire import Connection, ProtocolError
from wire.errors import InternalError
from wire.framing import FrameDecoder, encode_frame

from .mixes import MIXES
from .scenario import RunResult, SimulationError, run_once
from .servers import Address, ServerProcess, parse_address, running_server_processes, stop_process
from .stats import percentile

ATTACK_TIMEOUT_S = 30.0  # an attacker's socket gives up after this
STOP_TIMEOUT_S = 15.0  # a server must stop this long after SIGTERM (its send timeout and a margin)
PING = encode_frame({"op": "ping"})


@dataclass
class Attack:
    """What the attackers of one storm saw."""

    answered: int = 0
    busy: int = 0
    failures: int = 0  # no answer, a lost connection, or INTERNAL

    def count(self, failed: bool, busy: bool = False) -> None:
        """Count one attacker's outcome (from any attacker's thread)."""
        with _COUNT_LOCK:
            if failed:
                self.failures += 1
            elif busy:
                self.busy += 1
            else:
                self.answered += 1


_COUNT_LOCK = threading.Lock()


@dataclass
class Storm:
    """One storm: its name, what it does, and the attack (scaled by --scale)."""

    name: str
    description: str
    attack: Callable[[Address, float, Attack], None]
    squeeze: bool = False  # lowers the server's descriptor limit while it runs


def attacker_addresses(count: int) -> Iterator[str]:
    """Loopback source addresses other than the users' 127.0.0.1, each used in turn."""
    n = 0
    while True:
        yield f"127.0.0.{2 + n % count}"
        n += 1


def _connect(address: Address, source: str) -> socket.socket:
    sock = socket.create_connection(address, timeout=ATTACK_TIMEOUT_S, source_address=(source, 0))
    return sock


def _answers(sock: socket.socket, count: int) -> list[dict[str, Any]]:
    """Up to `count` answers (fewer if the server closes; OSError only if there were none)."""
    decoder, out = FrameDecoder(strict=False), list[dict[str, Any]]()
    while len(out) < count:
        try:
            data = sock.recv(65536)
        except OSError:
            if not out:
                raise
            break
        if not data:
            break
        decoder.feed(data)
        out.extend(decoder.messages())
    return out


def _judge(answers: list[dict[str, Any]], expected: int, tally: Attack) -> None:
    busy = any(not a.get("ok") and a["error"]["code"] == "BUSY" for a in answers)
    internal = any(not a.get("ok") and a["error"]["code"] == InternalError.code for a in answers)
    tally.count(failed=internal or (not busy and len(answers) < expected), busy=busy)


def _in_threads(work: Callable[[int], None], count: int) -> None:
    """Run work(0) ... work(count - 1) in threads at once; each ends by its sockets' timeouts."""
    threads = [threading.Thread(target=work, args=(n,), daemon=True) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(ATTACK_TIMEOUT_S * 3)


def _sockets_then(address: Address, count: int, sources: Iterator[str], send: Callable[[int], bytes],
                  expected: int, tally: Attack) -> None:
    """Open `count` connections, then have each send its bytes at the same moment and read
    `expected` answers."""
    socks: list[socket.socket | None] = []
    for _ in range(count):
        try:
            socks.append(_connect(address, next(sources)))
        except OSError:
            socks.append(None)
            tally.count(failed=True)
    gate = threading.Barrier(count, timeout=ATTACK_TIMEOUT_S)

    def one(n: int) -> None:
        sock = socks[n]
        try:
            gate.wait()
        except threading.BrokenBarrierError:
            pass
        if sock is None:
            return
        try:
            _send_then_judge(sock, send(n), expected, tally)
        finally:
            sock.close()

    _in_threads(one, count)


def _send_then_judge(sock: socket.socket, data: bytes, expected: int, tally: Attack) -> None:
    """Send the bytes and judge the answers. A send that fails is no failure yet: a server
    over its connection limit answers BUSY and closes at once, and a client sending after
    that meets a reset; the BUSY is still there to read."""
    try:
        sock.sendall(data)
    except OSError:
        sock.settimeout(1.0)
    try:
        _judge(_answers(sock, expected), expected, tally)
    except OSError:
        tally.count(failed=True)


def zero_length_frames(address: Address, scale: float, tally: Attack) -> None:
    """400 connections send a zero-length frame at once (each answered BAD_FRAME, closed)."""
    _sockets_then(address, int(400 * scale), attacker_addresses(4), lambda _: struct.pack(">I", 0), 1, tally)


def pipelined_pings(address: Address, scale: float, tally: Attack) -> None:
    """400 clients pipeline 70 pings each."""
    _sockets_then(address, int(400 * scale), attacker_addresses(4), lambda _: PING * 70, 70, tally)


def tiny_objects_frame(size: int = (1 << 20) - 64) -> bytes:
    """A frame of about `size` bytes of tiny JSON objects: cheap to send, costly to decode."""
    body = b'{"op":"ping","padding":[' + b",".join([b"{}"] * ((size - 32) // 3)) + b"]}"
    return struct.pack(">I", len(body)) + body


def big_frames(address: Address, scale: float, tally: Attack) -> None:
    """1,000 connections complete a 1 MiB frame of tiny objects at once."""
    frame = tiny_objects_frame()
    _sockets_then(address, int(1000 * scale), attacker_addresses(5), lambda _: frame, 1, tally)


def _flood(address: Address, scale: float, tally: Attack, op: str, duration_s: float) -> None:
    """50 clients call `op` with random names for duration_s."""
    sources = attacker_addresses(1)
    until = time.monotonic() + duration_s

    def one(n: int) -> None:
        rng = random.Random(n)
        try:
            with Connection(*address, timeout=ATTACK_TIMEOUT_S, source=next(sources),
                            retry_busy=False) as conn:
                while time.monotonic() < until:
                    name = f"storm{secrets.token_hex(4)}{rng.randrange(10**6)}"
                    try:
                        args = {"username": name, "password": "storm-password-1"}
                        conn.call(op, {**args, "name": name} if op == "create_account" else args)
                        tally.count(failed=False)
                    except ProtocolError as exc:
                        tally.count(failed=isinstance(exc, InternalError), busy=exc.code == "BUSY")
        except OSError:
            tally.count(failed=True)

    _in_threads(one, max(1, int(50 * scale)))


def sign_up_flood(address: Address, scale: float, tally: Attack) -> None:
    """50 clients create accounts with random names for 20 s."""
    _flood(address, scale, tally, "create_account", 20 * max(scale, 0.25))


def login_flood(address: Address, scale: float, tally: Attack) -> None:
    """50 clients log in with random names for 20 s."""
    _flood(address, scale, tally, "login", 20 * max(scale, 0.25))


def idle_sockets(address: Address, scale: float, tally: Attack, hold_s: float = 20.0) -> None:
    """1,000 idle sockets from one address, held for 20 s (then each is asked for a ping);
    both times the scale, the hold without a floor: far inside the server's idle timeout either way."""
    socks = []
    for _ in range(int(1000 * scale)):
        try:
            socks.append(_connect(address, "127.0.0.2"))
        except OSError:
            tally.count(failed=True)
    time.sleep(hold_s * scale)
    for sock in socks:
        try:
            sock.settimeout(5)
            sock.sendall(PING)
            _judge(_answers(sock, 1), 1, tally)
        except OSError:  # refused BUSY and closed: the ping may meet a reset
            tally.count(failed=False, busy=True)
        finally:
            sock.close()


def descriptor_squeeze(address: Address, scale: float, tally: Attack) -> None:
    """Connections past the server's descriptor limit (lowered to 256 for the storm)."""
    idle_sockets(address, scale * 0.4, tally, hold_s=10.0)


STORMS = {storm.name: storm for storm in (
    Storm("zero-frames", "400 zero-length frames at once", zero_length_frames),
    Storm("pipelined", "400 clients pipelining 70 pings", pipelined_pings),
    Storm("big-frames", "1,000 connections sending 1 MiB frames of tiny objects", big_frames),
    Storm("sign-ups", "50 clients creating accounts with random names", sign_up_flood),
    Storm("logins", "50 clients logging in with random names", login_flood),
    Storm("idle", "1,000 idle sockets from one address", idle_sockets),
    Storm("descriptors", "400 connections to a server limited to 256 descriptors", descriptor_squeeze,
          squeeze=True),
)}


@dataclass
class Verdict:
    """One storm's line of the report."""

    storm: Storm
    victims: RunResult | None
    victims_failed: str
    peak_rss_mb: float | None
    attack: Attack
    pinged: bool
    stop: str  # how the server took SIGTERM


def peak_rss_mb(pid: int) -> float | None:
    """A process's peak resident memory (VmHWM), or None if it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def answers_ping(address: Address) -> bool:
    """Whether a new client gets a ping answered within 10 s."""
    try:
        with Connection(*address, timeout=10) as conn:
            conn.call("ping")
            return True
    except (OSError, ProtocolError):
        return False


@contextmanager
def squeezed(server: ServerProcess | None, storm: Storm) -> Iterator[None]:
    """For the descriptor storm: the server's soft descriptor limit at 256 while it runs."""
    if server is None or not storm.squeeze:
        yield
        return
    pid = server.process.pid
    before = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (256, before[1]))
    try:
        yield
    finally:
        if server.process.poll() is None:
            resource.prlimit(pid, resource.RLIMIT_NOFILE, before)


def run_storm(storm: Storm, args: argparse.Namespace, buyer: Address, seller: Address,
              server: ServerProcess | None) -> Verdict:
    """The users of the mix shopping while the storm hits the buyer server."""
    result: list[RunResult] = []
    failed: list[str] = []
    shopping = threading.Event()

    def users() -> None:
        try:
            result.append(run_once(MIXES[args.mix], args.users, args.calls, buyer, seller,
                                   on_progress=lambda done: _set_if(done > 0, shopping)))
        except SimulationError as exc:
            failed.append(str(exc))
        shopping.set()

    victims = threading.Thread(target=users, daemon=True)
    victims.start()
    shopping.wait()
    tally = Attack()
    with squeezed(server, storm):
        storm.attack(buyer, args.scale, tally)
    victims.join()
    rss = peak_rss_mb(server.process.pid) if server else None
    pinged = answers_ping(buyer)
    return Verdict(storm, result[0] if result else None, failed[0] if failed else "", rss, tally, pinged,
                   _stop(server))


def _stop(server: ServerProcess | None) -> str:
    if server is None:
        return "not ours"
    took = stop_process(server.process, STOP_TIMEOUT_S)
    return f"in {took:.1f} s" if took is not None else "NO (killed)"


def report(verdicts: list[Verdict], console: Console) -> None:
    """The table of every storm's outcome."""
    table = Table(title="Storms against the buyer server")
    for column in ("storm", "users p99 ms", "users errors", "peak RSS MB", "attacks answered",
                   "BUSY", "attack failures", "pings after", "SIGTERM stop"):
        table.add_column(column)
    for v in verdicts:
        latencies = sorted(x for op in (v.victims.ops.values() if v.victims else []) for x in op.latencies)
        errors = sum(op.errors for op in v.victims.ops.values()) if v.victims else None
        table.add_row(v.storm.name, f"{percentile(latencies, 99) * 1000:.0f}" if latencies else "-",
                      str(errors) if errors is not None else f"FAILED: {v.victims_failed[:60]}",
                      f"{v.peak_rss_mb:.0f}" if v.peak_rss_mb else "-", str(v.attack.answered),
                      str(v.attack.busy), str(v.attack.failures), "yes" if v.pinged else "NO", v.stop)
    console.print(table)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m simulation.storms",
        description="Raise each storm against the buyer server while simulated users shop; "
                    "report the users' p99, the server's peak memory, the attackers' failures, "
                    "and whether the server stayed up.")
    parser.add_argument("-N", "--users", type=positive_int, default=100, help="sellers and buyers each")
    parser.add_argument("-n", "--calls", type=positive_int, default=100, help="calls per user")
    parser.add_argument("--mix", choices=sorted(MIXES), default="default")
    parser.add_argument("--storm", action="append", choices=[s for s in STORMS if s != "descriptors"],
                        help="only these storms (repeatable; default: all)")
    parser.add_argument("--descriptors", action="store_true",
                        help="also squeeze the server's descriptor limit (Linux; started servers only)")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="attackers and durations times this (e.g. 0.1 for a quick check)")
    parser.add_argument("--buyer", type=parse_address, help="HOST:PORT of a running buyer server")
    parser.add_argument("--seller", type=parse_address, help="HOST:PORT of a running seller server")
    parser.add_argument("--db-url", help="the database of the servers started (default: a fresh SQLite "
                        "file per storm); an existing MariaDB/MySQL database is shared by every storm")
    parser.add_argument("--out", type=Path, default=Path("storms-out"), help="server logs and databases")
    args = parser.parse_args(argv)
    if bool(args.buyer) != bool(args.seller):
        parser.error("--buyer and --seller go together")
    if args.descriptors and args.buyer:
        parser.error("--descriptors needs servers this script starts")
    if not 0 < args.scale <= 10:
        parser.error("--scale: from above 0 to 10")
    return args


def _set_if(condition: bool, event: threading.Event) -> None:
    if condition:
        event.set()


@contextmanager
def servers_for(storm: Storm, args: argparse.Namespace
                ) -> Iterator[tuple[Address, Address, ServerProcess | None]]:
    """The given servers, or fresh ones over --db-url or a fresh SQLite database for this storm."""
    if args.buyer:
        yield args.buyer, args.seller, None
        return
    folder = args.out / storm.name
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("market.db*"):
        stale.unlink()
    with running_server_processes(args.db_url or f"sqlite:///{folder / 'market.db'}", folder) as servers:
        yield servers["buyer"].address, servers["seller"].address, servers["buyer"]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(width=max(Console().width, 132))  # the table whole, in a log file too
    names = args.storm or [s for s in STORMS if s != "descriptors"]
    if args.descriptors:
        names.append("descriptors")
    verdicts = []
    for name in names:
        storm = STORMS[name]
        console.print(f"[bold]{storm.name}[/]: {storm.description} (scale {args.scale})")
        with servers_for(storm, args) as (buyer, seller, server):
            verdicts.append(run_storm(storm, args, buyer, seller, server))
    report(verdicts, console)
    survived = all(v.pinged and not v.stop.startswith("NO") for v in verdicts)
    return 0 if survived else 1


if __name__ == "__main__":
    raise SystemExit(main())
