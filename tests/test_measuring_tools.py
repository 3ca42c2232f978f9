"""The catalogue-growth and idle-connection measuring scripts run end to end (tiny sizes)."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from conftest import Market

from simulation import catalogue, idle


def test_catalogue_seeds_and_reports_every_read_op(tmp_path: Path, capsys: Any) -> None:
    url = f"sqlite:///{tmp_path / 'catalogue.db'}"
    assert catalogue.main(["--db-url", url, "--items", "60", "--sellers", "4", "--calls", "3"]) == 0
    out = capsys.readouterr().out
    assert "'items': 60" in out and "(60 items in sqlite:" in out
    for op in ("search_items (1 keyword)", "search_items (2 keywords)", "search_items (3 keywords)",
               "search_items (5 keywords)", "search_items (category only)",
               "get_item", "display_items (first page)"):
        assert f"| {op} | 3 |" in out
    for op in ("search_items (3 keywords, second page)", "search_items (5 keywords, second page)"):
        assert f"| {op} | 0 | - | - |" in out  # 60 items of a 4,000-word vocabulary: one page each


def test_catalogue_times_the_second_page_of_a_search_that_has_one(market: Market) -> None:
    seller, buyer = market.user("seller"), market.user("buyer")
    made = [market.item(seller, keywords=["a"] if n % 2 else ["a", "b"]) for n in range(25)]
    assert catalogue._second_page(buyer, ["x", "y", "z"]) is None
    second = catalogue._second_page(buyer, ["c", "b", "a"])
    assert second is not None
    assert [item["item_id"] for item in second()["items"]] == made[15::2]  # 13 of rank two, 7 of one first


def test_catalogue_without_seeding_reports_the_items_the_database_holds(tmp_path: Path, capsys: Any) -> None:
    url = f"sqlite:///{tmp_path / 'catalogue.db'}"
    assert catalogue.main(["--db-url", url, "--items", "40", "--sellers", "4", "--calls", "1"]) == 0
    capsys.readouterr()
    assert catalogue.main(["--db-url", url, "--calls", "1", "--no-seed"]) == 0
    assert "(40 items in sqlite:" in capsys.readouterr().out


def test_idle_connections_are_really_held(market: Market) -> None:
    addresses = [market.buyer_server.address, market.seller_server.address]
    seen: list[int] = []

    def watch() -> None:
        for _ in range(50):
            seen.append(market.buyer_server.connection_count + market.seller_server.connection_count)
            threading.Event().wait(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    assert idle.hold(addresses, count=30, seconds=1.0) == 30
    watcher.join()
    assert max(seen) >= 30
