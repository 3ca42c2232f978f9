"""The database a network hop away: throughput against server threads, and against server
processes behind HAProxy, with 0, 0.5, 1 and 2 ms added to every database round trip.

A private mariadbd (on a free loopback port, its own folder) is reached through a delay
proxy (simulation/studies/delay_proxy.py, a process of its own) that holds every request for
the chosen time, so each round trip takes that much longer while the clients still reach the
servers at once. (A network namespace with `tc netem` on its link would do the same in the
kernel; the kernel here has no queueing disciplines at all.) The proxy runs at 0 ms too, so
every row pays its own cost alike. The database server, the proxy and everything started are
stopped when the command ends, on errors, Ctrl-C and SIGTERM too.

`python -m simulation.studies.remote_db --out study-remote-db` writes remote_db.md,
remote_db.csv and remote_db.png. The full measurement is the defaults.
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import mysql.connector

from runtime.config import positive_int_list
from simulation.mixes import MIXES, mix_list
from simulation.ports import free_port
from simulation.report import plt
from simulation.scaleout import StartError, private_run_dir, started_mariadbd, terminate
from simulation.scenario import SimulationError
from simulation.servers import parse_address, stop_on_sigterm
from simulation.stats import OpSummary

from .runs import Configuration, add_common_arguments, measure, preamble

Address = tuple[str, int]


@dataclass(frozen=True)
class Row:
    """One configuration at one delay: its axis ("threads" or "processes"), value and ALL row."""

    delay_ms: float
    axis: str
    value: int
    summary: OpSummary | None  # None: the run failed (see `failure`)
    failure: str = ""


def _delays(text: str) -> list[float]:
    values = [float(part) for part in text.split(",") if part.strip()]
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError("expected delays in ms (0 or more) separated by commas")
    return values


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m simulation.studies.remote_db", description=__doc__)
    parser.add_argument("--delays", type=_delays, default=[0, 0.5, 1, 2],
                        help="ms added to each database round trip, comma-separated (default 0,0.5,1,2)")
    parser.add_argument("--threads", type=positive_int_list, default=[3, 8, 16, 32],
                        help="threads per process, one process per role (default 3,8,16,32)")
    parser.add_argument("--processes", type=positive_int_list, default=[1, 2, 4],
                        help="processes per role behind HAProxy (default 1,2,4)")
    parser.add_argument("--process-threads", type=int, default=8,
                        help="threads of each process on the processes axis (default 8)")
    # 20 + 20: with 50 + 50 on two busy cores, every user of a run through HAProxy lost its
    # connection at once (servers.sh marks an instance down at its first failed check and
    # closes its connections; its checks compete with the start's logins for the cores)
    parser.add_argument("--users", "-n", type=int, default=20, help="N sellers + N buyers (default 20)")
    parser.add_argument("--mix", type=mix_list, default=["default"],
                        help=f"one mix of {', '.join(MIXES)} (default: default)")
    add_common_arguments(parser, "study-remote-db")
    args = parser.parse_args(argv)
    if args.mysql_server:
        parser.error("--mysql-server: this study starts its own database server")
    return args


# -- the database behind a delay -----------------------------------------------------------------

def _config(node: Path, port: int) -> str:
    return "\n".join([
        "[mariadbd]", f"datadir={node / 'data'}", f"tmpdir={node / 'tmp'}", f"socket={node / 'mariadb.sock'}",
        "bind-address=127.0.0.1", f"port={port}", "user=mysql", f"log-error={node / 'error.log'}",
        f"pid-file={node / 'mariadbd.pid'}", "max_connections=500", ""])


@contextmanager
def private_mariadb() -> Iterator[Address]:
    """A mariadbd of its own on a free loopback port; stopped and removed afterwards."""
    run_dir, port = private_run_dir("market-remote-db-"), free_port()
    node = run_dir / "node"
    process: subprocess.Popen[bytes] | None = None
    try:
        process = started_mariadbd(node, _config(node, port), f"mysql://root@127.0.0.1:{port}")
        yield "127.0.0.1", port
    finally:
        if process is not None:
            terminate(process, 60)
        shutil.rmtree(run_dir, ignore_errors=True)


@contextmanager
def delay_proxy(target: Address, delay_ms: float) -> Iterator[Address]:
    """The delay proxy in a process of its own, in front of `target`."""
    process = subprocess.Popen([sys.executable, "-m", "simulation.studies.delay_proxy", "--target",
                                f"{target[0]}:{target[1]}", "--delay-ms", str(delay_ms)],
                               stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith("listening on "):
            raise StartError(f"the delay proxy did not start (said {line!r})")
        yield parse_address(line.removeprefix("listening on "))
    finally:
        terminate(process, 10)  # type: ignore[arg-type]


def round_trip_ms(address: Address) -> float:
    """The median time of `SELECT 1` over one connection: one database round trip (the driver's
    own cursor; through SQLAlchemy's a query took two)."""
    conn = mysql.connector.connect(host=address[0], port=address[1], user="root")
    try:
        cursor, times = conn.cursor(), []
        for _ in range(21):
            start = time.perf_counter()
            cursor.execute("SELECT 1")
            cursor.fetchall()
            times.append((time.perf_counter() - start) * 1000)
    finally:
        conn.close()
    return sorted(times)[len(times) // 2]


# -- the measurement -----------------------------------------------------------------------------

def configurations(args: argparse.Namespace) -> list[tuple[str, int, Configuration]]:
    """Every configuration measured at each delay: the threads axis, then the processes axis."""
    by_threads = [("threads", t, Configuration(f"{t} threads", threads=t)) for t in args.threads]
    by_processes = [("processes", p, Configuration(f"{p} processes", threads=args.process_threads,
                                                   balanced=p)) for p in args.processes]
    return by_threads + by_processes


def run(args: argparse.Namespace, database: Address) -> list[Row]:
    rows = []
    for delay in args.delays:
        with delay_proxy(database, delay) as proxy:
            server_url = f"mysql://root@{proxy[0]}:{proxy[1]}"
            print(f"delay {delay} ms: a round trip to the database takes {round_trip_ms(proxy):.2f} ms",
                  flush=True)
            for axis, value, config in configurations(args):
                rows.append(_measured(args, delay, axis, value, config, server_url))
    return rows


def _measured(args: argparse.Namespace, delay: float, axis: str, value: int, config: Configuration,
              server_url: str) -> Row:
    """One configuration's row; a run that fails is recorded as failed and the study goes on."""
    try:
        summary = measure(config, args.mix[0], [args.users], args.calls, 0, server_url)[0]
    except SimulationError as exc:
        print(f"  {config.label}: FAILED: {exc}", flush=True)
        return Row(delay, axis, value, None, str(exc))
    print(f"  {config.label}: {summary.ops_per_s:.0f} calls/s, p50 {summary.p50_ms:.2f} ms, "
          f"p99 {summary.p99_ms:.1f} ms", flush=True)
    return Row(delay, axis, value, summary)


def markdown(rows: Sequence[Row], args: argparse.Namespace) -> str:
    parts = []
    for axis, values in (("threads", args.threads), ("processes", args.processes)):
        head = "threads per process (1 process per role)" if axis == "threads" else \
            f"processes per role behind HAProxy ({args.process_threads} threads each)"
        lines = [f"**calls/s (p99 ms)** by {head}\n",
                 "| added round trip | " + " | ".join(str(v) for v in values) + " |",
                 "|---" * (len(values) + 1) + "|"]
        for delay in args.delays:
            cells = [_cell(rows, delay, axis, v) for v in values]
            lines.append(f"| {delay} ms | " + " | ".join(cells) + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def _cell(rows: Sequence[Row], delay: float, axis: str, value: int) -> str:
    row = _find(rows, delay, axis, value)
    return "failed" if row is None else f"{row.ops_per_s:.0f} ({row.p99_ms:.0f})"


def _find(rows: Sequence[Row], delay: float, axis: str, value: int) -> OpSummary | None:
    return next(r.summary for r in rows if (r.delay_ms, r.axis, r.value) == (delay, axis, value))


def _calls_per_s(rows: Sequence[Row], delay: float, axis: str, value: int) -> float:
    summary = _find(rows, delay, axis, value)
    return math.nan if summary is None else summary.ops_per_s


def plot(rows: Sequence[Row], args: argparse.Namespace, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5), sharey=True)
    for axis, (name, values) in zip(axes, (("threads", args.threads), ("processes", args.processes)),
                                    strict=True):
        for delay in args.delays:
            axis.plot(values, [_calls_per_s(rows, delay, name, v) for v in values], marker="o",
                      label=f"+{delay} ms")
        axis.set_xscale("log", base=2)
        axis.set_xticks(values, [str(v) for v in values])
        axis.set_xlabel("threads per process" if name == "threads" else "processes per role (HAProxy)")
        axis.legend(fontsize=8, title="database round trip")
    axes[0].set_ylabel("calls/s")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def write_results(rows: Sequence[Row], args: argparse.Namespace, argv: Sequence[str]) -> str:
    table = markdown(rows, args)
    title = (f"The database behind a delay, {args.users} + {args.users} users, mix {args.mix[0]}, "
             f"{args.calls} calls each")
    heading = preamble(title, argv, "simulation.studies.remote_db")
    (args.out / "remote_db.md").write_text(heading + "\n" + table)
    with (args.out / "remote_db.csv").open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["delay_ms", "axis", "value", "calls_per_s", "p50_ms", "p99_ms", "errors", "failure"])
        for r in rows:
            s = r.summary
            figures = [f"{s.ops_per_s:.1f}", f"{s.p50_ms:.3f}", f"{s.p99_ms:.3f}", s.errors] if s \
                else ["", "", "", ""]
            writer.writerow([r.delay_ms, r.axis, r.value, *figures, r.failure])
    plot(rows, args, args.out / "remote_db.png")
    return table


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if os.geteuid() != 0:
        print("error: the remote database study needs root (its mariadbd runs as mysql)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    try:
        with private_mariadb() as database:
            rows = run(args, database)
    except StartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    print(write_results(rows, args, argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
