"""Two checkouts of the marketplace measured taking turns: the same `market-sim` command run in
this checkout and in another one given by its path (a git worktree of another commit, say), each
with its own environment (its `.venv/bin/python` when it has one), a fresh database every run,
the order alternating each round so that a busy moment of the machine falls on both.

`python -m simulation.studies.checkouts ../other --rounds 3 --mysql-server
mysql://root@127.0.0.1:3306 -- -n 100 -k 200 -r 1` prints each run's calls/s and p99 per N, then
the median ratio of the other checkout's calls/s to this one's. Without `--mysql-server` each run
gets a fresh SQLite file (market-sim's default). Every run's output stays in `--out`.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from runtime.config import positive_int
from simulation.scaleout import drop_database, fresh_database
from simulation.targets import Figures, read_totals, round_order

HERE = Path(__file__).resolve().parents[2]


def python_of(checkout: Path) -> str:
    """The checkout's own interpreter, or this one."""
    own = checkout / ".venv" / "bin" / "python"
    return str(own) if own.exists() else sys.executable


def run_in(checkout: Path, sim_args: Sequence[str], out: Path,
           mysql_server: str | None) -> dict[int, Figures]:
    """One market-sim run in the checkout, on a fresh database; each scenario's ALL figures."""
    name = f"market_checkouts_{out.name}"
    db = ["--db-url", fresh_database(mysql_server, name)] if mysql_server else []
    try:
        with (out.parent / f"{out.name}.log").open("w") as log:
            done = subprocess.run([python_of(checkout), "-m", "simulation", *sim_args, *db, "--no-progress",
                                   "--out", str(out)], cwd=checkout, stdout=log, stderr=subprocess.STDOUT)
    finally:
        if mysql_server:
            drop_database(mysql_server, name)
    if done.returncode != 0:
        raise SystemExit(f"market-sim failed in {checkout} (exit {done.returncode}): see {out}.log")
    return read_totals(out / "results.csv")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulation.studies.checkouts", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("other", type=Path, help="the other checkout's folder")
    parser.add_argument("--rounds", type=positive_int, default=3, help="runs of each checkout (default 3)")
    parser.add_argument("--mysql-server", metavar="URL", help="a fresh database on this server per run")
    parser.add_argument("--out", type=Path, default=Path("checkouts-results"), help="results folder")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    args.sim_args = argv[cut + 1:]  # market-sim's arguments, after --
    other = args.other.resolve()
    if not (other / "simulation").is_dir():
        parser.error(f"{other} is not a checkout of the marketplace")
    args.out.mkdir(parents=True, exist_ok=True)
    ratios: dict[int, list[float]] = {}
    for number in range(1, args.rounds + 1):
        checkouts = {"this": HERE, "other": other}
        figures = {}
        for label in round_order(list(checkouts), number):
            checkout = checkouts[label]
            figures[label] = run_in(checkout, args.sim_args, args.out.resolve() / f"{label}_round{number}",
                                    args.mysql_server)
            for n, f in sorted(figures[label].items()):
                print(f"round {number}, {label}, {n} + {n}: {f.ops_per_s:,.0f} calls/s, "
                      f"p99 {f.p99_ms:.1f} ms, {f.errors} errors", flush=True)
        for n, mine in figures["this"].items():
            ratios.setdefault(n, []).append(figures["other"][n].ops_per_s / mine.ops_per_s)
    for n, each in sorted(ratios.items()):
        print(f"{n} + {n}: the other checkout's calls/s, median of {len(each)} rounds: "
              f"{statistics.median(each):.3f}x this one's ({', '.join(f'{r:.3f}' for r in each)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
