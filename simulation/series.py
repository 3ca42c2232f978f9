"""A series of runs, as market-sim makes them: every mix at every N, R runs of each, every run
audited against the database as soon as it ends. The measuring tools built on the simulator
(scale-out, the studies) run their series through `run_all` too.
"""
from __future__ import annotations

import os
import ssl
from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from db import Database
from operate.audit import audit, ledger_of

from .mixes import MIXES
from .scenario import Address, RunResult, run_once
from .server_latency import during, report, scrape


@dataclass(frozen=True)
class Plan:
    """What a series runs: each mix at each N (N sellers + N buyers), `repeats` runs of each,
    `calls` calls per user per run."""

    mixes: Sequence[str]
    users: Sequence[int]
    calls: int
    repeats: int
    seed: int | None = None  # the simulated users' random seed (None: a different series each time)
    progress: bool = True  # a progress bar on the console
    metrics: Sequence[Address] = ()  # the servers' metrics addresses: their latency per op reported too
    tls: ssl.SSLContext | None = None  # TLS to the servers (None: plaintext)


def run_all(plan: Plan, buyer: Address, seller: Address, database: Database,
            console: Console) -> list[RunResult]:
    """Every scenario of the plan, R times, each run audited."""
    runs = [(mix, users, run) for mix in plan.mixes for users in plan.users for run in range(plan.repeats)]
    total = sum(2 * users * plan.calls for _, users, _ in runs)
    console.print(f"{len(runs)} run{'s' * (len(runs) != 1)}, {total:,} calls in all: "
                  f"{estimate(runs, plan.calls, [])}",
                  markup=False, highlight=False)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    results: list[RunResult] = []
    with Progress(*columns, console=console, disable=not plan.progress) as progress:
        task = progress.add_task("starting", total=total)
        finished = 0
        for mix, users, run in runs:
            progress.update(task, description=f"{mix} N={users} run {run + 1}/{plan.repeats}")
            seed = None if plan.seed is None else f"{plan.seed}/{mix}/{users}/{run}"
            def show(done: int, base: int = finished) -> None:
                progress.update(task, completed=base + done)

            before = scrape(plan.metrics) if plan.metrics else {}
            result = run_once(MIXES[mix], users, plan.calls, buyer, seller, run=run, seed=seed,
                              on_progress=show, tls=plan.tls)
            finished += 2 * users * plan.calls
            progress.update(task, completed=finished)
            # the payment ledger where the buyer servers keep it (MARKET_PAYMENTS_URL, if set)
            ledger = ledger_of(database, os.environ.get("MARKET_PAYMENTS_URL") or None)
            result.violations = audit(database, result.acknowledged, ledger)
            console.print(describe(result), markup=False, highlight=False)
            results.append(result)
            left = runs[len(results):]
            if left and (len(results) == 1 or left[0][:2] != (mix, users)):  # said once per scenario
                console.print(f"  {estimate(left, plan.calls, results)}", markup=False, highlight=False)
            if plan.metrics:  # latency in ms; what the server's lacks is network and the client's own
                for line in report(result, during(before, scrape(plan.metrics))):
                    console.print(f"  {line}", markup=False, highlight=False)
    return results


# The first estimate's guesses, before a run is measured: calls/s (benchmarks.md: 2,000 to 4,000 at
# 100 + 100 on two cores; fewer users make fewer) and set-up seconds per user (two password hashes,
# a sign-up's and a login's, with waits on the server's limits: 0.2 to 0.6 s on two cores).
GUESSED_CALLS_PER_S = 1_500.0
GUESSED_SETUP_S_PER_USER = 0.3


def estimate(runs: Sequence[tuple[str, int, int]], calls: int, measured: Sequence[RunResult]) -> str:
    """How long these runs (mix, users, run) will take, as a sentence: at the rate of the runs
    measured so far of the same scenario (else the same N, else any), or guessed before the first."""
    seconds = 0.0
    for mix, users, _ in runs:
        like = ([r for r in measured if (r.mix, r.users) == (mix, users)]
                or [r for r in measured if r.users == users] or list(measured))
        made = sum(2 * r.users * calls for r in like)
        rate = made / sum(r.elapsed_s for r in like) if like else GUESSED_CALLS_PER_S
        setup = (sum(r.setup_s for r in like) / sum(2 * r.users for r in like) if like
                 else GUESSED_SETUP_S_PER_USER)
        seconds += 2 * users * (calls / rate + setup)
    how = "measured so far" if measured else f"a guess at {GUESSED_CALLS_PER_S:,.0f} calls/s"
    shorter = "; -n, -k and -r make it shorter" if seconds > 300 and not measured else ""
    return f"about {_duration(seconds)} {'left' if measured else 'to run'} ({how}){shorter}"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def describe(result: RunResult) -> str:
    """One line on a run: its calls, errors, conflicts, purchases and what the audit found; and
    its set-up's time, which the run's time leaves out, with the calls that waited on the
    server's limits of password hashing (sign-ups and logins per address)."""
    errors = sum(op.errors for op in result.ops.values())
    calls = sum(len(op.latencies) for op in result.ops.values()) + errors  # made, answered or not
    conflicts = sum(op.conflicts for op in result.ops.values())
    audit_text = "consistent" if not result.violations else f"{len(result.violations)} VIOLATIONS"
    waited = (f"; {result.setup_busy} sign-ups and logins answered BUSY by the server's limits of "
              "password hashing, sent again after a pause" if result.setup_busy else "")
    return (f"{result.mix} N={result.users} run {result.run + 1}: {calls} calls in {result.elapsed_s:.2f} s,"
            f" {errors} errors, {conflicts} conflicts, {len(result.acknowledged)} purchases, {audit_text}"
            f" (set-up before: {result.setup_s:.2f} s{waited})")
