"""`python -m simulation.storms`: its options, and one small storm run end to end."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import Market, port_of


def test_the_storm_script_explains_itself() -> None:
    done = subprocess.run([sys.executable, "-m", "simulation.storms", "--help"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0
    for option in ("--storm", "--scale", "--descriptors", "--buyer", "-n"):
        assert option in done.stdout


@pytest.mark.slow
def test_a_small_wake_storm_is_survived_and_reported(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "simulation.storms", "-N", "2", "-n", "5", "--scale", "0.05",
                           "--storm", "zero-frames", "--storm", "idle", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("│")]
    assert [row.split("│")[1].strip() for row in rows] == ["zero-frames", "idle"]
    for row in rows:
        cells = [cell.strip() for cell in row.split("│")[1:-1]]
        assert cells[2] == "0" and cells[6] == "0" and cells[7] == "yes" and cells[8].startswith("in ")
    assert (tmp_path / "idle" / "buyer_server.log").exists()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_attack_script_measures_a_normal_client_during_long_searches(market: Market) -> None:
    done = subprocess.run([sys.executable, "-m", "simulation.attacks", "--buyer",
                           f"127.0.0.1:{port_of(market, 'buyer')}", "--seller",
                           f"127.0.0.1:{port_of(market, 'seller')}", "--seed", "40", "--duration", "2"],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^searches: \d+ long searches answered; normal client: \d+ calls, p50 [\d.]+ ms, "
                     r"p99 [\d.]+ ms", done.stdout, re.MULTILINE), done.stdout
