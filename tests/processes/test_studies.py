"""simulation/studies: the delay proxy delays round trips and nothing else, and each study's
command runs end to end on a tiny scale, writes its table, CSV and plot, and leaves no
process behind.
"""
from __future__ import annotations

import csv
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import missing, require_tool

from simulation.studies.delay_proxy import DelayProxy


@pytest.fixture
def echo_server() -> Iterator[tuple[str, int]]:
    """A TCP server that sends back whatever it is sent."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=_echo, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()[:2]
    listener.close()


def _echo(conn: socket.socket) -> None:
    with conn:
        while data := conn.recv(65536):
            conn.sendall(data)


def _proxied(target: tuple[str, int], delay_s: float) -> DelayProxy:
    proxy = DelayProxy(target, delay_s)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    return proxy


def _round_trip_s(address: tuple[str, int], payload: bytes) -> tuple[float, bytes]:
    with socket.create_connection(address, timeout=10) as conn:
        start = time.perf_counter()
        conn.sendall(payload)
        got = b""
        while len(got) < len(payload):
            got += conn.recv(65536)
        return time.perf_counter() - start, got


def test_the_delay_proxy_adds_its_delay_to_each_round_trip_and_keeps_the_bytes(echo_server) -> None:  # type: ignore[no-untyped-def]
    proxy = _proxied(echo_server, 0.05)
    try:
        payload = os.urandom(300_000)  # several chunks each way, in order
        elapsed, got = _round_trip_s(proxy.address, payload)
        assert got == payload
        assert 0.05 <= elapsed < 2
        small = [_round_trip_s(proxy.address, b"ping")[0] for _ in range(3)]
        assert min(small) >= 0.05
    finally:
        proxy.listener.close()


def test_without_a_delay_the_proxy_answers_at_once(echo_server) -> None:  # type: ignore[no-untyped-def]
    proxy = _proxied(echo_server, 0.0)
    try:
        assert min(_round_trip_s(proxy.address, b"ping")[0] for _ in range(5)) < 0.05
    finally:
        proxy.listener.close()


def _study(module: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", f"simulation.studies.{module}", *args],
                          capture_output=True, text=True, timeout=timeout)


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_the_threads_study_fills_its_grid(tmp_path: Path) -> None:
    done = _study("threads", "--threads", "1,3", "--users", "1,3", "--calls", "2", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    rows = _rows(tmp_path / "threads.csv")
    grid = sorted((r["threads"], r["clients"]) for r in rows)
    assert grid == [("1", "2"), ("1", "6"), ("3", "2"), ("3", "6")]
    assert (tmp_path / "threads.png").stat().st_size > 1000


@pytest.mark.slow
def test_the_remote_database_study_delays_the_database_and_leaves_nothing_running(tmp_path: Path) -> None:
    for tool, package in (("mariadbd", "mariadb-server"), ("haproxy", "haproxy")):
        require_tool(tool, package)
    if os.geteuid() != 0:
        missing("root", "the study starts a mariadbd as the mysql user")
    # one delay (the proxy's own tests compare delays): each axis measured through it
    done = _study("remote_db", "--delays", "5", "--threads", "2", "--processes", "1", "--users", "1",
                  "--process-threads", "2", "--calls", "2", "--out", str(tmp_path), timeout=400)
    assert done.returncode == 0, done.stderr[-2000:]
    trips = [float(line.split("takes ")[1].split(" ms")[0]) for line in done.stdout.splitlines()
             if "a round trip to the database takes" in line]
    assert len(trips) == 1 and 5 <= trips[0]
    rows = _rows(tmp_path / "remote_db.csv")
    assert {(r["delay_ms"], r["axis"]) for r in rows} == {("5.0", "threads"), ("5.0", "processes")}
    leftovers = subprocess.run(["pgrep", "-f", "simulation.studies.delay_proxy|market-remote-db-"],
                               capture_output=True, text=True)
    assert leftovers.stdout == ""
    assert not list(Path("/tmp").glob("market-remote-db-*"))


def other_checkout(folder: Path) -> Path:
    """A checkout whose own interpreter stands in for its market-sim: it records its arguments
    and writes the results.csv of a run at 500 calls/s."""
    (folder / "simulation").mkdir(parents=True)
    python = folder / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text('#!/bin/sh\n'
                      'echo "$@" >> calls\n'
                      'while [ "$1" != --out ]; do shift; done\n'
                      'mkdir -p "$2"\n'
                      'printf "users,op,ops_per_s,p50_ms,p99_ms,errors\\n1,ALL,500,1,2,0\\n" \\\n'
                      '  > "$2/results.csv"\n')
    python.chmod(0o755)
    return folder


@pytest.mark.slow
def test_two_checkouts_run_a_round_and_their_ratio_is_reported(tmp_path: Path) -> None:
    """One round (the order of later rounds is targets.round_order, tested as a rule)."""
    other = other_checkout(tmp_path / "other")
    done = _study("checkouts", str(other), "--rounds", "1", "--out", str(tmp_path / "out"), "--", "-n", "1",
                  "-k", "3", "-r", "1")
    assert done.returncode == 0, done.stderr[-2000:]
    order = [line.split(",")[1].strip() for line in done.stdout.splitlines() if line.startswith("round ")]
    assert order == ["this", "other"]
    assert re.search(r"^1 \+ 1: the other checkout's calls/s, median of 1 rounds: [\d.]+x this one's "
                     r"\([\d.]+\)$", done.stdout, re.MULTILINE), done.stdout
    calls = (other / "calls").read_text().splitlines()  # its own interpreter, with the arguments given
    assert [call.split(" --out ")[0] for call in calls] == ["-m simulation -n 1 -k 3 -r 1 --no-progress"]
    assert (tmp_path / "out" / "this_round1" / "results.csv").exists()


def test_a_folder_that_is_no_checkout_is_refused(tmp_path: Path) -> None:
    done = _study("checkouts", str(tmp_path), "--out", str(tmp_path / "out"))
    assert done.returncode == 2 and "is not a checkout of the marketplace" in done.stderr
