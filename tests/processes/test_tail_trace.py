"""Tracing, switched on by MARKET_TRACE_DIR, gives simulation.tail what it needs: a real server
process and a real client, on the code as it is, joined per call."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from simulation import tail

ROOT = Path(__file__).resolve().parents[2]

CLIENT = """
import sys
from observe.trace import trace_clients
from wire import Connection
trace_clients()
with Connection("127.0.0.1", int(sys.argv[1]), timeout=10) as conn:
    for _ in range(5):
        conn.call("ping")
    conn.call("create_account", {"username": "tracer", "password": "a long password", "name": "T"})
    conn.call("login", {"username": "tracer", "password": "a long password"})
"""


def test_a_traced_server_and_client_give_every_call_its_segments(tmp_path: Path) -> None:
    trace_dir = tmp_path / "trace"
    # production hashes: the login's Argon2 verify is what makes it the slowest call
    env = {**os.environ, "MARKET_TRACE_DIR": str(trace_dir), "PYTHONUNBUFFERED": "1",
           "MARKET_TEST_FAST_HASHES": "0"}
    server = subprocess.Popen(
        [sys.executable, "-m", "buyer_server", "--port", "0", "--db-url", f"sqlite:///{tmp_path / 't.db'}"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert server.stdout is not None
        port = server.stdout.readline().strip().rsplit(":", 1)[1]
        subprocess.run([sys.executable, "-c", CLIENT, port], cwd=ROOT, env=env, check=True, timeout=60)
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=20) == 0
    assert len(list(trace_dir.glob("*.tsv"))) == 2  # the client's and the server's

    clients, servers = tail.read_trace(trace_dir)
    calls = tail.join(clients, servers)
    assert [call.op for call in calls] == ["ping"] * 5 + ["create_account", "login"]
    for call in calls:
        assert all(segment >= 0 for segment in call.segments)
        assert sum(call.segments) == pytest.approx(call.latency_ms, abs=1e-6)
    login = calls[-1]
    assert login.segments[tail.SEGMENTS.index("service")] > 1.0  # an Argon2 verify is in it
    lines = tail.report(calls, servers)
    assert lines[0] == "7 calls"
    assert any(line.startswith("p99 and up: 1 calls") and "in 100% of them" in line for line in lines)


def test_without_the_setting_nothing_is_traced(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "MARKET_TRACE_DIR"}
    script = ("import os; from observe.trace import trace_file, trace_clients; from wire import Connection; "
              "trace_clients(); print(trace_file(), Connection.observer.request_id(7))")
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert out.split() == ["None", "7"]
    assert not list(tmp_path.iterdir())


def test_join_leaves_out_the_set_up_and_calls_the_server_never_saw() -> None:
    clients = {"a": ["ping", "0", "1", "5", "6"], "b": ["login", "10", "11", "40", "41"],
               "c": ["ping", "50", "51", "60", "61"]}
    servers = {"a": ["ping", "2", "3", "4"], "b": ["login", "20", "21", "39"]}
    calls = tail.join([clients], servers, skip=1)
    assert [call.op for call in calls] == ["login"]
    assert calls[0].segments == pytest.approx(tuple(ms / 1e6 for ms in (1, 9, 1, 18, 1, 1)))
    hashing = tail.Hashing(servers)
    assert hashing.overlap_ms(calls[0].start, calls[0].done) == pytest.approx(18 / 1e6)
    assert hashing.two_or_more_ns(0, 100) == 0


def test_join_leaves_out_each_client_processes_own_set_up() -> None:
    """Two simulators without a common barrier: the second's set-up (s1, s2) comes after the
    first's first measured call (m1). Skipping two calls per process keeps m1 and m2."""
    first = {"s0": ["login", "0", "1", "4", "5"], "s3": ["login", "1", "2", "5", "6"],
             "m1": ["ping", "20", "21", "24", "25"]}
    second = {"s1": ["login", "30", "31", "34", "35"], "s2": ["login", "31", "32", "35", "36"],
              "m2": ["ping", "50", "51", "54", "55"]}
    servers = {rid: [record[0], "0", str(int(record[2]) + 1), str(int(record[2]) + 2)]
               for rid, record in {**first, **second}.items()}
    calls = tail.join([first, second], servers, skip=2)
    assert [(call.op, call.start) for call in calls] == [("ping", 20), ("ping", 50)]


def test_hashing_counts_the_time_two_hashes_overlap() -> None:
    servers = {"a": ["login", "0", "10", "30"], "b": ["create_account", "0", "20", "50"],
               "c": ["ping", "0", "25", "26"], "d": ["login", "0", "60", "70"]}
    hashing = tail.Hashing(servers)
    assert hashing.two_or_more_ns(0, 100) == 10  # 20-30
    assert hashing.two_or_more_ns(25, 65) == 5
    assert hashing.overlap_ms(25, 65) == pytest.approx((5 + 25 + 5) / 1e6)
