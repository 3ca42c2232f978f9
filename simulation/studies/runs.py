"""What every study does for one configuration: fresh SQLite database, both servers started
with the configuration's flags, N + N simulated users for each N, the ALL row of each
scenario kept. Servers and database go when the configuration is measured."""
from __future__ import annotations

import argparse
import os
import platform
import shlex
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from runtime.config import positive_int
from simulation.mixes import MIXES
from simulation.scaleout import balanced_servers, drop_database, fresh_database
from simulation.scenario import Address, run_once
from simulation.servers import running_servers
from simulation.stats import ALL, OpSummary, summarise


@dataclass(frozen=True)
class Configuration:
    """One set of server flags a study measures, and its label in the tables. With `balanced`
    processes per role, the servers run behind HAProxy (deploy/local/servers.sh)."""

    label: str
    server_args: tuple[str, ...] = ()
    threads: int | None = None
    balanced: int = 0


def measure(config: Configuration, mix: str, users: Sequence[int], calls: int, round_number: int,
            mysql_server: str | None = None) -> list[OpSummary]:
    """The ALL row of each N for one configuration: one run per N, on a fresh database (an SQLite
    file, or a database made on `mysql_server` and dropped afterwards)."""
    with tempfile.TemporaryDirectory(prefix="market-study-") as folder, \
            _fresh_database(mysql_server, Path(folder)) as url, \
            _servers(config, url, Path(folder)) as (buyer, seller):
        results = [run_once(MIXES[mix], n, calls, buyer, seller, run=round_number) for n in users]
    return [row for row in summarise(results) if row.op == ALL]


@contextmanager
def _servers(config: Configuration, db_url: str, folder: Path) -> Iterator[tuple[Address, Address]]:
    threads = ("--threads", str(config.threads)) if config.threads else ()
    if config.balanced:
        with balanced_servers(folder / "servers", db_url, config.balanced, threads) as addresses:
            yield addresses
        return
    with running_servers(db_url, folder, (*threads, *config.server_args)) as servers:
        yield servers["buyer"], servers["seller"]


@contextmanager
def _fresh_database(mysql_server: str | None, folder: Path) -> Iterator[str]:
    if mysql_server is None:
        yield f"sqlite:///{folder / 'study.db'}"
        return
    name = f"market_study_{os.getpid()}"
    try:
        yield fresh_database(mysql_server, name)
    finally:
        drop_database(mysql_server, name)


def add_common_arguments(parser: argparse.ArgumentParser, out: str) -> None:
    """--calls, --mysql-server and --out, which every study takes."""
    parser.add_argument("--calls", "-k", type=positive_int, default=200,
                        help="calls per user per run (default 200)")
    parser.add_argument("--mysql-server", metavar="URL",
                        help="make each configuration's database on this MariaDB/MySQL server "
                             "(default: a fresh SQLite file each)")
    parser.add_argument("--out", type=Path, default=Path(out), help=f"results folder (default {out})")


def preamble(title: str, argv: Sequence[str], command: str) -> str:
    """The heading of a study's Markdown: the command, when and where it ran."""
    return (f"# {title}\n\n`python -m {command} {shlex.join(argv)}`\n\n"
            f"- {time.strftime('%Y-%m-%d %H:%M:%S')}, {platform.platform()}, {os.cpu_count()} CPUs\n")
