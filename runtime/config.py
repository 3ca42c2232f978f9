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
from dataclasses import dataclass, fields
from typing import Any, NoReturn

from dotenv import find_dotenv, load_dotenv

from runtime.server import ServerLimits

DEFAULT_DB_URL = "sqlite:///market.db"
DEFAULT_PORTS = {"buyer": 7001, "seller": 7002}
_LIMITS = ServerLimits()  # the server loop's own defaults, not written twice


@dataclass(frozen=True)
class Settings:
    """Everything a server process is configured with."""

    role: str
    host: str = "127.0.0.1"
    port: int = 7001
    db_url: str = DEFAULT_DB_URL
    max_frame: int = _LIMITS.max_frame
    max_connections: int = _LIMITS.max_connections
    idle_timeout_s: float = _LIMITS.idle_timeout_s
    frame_deadline_s: float = _LIMITS.frame_deadline_s
    threads: int = _LIMITS.threads
    max_connections_per_address: int = _LIMITS.max_connections_per_address
    new_connections_per_s_per_address: float = _LIMITS.new_connections_per_s_per_address
    max_queued_bytes_per_connection: int = _LIMITS.max_queued_bytes_per_connection
    max_queued_bytes: int = _LIMITS.max_queued_bytes
    workers: int = 1
    session_idle_s: int = 300
    session_max_s: int = 86400
    payment_decline_rate: float = 0.0
    payments_url: str | None = None  # the simulated processor's ledger; None: in db_url's database
    settle_period_s: float = 5.0
    settle_after_s: float = 30.0  # a pending purchase this old was cut off: the settler settles it
    test_kill_at: str | None = None  # a test hook: buyer_server.checkout.KILL_POINTS
    login_free_failures: int = 5
    login_max_delay_s: float = 900.0
    login_address_free_failures: int = 50
    login_account_free_failures: int = 5  # the account's bucket (db.login_throttle)
    login_account_step_s: float = 1.25
    signups_per_address_hour: int = 300
    max_items_per_seller: int = 10_000  # items on sale at once (db.catalog.put_item)
    hash_queue: int = 0  # 0: threads - 1 (runtime.hashing)
    hash_queue_per_address: int = 0  # 0: half the queue (runtime.hashing)
    housekeeping_interval_s: float = 60.0
    worker_timeout_s: float = 30.0
    tls_cert: str | None = None
    tls_key: str | None = None
    log_level: str = "INFO"
    sqlite_synchronous: str = "NORMAL"
    metrics_port: int | None = None  # /metrics served on it when set
    metrics_host: str = "127.0.0.1"
    metrics_connections: int = 16  # open at once on the metrics port (the oldest gives way)
    log_format: str = "text"
    access_log: float = 0.0  # the fraction of requests the access log records
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
    for servers), or a usage error naming both (a flag's default from the environment is
    converted only when it is used)."""
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


# What each number may be: (the flag or variable that sets it, lowest, highest)
_RANGES: dict[str, tuple[str, float, float]] = {
    "port": ("--port", 0, 65535),
    "threads": ("--threads / MARKET_THREADS", 1, 1024),
    "workers": ("--workers / MARKET_WORKERS", 1, 256),
    "max_frame": ("MARKET_MAX_FRAME", 1024, 2**31 - 1),
    "max_connections": ("MARKET_MAX_CONNECTIONS", 1, 1_000_000),
    "max_connections_per_address": ("MARKET_MAX_CONNECTIONS_PER_ADDRESS", 1, 1_000_000),
    "new_connections_per_s_per_address": ("MARKET_NEW_CONNECTIONS_PER_S_PER_ADDRESS", 0.001, 10**9),
    "max_queued_bytes_per_connection": ("MARKET_MAX_QUEUED_BYTES_PER_CONNECTION", 1024, 2**40),
    "max_queued_bytes": ("MARKET_MAX_QUEUED_BYTES", 1024, 2**40),
    "idle_timeout_s": ("MARKET_IDLE_TIMEOUT_S", 0.001, 10**9),
    "frame_deadline_s": ("MARKET_FRAME_DEADLINE_S", 0.001, 10**9),
    "session_idle_s": ("MARKET_SESSION_IDLE_S", 1, 10**9),
    "session_max_s": ("MARKET_SESSION_MAX_S", 1, 10**9),
    "payment_decline_rate": ("MARKET_PAYMENT_DECLINE_RATE", 0, 1),
    "settle_period_s": ("MARKET_SETTLE_PERIOD_S", 0.01, 25),
    "settle_after_s": ("MARKET_SETTLE_AFTER_S", 0.01, 30),
    "login_free_failures": ("MARKET_LOGIN_FREE_FAILURES", 0, 10**9),
    "login_max_delay_s": ("MARKET_LOGIN_MAX_DELAY_S", 0, 10**9),
    "access_log": ("MARKET_ACCESS_LOG", 0, 1),
    "login_address_free_failures": ("MARKET_LOGIN_ADDRESS_FREE_FAILURES", 0, 10**9),
    "login_account_free_failures": ("MARKET_LOGIN_ACCOUNT_FREE_FAILURES", 0, 10**9),
    "login_account_step_s": ("MARKET_LOGIN_ACCOUNT_STEP_S", 0.001, 3600),
    "signups_per_address_hour": ("MARKET_SIGNUPS_PER_ADDRESS_HOUR", 0, 10**9),
    "max_items_per_seller": ("MARKET_MAX_ITEMS_PER_SELLER", 1, 10**9),
    "hash_queue": ("MARKET_HASH_QUEUE", 0, 1_000_000),
    "hash_queue_per_address": ("MARKET_HASH_QUEUE_PER_ADDRESS", 0, 1_000_000),
    "housekeeping_interval_s": ("MARKET_HOUSEKEEPING_INTERVAL_S", 0.01, 10**6),
    "worker_timeout_s": ("MARKET_WORKER_TIMEOUT_S", 0.1, 10**6),
}
# Written again rather than imported: the shells and tools read settings too, and importing
# db would load SQLAlchemy into each of them.
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_LOG_FORMATS = ("text", "json")  # observe.logs.FORMATS
_SWITCH = {"on": 1.0, "true": 1.0, "yes": 1.0, "off": 0.0, "false": 0.0, "no": 0.0, "": 0.0}
_SQLITE_SYNCHRONOUS = ("NORMAL", "FULL")  # db.engine.SQLITE_SYNCHRONOUS


def _fraction_or_switch(text: str, refuse: Callable[[str], NoReturn]) -> float:
    """on/off, or the fraction of requests to record (0.01: one in a hundred)."""
    if text.strip().lower() in _SWITCH:
        return _SWITCH[text.strip().lower()]
    try:
        return float(text)
    except ValueError:
        refuse(f"MARKET_ACCESS_LOG={text}: on, off, or a fraction from 0 to 1")


# Numbers read from the environment only: those set by MARKET_ and their name in capitals
# (access_log takes on/off too: _fraction_or_switch)
_FROM_ENVIRONMENT = [name for name, (source, _, _) in _RANGES.items()
                     if source == f"MARKET_{name.upper()}" and name != "access_log"]
_TYPES = {field.name: field.type for field in fields(Settings)}


def server_settings(role: str, argv: list[str] | None = None) -> Settings:
    """Settings for the buyer or seller server from flags, environment and `.env`.

    What neither sets keeps the default written once, in `Settings`. A value that is
    not a number, or out of its range, ends the program (status 2) with one line naming it.
    """
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
    from_environment = {name: number(f"MARKET_{name.upper()}", int if _TYPES[name] == "int" else float,
                                     getattr(default, name)) for name in _FROM_ENVIRONMENT}
    settings = Settings(
        role=role, host=args.host, port=args.port, db_url=args.db_url, threads=args.threads,
        workers=args.workers, tls_cert=args.tls_cert, tls_key=args.tls_key, **from_environment,
        payments_url=env("MARKET_PAYMENTS_URL") or None, test_kill_at=env("MARKET_TEST_KILL_AT") or None,
        log_level=args.log_level, sqlite_synchronous=args.sqlite_synchronous.upper(),
        metrics_port=args.metrics_port, metrics_host=args.metrics_host, log_format=args.log_format.lower(),
        access_log=_fraction_or_switch(env("MARKET_ACCESS_LOG", "off"), refuse),
        upgrade_schema=args.upgrade_schema,
    )
    for field, (source, low, high) in _RANGES.items():
        value = getattr(settings, field)
        if not low <= value <= high:
            refuse(f"{source} {value}: must be from {low:,} to {high:,}")
    short = descriptor_shortage(settings)
    if short:
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
                                 ("--log-format", args.log_format, _LOG_FORMATS),
                                 ("--sqlite-synchronous", args.sqlite_synchronous, _SQLITE_SYNCHRONOUS)):
        if value.upper() not in choices and value.lower() not in choices:
            refuse(f"{flag} {value}: one of {', '.join(choices)}")


def descriptors_needed(settings: Settings) -> int:
    """File descriptors one server process may hold at once: a socket per connection, and
    per database connection (the pool and its overflow) up to three (SQLite's file, its
    write-ahead log and shared memory), the metrics port's connections, plus a margin for
    the listener, the selector, logs and the accept that finds the process full."""
    return settings.max_connections + settings.metrics_connections + 2 * settings.threads * 3 + 64


def descriptor_shortage(settings: Settings) -> str:
    """Why the process's descriptor limit cannot hold the settings ("" if it can); the soft
    limit is raised towards the hard one first, as far as needed."""
    needed = descriptors_needed(settings)
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
