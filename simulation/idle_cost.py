"""`python -m simulation.idle_cost`: what many idle connections cost the busy ones.

Starts both servers once over one database, then runs `market-sim -n N -k K -r 1` against
them in rounds: once with nothing else connected, and once while --count connections
(spread over the two servers, each having pinged once) stay open and silent, the order
alternating from round to round. Writes idle.md to --out: each run's ops/s and p99, each
round's ratio with/without, and their median against the target (a cost under 10 %).
Exits 1 when an audit found a violation, 3 when a run did not finish or the servers did not
start (one line saying why).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from .idle import open_idle
from .servers import Address, ServerStartError, running_servers
from .targets import Figures, round_order, run_market_sim

TARGET_COST = 0.10  # at most this share of the throughput


@dataclass(frozen=True)
class Round:
    """One round: the run without idle connections and the run with them."""

    number: int
    without: Figures | None
    with_idle: Figures | None
    exit_codes: tuple[int, int]

    @property
    def ratio(self) -> float | None:
        """Throughput with the idle connections over throughput without."""
        if self.without is None or self.with_idle is None:
            return None
        return self.with_idle.ops_per_s / self.without.ops_per_s


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line of simulation.idle_cost."""
    parser = argparse.ArgumentParser(prog="python -m simulation.idle_cost",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6, help="pairs of runs (default 6)")
    parser.add_argument("--count", type=int, default=1000, help="idle connections (default 1000)")
    parser.add_argument("--users", "-n", type=int, default=100, help="N sellers + N buyers (default 100)")
    parser.add_argument("--calls", "-k", type=int, default=300, help="calls per user per run (default 300)")
    parser.add_argument("--db-url", help="the database (default: a new SQLite file in --out)")
    parser.add_argument("--out", type=Path, default=Path("idle-results"), help="results folder")
    args = parser.parse_args(argv)
    if min(args.rounds, args.count, args.users, args.calls) < 1:
        parser.error("--rounds, --count, --users and --calls must be positive")
    return args


def measure_round(args: argparse.Namespace, db_url: str, servers: dict[str, Address], number: int) -> Round:
    """Both runs of a round, without the idle connections first in odd rounds."""
    kinds = round_order(("without", "with"), number)
    figures: dict[str, Figures | None] = {}
    codes: dict[str, int] = {}
    for kind in kinds:
        held = open_idle([servers["buyer"], servers["seller"]], args.count) if kind == "with" else []
        try:
            figures[kind], codes[kind] = _run(args, db_url, servers, args.out / f"round{number}_{kind}")
        finally:
            for conn in held:
                conn.close()
    return Round(number, figures["without"], figures["with"], (codes["without"], codes["with"]))


def _run(args: argparse.Namespace, db_url: str, servers: dict[str, Address],
         out: Path) -> tuple[Figures | None, int]:
    # servers this tool started, on its own database: the simulator may write into them
    extra = [f"--{role}={host}:{port}" for role, (host, port) in servers.items()] + ["--allow-live"]
    code, totals = run_market_sim([args.users], args.calls, db_url, out, extra)
    return totals.get(args.users), code


def report(args: argparse.Namespace, rounds: list[Round], argv: list[str]) -> str:
    """idle.md: the command, every round, and the median ratio against the target."""
    n = args.users
    lines = [f"| round | without: ops/s (p99 ms) | with {args.count:,} idle: ops/s (p99 ms) | with/without |",
             "|---:|---:|---:|---:|"]
    for one in rounds:
        first = round_order(("without", "with"), one.number)[0] + " first"
        ratio = f"{one.ratio:.3f}" if one.ratio is not None else "-"
        lines.append(f"| {one.number} ({first}) | {_cell(one.without)} | {_cell(one.with_idle)} | {ratio} |")
    ratios = [one.ratio for one in rounds if one.ratio is not None]
    finished = all(one.exit_codes == (0, 0) for one in rounds) and len(ratios) == len(rounds)
    if ratios:
        median = statistics.median(ratios)
        met = finished and 1 - median < TARGET_COST
        cost = (f"a cost of {(1 - median) * 100:.1f} % of the throughput" if median < 1
                else "no cost: the runs with them were not slower")
        verdict = (f"Ratio with/without, the median of the rounds: {median:.3f} ({min(ratios):.3f} to "
                   f"{max(ratios):.3f}), {cost}: "
                   f"{'met' if met else 'not met'} (the target: under {TARGET_COST * 100:.0f} %"
                   f"{', every run audited and consistent' if finished else '; a run failed, see its log'}).")
    else:
        verdict = "No round finished both runs: see the runs' logs."
    return "\n\n".join([
        f"# {args.count:,} idle connections at {n} + {n}",
        f"`python -m simulation.idle_cost {' '.join(argv)}`",
        f"Both servers started once; each round runs `market-sim -n {n} -k {args.calls} -r 1` against "
        f"them without and with {args.count:,} idle connections held open, the order alternating.",
        "\n".join(lines), verdict]) + "\n"


def _cell(figures: Figures | None) -> str:
    return f"{figures.ops_per_s:,.1f} ({figures.p99_ms:.1f})" if figures is not None else "-"


def main(argv: list[str] | None = None) -> int:
    """Entry point: the servers, every round, then idle.md."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    db_url = args.db_url or f"sqlite:///{(args.out / 'idle.db').resolve()}"
    rounds = []
    try:
        with running_servers(db_url, args.out) as servers:
            for number in range(1, args.rounds + 1):
                rounds.append(measure_round(args, db_url, servers, number))
                print(f"round {number}: market-sim exited {rounds[-1].exit_codes}", flush=True)
    except ServerStartError as exc:
        print(f"python -m simulation.idle_cost: {exc}", file=sys.stderr)
        return 3
    text = report(args, rounds, argv)
    (args.out / "idle.md").write_text(text)
    print(text)
    codes = {code for one in rounds for code in one.exit_codes}
    return 0 if codes == {0} else 1 if codes <= {0, 1} else 3


if __name__ == "__main__":
    sys.exit(main())
