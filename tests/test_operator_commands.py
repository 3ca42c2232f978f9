"""The operator's commands of `market`: `audit` on each database (a clean one balances, a row
written wrong on purpose is named and exits 1) and `--version`, run as the installed program."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from conftest import CARD, Market
from sqlalchemy import text

import wire

MARKET = str(Path(sys.executable).with_name("market"))
TOTALS = re.compile(r"audit: (?P<verdict>.+); checked (?P<users>\d+) users, (?P<items>\d+) items, "
                    r"(?P<orders>\d+) orders, \d+ order lines, \d+ feedback, (?P<units>\d+) units sold, "
                    r"(?P<money>\d+\.\d\d) taken")


def market_audit(db_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([MARKET, "audit", "--db-url", db_url], capture_output=True, text=True,
                          timeout=60)


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
