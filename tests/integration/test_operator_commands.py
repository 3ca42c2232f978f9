"""The operator's commands of `market`: `audit` on each database (a clean one balances, a row
written wrong on purpose is named and exits 1) and `--version`, run as the installed program."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest
from sqlalchemy import text
from support import CARD, Market, running_market

import wire
from buyer_server.payments import SimulatedProcessor
from client.main import main
from db import Database
from db.ledger import Ledger

MARKET = str(Path(sys.executable).with_name("market"))
TOTALS = re.compile(r"audit: (?P<verdict>.+); checked (?P<users>\d+) users, (?P<items>\d+) items, "
                    r"(?P<orders>\d+) orders, \d+ order lines, \d+ feedback, (?P<units>\d+) units sold, "
                    r"(?P<payments>\d+) payments, "
                    r"(?P<money>\d+\.\d\d) taken, (?P<captured>\d+\.\d\d) captured")


def market_audit(db_url: str, *options: str, env: dict[str, str] | None = None
                 ) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "MARKET_PAYMENTS_URL"}
    return subprocess.run([MARKET, "audit", "--db-url", db_url, *options], capture_output=True, text=True,
                          timeout=60, env={**environment, **(env or {})})


def buy_two_lamps(market: Market) -> int:
    """A seller lists a lamp, a buyer buys two; the lamp's id."""
    seller, buyer = market.user("seller"), market.user("buyer")
    lamp = market.item(seller, price="12.50", quantity=5)
    buyer.call("add_to_cart", {"item_id": lamp, "quantity": 2})
    buyer.call("make_purchase", CARD)
    return lamp


def test_a_clean_database_balances_and_says_what_it_checked(market: Market) -> None:
    buy_two_lamps(market)
    result = market_audit(market.db.url)
    assert result.returncode == 0, result.stdout + result.stderr
    *violations, last = result.stdout.splitlines()
    assert violations == []
    totals = TOTALS.fullmatch(last)
    assert totals, last
    assert totals["verdict"] == "the books balance"
    assert (totals["users"], totals["items"], totals["orders"], totals["units"], totals["money"]) == (
        "2", "1", "1", "2", "25.00")
    assert (totals["payments"], totals["captured"]) == ("1", "25.00")


def test_a_row_written_wrong_is_printed_and_exits_1(market: Market) -> None:
    lamp = buy_two_lamps(market)
    with market.db.engine.begin() as conn:  # sold counted once more than the order lines say
        conn.execute(text("UPDATE items SET sold = sold + 1, quantity = quantity - 1 WHERE item_id = :id"),
                     {"id": lamp})
    result = market_audit(market.db.url)
    assert result.returncode == 1, result.stdout + result.stderr
    *violations, last = result.stdout.splitlines()
    assert violations == [f"item {lamp}: sold 3 != 2 units in order lines"]
    assert TOTALS.fullmatch(last) and TOTALS.fullmatch(last)["verdict"] == "1 violation", last


def test_the_ledger_is_checked_against_the_orders(market: Market) -> None:
    buy_two_lamps(market)
    with market.db.engine.begin() as conn:  # a second capture of the same payment
        conn.execute(text("UPDATE payments SET captures = captures + 1"))
    result = market_audit(market.db.url)
    assert result.returncode == 1, result.stdout + result.stderr
    *violations, last = result.stdout.splitlines()
    order_id = _only_order(market)
    assert violations == [f"order {order_id} (paid): captured 2 times"]
    assert TOTALS.fullmatch(last) and TOTALS.fullmatch(last)["captured"] == "25.00", last


def _only_order(market: Market) -> int:
    with market.db.engine.connect() as conn:
        return int(conn.execute(text("SELECT order_id FROM orders")).scalar_one())


def test_a_ledger_kept_apart_is_read_from_its_own_database(
        database: Database, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The buyer servers keep the ledger in another database (MARKET_PAYMENTS_URL): the audit
    reads it there, named by --payments-url or by the variable; without it, every paid order
    lacks its capture. (`market audit` run here, not as a program: the tests above run that.)"""
    def audit(*options: str) -> tuple[int, list[str]]:
        status = main(["audit", "--db-url", database.url, *options])
        return status, capsys.readouterr().out.splitlines()

    payments_url = f"sqlite:///{tmp_path / 'payments.db'}"
    with closing(Database(payments_url, pool_size=2)) as ledger_db:
        processor = SimulatedProcessor(Ledger(ledger_db))
        with running_market(database, processor=processor) as market:
            buy_two_lamps(market)
            order_id = _only_order(market)
    monkeypatch.delenv("MARKET_PAYMENTS_URL", raising=False)
    by_flag = audit("--payments-url", payments_url)
    monkeypatch.setenv("MARKET_PAYMENTS_URL", payments_url)
    by_variable = audit()
    monkeypatch.delenv("MARKET_PAYMENTS_URL")
    for status, lines in (by_flag, by_variable):
        assert status == 0, lines
        assert TOTALS.fullmatch(lines[-1])["captured"] == "25.00"  # type: ignore[index]
    status, lines = audit()
    assert status == 1
    assert lines[:-1] == [f"order {order_id} (paid): paid, but its payment is missing"]
    assert audit("--payments-url", f"sqlite:///{tmp_path / 'typo.db'}")[0] == 2


def test_a_missing_database_file_is_an_error_not_an_empty_database(tmp_path: Path) -> None:
    result = market_audit(f"sqlite:///{tmp_path / 'typo.db'}")
    assert result.returncode == 2 and "no such database file" in result.stderr
    assert not (tmp_path / "typo.db").exists()


def test_a_database_without_the_marketplace_tables_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "other.db").touch()
    result = market_audit(f"sqlite:///{tmp_path / 'other.db'}")
    assert result.returncode == 2 and result.stderr.startswith("error: cannot audit"), result.stderr


def test_version_is_the_packages_and_the_protocols() -> None:
    result = subprocess.run([MARKET, "--version"], capture_output=True, text=True, timeout=30)
    assert result.stdout == f"market {wire.__version__} (protocol {wire.PROTOCOL_VERSION})\n"
    from importlib.metadata import version
    assert version("marketplace") == wire.__version__
