"""What the tests share besides fixtures: accounts and cards, free ports, skipping for want of
a tool, databases of their own, both servers in-process, a server process, a MariaDB server of
a test's own, threads raced at one barrier, the tiny App of the server loop's tests.
A plain module (pytest's pythonpath holds tests/): the fixtures in the conftest.py files build on it.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import re
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn

import pytest
from sqlalchemy import bindparam, create_engine, insert, make_url, select, text, update
from sqlalchemy.pool import NullPool

from buyer_server.ops import build_app as build_buyer_app
from db import Database
from db.engine import driver_url
from db.schema import login_failures
from runtime.config import Settings
from runtime.server import Server, ServerLimits
from seller_server.ops import build_app as build_seller_app
from simulation.ports import free_port
from wire import Connection, OpSpec
from wire.app import App
from wire.errors import ProtocolError
from wire.framing import FrameDecoder

# mysql:// as everywhere else in the project (the driver is mysql-connector either way)
MYSQL_ADMIN_URL = driver_url(os.environ.get("MARKET_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
                             ).render_as_string(hide_password=False)
PASSWORD = "correct horse"
CARD = {"card_name": "A Buyer", "card_number": "4111111111111111", "card_expiry": "12/39"}
_names = itertools.count(1)


def unique_name(prefix: str = "user") -> str:
    """A username no other test uses."""
    return f"{prefix}{next(_names)}_{secrets.token_hex(3)}"


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


# -- Databases at this code's schema, copied from one made current once -----------------------
# Running the eight migrations on MariaDB creates the tables and then ALTERs several (a rebuild
# each); copying the tables they made is one CREATE TABLE apiece. The `database` fixture copies a
# template that the migrations themselves made current, once per test process.

def copy_sqlite_database(source: str, target: str) -> None:
    """SQLite's online backup of the file at `source` into the (new) file at `target`."""
    with contextlib.closing(sqlite3.connect(source)) as src, \
            contextlib.closing(sqlite3.connect(target)) as dst:
        src.backup(dst)


def copy_mysql_database(source_url: str, target_url: str) -> None:
    """Every table of `source_url`'s database, as SHOW CREATE TABLE gives it (indexes, foreign
    keys, collations), and its rows, into the empty database of `target_url`."""
    source, target = make_url(source_url).database, make_url(target_url).database
    engine = create_engine(target_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with engine.connect() as conn:
        conn.exec_driver_sql("SET SESSION foreign_key_checks = 0")
        tables = conn.exec_driver_sql(f"SHOW FULL TABLES FROM `{source}` WHERE Table_type = 'BASE TABLE'")
        for table in [row[0] for row in tables]:
            conn.exec_driver_sql(conn.exec_driver_sql(f"SHOW CREATE TABLE `{source}`.`{table}`").one()[1])
            conn.exec_driver_sql(f"INSERT INTO `{target}`.`{table}` SELECT * FROM `{source}`.`{table}`")
    engine.dispose()


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


# -- Real processes: a server, a MariaDB of the test's own ------------------------------------

LISTENING = re.compile(r"^listening on (\S+):(\d+)$")


class ServerProcess:
    """`python -m {role}_server --port 0` in a subprocess."""

    def __init__(self, role: str, db_url: str, port: int = 0, *extra: str, **environ: str) -> None:
        # stderr goes to a file: a pipe nobody reads would fill up and stall the server
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", f"{role}_server", "--port", str(port), "--db-url", db_url,
             "--threads", "4", *extra],
            stdout=subprocess.PIPE, stderr=self.log, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **environ})

    def wait_ready(self) -> ServerProcess:
        """Read the `listening on` line."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        match = LISTENING.match(line)
        assert match, f"expected 'listening on HOST:PORT', got {line!r}; stderr: {self.stderr()}"
        self.host, self.port = match.group(1), int(match.group(2))
        return self

    def stderr(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def connect(self) -> Connection:
        return Connection(self.host, self.port, timeout=10)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=20)


MARIADBD = "/usr/sbin/mariadbd"


class PrivateMariaDB:
    """A mariadbd of our own on a free port, which the test may kill and start again."""

    def __init__(self, root: Path) -> None:
        self.root, self.port = root, free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        (root / "tmp").mkdir(parents=True, exist_ok=True)
        install = subprocess.run(  # the bootstrap server in our tmpdir too (see start)
            ["mariadb-install-db", "--no-defaults", f"--datadir={root / 'data'}", "--user=root",
             f"--tmpdir={root / 'tmp'}", "--auth-root-authentication-method=normal", "--skip-test-db"],
            capture_output=True, timeout=120)
        if install.returncode != 0:
            raise RuntimeError(install.stderr.decode(errors="replace")[-500:])

    @property
    def url(self) -> str:
        return f"mysql+mysqlconnector://root@127.0.0.1:{self.port}/market"

    def start(self) -> None:
        log = (self.root / "mariadbd.log").open("ab")
        self.proc = subprocess.Popen(
            # a tmpdir of its own: mariadbd deletes every #sql* file in its tmpdir at start,
            # and in /tmp those are the temporary tables of the machine's own MariaDB and of
            # other tests' servers being installed (one of those failed a CI run so)
            [MARIADBD, "--no-defaults", f"--datadir={self.root / 'data'}", f"--port={self.port}",
             f"--tmpdir={self.root / 'tmp'}",
             "--bind-address=127.0.0.1", f"--socket={self.root / 'sock'}", "--user=root",
             f"--pid-file={self.root / 'pid'}", "--skip-log-bin", "--innodb-buffer-pool-size=32M"],
            stdout=log, stderr=log)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"mariadbd did not start: {(self.root / 'mariadbd.log').read_text()[-500:]}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


# -- Threads raced at one barrier ---------------------------------------------------------------

def race(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run every call at once (after a barrier); each result or the ProtocolError it raised."""
    barrier = threading.Barrier(len(calls))

    def run(call: Callable[[], Any]) -> Any:
        barrier.wait()
        try:
            return call()
        except ProtocolError as exc:
            return exc

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def codes(results: list[Any]) -> Counter[str]:
    return Counter(r.code if isinstance(r, ProtocolError) else "OK" for r in results)


# -- Statements the unit of work runs on the driver itself ---------------------------------------

LOGIN_FAILURE = (insert(login_failures).values(
    role=bindparam("role"), username=bindparam("username"), failures=bindparam("n"), last_failure_ms=0))
FAILURE_OF = (select(login_failures.c.username, login_failures.c.failures)
                      .where(login_failures.c.role == bindparam("role"),
                             login_failures.c.username == bindparam("username")))
BUMP = (update(login_failures).where(login_failures.c.username == bindparam("username"))
        .values(failures=login_failures.c.failures + 1))


# -- The server loop on its own: a tiny App of public ops ---------------------------------------

BIG = "x" * 500_000  # an answer the socket buffers cannot hold many of


def _boom() -> dict[str, Any]:
    raise RuntimeError("secret detail: password=hunter2")


def _slow() -> dict[str, Any]:
    time.sleep(0.5)
    return {"slept": True}


class NoSessions:
    def run(self, token: str, write: bool, work: Any) -> Any:
        raise AssertionError("no private ops here")


def tiny_app() -> App:
    specs = {name: OpSpec(name, public=True) for name in ("ping", "boom", "slow", "unencodable", "big")}
    specs["private"] = OpSpec("private")
    handlers = {"ping": lambda: {"pong": True}, "boom": _boom, "slow": _slow, "private": _boom,
                "unencodable": lambda: {"text": "\udc80 lone surrogate"}, "big": lambda: {"text": BIG}}
    return App(specs, handlers, NoSessions())


def read_messages(sock: socket.socket, count: int) -> list[dict[str, Any]]:
    decoder = FrameDecoder()
    out: list[dict[str, Any]] = []
    while len(out) < count:
        data = sock.recv(65536)
        if not data:
            break
        decoder.feed(data)
        out.extend(decoder.messages())
    return out


def wait_for_connections(server: Server, count: int, within: float = 5.0) -> None:
    """Wait (at most `within` s) until the server holds no more than `count` connections."""
    deadline = time.monotonic() + within
    while server.connection_count > count and time.monotonic() < deadline:
        time.sleep(0.1)


def waiting_to_write(server: Server) -> int:
    """Connections whose answer waits for their client to read (the loop's own state)."""
    return sum(1 for conn in list(server._connections) if conn.writing)
