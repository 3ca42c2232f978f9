"""`market backup` of a database two server processes are writing to, `market restore` of the
copy elsewhere, and `market audit` of what was restored: on SQLite and on MariaDB."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, func, select
from support import CARD, PASSWORD, ServerProcess, fresh_mysql_database, unique_name

from db import Database
from db.schema import orders, users
from wire import Connection
from wire.errors import ProtocolError

MARKET = str(Path(sys.executable).parent / "market")


def market(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([MARKET, *args], capture_output=True, text=True, timeout=300)


@pytest.fixture
def elsewhere(request: pytest.FixtureRequest, db_url: str, tmp_path: Path) -> Iterator[str]:
    """An empty database of the same kind as db_url's, to restore into."""
    if db_url.startswith("sqlite"):
        yield f"sqlite:///{tmp_path / 'restored.db'}"
    else:
        yield from fresh_mysql_database(request.getfixturevalue("mysql_server"), "market_restored")


def shopper(buyer: ServerProcess, seller: ServerProcess, stop: threading.Event, done: list[int],
            signed_up: list[bool]) -> None:
    """Sign up a seller and a buyer (then say so), then list, add to cart and buy until told to stop."""
    with Connection(seller.host, seller.port, timeout=30) as sells, \
            Connection(buyer.host, buyer.port, timeout=30) as buys:
        for conn in (sells, buys):
            name = unique_name()
            conn.call("create_account", {"username": name, "password": PASSWORD, "name": name})
            conn.token = conn.call("login", {"username": name, "password": PASSWORD})["token"]
        signed_up.append(True)
        while not stop.is_set():
            item = sells.call("put_item", {"name": "Lamp", "category": 2, "keywords": ["desk"],
                                           "condition": "new", "price": "3.25", "quantity": 2})["item_id"]
            try:
                buys.call("add_to_cart", {"item_id": item, "quantity": 1})
                buys.call("make_purchase", dict(CARD))
                done.append(item)
            except ProtocolError:  # BUSY under load, say: the next round goes on
                pass


def counts(url: str) -> tuple[int, int]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return (conn.execute(select(func.count()).select_from(users)).scalar_one(),
                    conn.execute(select(func.count()).select_from(orders)).scalar_one())
    finally:
        engine.dispose()


def test_a_backup_taken_under_load_restores_elsewhere_and_its_books_balance(
        database: Database, elsewhere: str, tmp_path: Path) -> None:
    from db.engine import driver_url

    db_url = database.url
    buyer = ServerProcess("buyer", db_url).wait_ready()
    seller = ServerProcess("seller", db_url).wait_ready()
    stop, bought, signed_up = threading.Event(), [], []
    load = [threading.Thread(target=shopper, args=(buyer, seller, stop, bought, signed_up)) for _ in range(4)]
    copy = tmp_path / "market.backup"
    try:
        for thread in load:
            thread.start()
        # every account made before the copy (on a slow machine one shopper may still be signing
        # up when the others have bought 20 times): the copy holds all 8 users
        while (len(bought) < 20 or len(signed_up) < 4) and all(thread.is_alive() for thread in load):
            stop.wait(0.1)
        taken = market("backup", "--db-url", db_url, str(copy))
        during = len(bought)
        while len(bought) < during + 10 and all(thread.is_alive() for thread in load):
            stop.wait(0.1)  # the load went on after the copy: the copy must not see that
    finally:
        stop.set()
        for thread in load:
            thread.join(timeout=60)
        assert buyer.stop() == 0 and seller.stop() == 0
    assert taken.returncode == 0, taken.stderr
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600  # it holds password hashes
    restored = market("restore", "--db-url", elsewhere, str(copy))
    assert restored.returncode == 0, restored.stderr
    audited = market("audit", "--db-url", elsewhere)
    assert audited.returncode == 0, audited.stdout + audited.stderr
    assert "the books balance" in audited.stdout
    assert market("db", "current", "--db-url", elsewhere).returncode == 0  # at head, as the original
    users_then, orders_then = counts(driver_url(elsewhere).render_as_string(hide_password=False))
    users_now, orders_now = counts(driver_url(db_url).render_as_string(hide_password=False))
    assert users_then == users_now == 8
    assert 20 <= orders_then < orders_now


def test_a_restore_never_writes_over_a_database_or_a_file(database: Database, tmp_path: Path) -> None:
    db_url = database.url
    copy = tmp_path / "copy"
    assert market("backup", "--db-url", db_url, str(copy)).returncode == 0
    again = market("backup", "--db-url", db_url, str(copy))
    assert again.returncode == 2 and "exists" in again.stderr
    over = market("restore", "--db-url", db_url, str(copy))
    assert over.returncode == 2 and "error:" in over.stderr
    wrong_kind = f"sqlite:///{tmp_path / 'x.db'}" if not db_url.startswith("sqlite") else \
        "mysql://root@127.0.0.1:3306/market_never_made"
    mismatched = market("restore", "--db-url", wrong_kind, str(copy))
    assert mismatched.returncode == 2 and "restores only to a database of that kind" in mismatched.stderr
    assert not os.path.exists(tmp_path / "x.db")
