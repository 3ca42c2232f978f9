"""`python -m simulation.targets`: the performance targets, checked in interleaved rounds.

Each round runs `market-sim -n 1,10,100 -k K -r 1` once for each database, on a fresh one (a
new MariaDB database, dropped afterwards; a new SQLite file), the databases' order
alternating from round to round: a machine drifts, and only runs made side by side compare.
Then, per database, the figures the targets are written on, as the median of the rounds
with every run's value beside it, and how many runs met each target:

- 1 + 1: p50 under 1 ms;
- 10 + 10: p99 at most 20 ms;
- 100 + 100: at least 4,000 ops/s, p99 at most 100 ms;

each only in a scenario with no errors, in a run whose audit passed.

Writes targets.md to --out, and each run's market-sim reports to a folder of its own there.
Exits 1 when an audit found a violation, 3 when a run did not finish or the MySQL server
cannot be reached.
"""
from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.exc import DBAPIError

from runtime.config import positive_int_list

from .scaleout import drop_database, fresh_database
from .stats import ALL

TARGET_P50_1_MS = 1.0
TARGET_P99_10_MS = 20.0
TARGET_OPS_100 = 4000.0
TARGET_P99_100_MS = 100.0


@dataclass(frozen=True)
class Figures:
    """One scenario of one run: its ALL row in market-sim's results.csv."""

    ops_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int


@dataclass
class Run:
    """One market-sim run of every scenario on one database."""

    database: str
    round: int
    exit_code: int
    scenarios: dict[int, Figures] = field(default_factory=dict)


@dataclass(frozen=True)
class Target:
    """A figure of one scenario and the bound it must keep."""

    users: int
    figure: str  # what the table's column says
    rule: str  # the bound, in words
    value: Callable[[Figures], float]
    met: Callable[[Run, Figures], bool]


def _clean(run: Run, f: Figures) -> bool:
    """No errors in the scenario and the run's audit passing: a figure counts only then."""
    return f.errors == 0 and run.exit_code == 0


TARGETS = (
    Target(1, "1 + 1 p50 ms", f"1 + 1 p50 under {TARGET_P50_1_MS:g} ms",
           lambda f: f.p50_ms, lambda run, f: f.p50_ms < TARGET_P50_1_MS and _clean(run, f)),
    Target(10, "10 + 10 p99 ms", f"10 + 10 p99 at most {TARGET_P99_10_MS:g} ms",
           lambda f: f.p99_ms, lambda run, f: f.p99_ms <= TARGET_P99_10_MS and _clean(run, f)),
    Target(100, "100 + 100 ops/s", f"100 + 100 at least {TARGET_OPS_100:,.0f} ops/s",
           lambda f: f.ops_per_s, lambda run, f: f.ops_per_s >= TARGET_OPS_100 and _clean(run, f)),
    Target(100, "100 + 100 p99 ms", f"100 + 100 p99 at most {TARGET_P99_100_MS:g} ms",
           lambda f: f.p99_ms, lambda run, f: f.p99_ms <= TARGET_P99_100_MS and _clean(run, f)),
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line of simulation.targets."""
    parser = argparse.ArgumentParser(prog="python -m simulation.targets",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="runs per database (default 3)")
    parser.add_argument("--users", "-n", type=positive_int_list, default=[1, 10, 100],
                        help="N per scenario (default 1,10,100: those the targets name)")
    parser.add_argument("--calls", "-k", type=int, default=300, help="calls per user per run (default 300)")
    parser.add_argument("--mysql", metavar="SERVER_URL",
                        help="also on this MySQL/MariaDB server (a URL without a database), "
                             "e.g. mysql://root@127.0.0.1:3306")
    parser.add_argument("--no-sqlite", action="store_true", help="leave out the embedded SQLite default")
    parser.add_argument("--out", type=Path, default=Path("targets-results"), help="results folder")
    args = parser.parse_args(argv)
    if args.no_sqlite and not args.mysql:
        parser.error("nothing to measure: --no-sqlite needs --mysql")
    if args.rounds < 1 or args.calls < 1:
        parser.error("--rounds and --calls must be positive")
    return args


def round_order(runs: Sequence[str], round_number: int) -> list[str]:
    """The runs of one round in their order: as given in odd rounds, reversed in even ones."""
    return list(runs) if round_number % 2 else list(reversed(runs))


def read_totals(results_csv: Path) -> dict[int, Figures]:
    """The ALL row of each scenario in a market-sim results.csv, by N."""
    with results_csv.open(newline="") as file:
        return {int(row["users"]): Figures(float(row["ops_per_s"]), float(row["p50_ms"]),
                                           float(row["p99_ms"]), int(row["errors"]))
                for row in csv.DictReader(file) if row["op"] == ALL}


def run_market_sim(users: Sequence[int], calls: int, db_url: str | None, out: Path,
                   extra: Sequence[str] = ()) -> tuple[int, dict[int, Figures]]:
    """One run of every scenario (market-sim in a process of its own, starting its servers
    unless `extra` names running ones with --buyer and --seller), its log beside `out`: its
    exit code and the figures of each scenario it finished (read_totals)."""
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.csv"
    results.unlink(missing_ok=True)  # an earlier series' figures must not pass for this run's
    command = [sys.executable, "-m", "simulation", "-n", ",".join(map(str, users)),
               "-k", str(calls), "-r", "1", "--no-progress", "--out", str(out), *extra]
    if db_url:  # else market-sim makes a fresh SQLite file in `out`
        command += ["--db-url", db_url]
    with (out.parent / f"{out.name}.log").open("w") as log:
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    return code, read_totals(results) if results.exists() else {}


def measure(args: argparse.Namespace, database: str, round_number: int) -> Run:
    """One round's run on one database, on a fresh database."""
    out = args.out / f"{database}_round{round_number}"
    if database == "sqlite":
        code, totals = run_market_sim(args.users, args.calls, None, out)
    else:
        name = f"market_targets_{round_number}"
        db_url = fresh_database(args.mysql, name)
        try:
            code, totals = run_market_sim(args.users, args.calls, db_url, out)
        finally:
            drop_database(args.mysql, name)
    return Run(database, round_number, code, totals)


def summary_table(runs: Sequence[Run]) -> str:
    """Per database, each target's figure: the median of the runs, every run's value, and how many met it."""
    shown = [t for t in TARGETS if any(t.users in run.scenarios for run in runs)]
    lines = ["| database | runs | " + " | ".join(t.figure for t in shown) + " |",
             "|---|---:|" + "---:|" * len(shown)]
    for database in dict.fromkeys(run.database for run in runs):
        mine = [run for run in runs if run.database == database]
        cells = [_cell(target, mine) for target in shown]
        lines.append(f"| {database} | {len(mine)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(target: Target, runs: Sequence[Run]) -> str:
    measured = [(run, run.scenarios[target.users]) for run in runs if target.users in run.scenarios]
    if not measured:
        return "-"
    values = [target.value(figures) for _, figures in measured]
    met = sum(target.met(run, figures) for run, figures in measured)
    each = " / ".join(number(v) for v in values)
    return f"{number(statistics.median(values))} ({each}); met in {met} of {len(runs)}"


def number(value: float) -> str:
    return f"{value:,.0f}" if value >= 1000 else f"{value:.2f}"


def report(args: argparse.Namespace, runs: Sequence[Run], argv: Sequence[str]) -> str:
    """targets.md: the command, the summary, and the runs that failed their audit or did not finish."""
    failed = [f"- {run.database} round {run.round}: market-sim exited {run.exit_code} "
              f"(see {run.database}_round{run.round}.log)" for run in runs if run.exit_code != 0]
    return "\n\n".join([
        "# The performance targets", f"`python -m simulation.targets {' '.join(argv)}`",
        f"Each run: `market-sim -n {','.join(map(str, args.users))} -k {args.calls} -r 1` on a fresh "
        "database, the databases' order alternating by round. Each cell: the median of the runs "
        f"(every run's value) and the runs that met the target ({'; '.join(t.rule for t in TARGETS)}; "
        "each only with no errors in the scenario and the run's audit passing).",
        summary_table(runs), *(["Runs that failed:\n\n" + "\n".join(failed)] if failed else [])]) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Entry point: every round, then targets.md."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    databases = ([] if args.no_sqlite else ["sqlite"]) + (["mysql"] if args.mysql else [])
    runs: list[Run] = []
    try:
        for round_number in range(1, args.rounds + 1):
            for database in round_order(databases, round_number):
                run = measure(args, database, round_number)
                print(f"round {round_number}, {database}: market-sim exited {run.exit_code}", flush=True)
                runs.append(run)
    except DBAPIError as exc:  # the MySQL server, making or dropping a round's database
        print(f"python -m simulation.targets: the MySQL server at {args.mysql}: {exc.orig}", file=sys.stderr)
        return 3
    text = report(args, runs, argv)
    (args.out / "targets.md").write_text(text)
    print(text)
    codes = {run.exit_code for run in runs}
    return 0 if codes == {0} else 1 if codes <= {0, 1} else 3


if __name__ == "__main__":
    sys.exit(main())
