"""Summaries of runs: per scenario and op, latency percentiles and throughput.

Latency figures (mean, p50, p95, p99) are computed per run, then the median across
runs is reported; throughput is reported as mean ± sample standard deviation across
runs, and its median. The op "ALL" pools every call of a run.
"""
from __future__ import annotations

import math
import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .scenario import OpLog, RunResult

ALL = "ALL"


@dataclass(frozen=True)
class OpSummary:
    """One row of the report: one op (or ALL) of one scenario, over its runs."""

    mix: str
    users: int
    op: str
    runs: int
    calls: int
    errors: int
    conflicts: int
    mean_ms: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    ops_per_s: float
    ops_per_s_sd: float
    ops_per_s_median: float


def process_cpu_s(pid: int) -> tuple[float, float]:
    """A process's user and system CPU seconds so far (Linux: /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) of sorted values, interpolating linearly; nan if empty."""
    if not sorted_values:
        return math.nan
    rank = (len(sorted_values) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (rank - low)


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def summarise(runs: Sequence[RunResult]) -> list[OpSummary]:
    """One summary per (mix, users, op) of these runs, plus an ALL row per scenario."""
    scenarios: dict[tuple[str, int], list[RunResult]] = {}
    for result in runs:
        scenarios.setdefault((result.mix, result.users), []).append(result)
    rows = []
    for (mix, users), results in scenarios.items():
        ops = sorted({op for result in results for op in result.ops})
        for op in [*ops, ALL]:
            logs = [(_pooled(result) if op == ALL else result.ops.get(op, OpLog()), result.elapsed_s)
                    for result in results]
            rows.append(_summary(mix, users, op, logs))
    return rows


def _pooled(result: RunResult) -> OpLog:
    pooled = OpLog()
    for entry in result.ops.values():
        pooled.merge(entry)
    return pooled


def _summary(mix: str, users: int, op: str, logs: list[tuple[OpLog, float]]) -> OpSummary:
    per_run = [sorted(entry.latencies) for entry, _ in logs]
    measured = [values for values in per_run if values]

    def median_of(figure: Callable[[list[float]], float]) -> float:
        figures = [figure(values) * 1000 for values in measured]
        return statistics.median(figures) if figures else math.nan

    throughput = [len(entry.latencies) / elapsed for entry, elapsed in logs if elapsed > 0]  # answered
    errors = sum(entry.errors for entry, _ in logs)
    mean, sd = mean_sd(throughput)
    return OpSummary(
        mix=mix, users=users, op=op, runs=len(logs),
        calls=sum(len(values) for values in per_run) + errors,  # made, answered or not
        errors=errors,
        conflicts=sum(entry.conflicts for entry, _ in logs),
        mean_ms=median_of(statistics.fmean), p50_ms=median_of(lambda v: percentile(v, 50)),
        p95_ms=median_of(lambda v: percentile(v, 95)), p99_ms=median_of(lambda v: percentile(v, 99)),
        ops_per_s=mean, ops_per_s_sd=sd,
        ops_per_s_median=statistics.median(throughput) if throughput else math.nan,
    )
