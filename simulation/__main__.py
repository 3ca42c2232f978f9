"""`market-sim`: run scenarios of N sellers + N buyers against the servers, repeat each,
report latency and throughput, and audit the database after every run.

It starts both servers itself (subprocesses over `--db-url`, a fresh SQLite file in
the results folder by default) or drives running ones (`--buyer`, `--seller`, with
`--allow-live`: their marketplace gets test users and items named loadtest-..., and its
stock is bought). It exits 1 when the audit finds a violation, 2 on bad arguments or
without the sim extra (matplotlib), 3 when a server does not start or a simulated user
cannot set up.
"""
from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

from rich.console import Console

from db import Database
from observe.trace import trace_clients
from runtime.config import add_tls_arguments, env, positive_int, positive_int_list
from wire.tls import optional_client_context

from .behaviour import LIVE_DATA_WARNING, LOAD_TEST_PREFIX
from .mixes import MIXES, mix_list
from .scenario import Address, RunResult, SimulationError
from .series import Plan, run_all
from .servers import ServerStartError, parse_address, running_servers
from .stats import summarise


def _address_list(text: str) -> list[Address]:
    try:
        return [parse_address(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line of market-sim."""
    mixes = "; ".join(f"{mix.name}: {mix.description}" for mix in MIXES.values())
    parser = argparse.ArgumentParser(prog="market-sim", description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", "-n", type=positive_int_list, default=[1, 10, 100],
                        help="N per scenario, comma-separated: N sellers + N buyers (default 1,10,100)")
    parser.add_argument("--calls", "-k", type=positive_int, default=1000,
                        help="calls per user per run (default 1000)")
    parser.add_argument("--repeats", "-r", type=positive_int, default=10,
                        help="runs per scenario (default 10)")
    parser.add_argument("--mix", type=mix_list, default=["default"],
                        help=f"op mixes, comma-separated ({mixes})")
    parser.add_argument("--db-url", help="the servers' database, audited after every run (default when "
                                         "starting the servers: a fresh SQLite file in --out; with "
                                         "--buyer/--seller: MARKET_DB_URL)")
    parser.add_argument("--buyer", type=parse_address, help="drive a running buyer server at HOST:PORT")
    parser.add_argument("--seller", type=parse_address, help="drive a running seller server at HOST:PORT")
    parser.add_argument("--allow-live", action="store_true",
                        help=f"let --buyer/--seller write into that marketplace: accounts and items "
                             f"named {LOAD_TEST_PREFIX}..., purchases of its stock")
    parser.add_argument("--metrics", type=_address_list, metavar="HOST:PORT,HOST:PORT",
                        help="the running servers' metrics addresses (--metrics-port): report each op's "
                             "server latency next to the clients'")
    parser.add_argument("--workers", type=int, help="server processes per role (for the servers it starts)")
    parser.add_argument("--out", type=Path, default=Path("sim-results"), help="results folder")
    parser.add_argument("--seed", type=int, help="random seed of the simulated users")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_tls_arguments(parser)
    parser.add_argument("--tls-cert", help="with --tls-key: start the servers with TLS (this certificate)")
    parser.add_argument("--tls-key", help="the key of --tls-cert")
    args = parser.parse_args(argv)
    if args.buyer and not args.db_url:  # running servers' database: the servers' own setting
        args.db_url = env("MARKET_DB_URL")
    if (args.buyer is None) != (args.seller is None):
        parser.error("--buyer and --seller go together")
    if (args.tls_cert is None) != (args.tls_key is None):
        parser.error("--tls-cert and --tls-key go together")
    if args.metrics and not args.buyer:
        parser.error("--metrics goes with --buyer/--seller: the servers' metrics addresses")
    if args.buyer and not args.db_url:
        parser.error("--db-url is required with --buyer/--seller: the audit reads the database")
    if args.buyer and not args.allow_live:
        parser.exit(2, f"market-sim: {LIVE_DATA_WARNING}; add --allow-live to go ahead\n")
    return args


@contextmanager
def _servers(args: argparse.Namespace, db_url: str) -> Iterator[tuple[Address, Address]]:
    if args.buyer:
        yield args.buyer, args.seller
        return
    extra: tuple[str, ...] = ("--workers", str(args.workers)) if args.workers else ()
    if args.tls_cert:
        extra += ("--tls-cert", args.tls_cert, "--tls-key", args.tls_key)
    with running_servers(db_url, args.out, extra) as addresses:
        yield addresses["buyer"], addresses["seller"]


def _fresh_sqlite(out: Path) -> str:
    path = out / "market-sim.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return f"sqlite:///{path}"


def plan_of(args: argparse.Namespace) -> Plan:
    """The series market-sim's arguments ask for."""
    return Plan(args.mix, args.users, args.calls, args.repeats, seed=args.seed,
                progress=not args.no_progress, metrics=args.metrics or (),
                tls=optional_client_context(args.tls_ca, args.tls))


def _preamble(args: argparse.Namespace, db_url: str, argv: list[str]) -> str:
    database_kind = "SQLite" if db_url.startswith("sqlite") else "MariaDB/MySQL"
    return (f"# market-sim results\n\n`market-sim {shlex.join(argv)}`\n\n"
            f"- {time.strftime('%Y-%m-%d %H:%M:%S')}, {platform.platform()}, {os.cpu_count()} CPUs, "
            f"Python {platform.python_version()}\n"
            f"- database: {database_kind}; K = {args.calls} calls per user, R = {args.repeats} runs; "
            f"mixes {', '.join(args.mix)}\n"
            "- latency: median across runs of each run's figure; ops/s: mean ± sd across runs")


def _report_consistency(results: list[RunResult], console: Console) -> int:
    violations = [f"{r.mix} N={r.users} run {r.run + 1}: {v}" for r in results for v in r.violations]
    if not violations:
        console.print("consistency: OK")
        return 0
    console.print(f"consistency: {len(violations)} violations", style="bold red")
    for line in violations:
        console.print(f"  {line}", markup=False, highlight=False)
    return 1


def _missing_extra() -> str | None:
    """What to install when the [sim] extra (matplotlib, for the plots) is missing; else None."""
    try:
        import matplotlib  # noqa: F401
    except ModuleNotFoundError as exc:
        return (f"market-sim needs {exc.name}, which comes with the sim extra: "
                "pip install 'marketplace[sim]' (in a checkout: pip install -e '.[sim]')")
    return None


def main(argv: list[str] | None = None) -> int:
    """Entry point of `market-sim`."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    missing = _missing_extra()
    if missing:  # said before any run, not after an hour of them
        print(f"error: {missing}", file=sys.stderr)
        return 2
    from .report import write_reports

    trace_clients()  # with MARKET_TRACE_DIR set: per-call timestamps for simulation.tail
    console = Console()
    if not console.is_terminal:
        console = Console(width=140)
    args.out.mkdir(parents=True, exist_ok=True)
    db_url = args.db_url or _fresh_sqlite(args.out)
    try:
        with _servers(args, db_url) as (buyer, seller), closing(Database(db_url, pool_size=2)) as database:
            results = run_all(plan_of(args), buyer, seller, database, console)
    except (SimulationError, ServerStartError) as exc:
        console.print(f"market-sim: {exc}", style="bold red", markup=False, soft_wrap=True)  # one line
        return 3
    rows = summarise(results)
    paths = write_reports(rows, args.out, console, _preamble(args, db_url, argv))
    console.print("written: " + ", ".join(str(path) for path in paths))
    _report_errors(results, console)
    return _report_consistency(results, console)


def _report_errors(results: list[RunResult], console: Console) -> None:
    kinds: Counter[str] = Counter()
    for result in results:
        kinds.update(result.error_kinds)
    for kind, count in kinds.most_common(10):
        console.print(f"error: {kind} x{count}", markup=False, highlight=False)


if __name__ == "__main__":
    sys.exit(main())
