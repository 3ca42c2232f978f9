"""Settings of servers, client and simulator, read in one place.

Precedence: command-line flag, then the environment, then a `.env` file in the
working folder (python-dotenv), then the default. Every name is listed, with its
default and a comment, in `.env.example`.
"""
from __future__ import annotations

import argparse
import functools
import os
import resource
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, NoReturn

from dotenv import find_dotenv, load_dotenv

from observe.logs import FORMATS
from runtime.server import ServerLimits

DEFAULT_DB_URL = "sqlite:///market.db"
DEFAULT_PORTS = {"buyer": 7001, "seller": 7002}
_LIMITS = ServerLimits()  # the server loop's own defaults, not written twice


def _number(default: Any, low: float, high: float, source: str) -> Any:
    """A number kept from low to high; `source` is the flag or variable that sets it."""
    return field(default=default, metadata={"range": (low, high), "source": source})


@dataclass(frozen=True)
class Settings:
    """Everything a server process is configured with."""

    role: str
    host: str = "127.0.0.1"
    port: int = _number(7001, 0, 65535, "--port")
    db_url: str = DEFAULT_DB_URL
    max_frame: int = _number(_LIMITS.max_frame, 1024, 2**31 - 1, "MARKET_MAX_FRAME")
    max_connections: int = _number(_LIMITS.max_connections, 1, 1_000_000, "MARKET_MAX_CONNECTIONS")
    idle_timeout_s: float = _number(_LIMITS.idle_timeout_s, 0.001, 10**9, "MARKET_IDLE_TIMEOUT_S")
    frame_deadline_s: float = _number(_LIMITS.frame_deadline_s, 0.001, 10**9, "MARKET_FRAME_DEADLINE_S")
    threads: int = _number(_LIMITS.threads, 1, 1024, "--threads / MARKET_THREADS")
    max_connections_per_address: int = _number(_LIMITS.max_connections_per_address, 1, 1_000_000,
                                               "MARKET_MAX_CONNECTIONS_PER_ADDRESS")
    new_connections_per_s_per_address: float = _number(
        _LIMITS.new_connections_per_s_per_address, 0.001, 10**9, "MARKET_NEW_CONNECTIONS_PER_S_PER_ADDRESS")
    max_queued_bytes_per_connection: int = _number(
        _LIMITS.max_queued_bytes_per_connection, 1024, 2**40, "MARKET_MAX_QUEUED_BYTES_PER_CONNECTION")
    max_queued_bytes: int = _number(_LIMITS.max_queued_bytes, 1024, 2**40, "MARKET_MAX_QUEUED_BYTES")
    workers: int = _number(1, 1, 256, "--workers / MARKET_WORKERS")
    session_idle_s: int = _number(300, 1, 10**9, "MARKET_SESSION_IDLE_S")
    session_max_s: int = _number(86400, 1, 10**9, "MARKET_SESSION_MAX_S")
    payment_decline_rate: float = _number(0.0, 0, 1, "MARKET_PAYMENT_DECLINE_RATE")
    payments_url: str | None = None  # the simulated processor's ledger; None: in db_url's database
    settle_period_s: float = _number(5.0, 0.01, 25, "MARKET_SETTLE_PERIOD_S")
    # a pending purchase this old was cut off: the settler settles it
    settle_after_s: float = _number(30.0, 0.01, 30, "MARKET_SETTLE_AFTER_S")
    test_kill_at: str | None = None  # a test hook: buyer_server.checkout.KILL_POINTS
    login_free_failures: int = _number(5, 0, 10**9, "MARKET_LOGIN_FREE_FAILURES")
    login_max_delay_s: float = _number(900.0, 0, 10**9, "MARKET_LOGIN_MAX_DELAY_S")
    login_address_free_failures: int = _number(50, 0, 10**9, "MARKET_LOGIN_ADDRESS_FREE_FAILURES")
    # the account's bucket (db.login_throttle)
    login_account_free_failures: int = _number(5, 0, 10**9, "MARKET_LOGIN_ACCOUNT_FREE_FAILURES")
    login_account_step_s: float = _number(1.25, 0.001, 3600, "MARKET_LOGIN_ACCOUNT_STEP_S")
    signups_per_address_hour: int = _number(300, 0, 10**9, "MARKET_SIGNUPS_PER_ADDRESS_HOUR")
    # items on sale at once (db.catalog.put_item)
    max_items_per_seller: int = _number(10_000, 1, 10**9, "MARKET_MAX_ITEMS_PER_SELLER")
    hash_queue: int = _number(0, 0, 1_000_000, "MARKET_HASH_QUEUE")  # 0: threads - 1 (runtime.hashing)
    # 0: half the queue (runtime.hashing)
    hash_queue_per_address: int = _number(0, 0, 1_000_000, "MARKET_HASH_QUEUE_PER_ADDRESS")
    housekeeping_interval_s: float = _number(60.0, 0.01, 10**6, "MARKET_HOUSEKEEPING_INTERVAL_S")
    worker_timeout_s: float = _number(30.0, 0.1, 10**6, "MARKET_WORKER_TIMEOUT_S")
    tls_cert: str | None = None
    tls_key: str | None = None
    log_level: str = "INFO"
    sqlite_synchronous: str = "NORMAL"
    metrics_port: int | None = None  # /metrics served on it when set
    metrics_host: str = "127.0.0.1"
    # one connection to the metrics port, from connect to its answer sent (observe.serving)
    metrics_timeout_s: float = _number(5.0, 0.01, 3600, "MARKET_METRICS_TIMEOUT_S")
    log_format: str = "text"
    access_log: float = _number(0.0, 0, 1, "MARKET_ACCESS_LOG")  # the fraction of requests logged
    upgrade_schema: bool = False  # upgrade an older schema at start instead of refusing it


@functools.cache
def _load_dotenv() -> None:
    """Read `.env` from the working folder once; the environment wins over it."""
    load_dotenv(find_dotenv(usecwd=True), override=False)


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (counts of runs, calls, items ...)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be at least 1")
    return value


def positive_int_list(text: str) -> list[int]:
    """An argparse type: whole numbers of at least 1 separated by commas (1,10,100)."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive integers separated by commas")
    return values


def port_setting(variable: str, lowest: int = 1) -> Callable[[str], int]:
    """An argparse type for a port that `variable` may also set: lowest-65535 (0: a free one,
    for servers), or a usage error naming both."""
    def port(text: str) -> int:
        if not text.strip().isdigit() or not lowest <= int(text) <= 65535:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a port from {lowest} to 65535 (flag or {variable})")
        return int(text)
    return port


def add_tls_arguments(parser: argparse.ArgumentParser) -> None:
    """--tls and --tls-ca, for talking to servers started with --tls-cert/--tls-key."""
    parser.add_argument("--tls-ca", default=env("MARKET_TLS_CA"), metavar="PEM",
                        help="use TLS, trusting this CA certificate (e.g. a self-signed server's)")
    parser.add_argument("--tls", action="store_true", help="use TLS, trusting the system's CAs")


def env(name: str, default: Any = None) -> Any:
    """A MARKET_* setting from the environment or `.env`; when that is unset or empty, the
    contents of the file NAME_FILE names (a container's secret); else the default."""
    _load_dotenv()
    value, path = os.environ.get(name), os.environ.get(f"{name}_FILE")
    if path and not value:
        return _secret_file(name, path)
    return default if value is None else value


def _secret_file(name: str, path: str) -> str:
    """The file's text, its final line break dropped; a file that cannot be read ends the program."""
    try:
        with open(path, encoding="utf-8") as file:
            return file.read().removesuffix("\n")
    except OSError as exc:
        sys.exit(f"error: {name}_FILE={path}: {exc.strerror}")


_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_SWITCH = {"on": 1.0, "true": 1.0, "yes": 1.0, "off": 0.0, "false": 0.0, "no": 0.0, "": 0.0}
# db.engine.SQLITE_SYNCHRONOUS, written again: the shells and tools read settings too, and
# importing db would load SQLAlchemy into each of them
_SQLITE_SYNCHRONOUS = ("NORMAL", "FULL")


def _fraction_or_switch(text: str, refuse: Callable[[str], NoReturn]) -> float:
    """on/off, or the fraction of requests to record (0.01: one in a hundred)."""
    if text.strip().lower() in _SWITCH:
        return _SWITCH[text.strip().lower()]
    try:
        return float(text)
    except ValueError:
        refuse(f"MARKET_ACCESS_LOG={text}: on, off, or a fraction from 0 to 1")


_RANGED = [f for f in fields(Settings) if "range" in f.metadata]
# read as numbers from their variable alone (access_log takes on/off too: _fraction_or_switch)
_FROM_ENVIRONMENT = [f for f in _RANGED
                     if f.metadata["source"] == f"MARKET_{f.name.upper()}" and f.name != "access_log"]


def server_settings(role: str, argv: list[str] | None = None) -> Settings:
    """Settings for the buyer or seller server from flags, environment and `.env`; a value
    not a number, or out of its range, ends the program (status 2) with one line naming it."""
    default = Settings(role=role)

    def refuse(message: str) -> NoReturn:  # one line, as for a database it cannot use (runner)
        print(f"error: {role} server: {message}", file=sys.stderr)
        sys.exit(2)

    def number(name: str, cast: type, fallback: Any) -> Any:
        raw = env(name, fallback)
        try:
            return cast(raw)
        except ValueError:
            refuse(f"{name}={raw}: not {'an integer' if cast is int else 'a number'}")

    args = _server_parser(role, default, number).parse_args(argv)
    _check_choices(args, refuse)
    from_environment = {f.name: number(f"MARKET_{f.name.upper()}", int if f.type == "int" else float,
                                       f.default) for f in _FROM_ENVIRONMENT}
    settings = Settings(
        role=role, **vars(args), **from_environment,
        payments_url=env("MARKET_PAYMENTS_URL") or None, test_kill_at=env("MARKET_TEST_KILL_AT") or None,
        access_log=_fraction_or_switch(env("MARKET_ACCESS_LOG", "off"), refuse),
    )
    for f in _RANGED:
        value, (low, high) = getattr(settings, f.name), f.metadata["range"]
        if not low <= value <= high:
            refuse(f"{f.metadata['source']} {value}: must be from {low:,} to {high:,}")
    if short := descriptor_shortage(settings):
        refuse(short)
    return settings


def _server_parser(role: str, default: Settings,
                   number: Callable[[str, type, Any], Any]) -> argparse.ArgumentParser:
    """The server's flags, each defaulting to its environment variable, then to `Settings`."""
    parser = argparse.ArgumentParser(prog=f"python -m {role}_server",
                                     description=f"Run the marketplace {role} server.")
    parser.add_argument("--host", default=env("MARKET_HOST", default.host))
    port = number(f"MARKET_{role.upper()}_PORT", int, DEFAULT_PORTS[role])
    parser.add_argument("--port", type=int, default=port, help="0 picks a free port")
    parser.add_argument("--db-url", default=env("MARKET_DB_URL", default.db_url),
                        help="SQLAlchemy URL (default: an SQLite file market.db here)")
    parser.add_argument("--threads", type=int, default=number("MARKET_THREADS", int, default.threads),
                        help="worker threads (and database connections) per process")
    parser.add_argument("--workers", type=int, default=number("MARKET_WORKERS", int, default.workers),
                        help="server processes sharing the port")
    parser.add_argument("--tls-cert", default=env("MARKET_TLS_CERT"),
                        help="serve TLS with this certificate chain (PEM); needs --tls-key")
    parser.add_argument("--tls-key", default=env("MARKET_TLS_KEY"), help="the certificate's key (PEM)")
    parser.add_argument("--log-level", default=env("MARKET_LOG_LEVEL", default.log_level))
    parser.add_argument("--sqlite-synchronous",
                        default=env("MARKET_SQLITE_SYNCHRONOUS", default.sqlite_synchronous),
                        help="NORMAL (default), or FULL: SQLite's commits survive a power cut too (slower)")
    parser.add_argument("--metrics-port", type=port_setting("MARKET_METRICS_PORT"),
                        default=env("MARKET_METRICS_PORT") or None,
                        help="serve Prometheus metrics at http://METRICS_HOST:PORT/metrics (default: off)")
    parser.add_argument("--metrics-host", default=env("MARKET_METRICS_HOST", default.metrics_host))
    parser.add_argument("--log-format", default=env("MARKET_LOG_FORMAT", default.log_format),
                        help="text (default) or json: one JSON object per line")
    parser.add_argument("--upgrade-schema", action="store_true",
                        default=env("MARKET_UPGRADE_SCHEMA", "0") not in ("", "0"),
                        help="upgrade a database of an older schema at start, instead of refusing it "
                             "(an empty one is always made; scripts/start.sh sets it on its SQLite default)")
    return parser


def _check_choices(args: argparse.Namespace, refuse: Callable[[str], NoReturn]) -> None:
    """Flags that go together, and those of a few names."""
    if bool(args.tls_cert) != bool(args.tls_key):
        refuse("--tls-cert and --tls-key go together")
    for flag, value, choices in (("--log-level", args.log_level, _LOG_LEVELS),
                                 ("--log-format", args.log_format, FORMATS),
                                 ("--sqlite-synchronous", args.sqlite_synchronous, _SQLITE_SYNCHRONOUS)):
        if value.upper() not in choices and value.lower() not in choices:
            refuse(f"{flag} {value}: one of {', '.join(choices)}")
    args.sqlite_synchronous, args.log_format = args.sqlite_synchronous.upper(), args.log_format.lower()


def descriptor_shortage(settings: Settings) -> str:
    """Why the process's descriptor limit cannot hold the settings ("" if it can); the soft
    limit is raised towards the hard one first, as far as needed."""
    # a socket per connection, per database connection (the pool and its overflow) up to three
    # (SQLite's file, its write-ahead log and shared memory), the metrics port's connections, and
    # a margin for the listener, the selector, logs and the accept that finds the process full
    from observe.serving import MAX_CONNECTIONS as metrics_connections

    needed = settings.max_connections + metrics_connections + 2 * settings.threads * 3 + 64
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return ""
    if hard == resource.RLIM_INFINITY or hard >= needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
        return ""
    return (f"MARKET_MAX_CONNECTIONS {settings.max_connections} with {settings.threads} "
            f"database connections (MARKET_THREADS) needs "
            f"{needed} file descriptors, over this process's limit of {hard} (ulimit -n): "
            f"lower MARKET_MAX_CONNECTIONS or raise the limit")
