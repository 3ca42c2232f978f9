"""Where a call's time goes, from per-request timestamps (docs/benchmarks.md, "Where the time
goes").

The timestamps come from the hooks of the server loop and the client connection
(observe.trace), switched on by MARKET_TRACE_DIR: every client and server process of a run
started with it set writes one file there at exit. This joins each call the simulator made
with the server's record of it and splits its latency into segments:

    send       the client building and encoding the request
    to_read    its send, then in the server's socket until the leader read it
    queue      read, waiting for a thread to answer it
    service    the answer: the op and its database work, encoded
    to_client  the answer's send, then in the client's socket until the client's thread had it
    decode     the client decoding it

Each mark is taken before a send or after a receive, so no segment comes out negative. It
then reports, for the calls near the median and those at the p95 and the p99 and above, how
much password hashing (`login`, `create_account`) was being answered while they waited, and
for how much of their time two or more hashing calls were.

    python -m simulation.tail TRACE_DIR [--skip N]

--skip leaves out the set-up calls that come before each simulator's measured ones (per
client process, one trace file each): its calls less users x calls x 2 (700 for one
simulator of `-n 100 -k 300` on a fresh database; 175 for each of four of `-n 25`).
"""
from __future__ import annotations

import argparse
import bisect
import itertools
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .stats import percentile

SEGMENTS = ("send", "to_read", "queue", "service", "to_client", "decode")
HASHING_OPS = frozenset({"login", "create_account"})


@dataclass(frozen=True)
class Call:
    """One call, as the client and the server saw it (nanoseconds)."""

    op: str
    start: int
    done: int
    segments: tuple[float, ...]  # milliseconds, in the order of SEGMENTS

    @property
    def latency_ms(self) -> float:
        return (self.done - self.start) / 1e6


def read_trace(folder: Path) -> tuple[list[dict[str, list[str]]], dict[str, list[str]]]:
    """The client records of each file in folder (one per process), and the server records
    of them all, by request id."""
    clients: list[dict[str, list[str]]] = []
    servers: dict[str, list[str]] = {}
    for path in sorted(folder.glob("*.tsv")):
        own: dict[str, list[str]] = {}
        for line in path.read_text().splitlines():
            kind, rid, *rest = line.split("\t")
            (own if kind == "C" else servers)[rid] = rest
        if own:
            clients.append(own)
    return clients, servers


def join(clients: list[dict[str, list[str]]], servers: dict[str, list[str]], skip: int = 0) -> list[Call]:
    """Calls in the order they started, the first `skip` of each client process left out (its
    set-up: several simulators at once share no barrier, so one's set-up may come after
    another's first measured calls)."""
    calls = []
    for own in clients:
        calls.extend(sorted(_joined(own, servers), key=lambda call: call.start)[skip:])
    calls.sort(key=lambda call: call.start)
    return calls


def _joined(clients: dict[str, list[str]], servers: dict[str, list[str]]) -> list[Call]:
    calls = []
    for rid, (op, *client) in clients.items():
        if rid not in servers:
            continue
        start, sending, first_byte, done = map(int, client)
        read, answering, answered = map(int, servers[rid][1:])
        marks = (start, sending, read, answering, answered, first_byte, done)
        gaps = (later - earlier for earlier, later in itertools.pairwise(marks))
        calls.append(Call(op, start, done, tuple(gap / 1e6 for gap in gaps)))
    return calls


class Hashing:
    """When the hashing calls (login, create_account) were being answered, from the server records."""

    def __init__(self, servers: dict[str, list[str]]) -> None:
        spans = [(int(rec[2]), int(rec[3])) for rec in servers.values() if rec[0] in HASHING_OPS]
        # how many were in service, as a step function: from times[i] on, levels[i]
        self.times: list[int] = []
        self.levels: list[int] = []
        level = 0
        for time, step in sorted([(b, 1) for b, _ in spans] + [(e, -1) for _, e in spans]):
            level += step
            self.times.append(time)
            self.levels.append(level)

    def overlap_ms(self, begin: int, end: int) -> float:
        """Milliseconds of hashing calls' service (summed over them) between begin and end."""
        return self._integral(begin, end, lambda level: level) / 1e6

    def two_or_more_ns(self, begin: int, end: int) -> int:
        """Nanoseconds between begin and end while two or more hashing calls were in service."""
        return self._integral(begin, end, lambda level: int(level >= 2))

    def _integral(self, begin: int, end: int, weight: Callable[[int], int]) -> int:
        """weight(number in service), summed over every nanosecond from begin to end."""
        i = bisect.bisect_right(self.times, begin)
        level = self.levels[i - 1] if i else 0
        now, total = begin, 0
        while i < len(self.times) and self.times[i] < end:
            total += (self.times[i] - now) * weight(level)
            now, level = self.times[i], self.levels[i]
            i += 1
        return total + (end - now) * weight(level)


def report(calls: list[Call], servers: dict[str, list[str]]) -> list[str]:
    """The lines printed: segment percentiles, then the tail against the median."""
    lines = [f"{len(calls)} calls", f"{'segment':10} {'mean':>8} {'p50':>8} {'p95':>8} {'p99':>8}"]
    for name, values in [("total", [c.latency_ms for c in calls])] + [
            (name, [c.segments[i] for c in calls]) for i, name in enumerate(SEGMENTS)]:
        ordered = sorted(values)
        lines.append(f"{name:10} {statistics.mean(values):8.2f} " + " ".join(
            f"{percentile(ordered, q):8.2f}" for q in (50, 95, 99)))
    hashing = Hashing(servers)
    span = calls[-1].done - calls[0].start
    two_or_more = hashing.two_or_more_ns(calls[0].start, calls[-1].done)
    lines.append(f"two or more hashing calls in service: {two_or_more / max(1, span):.0%} of the run")
    by_latency = sorted(calls, key=lambda c: c.latency_ms)
    n = len(by_latency)
    for label, group in (("p40-p60", by_latency[int(0.4 * n):int(0.6 * n)]),
                         ("p95-p99", by_latency[int(0.95 * n):int(0.99 * n)]),
                         ("p99 and up", by_latency[int(0.99 * n):])):
        if group:
            lines.append(_group_line(label, group, hashing))
    return lines


def _group_line(label: str, group: list[Call], hashing: Hashing) -> str:
    overlap = [hashing.overlap_ms(call.start, call.done) for call in group]
    two_or_more = sum(hashing.two_or_more_ns(call.start, call.done) for call in group)
    lifetimes = sum(call.done - call.start for call in group)
    means = " ".join(f"{name}={statistics.mean(c.segments[i] for c in group):.1f}"
                     for i, name in enumerate(SEGMENTS))
    return (f"{label}: {len(group)} calls, mean {statistics.mean(c.latency_ms for c in group):.1f} ms "
            f"({means}); hashing served meanwhile {statistics.mean(overlap):.1f} ms, "
            f"in {sum(o > 0 for o in overlap) / len(overlap):.0%} of them; "
            f"two or more at once for {two_or_more / max(1, lifetimes):.0%} of their time")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulation.tail", description=__doc__.split("\n")[0])
    parser.add_argument("trace_dir", type=Path)
    parser.add_argument("--skip", type=int, default=0,
                        help="calls to leave out at the start of each client process (set-up)")
    args = parser.parse_args(argv)
    clients, servers = read_trace(args.trace_dir)
    calls = join(clients, servers, args.skip)
    if not calls:
        parser.error(f"no calls with both a client and a server record in {args.trace_dir}")
    print("\n".join(report(calls, servers)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
