"""One run of a scenario: N sellers and N buyers, each a thread with its own connection.

Every user creates its account, logs in and seeds (sellers list stock) before a
barrier; the clock starts when the last one arrives, then each makes K calls drawn
from the mix. A run's wall time ends when the last user finishes.
"""
from __future__ import annotations

import bisect
import itertools
import random
import secrets
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from operate.audit import AckedOrder
from wire import Connection

from .behaviour import Actor, Buyer, Call, make_actor
from .mixes import Mix

Address = tuple[str, int]
SETUP_TIMEOUT_S = 600.0


class SimulationError(RuntimeError):
    """A simulated user could not set up (account, login, seeding) or crashed."""


class SetupUnfinished(SimulationError):
    """The users did not all reach the start: one failed, or set-up outlasted its time."""


@dataclass
class OpLog:
    """What one op did in one run: the latency (seconds) of every answered call, an expected
    conflict's too, and how many calls went wrong (counted only, neither timed nor in the
    throughput: a fast failure must not pass for a fast call)."""

    latencies: list[float] = field(default_factory=list)
    conflicts: int = 0
    errors: int = 0

    def merge(self, other: OpLog) -> None:
        """Add another user's log of the same op."""
        self.latencies.extend(other.latencies)
        self.conflicts += other.conflicts
        self.errors += other.errors


@dataclass
class RunResult:
    """The outcome of one run of one scenario."""

    mix: str
    users: int
    run: int
    elapsed_s: float
    ops: dict[str, OpLog]
    error_kinds: Counter[str]
    acknowledged: list[AckedOrder]
    violations: list[str] = field(default_factory=list)
    setup_s: float = 0.0  # from the first thread's start to the barrier: sign-ups, logins, seeding
    setup_busy: int = 0  # set-up calls answered BUSY (the server's hashing limits), waited and made again


class SimulatedUser(threading.Thread):
    """One simulated user: its actor, its connection and its log."""

    def __init__(self, actor: Actor, address: Address, mix: Mix, calls: int,
                 barrier: threading.Barrier, tls: ssl.SSLContext | None = None,
                 setup_timeout_s: float = SETUP_TIMEOUT_S) -> None:
        super().__init__(name=actor.username, daemon=True)
        self.actor, self.address, self.calls, self.barrier = actor, address, calls, barrier
        self.tls, self.setup_timeout_s = tls, setup_timeout_s
        weights = mix.weights(actor.role)
        self.ops, self.cum_weights = list(weights), list(itertools.accumulate(weights.values()))
        self.log: dict[str, OpLog] = {}
        self.error_kinds: Counter[str] = Counter()
        self.done = 0
        self.busy = 0  # set-up calls answered BUSY, tried again
        self.finished = 0.0
        self.failure: BaseException | None = None

    def run(self) -> None:
        """Set up, wait for everyone, then make the calls."""
        with Connection(*self.address, timeout=120, tls=self.tls) as conn:
            try:
                for call in self.actor.setup_calls():
                    self._setup(conn, call)
            except BaseException as exc:
                self.failure = exc
                self.barrier.abort()
                return
            self.busy = self.actor.setup_waits + conn.busy_retries
            try:
                self.barrier.wait(self.setup_timeout_s)
            except threading.BrokenBarrierError:
                self.failure = SetupUnfinished(
                    f"{self.actor.username}: the users did not all finish setting up within"
                    f" {self.setup_timeout_s:g} s")
                return
            # what rng.choices(self.ops, cum_weights=...) does, the same draws, without its
            # Python-level set-up on every call
            total, last = float(self.cum_weights[-1]), len(self.ops) - 1
            try:
                for _ in range(self.calls):
                    op = self.ops[bisect.bisect(self.cum_weights, self.actor.rng.random() * total, 0, last)]
                    self.record(conn, self.actor.next_call(op))
                    self.done += 1
            except BaseException as exc:  # a bug of the simulator: fail the run, do not shorten it
                self.failure = exc
            self.finished = time.perf_counter()

    def _setup(self, conn: Connection, call: Call) -> None:
        outcome = self.actor.perform_setup(conn, call)
        if outcome.result is None:  # answered, if only when sent again: set up all the same
            raise SimulationError(f"{self.actor.username}: {call.op} failed: {outcome.error}")

    def record(self, conn: Connection, call: Call) -> None:
        """Make the call and log its outcome: timed when answered, counted as an error otherwise."""
        outcome = self.actor.perform(conn, call)
        entry = self.log.setdefault(call.op, OpLog())
        if outcome.kind not in ("ok", "conflict"):  # timed and counted only as an error: a fast
            entry.errors += 1                        # failure must not pass for a fast call
            self.error_kinds[f"{call.op}: {outcome.kind}"] += 1
            return
        entry.latencies.append(outcome.latency_s)
        entry.conflicts += outcome.kind == "conflict"


def run_once(mix: Mix, users: int, calls: int, buyer: Address, seller: Address, *, run: int = 0,
             seed: str | None = None, on_progress: Callable[[int], None] = lambda done: None,
             tls: ssl.SSLContext | None = None, setup_timeout_s: float = SETUP_TIMEOUT_S) -> RunResult:
    """Run N sellers + N buyers for K calls each; `on_progress` gets the calls done so far. A
    user still setting up after `setup_timeout_s` fails the run."""
    tag, began = secrets.token_hex(3), time.perf_counter()
    rng = random.Random(seed)
    actors = [make_actor(role, f"{role[0]}{tag}r{run}u{i}", random.Random(rng.random()))
              for role in ("seller", "buyer") for i in range(users)]
    start = [0.0]
    barrier = threading.Barrier(len(actors), action=lambda: start.__setitem__(0, time.perf_counter()))
    threads = [SimulatedUser(actor, seller if actor.role == "seller" else buyer, mix, calls, barrier, tls,
                             setup_timeout_s) for actor in actors]
    for thread in threads:
        thread.start()
    wait_for(threads, lambda: on_progress(sum(thread.done for thread in threads)))
    failures = [thread.failure for thread in threads if thread.failure]
    failures.sort(key=lambda failure: isinstance(failure, SetupUnfinished))  # the cause first
    if failures:
        raise SimulationError(f"{len(failures)} simulated users failed; first: {failures[0]!r}")
    result = _collect(mix, users, run, start[0], threads)
    result.setup_s, result.setup_busy = start[0] - began, sum(thread.busy for thread in threads)
    return result


def wait_for(threads: Sequence[threading.Thread], report: Callable[[], None], every_s: float = 0.2) -> None:
    """Wait until every thread has ended, calling `report` about every `every_s` seconds.

    Each join waits on a thread still running: joining one that has ended returns at once,
    and a loop on it would spin, holding the GIL the simulated users need.
    """
    for thread in threads:
        while thread.is_alive():
            thread.join(every_s)
            report()
    report()


def _collect(mix: Mix, users: int, run: int, start: float, threads: list[SimulatedUser]) -> RunResult:
    ops: dict[str, OpLog] = {}
    error_kinds: Counter[str] = Counter()
    acknowledged: list[AckedOrder] = []
    for thread in threads:
        for op, entry in thread.log.items():
            ops.setdefault(op, OpLog()).merge(entry)
        error_kinds.update(thread.error_kinds)
        if isinstance(thread.actor, Buyer):
            acknowledged.extend(thread.actor.orders)
    elapsed = max(thread.finished for thread in threads) - start
    return RunResult(mix.name, users, run, elapsed, ops, error_kinds, acknowledged)
