"""Fixtures: real databases (a fresh SQLite file, a fresh MariaDB database) and real
servers on port 0, in-process, with connections to them; the helpers they build on are in
support.py.

MariaDB tests skip with a reason when no server answers, unless CI=true, where an
unreachable MariaDB fails the run. Set MARKET_TEST_MYSQL_URL to use another server.
"""
from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine
from support import (
    MYSQL_ADMIN_URL,
    MariaDBPool,
    Market,
    RoundTrips,
    copy_sqlite_database,
    fresh_mysql_database,
    missing,
    new_mysql_database,
    running_market,
)

from db import Database
from db.migrations import make_current

# Password hashes at a fraction of production's cost (db.passwords): half the suite's CPU was
# Argon2. Servers started by the tests inherit it; a test of hashing itself sets it to 0.
os.environ.setdefault("MARKET_TEST_FAST_HASHES", "1")

# A suite started in the background by a shell without job control (`cmd &` in a script)
# inherits Ctrl-C ignored, and so would every shell and server it starts: the Ctrl-C tests
# would then see nothing happen. Ctrl-C as a terminal would give it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

def _mysql_reachable() -> str | None:
    url = create_engine(MYSQL_ADMIN_URL).url
    try:
        with socket.create_connection((url.host or "127.0.0.1", url.port or 3306), timeout=2):
            return None
    except OSError as exc:
        return f"no MariaDB/MySQL server answers at {url.host}:{url.port or 3306} ({exc})"


@pytest.fixture(scope="session")
def mysql_server() -> str:
    """The admin URL of a reachable MariaDB; skip (or fail under CI=true) otherwise."""
    problem = _mysql_reachable()
    if problem:
        missing("MariaDB", problem)
    return MYSQL_ADMIN_URL


@pytest.fixture(params=["sqlite", "mariadb"])
def db_url(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[str]:
    """A fresh, empty database of each kind (for the `database` fixture, MariaDB's at head)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'market.db'}"
    elif "database" in request.fixturenames:
        yield from request.getfixturevalue("mysql_pool").take()
    else:
        yield from fresh_mysql_database(request.getfixturevalue("mysql_server"))


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> str:
    """An SQLite file the migrations made current, once per test process, to copy."""
    url = f"sqlite:///{tmp_path_factory.mktemp('template') / 'market.db'}"
    make_current(url)
    return url


@pytest.fixture(scope="session")
def mysql_template(mysql_server: str) -> str:
    """A MariaDB database the migrations made current, once per test process, to copy (the pool
    drops it at the end)."""
    url = new_mysql_database(mysql_server, "market_template")
    make_current(url)
    return url


@pytest.fixture(scope="session")
def mysql_pool(mysql_server: str, mysql_template: str) -> Iterator[MariaDBPool]:
    """MariaDB databases at head, emptied after each test for the next one."""
    pool = MariaDBPool(mysql_server, mysql_template)
    yield pool
    pool.close()


@pytest.fixture
def database(request: pytest.FixtureRequest, db_url: str) -> Iterator[Database]:
    """The data layer over a fresh database, schema created: a copy of a template the migrations
    made current (make_current then finds it so); on MariaDB one emptied back to it."""
    if db_url.startswith("sqlite"):
        copy_sqlite_database(request.getfixturevalue("sqlite_template").removeprefix("sqlite:///"),
                             db_url.removeprefix("sqlite:///"))
    elif "round_trips" in request.fixturenames:
        db_url = request.getfixturevalue("round_trips").through(db_url)
    db = Database(db_url, pool_size=8)
    make_current(db)
    yield db
    db.close()


@pytest.fixture
def market(database: Database) -> Iterator[Market]:
    """Buyer and seller servers on a fresh database (each kind)."""
    with running_market(database) as m:
        yield m


@pytest.fixture
def round_trips() -> Iterator[RoundTrips]:
    """Every command sent to MariaDB from now on (one round trip each), as the number of
    statements it carried, counted by a relay in front of the server: the `database` fixture
    goes through it when a test asks for this one too."""
    counted = RoundTrips()
    yield counted
    counted.close()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The long tests first (the slow-marked, then those of real processes and deployments),
    the short ones last: the workers then finish together instead of one running a long test
    alone at the end."""
    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("slow"):
            return 0
        return 1 if "/processes/" in item.nodeid or "/deploy/" in item.nodeid else 2

    items.sort(key=rank)
