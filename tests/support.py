"""What the tests share besides fixtures: accounts and cards, free ports, skipping for want of
a tool, databases of their own, both servers in-process, the shells in a pseudo-terminal, a
server process, a MariaDB server of a test's own, a TCP relay that counts MariaDB's round trips,
shoppers checked against the books, threads raced at one barrier, the tiny App of the server
loop's tests. Test modules import from here, never from each other.
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
from typing import Any, NoReturn, TypeVar

import pexpect
import pytest
from sqlalchemy import bindparam, create_engine, func, insert, make_url, select, text, update
from sqlalchemy.pool import NullPool

from buyer_server.ops import build_app as build_buyer_app
from db import Database
from db.engine import driver_url
from db.purchases import COMPLETED
from db.schema import login_failures, orders
from operate.audit import AckedOrder, audit
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


def new_mysql_database(admin_url: str, prefix: str = "market_test") -> str:
    """The URL of a new, empty database of its own on the server of `admin_url`."""
    name = f"{prefix}_{os.getpid()}_{secrets.token_hex(4)}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"))
    return admin.url.set(database=name).render_as_string(hide_password=False)


def fresh_mysql_database(admin_url: str, prefix: str = "market_test") -> Iterator[str]:
    """Create a database of its own for one test; drop it afterwards."""
    url = new_mysql_database(admin_url, prefix)
    try:
        yield url
    finally:
        admin = create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {make_url(url).database}"))
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


_DROP_DATABASES = """import sys
from sqlalchemy import create_engine, text
with create_engine(sys.argv[1], isolation_level="AUTOCOMMIT").connect() as conn:
    for name in sys.argv[2:]:
        conn.execute(text(f"DROP DATABASE IF EXISTS `{name}`"))
"""


class MariaDBPool:
    """Databases at this code's schema for one test process, used again once emptied: a copy
    costs a CREATE TABLE per table (seconds on a busy disk), emptying one a DELETE per table.
    A database whose tables a test changed, or that cannot be emptied at once, is dropped."""

    def __init__(self, admin_url: str, template_url: str) -> None:
        self.admin_url, self.template_url, self.free = admin_url, template_url, list[str]()
        self.engine = create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
        self.shape = self._shape(make_url(template_url).database or "")

    def take(self) -> Iterator[str]:
        """A database at head holding only what the migrations put there; back to the pool after."""
        url = self.free.pop() if self.free else self._new()
        yield url
        if self._emptied(make_url(url).database or ""):
            self.free.append(url)
        else:
            self._drop(url)

    def close(self) -> None:
        """The free databases and the template dropped by a process of its own, which outlives the
        tests: at the suite's end, with every worker dropping, the drops took 10-18 s of its last worker."""
        names = [make_url(url).database or "" for url in [*self.free, self.template_url]]
        subprocess.Popen([sys.executable, "-c", _DROP_DATABASES, self.admin_url, *names],
                         start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
        self.engine.dispose()

    def _new(self) -> str:
        url = new_mysql_database(self.admin_url)
        copy_mysql_database(self.template_url, url)
        return url

    def _drop(self, url: str) -> None:
        with self.engine.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{make_url(url).database}`")

    def _shape(self, name: str) -> list[tuple[Any, ...]]:
        """Every column and index of the database's tables, to tell a changed schema."""
        with self.engine.connect() as conn:
            return [tuple(row) for row in conn.execute(text(
                "SELECT table_name, column_name, column_type, is_nullable, column_default FROM "
                "information_schema.columns WHERE table_schema = :name UNION ALL "
                "SELECT table_name, index_name, column_name, non_unique, seq_in_index FROM "
                "information_schema.statistics WHERE table_schema = :name ORDER BY 1, 2, 3"),
                {"name": name})]

    def _emptied(self, name: str) -> bool:
        """Empty the database back to the template's rows, counters restarted; False if it cannot be."""
        template = make_url(self.template_url).database
        try:
            if self._shape(name) != self.shape:
                return False
            with self.engine.connect() as conn:
                conn.exec_driver_sql("SET SESSION foreign_key_checks = 0, innodb_lock_wait_timeout = 2, "
                                     "lock_wait_timeout = 2")
                counters = conn.execute(text(  # a table whose counter moved (ALTERs are slow)
                    "SELECT table_name, auto_increment > 1 FROM information_schema.tables "
                    "WHERE table_schema = :name AND table_type = 'BASE TABLE'"), {"name": name}).all()
                for table, moved in counters:
                    here, there = f"`{name}`.`{table}`", f"`{template}`.`{table}`"
                    conn.exec_driver_sql(f"DELETE FROM {here}")
                    conn.exec_driver_sql(f"INSERT INTO {here} SELECT * FROM {there}")
                    if moved:
                        conn.exec_driver_sql(f"ALTER TABLE {here} AUTO_INCREMENT = 1")
            return True
        except Exception:  # noqa: BLE001 - a database that cannot be emptied is dropped instead
            return False


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


# -- The shells, in a pseudo-terminal (pexpect) or as scripts ----------------------------------

MARKET = str(Path(sys.executable).with_name("market"))
PROMPT_TIMEOUT = 15




def shell_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment of a shell under test: a dumb terminal, a private home and history."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("MARKET_")}
    return {**env, "TERM": "dumb", "HOME": str(home), "PROMPT_TOOLKIT_NO_CPR": "1",
            "MARKET_HISTORY_FILE": str(home / "history"), "COLUMNS": "200", "LINES": "50", **extra}


def spawn(role: str, port: int, home: Path, **env: str) -> pexpect.spawn:
    """An interactive shell in a pseudo-terminal, at its first prompt."""
    child = pexpect.spawn(MARKET, [role, "--port", str(port)], env=shell_env(home, **env),
                          encoding="utf-8", dimensions=(50, 200), timeout=PROMPT_TIMEOUT)
    child.expect(f"Connected to the {role} server")
    child.expect_exact(f"{role}> ")
    return child


def run(child: pexpect.spawn, line: str, prompt: str) -> str:
    """Type a line, wait for the next prompt and return what was printed in between."""
    child.sendline(line)
    return wait(child, prompt)


def wait(child: pexpect.spawn, prompt: str) -> str:
    """Wait for the next prompt and return what was printed before it."""
    child.expect_exact(prompt)
    return str(child.before)


def keys(child: pexpect.spawn, *chunks: str) -> None:
    """Type keys at a prompt once it reads the keyboard raw, one chunk at a time."""
    child.waitnoecho(timeout=PROMPT_TIMEOUT)
    for chunk in chunks:
        child.send(chunk)
        time.sleep(0.2)


def answer(child: pexpect.spawn, question: str, text: str) -> None:
    """Wait for a question of the shell and type the answer."""
    child.expect_exact(question)
    child.sendline(text)


def script(role: str, port: int, home: Path, *commands: str, stdin: str | None = None,
           **env: str) -> subprocess.CompletedProcess[str]:
    """Run a shell in script mode: `-c COMMANDS` (joined by `;`), or lines on stdin."""
    args = [MARKET, role, "--port", str(port)] + (["-c", "; ".join(commands)] if commands else [])
    return subprocess.run(args, input=stdin or "", capture_output=True, text=True, timeout=60,
                          env=shell_env(home, **env))


def port_of(market: Market, role: str) -> int:
    """The port a server of the module's market listens on."""
    return (market.buyer_server if role == "buyer" else market.seller_server).address[1]


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


def child_pids(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def a_frozen_worker_is_replaced(server: ServerProcess, connect: Callable[[], Connection]) -> None:
    """SIGSTOP one of two workers (MARKET_WORKER_TIMEOUT_S=2): it is killed, logged, and
    replaced; the other is left alone; the service answers; the supervisor stops cleanly."""
    try:
        server.wait_ready()
        workers = child_pids(server.proc.pid)
        assert len(workers) == 2
        os.kill(workers[0], signal.SIGSTOP)
        deadline = time.monotonic() + 15  # a ping every 0.67 s, answered within 2 s
        children = child_pids(server.proc.pid)
        while time.monotonic() < deadline and (len(children) != 2 or workers[0] in children):
            time.sleep(0.1)
            children = child_pids(server.proc.pid)
        assert len(children) == 2 and workers[0] not in children, (workers, children, server.stderr())
        assert workers[1] in children  # alive all along, and left alone
        assert all(connect().call("ping")["server"] == "buyer" for _ in range(10))
        log = server.stderr()
        assert f"worker {workers[0]} did not answer a health check within 2 s; killing it" in log, log
        assert f"worker {workers[0]} was killed by SIGKILL" in log, log
        assert server.stop() == 0
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()


MARIADBD = "/usr/sbin/mariadbd"


class PrivateMariaDB:
    """A mariadbd of our own on a free port, which the test may kill and start again."""

    def __init__(self, root: Path, installed: Path | None = None) -> None:
        """`installed`: the data directory of another one, copied instead of installing anew
        (an install starts a bootstrap server: seconds; a copy: a fraction of one)."""
        self.root, self.port = root, free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        (root / "tmp").mkdir(parents=True, exist_ok=True)
        if installed:
            shutil.copytree(installed, root / "data")
            return
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


# -- A TCP relay whose two directions a test may watch, hold or cut -----------------------------

Link = dict[str, Any]  # one relayed connection's state, shared by both directions' hooks
Hook = Callable[[bytes, Link], tuple[bytes, bool]]  # a chunk -> what to pass on, whether to cut then


def _pass(data: bytes, link: Link) -> tuple[bytes, bool]:
    return data, False


class Relay:
    """Relays each connection made to `address` to `target`; every chunk read from the client
    goes through `requests`, every chunk of the server's through `answers`: each returns the
    bytes to pass on and whether to cut the connection after them. While `refuse()` is true, a
    new connection is closed at once (the target away)."""

    def __init__(self, target: tuple[str, int], requests: Hook = _pass, answers: Hook = _pass,
                 refuse: Callable[[], bool] = lambda: False) -> None:
        self.target, self.requests, self.answers, self.refuse = target, requests, answers, refuse
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address: tuple[str, int] = self.listener.getsockname()[:2]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.refuse():
                _cut(client)
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                _cut(client)
                continue
            server.settimeout(None)
            self.link(client, server)

    def link(self, client: socket.socket, server: socket.socket) -> None:
        """Relays one connection through the hooks (a subclass may read its packets instead)."""
        state: Link = {"sockets": (client, server)}
        for source, sink, hook in ((client, server, self.requests), (server, client, self.answers)):
            threading.Thread(target=self._pump, args=(source, sink, hook, state), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket, hook: Hook, link: Link) -> None:
        with contextlib.suppress(OSError):  # the other direction cut the link meanwhile
            while data := source.recv(65536):
                data, cut = hook(data, link)
                if data:
                    sink.sendall(data)
                if cut:
                    break
        _cut(source, sink)

    def close(self) -> None:
        self.listener.close()


def _cut(*socks: socket.socket) -> None:
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()


# What the driver and SQLAlchemy send to set up a connection (a new one, or one opened again
# while a call runs): not an op's round trips.
_CONNECTION_SETUP = re.compile(
    rb"\x03(SET |set |SELECT VERSION\(\)|SELECT DATABASE\(\)|SELECT @@|SHOW VARIABLES)")


class RoundTrips(list[int]):
    """The commands MariaDB clients send through this object's relays, one entry per round trip:
    the number of statements it carried (a query's `;`-separated statements; the tests' values
    hold no `;`), a new connection's set-up left out; `queries` holds the SQL of each query
    among them, its values in it. `through(url)` is the URL of a relay to `url`'s server that
    counts them."""

    def __init__(self) -> None:
        super().__init__()
        self.relays: list[Relay] = []
        self.queries: list[str] = []

    def through(self, url: str) -> str:
        given = make_url(url)
        relay = Relay((given.host or "127.0.0.1", given.port or 3306), requests=self._count)
        self.relays.append(relay)
        return given.set(host=relay.address[0], port=relay.address[1]).render_as_string(hide_password=False)

    def _count(self, data: bytes, link: Link) -> tuple[bytes, bool]:
        buffer = link.get("buffer", b"") + data
        while len(buffer) >= 4 and len(buffer) >= 4 + int.from_bytes(buffer[:3], "little"):
            size = int.from_bytes(buffer[:3], "little")
            payload = buffer[4:4 + size]
            if buffer[3] == 0 and not _CONNECTION_SETUP.match(payload):  # 0: a command starts
                if payload[:1] == b"\x03":  # COM_QUERY
                    self.queries.append(payload[1:].decode("utf-8", "replace"))
                self.append(payload.count(b";") + 1 if payload[:1] == b"\x03" else 1)
            buffer = buffer[4 + size:]
        link["buffer"] = buffer
        return data, False

    def close(self) -> None:
        for relay in self.relays:
            relay.close()


# -- Shoppers whose acknowledged purchases are checked against the books ----------------------

T = TypeVar("T")
RETRY_FOR_S = 60.0


def until_done(call: Callable[[], T], retry_on: tuple[type[BaseException], ...] = (OSError,)) -> T:
    """Repeat a call while the server is away (bounded); what a patient client does."""
    deadline = time.monotonic() + RETRY_FOR_S
    while True:
        try:
            return call()
        except retry_on:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def sign_up(conn: Connection, role: str) -> Connection:
    name = unique_name(role)
    conn.user_id = conn.call("create_account",  # type: ignore[attr-defined]
                             {"username": name, "password": PASSWORD, "name": name})["user_id"]
    conn.token = conn.call("login", {"username": name, "password": PASSWORD})["token"]
    return conn


def list_items(seller: Connection, count: int, quantity: int) -> list[int]:
    return [int(seller.call("put_item", {"name": f"Item {n}", "category": 1, "keywords": ["x"],
                                         "condition": "new", "price": f"{n + 1}.25",
                                         "quantity": quantity})["item_id"]) for n in range(count)]


def acked_order(buyer_id: int, receipt: dict[str, Any]) -> AckedOrder:
    return AckedOrder(receipt["order_id"], buyer_id,
                      {line["item_id"]: line["quantity"] for line in receipt["lines"]})


def orders_per_buyer(database: Database) -> Counter[int]:
    """Completed orders per buyer (an order undone after a crash or a decline stays, as void)."""
    rows = database.run(lambda tx: tx.execute(
        select(orders.c.buyer_id, func.count()).where(orders.c.status.in_(COMPLETED))
        .group_by(orders.c.buyer_id)).all(), write=False)
    return Counter({int(buyer): int(count) for buyer, count in rows})


@dataclass
class Shopper:
    """A buyer that fills its cart and buys with an idempotency key until acknowledged."""

    conn: Connection
    items: list[int]
    retry_on: tuple[type[BaseException], ...] = (OSError,)
    acked: list[AckedOrder] = field(default_factory=list)
    unexpected: list[BaseException] = field(default_factory=list)

    def buy(self, n: int) -> None:
        """One purchase; a lost answer is asked for again with the same key."""
        def fill_cart() -> None:
            self.conn.call("clear_cart")
            for k, item_id in enumerate(self.items):
                self.conn.call("add_to_cart", {"item_id": item_id, "quantity": 1 + (n + k) % 3})

        until_done(fill_cart, self.retry_on)
        key = f"order-{self.conn.user_id}-{n}"  # type: ignore[attr-defined]
        receipt = until_done(lambda: self.conn.call("make_purchase", {**CARD, "idempotency_key": key}),
                             self.retry_on)
        self.acked.append(acked_order(self.conn.user_id, receipt))  # type: ignore[attr-defined]

    def shop(self, stop: threading.Event, at_least: int) -> None:
        n = 0
        try:
            while not stop.is_set() or n < at_least:
                self.buy(n)
                n += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.unexpected.append(exc)


def run_shoppers(shoppers: list[Shopper], stop: threading.Event, at_least: int) -> list[threading.Thread]:
    threads = [threading.Thread(target=s.shop, args=(stop, at_least), daemon=True) for s in shoppers]
    for thread in threads:
        thread.start()
    return threads


def check_books(database: Database, shoppers: list[Shopper]) -> None:
    """Every acknowledged order is there, whole, once; the audit passes."""
    for shopper in shoppers:
        assert not shopper.unexpected, shopper.unexpected
    acked = [order for shopper in shoppers for order in shopper.acked]
    assert len({order.order_id for order in acked}) == len(acked), "one order acknowledged twice"
    assert audit(database, acked) == []
    per_buyer = orders_per_buyer(database)
    for shopper in shoppers:
        assert per_buyer[shopper.conn.user_id] == len(shopper.acked), "an order was doubled"  # type: ignore[attr-defined]



@dataclass
class Call:
    started: float
    seconds: float
    op: str
    code: str


class Recorder:
    """A shopper that also browses, recording every call's outcome and time."""

    def __init__(self, shopper: Shopper) -> None:
        self.shopper = shopper
        self.calls: list[Call] = []
        self._lock = threading.Lock()
        wrapped, self._call = shopper.conn.call, shopper.conn.call

        def recorded(op: str, args: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
            started = time.monotonic()
            code = "OK"
            try:
                return wrapped(op, args, **kwargs)
            except ProtocolError as exc:
                code = exc.code
                raise
            finally:
                with self._lock:
                    self.calls.append(Call(started, time.monotonic() - started, op, code))

        shopper.conn.call = recorded  # type: ignore[method-assign]

    def browse_and_shop(self, stop: threading.Event) -> None:
        n = 0
        try:
            while not stop.is_set():
                try:
                    self.shopper.conn.call("get_item", {"item_id": self.shopper.items[0]})
                except ProtocolError as exc:
                    if exc.code != "UNAVAILABLE":
                        raise
                self.shopper.buy(n)
                n += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.shopper.unexpected.append(exc)


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
    return server.waiting_to_write


class MariaDBFaults(Relay):
    """A relay in front of MariaDB that reads the queries going by (the MySQL protocol's
    COM_QUERY packets) and, once, at the COMMIT of the first transaction whose queries `match`,
    makes a fault instead of passing the COMMIT on:

        deadlock     the transaction rolled back, and error 1213 answered (as MariaDB, or a
                     Galera node's certification, does to a COMMIT it will not make)
        lost_before  the connection dropped before the query reaches the server
        lost_after   the query run, COMMIT included, and the connection dropped before its answer

    `on_fault` runs at that moment (after the COMMIT ran, for lost_after); `url` is the
    database's URL through the relay; `made` counts the faults made."""

    def __init__(self, db_url: str, matches: Callable[[list[str]], bool], fault: str,
                 on_fault: Callable[[], None] = lambda: None) -> None:
        assert fault in ("deadlock", "lost_before", "lost_after")
        self.matches, self.fault, self.on_fault, self.made = matches, fault, on_fault, 0
        self._lock = threading.Lock()
        target = make_url(db_url)
        super().__init__((target.host or "127.0.0.1", target.port or 3306))
        self.url = target.set(host="127.0.0.1", port=self.address[1]).render_as_string(hide_password=False)

    def link(self, client: socket.socket, server: socket.socket) -> None:
        answer: list[bytes | None] = []  # what replaces the server's next answer (None: drop it)
        threading.Thread(target=self._answers, args=(server, client, answer), daemon=True).start()
        threading.Thread(target=self._queries, args=(client, server, answer), daemon=True).start()

    def _queries(self, client: socket.socket, server: socket.socket, answer: list[bytes | None]) -> None:
        transaction: list[str] = []
        while (packet := _read_packet(client)) is not None:
            sql = packet[5:].decode("utf-8", "replace") if packet[4:5] == b"\x03" else ""
            transaction.append(sql)
            ends = re.search(r"(^|;)\s*(COMMIT|ROLLBACK)\s*$", sql) is not None
            if ends and "COMMIT" in sql.rsplit(";", 1)[-1] and self._fault_now(transaction):
                if self.fault == "lost_before":
                    self.on_fault()
                    break
                if self.fault == "deadlock":
                    error = b"\xff" + (1213).to_bytes(2, "little") + b"#40001Deadlock found when trying " \
                        b"to get lock; try restarting transaction"
                    answer.append(len(error).to_bytes(3, "little") + bytes([packet[3] + 1]) + error)
                    packet = b"\x09\x00\x00\x00\x03ROLLBACK"
                    self.on_fault()
                else:
                    answer.append(None)
            if ends:
                transaction.clear()
            try:
                server.sendall(packet)
            except OSError:
                break
        _cut(client, server)

    def _fault_now(self, transaction: list[str]) -> bool:
        with self._lock:
            if self.made or not self.matches(transaction):
                return False
            self.made += 1
            return True

    def _answers(self, server: socket.socket, client: socket.socket, answer: list[bytes | None]) -> None:
        """The server's packets on to the client; once a fault is set, its last answer to the
        query (an OK without "more results", or an error) replaced or dropped."""
        while (packet := _read_packet(server)) is not None:
            if answer and _ends_answer(packet):
                replacement = answer.pop()
                if replacement is None:
                    self.on_fault()
                    break
                packet = replacement
            try:
                client.sendall(packet)
            except OSError:
                break
        _cut(client, server)


def _read_packet(sock: socket.socket) -> bytes | None:
    """One MySQL packet (its 4-byte header included), or None at the end of the stream."""
    header = _read_exactly(sock, 4)
    if header is None:
        return None
    body = _read_exactly(sock, int.from_bytes(header[:3], "little"))
    return None if body is None else header + body


def _read_exactly(sock: socket.socket, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        try:
            chunk = sock.recv(size - len(data))
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
    return data


def _ends_answer(packet: bytes) -> bool:
    """An error, or an OK packet whose status has no SERVER_MORE_RESULTS_EXISTS (0x0008)."""
    if packet[4] == 0xFF:
        return True
    if packet[4] != 0x00 or len(packet) < 7:
        return False
    at = 5
    for _ in range(2):  # affected rows, last insert id: length-encoded integers
        first = packet[at]
        at += 1 + {0xFC: 2, 0xFD: 3, 0xFE: 8}.get(first, 0)
    return not int.from_bytes(packet[at:at + 2], "little") & 0x0008


