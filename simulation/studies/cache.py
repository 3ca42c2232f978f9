"""The read cache, on and off: throughput and latency of N + N users for several mixes (from
read-only to write-heavy), the two settings interleaved round by round so that a busy moment
of the machine hits both.

`python -m simulation.studies.cache --out study-cache` writes cache.md, cache.csv and
cache.png there. The full measurement: `--users 100 --calls 200 --rounds 3` (the defaults).
"""
from __future__ import annotations

import argparse
import csv
import signal
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from runtime.config import positive_int
from simulation.mixes import MIXES, mix_list
from simulation.report import plt
from simulation.servers import stop_on_sigterm
from simulation.stats import OpSummary

from .runs import Configuration, add_common_arguments, measure, preamble

SETTINGS = (Configuration("off", ("--cache", "off")), Configuration("on", ("--cache", "one-host")))
Row = tuple[str, str, int, OpSummary]  # mix, cache, round, ALL row


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m simulation.studies.cache", description=__doc__)
    parser.add_argument("--users", "-n", type=positive_int, default=100,
                        help="N: N sellers + N buyers (default 100)")
    parser.add_argument("--rounds", type=positive_int, default=3,
                        help="rounds of off and on, interleaved (default 3)")
    parser.add_argument("--mix", type=mix_list, default=["browse", "default", "checkout"],
                        help=f"mixes, comma-separated, of {', '.join(MIXES)} (default: three)")
    add_common_arguments(parser, "study-cache")
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> list[Row]:
    rows: list[Row] = []
    for round_number in range(args.rounds):
        for mix in args.mix:
            order = SETTINGS if round_number % 2 == 0 else SETTINGS[::-1]
            for config in order:
                row = measure(config, mix, [args.users], args.calls, round_number, args.mysql_server)[0]
                print(f"round {round_number + 1} {mix} cache {config.label}: {row.ops_per_s:.0f} calls/s, "
                      f"p50 {row.p50_ms:.2f} ms, p99 {row.p99_ms:.2f} ms", flush=True)
                rows.append((mix, config.label, round_number, row))
    return rows


def _median(rows: list[Row], mix: str, cache: str, figure: str) -> float:
    return statistics.median(getattr(r[3], figure) for r in rows if r[0] == mix and r[1] == cache)


def markdown(rows: list[Row], mixes: Sequence[str]) -> str:
    lines = ["| mix | calls/s off | calls/s on | p50 ms off | p50 ms on | p99 ms off | p99 ms on |",
             "|---|---|---|---|---|---|---|"]
    for mix in mixes:
        cells = [f"{_median(rows, mix, c, f):.{d}f}" for f, d in
                 (("ops_per_s", 0), ("p50_ms", 2), ("p99_ms", 2)) for c in ("off", "on")]
        lines.append(f"| {mix} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\nMedians over the rounds.\n"


def plot(rows: list[Row], mixes: Sequence[str], path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for offset, cache in ((-0.2, "off"), (0.2, "on")):
        xs = [n + offset for n in range(len(mixes))]
        axes[0].bar(xs, [_median(rows, m, cache, "ops_per_s") for m in mixes], 0.4, label=f"cache {cache}")
        axes[1].bar(xs, [_median(rows, m, cache, "p50_ms") for m in mixes], 0.4, label=f"p50, cache {cache}")
    for axis, label in zip(axes, ("calls/s", "p50 latency (ms)"), strict=True):
        axis.set_xticks(range(len(mixes)), mixes)
        axis.set_ylabel(label)
        axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, stop_on_sigterm)  # servers and databases are stopped on the way out
    rows = run(args)
    title = f"Read cache on and off, {args.users} + {args.users} users, {args.calls} calls each"
    (args.out / "cache.md").write_text(preamble(title, argv, "simulation.studies.cache") + "\n"
                                       + markdown(rows, args.mix))
    with (args.out / "cache.csv").open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["mix", "cache", "round", "calls_per_s", "p50_ms", "p99_ms", "errors"])
        for mix, cache, round_number, row in rows:
            writer.writerow([mix, cache, round_number + 1, f"{row.ops_per_s:.1f}", f"{row.p50_ms:.3f}",
                             f"{row.p99_ms:.3f}", row.errors])
    plot(rows, args.mix, args.out / "cache.png")
    print(markdown(rows, args.mix))
    return 0


if __name__ == "__main__":
    sys.exit(main())
