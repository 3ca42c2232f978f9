"""Server threads against clients: p50, p99 and throughput for each number of threads per
server process as the clients (N sellers + N buyers) grow past it, to find the knee where
clients outnumber threads.

`python -m simulation.studies.threads --out study-threads` writes threads.md, threads.csv and
threads.png (one heatmap per figure). The full measurement: threads 1,2,4,8,16 against
N = 1,5,25,50,100 (2 to 200 clients), the defaults.
"""
from __future__ import annotations

import argparse
import csv
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from runtime.config import positive_int_list
from simulation.mixes import MIXES, mix_list
from simulation.report import plt
from simulation.servers import stop_on_sigterm
from simulation.stats import OpSummary

from .runs import Configuration, add_common_arguments, measure, preamble

FIGURES = (("ops_per_s", "calls/s", 0), ("p50_ms", "p50 (ms)", 2), ("p99_ms", "p99 (ms)", 1))
Grid = dict[tuple[int, int], OpSummary]  # (threads, N) -> ALL row


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m simulation.studies.threads", description=__doc__)
    parser.add_argument("--threads", type=positive_int_list, default=[1, 2, 4, 8, 16],
                        help="threads per server process, comma-separated (default 1,2,4,8,16)")
    parser.add_argument("--users", "-n", type=positive_int_list, default=[1, 5, 25, 50, 100],
                        help="N sellers + N buyers, comma-separated (default 1,5,25,50,100)")
    parser.add_argument("--mix", type=mix_list, default=["default"],
                        help=f"one mix of {', '.join(MIXES)} (default: default)")
    parser.add_argument("--server-args", default="",
                        help="more flags for both servers, e.g. '--workers 2' (one string)")
    add_common_arguments(parser, "study-threads")
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> Grid:
    grid: Grid = {}
    for threads in args.threads:
        config = Configuration(f"{threads} threads", tuple(args.server_args.split()), threads=threads)
        for row in measure(config, args.mix[0], args.users, args.calls, 0, args.mysql_server):
            grid[(threads, row.users)] = row
            print(f"{threads} threads, {row.users} + {row.users} users: {row.ops_per_s:.0f} calls/s, "
                  f"p50 {row.p50_ms:.2f} ms, p99 {row.p99_ms:.2f} ms", flush=True)
    return grid


def markdown(grid: Grid, threads: Sequence[int], users: Sequence[int]) -> str:
    parts = []
    for figure, label, digits in FIGURES:
        lines = [f"**{label}**, rows: threads per process; columns: clients (N + N)\n",
                 "| threads | " + " | ".join(str(2 * n) for n in users) + " |",
                 "|---" * (len(users) + 1) + "|"]
        for t in threads:
            cells = [f"{getattr(grid[(t, n)], figure):.{digits}f}" for n in users]
            lines.append(f"| {t} | " + " | ".join(cells) + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def plot(grid: Grid, threads: Sequence[int], users: Sequence[int], path: Path) -> None:
    fig, axes = plt.subplots(1, len(FIGURES), figsize=(4 * len(FIGURES), 3.4))
    for axis, (figure, label, digits) in zip(axes, FIGURES, strict=True):
        values = [[getattr(grid[(t, n)], figure) for n in users] for t in threads]
        image = axis.imshow(values, aspect="auto", cmap="viridis" if figure == "ops_per_s" else "magma_r")
        for i, row in enumerate(values):
            for j, value in enumerate(row):
                axis.text(j, i, f"{value:.{min(digits, 1)}f}", ha="center", va="center", fontsize=7,
                          bbox={"facecolor": "white", "alpha": 0.7, "linewidth": 0, "pad": 1})
        axis.set_xticks(range(len(users)), [str(2 * n) for n in users])
        axis.set_yticks(range(len(threads)), [str(t) for t in threads])
        axis.set_xlabel("clients")
        axis.set_ylabel("threads per process")
        axis.set_title(label)
        fig.colorbar(image, ax=axis, shrink=0.8)
    fig.tight_layout()
    fig.savefig(path, dpi=70)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, stop_on_sigterm)  # servers and databases are stopped on the way out
    grid = run(args)
    table = markdown(grid, args.threads, args.users)
    title = f"Threads against clients, mix {args.mix[0]}, {args.calls} calls per user"
    (args.out / "threads.md").write_text(preamble(title, argv, "simulation.studies.threads") + "\n" + table)
    with (args.out / "threads.csv").open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["threads", "clients", "calls_per_s", "p50_ms", "p99_ms", "errors"])
        for (t, n), row in sorted(grid.items()):
            writer.writerow([t, 2 * n, f"{row.ops_per_s:.1f}", f"{row.p50_ms:.3f}", f"{row.p99_ms:.3f}",
                             row.errors])
    plot(grid, args.threads, args.users, args.out / "threads.png")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
