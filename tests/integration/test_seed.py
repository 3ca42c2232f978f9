"""Bulk seeding: the rows arrive whole, consistent and searchable."""
from __future__ import annotations

import subprocess
import sys

import pytest
from sqlalchemy import func, select
from support import Market

from db.schema import item_keywords, item_words, items, users
from operate.audit import audit
from operate.seed import SEED_PASSWORD, seed


def test_seeded_items_are_consistent_and_searchable(market: Market) -> None:
    result = seed(market.db, sellers=7, items_count=1234)
    counts = market.db.run(lambda tx: (tx.execute(select(func.count()).select_from(items)).scalar(),
                                       tx.execute(select(func.count()).select_from(users)).scalar(),
                                       tx.execute(select(func.count()).select_from(item_keywords)).scalar()))
    assert counts[0] == 1234 and counts[1] == 7 and counts[2] > 1234
    assert audit(market.db) == []
    buyer = market.user("buyer")
    word = next(k for i in range(1, 100) for k in buyer.call("get_item", {"item_id": i})["keywords"])
    found = buyer.call("search_items", {"keywords": [word], "limit": 500})["items"]
    assert found and all(word in item["keywords"] for item in found)
    seller = market.connect("seller")
    seller.token = seller.call("login", {"username": f"seed{result['first_seller_id']}",
                                         "password": SEED_PASSWORD})["token"]
    assert seller.call("display_items")["items"]
    market.item(seller)  # ids keep counting after the seeded ones


def test_seeded_items_are_found_by_the_words_of_their_names(market: Market) -> None:
    seed(market.db, sellers=3, items_count=600)
    seed(market.db, sellers=2, items_count=500)  # a second seed adds to the first, its ids after
    words = market.db.run(lambda tx: tx.execute(select(func.count()).select_from(item_words)).scalar())
    assert words >= 1100 and audit(market.db) == []  # the audit: every index row, and only those
    buyer = market.user("buyer")
    for item_id in (1, 600, 601, 1100):
        item = buyer.call("get_item", {"item_id": item_id})
        found = buyer.call("search_items", {"query": item["name"].upper(), "limit": 1})["items"]
        assert found[0]["item_id"] == item_id  # its every word: the best match is the item itself
        for keyword in item["keywords"]:
            by_keyword = buyer.call("search_items", {"keywords": [keyword], "limit": 500})["items"]
            assert item_id in [found["item_id"] for found in by_keyword]


def test_the_seed_command(tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/seeded.db"
    done = subprocess.run([sys.executable, "-m", "client.main", "seed", "--db-url", url,
                           "--sellers", "3", "--items", "50"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "seeded 3 sellers" in done.stdout and "50 items" in done.stdout


@pytest.mark.parametrize("flag", ["--sellers", "--items"])
def test_the_seed_command_wants_at_least_one_seller_and_item(flag: str, tmp_path: object) -> None:
    # before: --sellers 0 gave every item a seller id no account had (the next sign-up got them)
    url = f"sqlite:///{tmp_path}/seeded.db"
    done = subprocess.run([sys.executable, "-m", "client.main", "seed", "--db-url", url, flag, "0"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == f"market seed: error: argument {flag}: 0: must be at least 1"
