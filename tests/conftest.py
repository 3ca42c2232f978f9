"""Fixtures: real databases (a fresh SQLite file, a fresh MariaDB database) and real
servers on port 0, in-process, with connections to them.

MariaDB tests skip with a reason when no server answers, unless CI=true, where an
unreachable MariaDB fails the run. Set MARKET_TEST_MYSQL_URL to use another server.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import random
import secrets
import shutil
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, NoReturn

import pytest
from sqlalchemy import create_engine, text

from buyer_server.ops import build_app as build_buyer_app
from db import Database
from db.engine import driver_url
from runtime.config import Settings
from seller_server.ops import build_app as build_seller_app
from wire import Connection
from wire.server import Server, ServerLimits

# mysql:// as everywhere else in the project (the driver is mysql-connector either way)
MYSQL_ADMIN_URL = driver_url(os.environ.get("MARKET_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
                             ).render_as_string(hide_password=False)
PASSWORD = "correct horse"
CARD = {"card_name": "A Buyer", "card_number": "4111111111111111", "card_expiry": "12/39"}
_names = itertools.count(1)
# Tests start server processes on fresh databases all the time: those servers make their
# database current themselves (the tests of a server refusing an old schema unset this).
os.environ.setdefault("MARKET_UPGRADE_SCHEMA", "1")


def free_port() -> int:
    """A port nothing uses right now, for a program to bind later: below the kernel's range
    for ports it hands out itself, so no outgoing connection and no `--port 0` server takes
    it meanwhile (one did, once: HAProxy could not bind its frontend in CI)."""
    low = _ephemeral_ports_start()
    if low <= 10_000:  # a widened range (say 1024-65535) leaves no room below it:
        return _port_the_kernel_picks()  # the kernel's choice, which it may hand out again
    for _ in range(100):
        port = random.randrange(10_000, low)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port from 10000 to {low}")


def _port_the_kernel_picks() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ephemeral_ports_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
            return int(ports.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def unique_name(prefix: str = "user") -> str:
    """A username no other test uses."""
    return f"{prefix}{next(_names)}_{secrets.token_hex(3)}"


def _mysql_reachable() -> str | None:
    url = create_engine(MYSQL_ADMIN_URL).url
    try:
        with socket.create_connection((url.host or "127.0.0.1", url.port or 3306), timeout=2):
            return None
    except OSError as exc:
        return f"no MariaDB/MySQL server answers at {url.host}:{url.port or 3306} ({exc})"


def missing(what: str, reason: str) -> NoReturn:
    """Skip for want of `what`, or fail under CI=true, where every test must run."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true requires {what}: {reason}")
    pytest.skip(reason)


def require_tool(name: str, package: str | None = None) -> str:
    """The program's path; skip without it, except under CI=true, where it must be there."""
    path = shutil.which(name)
    if path is None:
        missing(name, f"{name} is not installed (apt-get install -y {package or name})")
    return path


@pytest.fixture(scope="session")
def mysql_server() -> str:
    """The admin URL of a reachable MariaDB; skip (or fail under CI=true) otherwise."""
    problem = _mysql_reachable()
    if problem:
        missing("MariaDB", problem)
    return MYSQL_ADMIN_URL


def fresh_mysql_database(admin_url: str, prefix: str = "market_test") -> Iterator[str]:
    """Create a database of its own for one test; drop it afterwards."""
    name = f"{prefix}_{os.getpid()}_{secrets.token_hex(4)}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"))
    try:
        yield admin.url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name}"))
        admin.dispose()


@pytest.fixture(params=["sqlite", "mariadb"])
def db_url(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[str]:
    """A fresh, empty database of each kind."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'market.db'}"
    else:
        yield from fresh_mysql_database(request.getfixturevalue("mysql_server"))


@pytest.fixture
def database(db_url: str) -> Iterator[Database]:
    """The data layer over a fresh database, schema created."""
    db = Database(db_url, pool_size=8)
    db.create_schema()
    yield db
    db.close()


@dataclass
class Market:
    """Both servers running in this process over one database."""

    db: Database
    buyer_server: Server
    seller_server: Server
    connections: list[Connection] = field(default_factory=list)

    def connect(self, role: str) -> Connection:
        """A new connection to the buyer or seller server."""
        server = self.buyer_server if role == "buyer" else self.seller_server
        conn = Connection(*server.address, timeout=30)
        self.connections.append(conn)
        return conn

    def user(self, role: str, name: str | None = None) -> Connection:
        """A connection logged in as a new account of that role."""
        conn = self.connect(role)
        username = name or unique_name(role)
        conn.username = username  # type: ignore[attr-defined]
        conn.user_id = conn.call("create_account",  # type: ignore[attr-defined]
                                 {"username": username, "password": PASSWORD, "name": username})["user_id"]
        conn.token = conn.call("login", {"username": username, "password": PASSWORD})["token"]
        return conn

    def item(self, seller: Connection, **overrides: Any) -> int:
        """List an item (defaults for every field) and return its id."""
        args = {"name": "Lamp", "category": 2, "keywords": ["desk", "light"], "condition": "used",
                "price": "12.50", "quantity": 5, **overrides}
        return int(seller.call("put_item", args)["item_id"])


def start_market(db: Database, settings: Settings | None = None,
                 limits: ServerLimits = ServerLimits(threads=8), **app_kwargs: Any) -> Market:
    """Start both servers on port 0 over a database."""
    settings = settings or Settings(role="buyer")
    buyer = Server(build_buyer_app(replace(settings, role="buyer"), db, **app_kwargs), limits=limits)
    seller = Server(build_seller_app(replace(settings, role="seller"), db), limits=limits)
    buyer.start()
    seller.start()
    return Market(db, buyer, seller)


@contextlib.contextmanager
def running_market(db: Database, settings: Settings | None = None, **kwargs: Any) -> Iterator[Market]:
    """start_market, stopped (and its connections closed) on the way out."""
    m = start_market(db, settings, **kwargs)
    try:
        yield m
    finally:
        for conn in m.connections:
            conn.close()
        m.buyer_server.shutdown()
        m.seller_server.shutdown()


@pytest.fixture
def market(database: Database) -> Iterator[Market]:
    """Buyer and seller servers on a fresh database (each kind)."""
    with running_market(database) as m:
        yield m


@pytest.fixture
def round_trips(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every query sent to MySQL/MariaDB from now on (one round trip each), as the number
    of statements it carried; the driver is the real one, only watched."""
    import db.unit_of_work

    sent: list[int] = []
    send = db.unit_of_work._run_mysql

    def watched(driver: Any, statements: list[tuple[str, Any]]) -> Any:
        sent.append(len(statements))
        return send(driver, statements)

    monkeypatch.setattr(db.unit_of_work, "_run_mysql", watched)
    return sent
