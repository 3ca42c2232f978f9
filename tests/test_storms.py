"""Storms a hostile or merely numerous client can raise, against the real server loop.

Each storm runs over loopback sockets against a tiny App (the loop is what is under
test); 127.0.0.2 stands for a second client's address. Every storm is bounded in time.
"""
from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from test_server_loop import read_messages, tiny_app

from wire.framing import encode_frame
from wire.server import Server, ServerLimits

PING = encode_frame({"op": "ping"})


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[Server] = []

    def start(**limits: Any) -> Server:
        server = Server(tiny_app(), limits=ServerLimits(**{"threads": 3, **limits}))
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
