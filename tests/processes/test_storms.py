"""Storms a hostile or merely numerous client can raise, against the real server loop.

Each storm runs over loopback sockets against a tiny App (the loop is what is under
test); 127.0.0.2 stands for a second client's address. Every storm is bounded in time.
"""
from __future__ import annotations

import os
import resource
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from support import ServerProcess, read_messages, tiny_app

from observe.observers import MarketObserver
from runtime.server import Server, ServerLimits
from wire.framing import encode_frame
from wire.observer import NO_SERVER_OBSERVER, ServerObserver

PING = encode_frame({"op": "ping"})


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[Server] = []

    def start(observer: ServerObserver = NO_SERVER_OBSERVER, **limits: Any) -> Server:
        server = Server(tiny_app(), limits=ServerLimits(**{"threads": 3, **limits}), observer=observer)
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        stops_within(server, 15)


def stops_within(server: Server, seconds: float) -> bool:
    """Ask the server to stop; whether it had stopped within `seconds`."""
    stopper = threading.Thread(target=server.shutdown, daemon=True)
    stopper.start()
    stopper.join(seconds)
    return not stopper.is_alive()


def counted(server: str) -> MarketObserver:
    """An observer counting into market_* metrics labelled server=`server` (one name a test)."""
    return MarketObserver(server, ("ping", "slow"))


def refusals(server: str, reason: str) -> float:
    return REGISTRY.get_sample_value("market_connections_refused_total",
                                     {"server": server, "reason": reason}) or 0.0


def connect_many(address: tuple[str, int], count: int, source: str = "127.0.0.1") -> list[socket.socket]:
    socks = []
    for _ in range(count):
        sock = socket.socket()
        sock.settimeout(10)
        sock.bind((source, 0))
        sock.connect(address)
        socks.append(sock)
    return socks


def answers_a_ping(server: Server, within: float = 5.0, source: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection(server.address, timeout=within, source_address=(source, 0)) as sock:
            sock.sendall(PING)
            return read_messages(sock, 1)[0].get("ok") is True
    except OSError:
        return False


def occupy_every_thread(server: Server, threads: int) -> list[socket.socket]:
    """Keep every thread of the pool answering a slow request for half a second."""
    socks = connect_many(server.address, threads)
    for sock in socks:
        sock.sendall(encode_frame({"op": "slow"}))
        time.sleep(0.02)
    return socks


def close_all(socks: list[socket.socket]) -> None:
    for sock in socks:
        sock.close()


def test_four_hundred_zero_length_frames_at_once_neither_freeze_nor_block_a_stop(serve: Any) -> None:
    server = serve(max_connections_per_address=1000, new_connections_per_s_per_address=10_000)
    socks = connect_many(server.address, 400)
    occupy_every_thread(server, 3)  # so that the leader finds all 400 frames in one look
    for sock in socks:  # each is answered BAD_FRAME and closed: a wake of the leader each
        sock.sendall(struct.pack(">I", 0))
    assert answers_a_ping(server, within=10)
    close_all(socks)
    assert stops_within(server, ServerLimits().send_timeout_s + 5)


def test_pipelined_pings_on_many_connections_are_all_answered(serve: Any) -> None:
    server = serve(max_connections_per_address=1000, new_connections_per_s_per_address=10_000)
    socks = connect_many(server.address, 400)
    occupy_every_thread(server, 3)
    for sock in socks:
        sock.sendall(PING * 70)
    for sock in socks:
        assert len(read_messages(sock, 70)) == 70
    assert answers_a_ping(server)
    close_all(socks)


def wait_until(condition: Any, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def busy_answers(socks: list[socket.socket]) -> list[str]:
    """The BUSY messages the sockets were sent (a refused socket gets one and is closed)."""
    messages = []
    for sock in socks:
        sock.settimeout(0.05)
        try:
            answer = read_messages(sock, 1)
        except OSError:  # admitted: nothing to read
            continue
        if answer and answer[0]["error"]["code"] == "BUSY":
            messages.append(answer[0]["error"]["message"])
    return messages


def test_one_address_cannot_take_every_connection(serve: Any) -> None:
    server = serve(counted("storm-cap"), max_connections=300, max_connections_per_address=100)
    hogs = connect_many(server.address, 300)
    refused = busy_answers(hogs)
    assert len(refused) == 200 and "your address" in refused[0]
    assert server.connection_count == 100
    assert refusals("storm-cap", "max_connections_per_address") == 200
    assert answers_a_ping(server, source="127.0.0.2")  # another client still gets in
    close_all(hogs)


def test_one_address_cannot_open_connections_faster_than_its_rate(serve: Any) -> None:
    server = serve(counted("storm-rate"), max_connections_per_address=10, new_connections_per_s_per_address=2)
    first = connect_many(server.address, 10)  # the whole burst
    wait_until(lambda: server.connection_count == 10)
    close_all(first)
    wait_until(lambda: server.connection_count == 0)
    burst = connect_many(server.address, 5)
    refused = busy_answers(burst)
    assert len(refused) >= 4 and "new connections" in refused[0]
    assert refusals("storm-rate", "new_connections_per_address") == len(refused)
    assert answers_a_ping(server, source="127.0.0.2")
    time.sleep(1.1)  # two new connections a second come back
    assert answers_a_ping(server)
    close_all(burst)


def request_of(size: int) -> bytes:
    """A request of about `size` bytes (answered BAD_REQUEST: ping takes no padding)."""
    return encode_frame({"op": "ping", "padding": "x" * size})


@pytest.mark.slow
@pytest.mark.parametrize("limit_mib,bound_mib", [(2, 12), (1024, None)])
def test_requests_read_and_not_answered_are_bounded(serve: Any, limit_mib: int,
                                                    bound_mib: int | None) -> None:
    """60 connections each complete a 512 KiB request while every thread is busy: past
    the limit the server stops reading the connections that hold the most. (With no
    practical limit, the second case shows the storm does hold all 30 MiB at once.)"""
    name = f"storm-memory-{limit_mib}"
    server = serve(counted(name), threads=2, max_queued_bytes=limit_mib << 20,
                   max_connections_per_address=1000)
    socks = connect_many(server.address, 60)
    peak = [0]
    watching = threading.Event()

    def watch() -> None:
        while not watching.is_set():
            peak[0] = max(peak[0], server.queued_bytes)
            time.sleep(0.0005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    occupy_every_thread(server, 2)
    frame = request_of(512 << 10)
    senders = [threading.Thread(target=sock.sendall, args=(frame,), daemon=True) for sock in socks]
    for sender in senders:
        sender.start()
    assert answers_a_ping(server, within=20, source="127.0.0.2")
    for sock in socks:
        assert read_messages(sock, 1)[0]["error"]["code"] == "BAD_REQUEST"
    watching.set()
    watcher.join()
    if bound_mib is None:
        assert peak[0] > 20 << 20
        assert refusals(name, "memory") == 0
    else:
        assert peak[0] <= bound_mib << 20
        assert refusals(name, "memory") > 0  # connections left unread a while are counted
    assert server.queued_bytes == 0
    close_all(socks)


_SERVER_UNDER_A_DESCRIPTOR_LIMIT = """
import resource, signal, sys
from observe.logs import configure
from observe.observers import LogObserver
from runtime.server import Server, ServerLimits
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
configure("buyer")
class Pong:
    def handle(self, message, peer=None):
        return {"ok": True, "result": {"pong": True}}
server = Server(Pong(), limits=ServerLimits(threads=2), observer=LogObserver("buyer", ["ping"]))
signal.signal(signal.SIGTERM, lambda *_: server.shutdown(wait=False))
print(server.address[1], flush=True)
server.serve_forever()
"""


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.slow
def test_out_of_descriptors_the_server_waits_instead_of_spinning(tmp_path: Path) -> None:
    log = (tmp_path / "server.log").open("w+")
    proc = subprocess.Popen([sys.executable, "-c", _SERVER_UNDER_A_DESCRIPTOR_LIMIT, "64"],
                            stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        assert proc.stdout is not None
        address = ("127.0.0.1", int(proc.stdout.readline()))
        socks = connect_many(address, 100)  # more than 64 descriptors hold
        time.sleep(0.5)
        before = cpu_seconds(proc.pid)
        time.sleep(2)
        assert cpu_seconds(proc.pid) - before < 0.3  # before: as much of a core as it got
        log.seek(0)
        logged = log.read()
        assert logged.count("cannot accept") == 1  # before: a line per try, megabytes
        assert "connection refused [client= reason=out_of_descriptors events=1]" in logged
        close_all(socks)
        with socket.create_connection(address, timeout=10) as sock:  # accepting again
            sock.sendall(PING)
            assert read_messages(sock, 1)[0]["ok"]
        socks = connect_many(address, 100)  # out of descriptors again: a stop must still work
        time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=ServerLimits().send_timeout_s + 5) == 0
        close_all(socks)
    finally:
        proc.kill()
        proc.wait()


def test_settings_the_descriptor_limit_cannot_hold_are_refused_at_start(tmp_path: Path) -> None:
    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    done = subprocess.run([sys.executable, "-m", "buyer_server", "--port", "0", "--db-url",
                           f"sqlite:///{tmp_path / 'market.db'}"], capture_output=True, text=True,
                          timeout=60, preexec_fn=low_limit,
                          env={**os.environ, "MARKET_MAX_CONNECTIONS": "1000"})
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "file descriptors" in done.stderr and "ulimit -n" in done.stderr
    assert not (tmp_path / "market.db").exists()


def test_the_soft_descriptor_limit_is_raised_as_far_as_the_settings_need() -> None:
    def low_soft_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    script = ("import resource; from runtime.config import server_settings; server_settings('buyer', []);"
              "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          preexec_fn=low_soft_limit, env={**os.environ, "MARKET_MAX_CONNECTIONS": "1000"})
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) >= 1000


def test_the_per_address_limit_is_a_setting_of_the_server_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MARKET_MAX_CONNECTIONS_PER_ADDRESS", "2")
    server = ServerProcess("buyer", f"sqlite:///{tmp_path / 'market.db'}").wait_ready()
    try:
        held = connect_many((server.host, server.port), 3)
        assert busy_answers(held) == ["too many connections from your address; close some and try again"]
        close_all(held)
    finally:
        assert server.stop() == 0
