"""`market`: the command people type: the buyer and seller shells, `serve`, `health`, `seed`,
`db`, `backup`/`restore`, `audit` and `admin` (`market -h` lists them).
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from observe import logs
from runtime.config import DEFAULT_DB_URL, DEFAULT_PORTS, add_tls_arguments, env, port_setting, positive_int
from runtime.supervisor import die_with_parent
from wire import PROTOCOL_VERSION, Connection, ProtocolError, __version__
from wire.errors import UnauthenticatedError
from wire.tls import optional_client_context
from wire.values import format_money

from .admin import add_admin_parser, on_database
from .loops import PORT_SETTINGS, add_shell_arguments

log = logging.getLogger("market.serve")


def serve(args: argparse.Namespace) -> int:
    """Run the buyer and seller servers until Ctrl-C or SIGTERM, or until one of them stops
    (then the other is stopped too: half a marketplace is no use)."""
    logs.configure_leniently("serve", str(env("MARKET_LOG_LEVEL", "INFO")),
                             str(env("MARKET_LOG_FORMAT", "text")))
    parent = os.getpid()  # the servers stop with it, even when it is killed outright
    procs: dict[str, subprocess.Popen[bytes]] = {}
    stopping: list[int] = []  # the signal that stops them

    def stop(signum: int, _frame: Any) -> None:
        stopping.append(signum)
        for proc in procs.values():
            proc.terminate()

    signal.signal(signal.SIGTERM, stop)  # before any server starts: a Ctrl-C meanwhile stops them all
    signal.signal(signal.SIGINT, stop)
    metrics = dict(zip(("buyer", "seller"), args.metrics_port or (), strict=False))
    for role, port in (("buyer", args.buyer_port), ("seller", args.seller_port)):
        own = ["--metrics-port", str(metrics[role])] if role in metrics else []
        procs[role] = subprocess.Popen(  # stopped by the kernel should this process die
            [sys.executable, "-m", f"{role}_server", "--db-url", args.db_url, "--host", args.host,
             "--port", str(port), *own], preexec_fn=lambda: die_with_parent(parent))
        if stopping:  # a signal before this server's entry in procs
            stop(signal.SIGTERM, None)
            break
    while not stopping and all(proc.poll() is None for proc in procs.values()):
        time.sleep(0.2)
    on_its_own = not stopping  # a server stopped without being asked: a failure, whatever its status
    if on_its_own:
        role, proc = next((role, proc) for role, proc in procs.items() if proc.returncode is not None)
        log.error("the %s server stopped (exit status %d); stopping the other", role, proc.returncode)
        stop(signal.SIGTERM, None)
    codes = [proc.wait() for proc in procs.values()]
    return next((code if code > 0 else 1 for code in codes if code != 0), int(on_its_own))


def metrics_ports(text: str) -> tuple[int, int]:
    """An argparse type: the buyer's and the seller's /metrics ports, "BUYER,SELLER", or
    "PORT" for PORT and PORT+1."""
    port = port_setting("MARKET_METRICS_PORT")
    ports = [port(part) for part in text.split(",")]
    if len(ports) == 1 and ports[0] < 65535:
        ports.append(ports[0] + 1)
    if len(ports) != 2 or ports[0] == ports[1]:
        raise argparse.ArgumentTypeError(f"{text!r}: expected PORT, or two ports BUYER,SELLER")
    return ports[0], ports[1]


# A private read of each server, asked with a token no session has: UNAUTHENTICATED means the
# server looked the token up in its database, UNAVAILABLE that it could not reach it.
_READINESS_OPS = {"buyer": "display_cart", "seller": "display_items"}


def health(args: argparse.Namespace) -> int:
    """Ping a server (and with --ready, see that it reaches its database); print what answered."""
    host, _, port = args.address.rpartition(":")
    try:
        tls = optional_client_context(args.tls_ca, args.tls)
        with Connection(host or "127.0.0.1", int(port), timeout=args.timeout, tls=tls) as conn:
            result = conn.call("ping")
            role = str(result.get("server"))
            if args.ready and role not in _READINESS_OPS:
                raise ValueError(f"not a marketplace server: {role!r}")
            with contextlib.suppress(UnauthenticatedError):  # the token was looked up: the database answers
                if args.ready:
                    conn.call(_READINESS_OPS[role], token="health-check-" + "0" * 30)
    except (OSError, ValueError, ProtocolError) as exc:
        print(f"unhealthy: {args.address}: {exc}", file=sys.stderr)
        return 1
    ready = " (its database answers)" if args.ready else ""
    print(f"ok: {result.get('server')} server {result.get('version')} at {args.address}{ready}")
    return 0


def seed(args: argparse.Namespace) -> int:
    """Load a large catalogue into a database (for scale measurements)."""
    from db.migrations import make_current
    from operate import seed as seeding

    def report(database: Any) -> tuple[str, int]:
        make_current(database)
        result = seeding.seed(database, args.sellers, args.items)
        return (f"seeded {result['sellers']} sellers (seed<id>, password {seeding.SEED_PASSWORD!r}) and "
                f"{result['items']} items in {result['seconds']} s"), 0
    return on_database(args.db_url, report, pool_size=2)


def audit(args: argparse.Namespace) -> int:
    """Print every violation of the database's invariants, then a line of totals."""
    from sqlalchemy.exc import DBAPIError

    from db import DatabaseUnusable
    from operate.audit import book_totals, ledger_of, violations

    def report(database: Any) -> tuple[str, int]:
        try:  # the ledger where the buyer servers keep it; the books read in one transaction
            ledger = ledger_of(database, args.payments_url)
            found, totals = database.run(lambda tx: (violations(tx, (), ledger), book_totals(tx, ledger)),
                                         write=False)
        except (DBAPIError, ProtocolError) as exc:
            reason = " ".join(str(getattr(exc, "orig", None) or exc).split())
            raise DatabaseUnusable(f"cannot audit {database.engine.url!r}: {reason}") from None
        verdict = "the books balance" if not found else f"{len(found)} violation{'s' * (len(found) != 1)}"
        taken, captured = totals.pop("cents taken"), totals.pop("cents captured")
        counted = ", ".join(f"{count} {name}" for name, count in totals.items())
        return "\n".join([*found, f"audit: {verdict}; checked {counted}, {format_money(taken)} taken, "
                                   f"{format_money(captured)} captured"]), int(bool(found))
    return on_database(args.db_url, report, must_exist=(args.db_url, args.payments_url))


def backup_or_restore(args: argparse.Namespace) -> int:
    """`market backup` copies a live database to a new file, `market restore` makes a new
    database from one; one line either way."""
    from operate.backup import BackupError, backup, restore

    try:
        print(restore(args.file, args.db_url) if args.restoring else backup(args.db_url, args.file))
        return 0
    except BackupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def db_upgrade(args: argparse.Namespace) -> int:
    """Bring the database to head under the upgrade lock; say what was done."""
    from db.migrations import upgrade

    def report(database: Any) -> tuple[str, int]:
        before, after = upgrade(database)
        if before.current == after.current:
            return f"the database {database.where} is at revision {after.current} (head): nothing to do", 0
        return (f"upgraded the database {database.where} from revision "
                f"{before.current or 'none (empty)'} to {after.current} (head)"), 0
    return on_database(args.db_url, report)


def db_current(args: argparse.Namespace) -> int:
    """Print the database's revision and whether it is head; exit 1 when it is not."""
    from db.migrations import revision_of

    def report(database: Any) -> tuple[str, int]:
        revision = revision_of(database)
        state = "head" if revision.is_head else f"not head: this code's head is {revision.head}"
        if revision.is_newer:
            state = f"newer than this code's head {revision.head}"
        return f"{revision.current or 'none (empty database)'} ({state})", int(not revision.is_head)
    return on_database(args.db_url, report, must_exist=(args.db_url,))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="market", description="The marketplace command.")
    parser.add_argument("--version", action="version",
                        version=f"market {__version__} (protocol {PROTOCOL_VERSION})")
    sub = parser.add_subparsers(dest="command", required=True)
    for role in PORT_SETTINGS:
        add_shell_arguments(sub.add_parser(role, help=f"the {role} shell (interactive, or a "
                                                       "script with -c/stdin)"), role)
    db = argparse.ArgumentParser(add_help=False)  # --db-url, for the commands that take it
    db.add_argument("--db-url", default=env("MARKET_DB_URL", DEFAULT_DB_URL))
    p = sub.add_parser("serve", parents=[db], help="run both servers in the foreground")
    p.add_argument("--host", default=env("MARKET_HOST", "127.0.0.1"))
    for role, variable in PORT_SETTINGS.items():
        p.add_argument(f"--{role}-port", type=port_setting(variable, lowest=0),  # 0: a free port
                       default=env(variable, str(DEFAULT_PORTS[role])))
    p.add_argument("--metrics-port", type=metrics_ports, default=env("MARKET_METRICS_PORT") or None,
                   metavar="PORT[,PORT]", help="serve the buyer's /metrics on PORT and the seller's "
                                              "on PORT+1 (or on the second PORT); default: off")
    p.set_defaults(func=serve)
    _add_operator_parsers(sub, db)
    p = sub.add_parser("health", help="ping a server; exit non-zero if it does not answer")
    p.add_argument("address", help="HOST:PORT")
    p.add_argument("--timeout", type=float, default=3.0)
    p.add_argument("--ready", action="store_true",
                   help="also check that the server reaches its database (a lookup of an unknown token)")
    add_tls_arguments(p)
    p.set_defaults(func=health)
    return parser


def _add_operator_parsers(sub: Any, db: argparse.ArgumentParser) -> None:
    p = sub.add_parser("seed", parents=[db], help="bulk-load sellers and items into an idle database")
    p.add_argument("--sellers", type=positive_int, default=100_000)
    p.add_argument("--items", type=positive_int, default=1_000_000)
    p.set_defaults(func=seed)
    schema = sub.add_parser("db", help="the database's schema: upgrade it, or show its revision")
    schema = schema.add_subparsers(dest="db_command", required=True)
    schema.add_parser("upgrade", parents=[db], help="bring the database to this code's schema",
                      ).set_defaults(func=db_upgrade)
    schema.add_parser("current", parents=[db], help="print the database's revision; exit 1 if not head",
                      ).set_defaults(func=db_current)
    p = sub.add_parser("audit", parents=[db], help="check the books of a whole database and the "
                                                   "payment ledger (run it with no load)")
    p.add_argument("--payments-url", default=env("MARKET_PAYMENTS_URL") or None,
                   help="the payment ledger's database, when the buyer servers keep it apart "
                        "(default: MARKET_PAYMENTS_URL, else the payments table of --db-url)")
    p.set_defaults(func=audit)
    for name, text in (("backup", "copy a database, live, to a new FILE (SQLite: a database file; "
                                  "MariaDB: a mariadb-dump SQL file)"),
                       ("restore", "make a new, empty database from a backup FILE")):
        p = sub.add_parser(name, parents=[db], help=text)
        p.add_argument("file", type=Path, metavar="FILE")
        p.set_defaults(func=backup_or_restore, restoring=name == "restore")
    add_admin_parser(sub, db)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
