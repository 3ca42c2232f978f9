"""Scale-out measurement: throughput and p99 against the number of server processes per role
behind HAProxy on one MariaDB, and that single MariaDB against the 3-node Galera cluster.

Everything runs through deploy/local: `servers.sh` starts the server processes and their
balancer for each configuration, `galera.sh` the cluster; the simulator (market-sim's own
series, `simulation.series.run_all`, audit included) drives the balancer's ports. Each
configuration gets a fresh database; whatever was started is stopped again, on errors and
Ctrl-C too.

Like-for-like: galera.sh's nodes run with innodb_flush_log_at_trx_commit=2 and a 32 MB
buffer pool, the machine's MariaDB with its defaults (1 and 128 MB). By default the single
side is therefore one standalone mariadbd started from galera.sh's own node configuration
(`galera.sh config 1`) with the wsrep lines removed: same flush, buffer pool, log size and
connection settings, no replication. `--single-url` uses an existing server instead (its
settings then differ). The settings each side ran with are read from the servers and written
with the results. What still differs: the cluster is reached through its HAProxy (one more
loopback hop per query) and reads wait for causal consistency (wsrep_sync_wait=1), which is
part of what the cluster costs.

The full measurement (N = 10, K = 200, R = 3; 1, 2 and 4 processes per role on each side):
`python -m simulation.scaleout --out scaleout-results`.

Writes to --out: scaleout.md, scaleout.csv, scaleout.png, and market-sim's per-op reports of
each configuration in a folder of its own. Exits 1 when an audit finds a violation, 3 when
something does not start.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from sqlalchemy import URL, create_engine, text

from db import Database
from db.engine import driver_url
from runtime import config as runtime_config
from runtime.config import positive_int_list

from .mixes import mix_list
from .ports import free_port
from .report import COLUMNS, count_axis, plt, scenario_totals, write_reports
from .scenario import Address, SimulationError
from .series import Plan, run_all
from .servers import ServerStartError, stop_on_sigterm
from .stats import OpSummary, summarise

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "deploy" / "local"
SINGLE, CLUSTER = "one MariaDB", "Galera, 3 nodes"
TARGET_RATIO = 0.60
SETTINGS = ("version", "innodb_flush_log_at_trx_commit", "innodb_buffer_pool_size", "innodb_log_file_size",
            "log_bin", "sync_binlog", "max_connections", "wsrep_on", "wsrep_sync_wait")
REPORTED = ("calls", "errors", "p50 ms", "p99 ms", "ops/s (mean ± sd)", "ops/s median")


class StartError(RuntimeError):
    """A script or a database server did not start."""


@dataclass(frozen=True)
class DatabaseServer:
    """A MariaDB server (or cluster balancer) to measure on, and the settings it runs with."""

    label: str
    admin_url: str
    settings: dict[str, str]


@dataclass(frozen=True)
class Measured:
    """One configuration's outcome for one mix: the aggregate (ALL) summary of its runs."""

    database: str
    processes: int
    summary: OpSummary
    violations: int


# -- command line --------------------------------------------------------------------------

def _process_counts(text: str) -> list[int]:
    return sorted(set(positive_int_list(text)))


def _database_name(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", text):
        raise argparse.ArgumentTypeError("letters, digits and underscores only")
    return text


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line of `python -m simulation.scaleout`."""
    parser = argparse.ArgumentParser(prog="python -m simulation.scaleout",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=_process_counts, default=[1, 2, 4],
                        help="server processes per role, comma-separated (default 1,2,4)")
    parser.add_argument("--users", "-n", type=int, default=10, help="N sellers + N buyers (default 10)")
    parser.add_argument("--calls", "-k", type=int, default=200, help="calls per user per run (default 200)")
    parser.add_argument("--repeats", "-r", type=int, default=3, help="runs per configuration (default 3)")
    parser.add_argument("--mix", type=mix_list, default=["default"], help="op mixes, comma-separated")
    parser.add_argument("--skip-galera", action="store_true", help="measure the single MariaDB only")
    parser.add_argument("--single-url", metavar="URL",
                        help="run the single side on this existing server (mysql://USER@HOST:PORT) "
                             "instead of a standalone mariadbd with the Galera nodes' settings")
    parser.add_argument("--database", type=_database_name, default="scaleout",
                        help="database name, dropped and created for every configuration (default scaleout)")
    parser.add_argument("--out", type=Path, default=Path("scaleout-results"), help="results folder")
    parser.add_argument("--seed", type=int, help="random seed of the simulated users")
    args = parser.parse_args(argv)
    if min(args.users, args.calls, args.repeats) < 1:
        parser.error("-n, -k and -r must be at least 1")
    args.out = args.out.resolve()
    return args


# -- ports, scripts and databases ------------------------------------------------------------

def script(name: str, *args: str, timeout: float = 600) -> str:
    """Run a deploy/local script to its end and return its output; StartError when it fails.

    It runs in a session of its own, so a Ctrl-C reaches only this process, which lets the
    script finish (a start or stop cut in half would leave processes behind) and then stops."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen([str(SCRIPTS / name), *args], stdout=out, stderr=err,
                                   start_new_session=True)
        if not finish(process, timeout):
            raise StartError(f"{name} {args[0]} did not finish within {timeout:.0f} s")
        out.seek(0)
        err.seek(0)
        if process.returncode != 0:
            raise StartError(f"{name} {args[0]} failed: {err.read().strip()[-800:]}")
        return out.read()


def finish(process: subprocess.Popen[Any], timeout: float) -> bool:
    """Wait until the process ends, killing it after `timeout` s; True if it ended by itself.
    A Ctrl-C or SIGTERM that comes meanwhile is raised once it has ended."""
    deadline, ended = time.monotonic() + timeout, True
    pending: BaseException | None = None
    while process.poll() is None:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            deadline, ended = time.monotonic() + 10, False
        except (KeyboardInterrupt, SystemExit) as exc:
            pending = exc
    if pending is not None:
        raise pending
    return ended


def admin_url(url: str) -> URL:
    """The server of a MySQL URL, without a database, on mysql-connector."""
    parsed = driver_url(url)
    return URL.create(parsed.drivername, parsed.username, parsed.password, parsed.host, parsed.port)


def fresh_database(server_url: str, name: str) -> str:
    """Drop and create the database on the server; its URL for the servers and the audit."""
    _administer(server_url, f"DROP DATABASE IF EXISTS {name}",
                f"CREATE DATABASE {name} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    return admin_url(server_url).set(drivername="mysql", database=name).render_as_string(hide_password=False)


def drop_database(server_url: str, name: str) -> None:
    """Drop the database from the server, if it is there."""
    _administer(server_url, f"DROP DATABASE IF EXISTS {name}")


def _administer(server_url: str, *statements: str) -> None:
    engine = create_engine(admin_url(server_url), isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            for statement in statements:
                conn.execute(text(statement))
    finally:
        engine.dispose()


def server_settings(url: str) -> dict[str, str]:
    """The global variables of SETTINGS that the server has."""
    engine = create_engine(admin_url(url))
    listed = ", ".join(f"'{name}'" for name in SETTINGS)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text(f"SHOW GLOBAL VARIABLES WHERE Variable_name IN ({listed})"))
            found = {str(name): str(value) for name, value in rows}
    finally:
        engine.dispose()
    return {name: found[name] for name in SETTINGS if name in found}


def describe_settings(settings: dict[str, str]) -> str:
    """The settings as `name=value` pairs, byte sizes in MB."""
    def shown(name: str, value: str) -> str:
        return f"{int(value) // 2**20}M" if name.endswith("_size") and value.isdigit() else value

    return ", ".join(f"{name}={shown(name, value)}" for name, value in settings.items())


def wait_for_server(url: str, process: subprocess.Popen[bytes], seconds: float) -> None:
    """Until the server answers a query; StartError if it exits or the time runs out."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            server_settings(url)
            return
        except Exception as exc:  # not up yet: refused, or still starting
            if process.poll() is not None or time.monotonic() > deadline:
                raise StartError(f"mariadbd did not answer at {url}: {exc}") from exc
            time.sleep(0.5)


def private_run_dir(prefix: str) -> Path:
    """A folder under /tmp that the database server (running as mysql) can enter."""
    run_dir = Path(tempfile.mkdtemp(prefix=prefix))
    run_dir.chmod(0o755)
    return run_dir


# -- the database sides ----------------------------------------------------------------------

def standalone_config(run_dir: Path, base: int) -> str:
    """galera.sh's node-1 configuration without its wsrep (replication) lines and comments."""
    config = script("galera.sh", "config", "1", "--dir", str(run_dir), "--base-port", str(base))
    kept = [line for line in config.splitlines() if not line.startswith(("wsrep_", "#"))]
    return "\n".join(kept) + "\n"


@contextmanager
def standalone_mariadb(console: Console) -> Iterator[DatabaseServer]:
    """One mariadbd with the Galera nodes' settings, no replication; stopped and removed after."""
    run_dir, base = private_run_dir("market-scaleout-mariadb-"), free_port(2)
    node, url = run_dir / "node1", f"mysql://root@127.0.0.1:{base + 1}"
    console.print(f"starting a standalone mariadbd on 127.0.0.1:{base + 1} ({run_dir})", markup=False)
    process: subprocess.Popen[bytes] | None = None
    try:
        process = started_mariadbd(node, standalone_config(run_dir, base), url)
        yield DatabaseServer(f"{SINGLE} (standalone)", url, server_settings(url))
    finally:
        if process is not None:
            terminate(process, 60)
        shutil.rmtree(run_dir, ignore_errors=True)
        console.print("standalone mariadbd stopped")


def started_mariadbd(node: Path, config: str, url: str) -> subprocess.Popen[bytes]:
    """mariadbd with this configuration over a new data folder in `node`, once it answers at `url`
    (its log's last lines in the StartError, should it not)."""
    (node / "data").mkdir(parents=True)
    (node / "tmp").mkdir()  # the config's tmpdir (see galera.sh: never /tmp)
    (node / "my.cnf").write_text(config)
    _install_db(node)
    with (node / "console.log").open("wb") as log:
        process = subprocess.Popen(["mariadbd", f"--defaults-file={node / 'my.cnf'}"], stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_server(url, process, 120)
    except StartError as exc:
        terminate(process, 60)
        raise StartError(f"{exc}\n{_tail(node / 'error.log')}") from exc
    return process


def _tail(path: Path, lines: int = 15) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


def _install_db(node: Path) -> None:
    # its bootstrap server's tmpdir too (at start mariadbd deletes every #sql* file there),
    # which the bootstrap server, running as mysql, writes
    subprocess.run(["chown", "mysql:mysql", str(node / "tmp")], check=True)
    done = subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={node / 'data'}",
                           f"--tmpdir={node / 'tmp'}", "--user=mysql",
                           "--auth-root-authentication-method=normal", "--skip-test-db"],
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise StartError(f"mariadb-install-db failed: {done.stderr.strip()[-800:]}")
    subprocess.run(["chown", "-R", "mysql:mysql", str(node)], check=True)


def terminate(process: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM, then wait for the process to end, killing it after `grace` s (see finish)."""
    if process.poll() is None:
        process.terminate()
        finish(process, grace)


@contextmanager
def existing_mariadb(url: str) -> Iterator[DatabaseServer]:
    """A server that runs already (--single-url): nothing to start or stop."""
    yield DatabaseServer(SINGLE, url, server_settings(url))


@contextmanager
def galera_cluster(console: Console) -> Iterator[DatabaseServer]:
    """galera.sh's cluster on free ports; stopped and removed after."""
    run_dir, base = private_run_dir("market-scaleout-galera-"), free_port(34)
    console.print(f"starting the Galera cluster, balancer on 127.0.0.1:{base} ({run_dir})")
    try:
        script("galera.sh", "start", "--dir", str(run_dir), "--base-port", str(base))
        url = f"mysql://root@127.0.0.1:{base}"
        yield DatabaseServer(CLUSTER, url, server_settings(url))
    finally:
        try:
            script("galera.sh", "stop", "--dir", str(run_dir))
            shutil.rmtree(run_dir, ignore_errors=True)
            console.print("Galera cluster stopped")
        except (StartError, subprocess.TimeoutExpired) as exc:
            console.print(f"stopping the cluster failed ({exc}); see {run_dir}", markup=False)


def database_sides(args: argparse.Namespace,
                   console: Console) -> Iterator[AbstractContextManager[DatabaseServer]]:
    """The database setups to measure on, one after the other (each runs only while measured)."""
    yield existing_mariadb(args.single_url) if args.single_url else standalone_mariadb(console)
    if not args.skip_galera:
        yield galera_cluster(console)


# -- one configuration -------------------------------------------------------------------------

@contextmanager
def balanced_servers(run_dir: Path, db_url: str, processes: int,
                     options: Sequence[str] = ()) -> Iterator[tuple[Address, Address]]:
    """servers.sh: `processes` buyer and seller servers behind HAProxy on free ports (`options`:
    more of servers.sh's, such as --threads N)."""
    buyer, seller = ("127.0.0.1", free_port()), ("127.0.0.1", free_port())
    try:
        script("servers.sh", "start", "--dir", str(run_dir), "--db-url", db_url,
               "--buyers", str(processes), "--sellers", str(processes),
               "--buyer-port", str(buyer[1]), "--seller-port", str(seller[1]), *options, timeout=300)
        yield buyer, seller
    finally:
        script("servers.sh", "stop", "--dir", str(run_dir), timeout=120)


def measure(server: DatabaseServer, processes: int, args: argparse.Namespace,
            console: Console) -> list[Measured]:
    """R runs of every mix against `processes` servers per role over a fresh database."""
    folder = args.out / f"{slug(server.label)}-{processes}"
    db_url = fresh_database(server.admin_url, args.database)
    plan = Plan(args.mix, [args.users], args.calls, args.repeats, seed=args.seed, progress=False)
    with balanced_servers(folder / "servers", db_url, processes) as (buyer, seller), \
            closing(Database(db_url, pool_size=2)) as database:
        results = run_all(plan, buyer, seller, database, console)
    rows = summarise(results)
    heading = f"# {server.label}, processes per role: {processes}\n\n- {describe_settings(server.settings)}"
    write_reports(rows, folder, Console(quiet=True), heading)
    return [Measured(server.label, processes, row,
                     sum(len(r.violations) for r in results if r.mix == row.mix))
            for row in scenario_totals(rows)]


def slug(label: str) -> str:
    """A folder name for a label."""
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")


def measure_all(args: argparse.Namespace, console: Console, measured: list[Measured],
                servers: list[DatabaseServer]) -> None:
    """Every database side, each over every process count; appends as it goes, so that what
    was measured before an error or Ctrl-C can still be written."""
    sides = 1 if args.skip_galera else 2
    for side, setup in enumerate(database_sides(args, console)):
        with setup as server:
            servers.append(server)
            console.print(f"{server.label}: {describe_settings(server.settings)}", markup=False)
            for step, processes in enumerate(args.processes, start=1):
                console.print(f"[{side * len(args.processes) + step}/{sides * len(args.processes)}] "
                              f"{server.label}, processes per role {processes}: fresh database "
                              f"{args.database}, starting the servers", markup=False)
                found = measure(server, processes, args, console)
                for row in found:
                    console.print(f"  {row.summary.mix}: {outcome(row)}", markup=False)
                measured += found


def outcome(row: Measured) -> str:
    """One line: the figures of a configuration."""
    return ", ".join(f"{header} {cell(row.summary)}" for header, cell in COLUMNS if header in REPORTED)


# -- the report ----------------------------------------------------------------------------------

def ratios(measured: Sequence[Measured]) -> list[tuple[int, str, float, float, float]]:
    """(processes, mix, single median, cluster median, cluster/single) where both were measured."""
    medians = {(m.database != CLUSTER, m.processes, m.summary.mix): m.summary.ops_per_s_median
               for m in measured}
    found = []
    for (single, processes, mix), base in medians.items():
        cluster = medians.get((False, processes, mix))
        if single and cluster is not None:
            found.append((processes, mix, base, cluster, cluster / base if base else math.nan))
    return sorted(found)


def markdown(measured: Sequence[Measured], servers: Sequence[DatabaseServer], preamble: str) -> str:
    """The results, the ratio cluster/single and the settings of each side, in Markdown."""
    reported = [(header, cell) for header, cell in COLUMNS if header in REPORTED]
    lines = [preamble, "", "## Throughput and latency", "",
             "| processes per role | database | mix | " + " | ".join(h for h, _ in reported) + " | audit |",
             "|---:|---|---|" + "---:|" * len(reported) + "---|"]
    lines += [f"| {m.processes} | {m.database} | {m.summary.mix} | "
              + " | ".join(cell(m.summary) for _, cell in reported)
              + f" | {audited(m)} |" for m in measured]
    found = ratios(measured)
    if found:
        lines += ["", "## Cluster against single server (median ops/s)", "",
                  f"| processes per role | mix | {SINGLE} | {CLUSTER} | cluster/single "
                  f"| ≥ {TARGET_RATIO:.0%} |",
                  "|---:|---|---:|---:|---:|---|"]
        lines += [f"| {p} | {mix} | {single:.1f} | {cluster:.1f} | {ratio:.1%} | "
                  f"{'yes' if ratio >= TARGET_RATIO else 'NO'} |" for p, mix, single, cluster, ratio in found]
    lines += ["", "## Database settings", ""]
    lines += [f"- {server.label}: {describe_settings(server.settings)}" for server in servers]
    differing = different_settings(servers)
    if differing:
        lines += ["", f"**Not like-for-like:** the sides differ in {', '.join(differing)}."]
    return "\n".join(lines) + "\n"


def different_settings(servers: Sequence[DatabaseServer]) -> list[str]:
    """The settings, other than replication's own, that are not the same on every side."""
    shared = [name for name in SETTINGS if not name.startswith("wsrep_") and name != "version"]
    return [name for name in shared if len({server.settings.get(name) for server in servers}) > 1]


def audited(row: Measured) -> str:
    """The audit's verdict over a configuration's runs."""
    return "consistent" if not row.violations else f"{row.violations} violations"


def write_csv(measured: Sequence[Measured], path: Path) -> None:
    """One row per configuration and mix: its setup, then every field of its summary."""
    fields = ["database", "processes", "violations", *(f.name for f in dataclasses.fields(OpSummary))]
    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=fields)
        writer.writeheader()
        for m in measured:
            writer.writerow({"database": m.database, "processes": m.processes, "violations": m.violations,
                             **dataclasses.asdict(m.summary)})


def plot(measured: Sequence[Measured], path: Path) -> None:
    """Median ops/s (bars: ± sd) and p99 against processes per role, a line per database and mix."""
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for (database, mix), points in _lines(measured).items():
        label = database if mix == "default" else f"{database}, {mix}"
        counts = [m.processes for m in points]
        left.errorbar(counts, [m.summary.ops_per_s_median for m in points],
                      yerr=[m.summary.ops_per_s_sd for m in points], marker="o", capsize=4, label=label)
        right.plot(counts, [m.summary.p99_ms for m in points], marker="o", label=label)
    counts = sorted({m.processes for m in measured})
    for axis, title, unit in ((left, "throughput (median, ± sd)", "ops/s"), (right, "p99 latency", "ms")):
        axis.set(title=title, ylabel=unit)
        axis.set_ylim(bottom=0)
        count_axis(axis, counts, "server processes per role")
        axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _lines(measured: Sequence[Measured]) -> dict[tuple[str, str], list[Measured]]:
    lines: dict[tuple[str, str], list[Measured]] = {}
    for m in sorted(measured, key=lambda m: m.processes):
        lines.setdefault((m.database, m.summary.mix), []).append(m)
    return lines


def write_results(measured: Sequence[Measured], servers: Sequence[DatabaseServer], out: Path,
                  preamble: str) -> list[Path]:
    """scaleout.md, scaleout.csv and scaleout.png in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / name for name in ("scaleout.md", "scaleout.csv", "scaleout.png")]
    paths[0].write_text(markdown(measured, servers, preamble))
    write_csv(measured, paths[1])
    plot(measured, paths[2])
    return paths


def server_threads() -> int:
    """The worker threads a server started without --threads runs (environment, .env, default)."""
    return runtime_config.server_settings("buyer", []).threads


def preamble(args: argparse.Namespace, argv: Sequence[str]) -> str:
    """The heading: command, machine and parameters."""
    return (f"# Scale-out\n\n`python -m simulation.scaleout {shlex.join(argv)}`\n\n"
            f"- {time.strftime('%Y-%m-%d %H:%M:%S')}, {platform.platform()}, {os.cpu_count()} CPUs, "
            f"Python {platform.python_version()}\n"
            f"- servers.sh behind HAProxy (1 worker, {server_threads()} threads each); "
            f"N = {args.users} sellers + {args.users} buyers, K = {args.calls} calls per user, "
            f"R = {args.repeats} runs; "
            f"mixes {', '.join(args.mix)}\n"
            "- latency: median across runs of each run's figure; ops/s: mean ± sd and median across runs")


# -- entry point ---------------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m simulation.scaleout`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    console = Console() if Console().is_terminal else Console(width=140)
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    measured: list[Measured] = []
    servers: list[DatabaseServer] = []
    status = 0
    try:
        measure_all(args, console, measured, servers)
    except (StartError, SimulationError, ServerStartError) as exc:
        console.print(f"scaleout: {exc}", style="bold red", markup=False)
        status = 3
    except KeyboardInterrupt:
        console.print("scaleout: interrupted; what it started is stopped", style="bold red")
        status = 130
    if not measured:
        return status
    heading = preamble(args, argv) + ("" if not status else "\n- **incomplete**: stopped early")
    paths = write_results(measured, servers, args.out, heading)
    for processes, mix, _, _, ratio in ratios(measured):
        console.print(f"cluster/single, {processes} processes per role, {mix}: {ratio:.1%} of the median "
                      f"throughput (target ≥ {TARGET_RATIO:.0%})")
    console.print("written: " + ", ".join(str(path) for path in paths), markup=False)
    violations = sum(m.violations for m in measured)
    console.print("consistency: OK" if not violations else f"consistency: {violations} violations",
                  style=None if not violations else "bold red")
    return status or (1 if violations else 0)


if __name__ == "__main__":
    sys.exit(main())
