"""simulation.guessing, the measuring tool of password guessing and hashing floods, run
briefly against a server it starts: it prints the figures it names."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_guessing_tool_prints_its_figures() -> None:
    # the account's bucket the server it starts is given: 5 wrong passwords, then one per 1.25 s
    bucket = {"MARKET_LOGIN_ACCOUNT_FREE_FAILURES": "5", "MARKET_LOGIN_ACCOUNT_STEP_S": "1.25"}
    done = subprocess.run([sys.executable, "-m", "simulation.guessing", "--seconds", "2", "--rate", "40",
                           "--addresses", "40", "--logins", "5", "--connections", "2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, **bucket})
    assert done.returncode == 0, done.stderr
    guesses = re.search(r"guessing: (\d+) wrong logins .* in ([\d.]+) s .*: (\d+) passwords checked",
                        done.stdout)
    assert guesses, done.stdout
    sent, seconds, checked = int(guesses[1]), float(guesses[2]), int(guesses[3])
    assert checked <= 5 + seconds / 1.25 + 1 and sent >= 80, done.stdout
    assert re.search(r"owner with the device token: (\d+) of \1 logins in", done.stdout), done.stdout
    assert "fair-hashing: 2 addresses x 2 connections" in done.stdout
    assert "the third address: 5 of 5 logins in" in done.stdout, done.stdout
