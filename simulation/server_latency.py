"""The servers' own latency next to the clients': market-sim --metrics reads each server's
/metrics before and after a run, and reports per op the server's median and p99 (from its
market_request_duration_seconds histogram) beside the client's, so that what is network,
the client's own time and the client's socket shows as the difference.

The server's percentiles are interpolated within a bucket, as Prometheus' histogram_quantile
does: read them as "about"; the buckets are 0.1 ms to 10 s, 2.5x apart at most.
"""
from __future__ import annotations

import math
import urllib.request
from collections import defaultdict
from collections.abc import Sequence

from prometheus_client.parser import text_string_to_metric_families

from .scenario import Address, RunResult
from .stats import percentile

Buckets = dict[float, float]  # upper bound (seconds) -> requests at or under it, cumulative
_DURATION = "market_request_duration_seconds_bucket"


def scrape(addresses: Sequence[Address], timeout: float = 10.0) -> dict[str, Buckets]:
    """Each op's duration buckets, summed over the servers at these metrics addresses."""
    ops: dict[str, Buckets] = defaultdict(lambda: defaultdict(float))
    for host, port in addresses:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout) as answer:
            text = answer.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == _DURATION:
                    ops[sample.labels["op"]][float(sample.labels["le"])] += sample.value
    return ops


def quantile(buckets: Buckets, q: float) -> float:
    """The q-quantile (0-1) in seconds, linear within its bucket; nan without requests."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return math.nan
    rank, lower, below = q * total, 0.0, 0.0
    for bound in bounds:
        if buckets[bound] >= rank:
            if math.isinf(bound):
                return lower  # past the last finite bucket: its bound is all we know
            share = (rank - below) / (buckets[bound] - below) if buckets[bound] > below else 1.0
            return lower + (bound - lower) * share
        lower, below = bound, buckets[bound]
    return lower


def during(before: dict[str, Buckets], after: dict[str, Buckets]) -> dict[str, Buckets]:
    """The requests answered between two scrapes."""
    return {op: {bound: count - before.get(op, {}).get(bound, 0.0) for bound, count in buckets.items()}
            for op, buckets in after.items()}


def report(result: RunResult, server: dict[str, Buckets]) -> list[str]:
    """One line per op the run made: client and server p50 and p99 (ms), and the server's share."""
    lines = [f"{'op':<22} {'client p50':>10} {'server p50':>10} {'client p99':>10} {'server p99':>10}"]
    for op, log in sorted(result.ops.items()):
        client = sorted(log.latencies)
        buckets = server.get(op, {})
        values = (percentile(client, 50) * 1000, quantile(buckets, 0.5) * 1000,
                  percentile(client, 99) * 1000, quantile(buckets, 0.99) * 1000)
        lines.append(f"{op:<22} " + " ".join(f"{value:>10.2f}" for value in values))
    return lines
