"""The shared server loop over real sockets: framing errors, pipelining, limits, stop.

These use a tiny App of public ops so that the loop is tested on its own; the real
buyer and seller apps are exercised over the same loop by the op tests.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support import BIG, NoSessions, read_messages, tiny_app, wait_for_connections, waiting_to_write

from runtime.server import Server, ServerLimits
from runtime.signals import StopRequested, StopSignals
from wire import Connection, OpSpec, values
from wire.app import App
from wire.framing import FrameDecoder, encode_frame
from wire.observer import ServerObserver


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[Server] = []

    def start(decoder: Any = FrameDecoder, **limits: Any) -> Server:
        server = Server(tiny_app(), limits=ServerLimits(**{"threads": 4, **limits}), decoder=decoder)
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()


def raw(server: Server) -> socket.socket:
    sock = socket.create_connection(server.address, timeout=5)
    return sock


def closed_by_server(sock: socket.socket, within: float = 5.0) -> bool:
    sock.settimeout(within)
    try:
        while True:
            if sock.recv(65536) == b"":
                return True
    except (TimeoutError, ConnectionResetError):
        return False


def test_pipelined_requests_are_answered_in_order(serve: Any) -> None:
    sock = raw(serve())
    ops = ["slow", "ping", "ping", "slow", "ping"] * 4
    sock.sendall(b"".join(encode_frame({"id": i, "op": op}) for i, op in enumerate(ops)))
    responses = read_messages(sock, len(ops))
    assert [r["id"] for r in responses] == list(range(len(ops)))
    assert all(r["ok"] for r in responses)


def test_ids_are_echoed_and_an_id_of_another_type_is_a_bad_request(serve: Any) -> None:
    sock = raw(serve())
    for rid in (7, "abc", None):
        sock.sendall(encode_frame({"id": rid, "op": "ping"}))
        assert read_messages(sock, 1)[0] == {"id": rid, "ok": True, "result": {"pong": True}}
    for bad in (True, 1.5, [1], {"a": 1}):
        sock.sendall(encode_frame({"id": bad, "op": "ping"}))
        response = read_messages(sock, 1)[0]
        assert response["id"] is None and response["error"]["code"] == "BAD_REQUEST"
        assert response["error"]["message"].startswith("id:")


@pytest.mark.parametrize("message,code,field", [
    ({"op": "nope"}, "UNKNOWN_OP", None),
    ({"op": "put_item"}, "UNKNOWN_OP", None),
    ({}, "BAD_REQUEST", "op"),
    ({"op": 5}, "BAD_REQUEST", "op"),
    ({"op": "ping", "args": [1]}, "BAD_REQUEST", "args"),
    ({"op": "ping", "args": {"x": 1}}, "BAD_REQUEST", "x"),
    ({"op": "ping", "token": 5}, "BAD_REQUEST", "token"),
    ({"op": "ping", "arg": {}}, "BAD_REQUEST", "arg"),
    ({"op": "private"}, "UNAUTHENTICATED", None),
    ({"op": "private", "args": {"bad": 1}}, "UNAUTHENTICATED", None),
    # the contract's order holds for the envelope's fields too: UNKNOWN_OP, UNAUTHENTICATED first
    ({"op": "nope", "args": []}, "UNKNOWN_OP", None),
    ({"op": "nope", "id": True, "arg": {}}, "UNKNOWN_OP", None),
    ({"op": "private", "args": []}, "UNAUTHENTICATED", None),
    ({"op": "private", "token": 5}, "UNAUTHENTICATED", None),
    ({"op": "private", "token": ""}, "UNAUTHENTICATED", None),
])
def test_request_errors_keep_the_connection_open(serve: Any, message: dict, code: str,
                                                 field: str | None) -> None:
    sock = raw(serve())
    sock.sendall(encode_frame({"id": 1, **message}) + encode_frame({"id": 2, "op": "ping"}))
    error, after = read_messages(sock, 2)
    assert error["ok"] is False and error["error"]["code"] == code
    assert error["error"]["retryable"] is False
    if field:
        assert error["error"]["message"].startswith(f"{field}:")
    assert after == {"id": 2, "ok": True, "result": {"pong": True}}


@pytest.mark.parametrize("frame,code", [
    (struct.pack(">I", 0), "BAD_FRAME"),
    (struct.pack(">I", 3) + b"{x}", "BAD_FRAME"),
    (struct.pack(">I", 2) + b"[]", "BAD_FRAME"),
    (struct.pack(">I", 4) + b"\xff\xfe{}", "BAD_FRAME"),
    (struct.pack(">I", 14) + b'{"a":1, "a":2}', "BAD_FRAME"),
    (struct.pack(">I", 10) + b'{"a":NaN }', "BAD_FRAME"),
    (struct.pack(">I", 2000), "FRAME_TOO_LARGE"),
])
def test_frame_errors_answer_once_then_close(serve: Any, frame: bytes, code: str) -> None:
    sock = raw(serve(max_frame=1000))
    sock.sendall(encode_frame({"id": 1, "op": "ping"}) + frame + encode_frame({"id": 2, "op": "ping"}))
    first, error = read_messages(sock, 2)
    assert first["id"] == 1 and first["ok"]
    assert error == {"id": None, "ok": False,
                     "error": {"code": code, "message": error["error"]["message"], "retryable": False}}
    assert closed_by_server(sock)


class FragileDecoder(FrameDecoder):
    """The real decoder, failing as a bug would on a message that mentions "crash"."""

    def decode(self, body: bytes) -> dict[str, Any]:
        if b"crash" in body:
            raise RecursionError("maximum recursion depth exceeded")
        return super().decode(body)


def test_a_frame_the_decoder_fails_on_costs_its_connection_not_the_server(serve: Any, caplog: Any) -> None:
    """A bug while decoding one client's bytes (an exception that is no ProtocolError: the
    RecursionError Python 3.12 once gave) used to stop the whole server."""
    caplog.set_level(logging.ERROR)
    server = serve(decoder=FragileDecoder)
    bystander = raw(server)
    sock = raw(server)
    sock.sendall(encode_frame({"id": 1, "op": "crash"}))
    assert read_messages(sock, 1)[0]["error"]["code"] == "BAD_FRAME"
    assert closed_by_server(sock)
    assert "RecursionError" in caplog.text
    for conn in (bystander, raw(server)):  # an open connection and a new one are served
        conn.sendall(encode_frame({"id": 2, "op": "ping"}))
        assert read_messages(conn, 1)[0]["ok"]


def test_internal_errors_leak_nothing_and_are_logged(serve: Any, caplog: Any) -> None:
    caplog.set_level(logging.ERROR)
    sock = raw(serve())
    sock.sendall(encode_frame({"id": 9, "op": "boom"}))
    response = read_messages(sock, 1)[0]
    assert response["error"]["code"] == "INTERNAL"
    assert "hunter2" not in json.dumps(response) and "RuntimeError" not in json.dumps(response)
    assert "hunter2" in caplog.text and "Traceback" in caplog.text
    sock.sendall(encode_frame({"id": 10, "op": "ping"}))
    assert read_messages(sock, 1)[0]["ok"]


def test_an_answer_that_cannot_be_json_is_internal_and_the_connection_lives(serve: Any) -> None:
    sock = raw(serve())
    sock.sendall(encode_frame({"id": 1, "op": "unencodable"}) + encode_frame({"id": 2, "op": "ping"}))
    first, second = read_messages(sock, 2)
    assert (first["id"], first["error"]["code"]) == (1, "INTERNAL")
    assert (second["id"], second["ok"]) == (2, True)


def test_an_id_beyond_64_bits_comes_back_exactly(serve: Any) -> None:
    sock = raw(serve())
    sock.sendall(encode_frame({"id": 10**30, "op": "ping"}))
    assert read_messages(sock, 1)[0]["id"] == 10**30


def test_over_the_connection_limit_a_client_gets_busy_and_is_closed(serve: Any) -> None:
    server = serve(max_connections=3)
    held = [Connection(*server.address) for _ in range(3)]
    for conn in held:
        conn.call("ping")
    extra = raw(server)
    busy = read_messages(extra, 1)
    assert busy[0]["error"]["code"] == "BUSY" and busy[0]["error"]["retryable"] is True
    assert closed_by_server(extra)
    held.pop().close()
    deadline = time.monotonic() + 5
    while server.connection_count >= 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert Connection(*server.address).call("ping") == {"pong": True}


def test_an_idle_connection_is_closed_after_the_idle_limit(serve: Any) -> None:
    sock = raw(serve(idle_timeout_s=0.5))
    sock.sendall(encode_frame({"op": "ping"}))
    assert read_messages(sock, 1)[0]["ok"]
    assert closed_by_server(sock, within=5)


def test_after_an_idle_close_a_call_unsafe_to_repeat_goes_out_on_a_new_connection(serve: Any) -> None:
    """The client notices the hang-up before sending, so even a call it may not repeat
    ("slow" is no read-only op and has no idempotency key) is not lost to a dead socket."""
    server = serve(idle_timeout_s=0.3)
    conn = Connection(*server.address, timeout=5)
    assert conn.call("slow") == {"slept": True}
    later = raw(server)  # idle for less time than conn: once it is closed, so is conn
    later.sendall(encode_frame({"op": "ping"}))
    assert read_messages(later, 1)[0]["ok"]
    assert closed_by_server(later, within=10)
    # Both may expire in one sweep, later first: wait for the server to have closed conn too.
    deadline = time.monotonic() + 10
    while server.connection_count and time.monotonic() < deadline:
        time.sleep(0.01)
    assert conn.call("slow") == {"slept": True}
    assert conn.reconnects == 1
    conn.close()


def test_a_frame_not_finished_in_time_gets_the_connection_closed(serve: Any) -> None:
    sock = raw(serve(frame_deadline_s=0.5))
    sock.sendall(encode_frame({"op": "ping"})[:7])
    assert closed_by_server(sock, within=5)


def test_the_frame_deadline_is_each_frames_own(serve: Any) -> None:
    # every read ends inside a frame, but each frame arrives well within the deadline; before,
    # the deadline ran from the first partial frame and closed the connection after 0.5 s
    server = serve(frame_deadline_s=0.5)
    sock, other = raw(server), Connection(*server.address)
    frames = b"".join(encode_frame({"id": n, "op": "ping"}) for n in range(13))
    cut = [len(encode_frame({"id": n, "op": "ping"})) for n in range(13)]
    ends = [sum(cut[: n + 1]) + 1 for n in range(12)]  # one byte into the next frame
    sent = 0
    for end in ends:
        sock.sendall(frames[sent:end])
        sent = end
        for _ in range(3):  # another client's calls, so that the server looks at its clocks meanwhile
            other.call("ping")
            time.sleep(0.05)
    sock.sendall(frames[sent:])
    assert [r["id"] for r in read_messages(sock, 13)] == list(range(13))
    other.close()


def test_time_the_server_spent_not_reading_is_not_charged_to_a_started_frame(serve: Any) -> None:
    # 65 requests queued: the server stops reading this connection while it answers them
    # (0.6 s), with the start of one more frame already read; the rest comes 0.1 s later
    server = serve(frame_deadline_s=0.3, threads=1)
    sock, other = raw(server), Connection(*server.address)
    ping = encode_frame({"id": 99, "op": "ping"})
    sock.sendall(encode_frame({"id": 0, "op": "slow"}) + b"".join(
        encode_frame({"id": n, "op": "ping"}) for n in range(1, 65)) + ping[:3])
    assert [r["id"] for r in read_messages(sock, 65)] == list(range(65))
    for _ in range(2):  # another client's calls, so that the server looks at its clocks meanwhile
        other.call("ping")
        time.sleep(0.05)
    sock.sendall(ping[3:])
    assert read_messages(sock, 1) == [{"id": 99, "ok": True, "result": {"pong": True}}]
    other.close()


def unread_big_answers(server: Server, count: int) -> socket.socket:
    """A connection that asks for `count` big answers and reads none of them (yet)."""
    sock = raw(server)
    sock.sendall(b"".join(encode_frame({"id": n, "op": "big"}) for n in range(count)))
    return sock


def test_clients_that_do_not_read_their_answers_hold_no_thread(serve: Any) -> None:
    # before: each one's answer blocked a thread in sendall for up to send_timeout_s, and
    # with every thread blocked nobody was read or answered
    server = serve(threads=2, send_timeout_s=1.5)
    stuck = [unread_big_answers(server, 60) for _ in range(4)]
    time.sleep(0.5)
    assert waiting_to_write(server) == 4
    other = Connection(*server.address, timeout=1.0)
    for _ in range(20):
        assert other.call("ping") == {"pong": True}
    wait_for_connections(server, 1)
    assert server.connection_count == 1  # nothing read for 1.5 s: closed; `other` is left
    assert other.call("ping") == {"pong": True}
    other.close()
    for sock in stuck:
        sock.close()


def test_a_client_that_reads_late_gets_every_answer_in_order(serve: Any) -> None:
    server = serve(threads=1)
    late = unread_big_answers(server, 60)
    time.sleep(0.5)
    assert waiting_to_write(server) == 1
    Connection(*server.address, timeout=1.0).call("ping")  # served meanwhile by the one thread
    answers = read_messages(late, 60)
    assert [a["id"] for a in answers] == list(range(60))
    assert all(a["result"]["text"] == BIG for a in answers)


def test_many_connections_do_not_add_threads(serve: Any) -> None:
    server = serve(threads=4)
    Connection(*server.address).call("ping")
    before = threading.active_count()
    conns = [Connection(*server.address) for _ in range(200)]
    for conn in conns:
        conn.call("ping")
    assert server.connection_count >= 200
    assert threading.active_count() <= before + 4
    for conn in conns:
        conn.close()


def test_while_a_thread_answers_a_slow_request_another_keeps_reading(serve: Any) -> None:
    # the thread that read the slow request answers it, and passes the watch on first
    server = serve(threads=2)
    slow, quick = raw(server), raw(server)
    slow.sendall(encode_frame({"id": 1, "op": "slow"}))
    time.sleep(0.1)
    quick.sendall(encode_frame({"id": 2, "op": "ping"}))
    assert read_messages(quick, 1) == [{"id": 2, "ok": True, "result": {"pong": True}}]
    slow.setblocking(False)
    with pytest.raises(BlockingIOError):
        slow.recv(1)  # the slow answer is still on its way
    slow.setblocking(True)
    assert read_messages(slow, 1) == [{"id": 1, "ok": True, "result": {"slept": True}}]


def test_connections_are_answered_in_the_order_their_requests_arrived() -> None:
    # a busy pool answers the requests found earlier first: a leader that answered the newest
    # it found, while older ones waited in the queue, let some wait behind dozens of later ones
    handled: list[int] = []

    def work(n: int) -> dict[str, Any]:
        handled.append(n)
        time.sleep(0.01)
        return {}

    app = App({"work": OpSpec("work", required={"n": values.integer(0, 99)}, public=True)},
              {"work": work}, NoSessions())
    server = Server(app, limits=ServerLimits(threads=2))
    server.start()
    try:
        socks = [raw(server) for _ in range(40)]
        sending, sent = [], []  # around each send: a sender put off the CPU skews neither way
        for n, sock in enumerate(socks):
            sending.append(time.monotonic())
            sock.sendall(encode_frame({"id": n, "op": "work", "args": {"n": n}}))
            sent.append(time.monotonic())
            time.sleep(0.003)
        for sock in socks:
            assert read_messages(sock, 1)[0]["ok"] is True
    finally:
        server.shutdown()
    # overtaken: answered before a request sent at least 20 ms before it (several select rounds)
    overtaken = [(n, later) for i, n in enumerate(handled) for later in handled[:i]
                 if sending[later] - sent[n] >= 0.02]
    assert sorted(handled) == list(range(40))
    assert overtaken == []


def test_one_thread_serves_every_connection_in_turn(serve: Any) -> None:
    server = serve(threads=1)
    socks = [raw(server) for _ in range(5)]
    for n, sock in enumerate(socks):
        sock.sendall(b"".join(encode_frame({"id": n * 10 + i, "op": "ping"}) for i in range(3)))
    for n, sock in enumerate(socks):
        assert [r["id"] for r in read_messages(sock, 3)] == [n * 10, n * 10 + 1, n * 10 + 2]


class LeaderBreaks(ServerObserver):
    """An observer failing where the leader calls it: a bug in the loop itself."""

    def connection_opened(self, address: str) -> None:
        raise RuntimeError("the loop broke")


def test_a_failure_of_the_loop_itself_stops_the_server_and_is_raised() -> None:
    server = Server(tiny_app(), limits=ServerLimits(threads=2), observer=LeaderBreaks())
    address = server.address
    failures: list[BaseException] = []

    def serve() -> None:
        try:
            server.serve_forever()
        except RuntimeError as exc:
            failures.append(exc)

    thread = threading.Thread(target=serve)
    thread.start()
    client = socket.create_connection(address, timeout=1)  # admitted by the leader, which breaks
    thread.join(10)
    client.close()
    assert not thread.is_alive(), "serve_forever did not return"
    assert [str(f) for f in failures] == ["the loop broke"]
    with pytest.raises(OSError):
        socket.create_connection(address, timeout=1)


@pytest.mark.parametrize("threads", [1, 4])
def test_shutdown_finishes_requests_in_flight(serve: Any, threads: int) -> None:
    server = serve(threads=threads)
    sock = raw(server)
    sock.sendall(encode_frame({"id": 1, "op": "slow"}))
    time.sleep(0.1)
    stopper = threading.Thread(target=server.shutdown)
    stopper.start()
    assert read_messages(sock, 1) == [{"id": 1, "ok": True, "result": {"slept": True}}]
    stopper.join(5)
    assert not stopper.is_alive()
    with pytest.raises(OSError):
        socket.create_connection(server.address, timeout=1)


def test_a_client_that_vanishes_mid_request_does_not_hurt_the_server(serve: Any) -> None:
    server = serve()
    for _ in range(20):
        sock = raw(server)
        sock.sendall(encode_frame({"op": "slow"}))
        sock.close()
    assert Connection(*server.address).call("ping") == {"pong": True}


def test_a_signal_the_kernel_gives_a_worker_thread_still_stops_the_server() -> None:
    """Python runs signal handlers on the main thread only; the kernel may hand a process's
    SIGTERM to any of its threads, here a worker's, while the main thread waits."""
    server = Server(tiny_app(), limits=ServerLimits(threads=2))
    returned, forced = threading.Event(), threading.Event()

    def signal_a_worker(_server: Server) -> None:
        def send() -> None:
            time.sleep(0.3)
            worker = next(t for t in threading.enumerate() if t.name.startswith("market-worker"))
            signal.pthread_kill(worker.ident, signal.SIGTERM)  # type: ignore[arg-type]
            if not returned.wait(3):  # the signal was not handled: unblock the test
                forced.set()
                server.shutdown(wait=False)
        threading.Thread(target=send, daemon=True).start()

    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        StopSignals().serve(server, ready=signal_a_worker)
        returned.set()
    finally:
        signal.signal(signal.SIGTERM, handlers[0])
        signal.signal(signal.SIGINT, handlers[1])
    assert not forced.is_set(), "the server went on serving after SIGTERM"


def test_a_signal_while_start_up_holds_it_stops_the_start_once_the_block_ends() -> None:
    """Before serving, SIGTERM raises StopRequested wherever start-up is, except in a `held`
    block (closing connections: a library catching the exception would log a failed close
    and go on), after which it is raised."""
    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    finished = []
    try:
        stops = StopSignals()
        with pytest.raises(StopRequested, match=f"^{int(signal.SIGINT)}$"):
            with stops.held():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)  # the handler has run by now (on this thread)
                finished.append("the block")
        with pytest.raises(StopRequested):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
            finished.append("outside a held block")
    finally:
        signal.signal(signal.SIGTERM, handlers[0])
        signal.signal(signal.SIGINT, handlers[1])
    assert finished == ["the block"]


def test_answers_owed_at_a_stop_reach_a_client_that_reads_them() -> None:
    """A stop closed every connection at once: the answers in a slow reader's outbox were
    thrown away, and the close, with the client's later requests unread, was a reset that
    lost those on their way too (a pipelining client got 76 answers of thousands)."""
    server = Server(tiny_app(), limits=ServerLimits(threads=2))
    server.start()
    client = socket.create_connection(server.address, timeout=10)
    big = [encode_frame({"op": "big", "id": n}) for n in range(100)]  # 50 MB of answers
    pings = [encode_frame({"op": "ping", "id": n}) for n in range(100, 10_100)]  # more than one read
    client.sendall(b"".join(big + pings))
    decoder = FrameDecoder(2**24)
    decoder.feed(client.recv(4096))  # it is answering
    server.shutdown(wait=False)
    received = []
    try:
        while chunk := client.recv(1 << 20):
            decoder.feed(chunk)
            while (message := decoder.next_message()) is not None:
                received.append(message["id"])
    finally:
        client.close()
    assert not decoder.in_frame  # the stream ended on a whole answer, with no reset
    assert len(received) >= 100 and received == list(range(len(received)))  # every big one, in order


def test_a_stop_leaves_queued_requests_unanswered_once_its_time_is_up() -> None:
    """Each request queued at the stop was still answered, one after another, however long
    that took: 40 pipelined calls of 0.5 s held the stop for 20 s."""
    server = Server(tiny_app(), limits=ServerLimits(threads=2, send_timeout_s=1.0))
    thread = server.start()
    client = socket.create_connection(server.address, timeout=30)
    client.sendall(b"".join(encode_frame({"op": "slow", "id": n}) for n in range(40)))
    decoder = FrameDecoder(2**20)
    decoder.feed(client.recv(4096))  # it has begun answering
    asked = time.monotonic()
    server.shutdown(wait=False)
    thread.join(30)
    took = time.monotonic() - asked
    answered = 0
    while chunk := client.recv(65536):
        decoder.feed(chunk)
        while decoder.next_message() is not None:
            answered += 1
    client.close()
    assert not thread.is_alive() and took < 5, took  # the 1 s for answers owed, and the call in hand
    assert 1 <= answered < 40


class Recording:
    """An App whose `work` op takes 0.2 s; it notes each request's start and end with its
    client's address, and the most `work` requests one address had under way at once."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str | None]] = []
        self.most: dict[str | None, int] = {}
        self._running: dict[str | None, int] = {}
        self._lock = threading.Lock()

    def handle(self, message: dict[str, Any], peer: str | None = None) -> dict[str, Any]:
        op = str(message.get("op"))
        with self._lock:
            self.events.append(("start", op, peer))
            self._running[peer] = self._running.get(peer, 0) + 1
            self.most[peer] = max(self.most.get(peer, 0), self._running[peer])
        if op == "work":
            time.sleep(0.2)
        with self._lock:
            self.events.append(("end", op, peer))
            self._running[peer] -= 1
        return {"id": message.get("id"), "ok": True, "result": {}}

    def started(self, op: str) -> int:
        return sum(1 for event in list(self.events) if event[:2] == ("start", op))

    def work_done_before(self, op: str) -> int:
        """`work` requests finished before the first `op` started."""
        first = self.events.index(("start", op, next(e[2] for e in self.events if e[:2] == ("start", op))))
        return sum(1 for event in self.events[:first] if event[:2] == ("end", "work"))


def _pipeline_work(address: tuple[str, int], source: str, connections: int, each: int) -> list[socket.socket]:
    socks = [socket.create_connection(address, timeout=30, source_address=(source, 0))
             for _ in range(connections)]
    for sock in socks:
        sock.sendall(b"".join(encode_frame({"op": "work", "id": n}) for n in range(each)))
    return socks


def _wait_until(done: Any, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not done() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_pipelines_of_one_address_leave_a_thread_to_another_clients_request() -> None:
    # before: each of the three threads answered one connection's whole pipeline (8 requests)
    # before reading anything else: another client waited for at least 8 to finish
    app = Recording()
    server = Server(app, limits=ServerLimits(threads=3))
    server.start()
    try:
        with socket.create_connection(server.address, timeout=30, source_address=("127.0.0.3", 0)) as normal:
            attack = _pipeline_work(server.address, "127.0.0.2", connections=3, each=8)
            _wait_until(lambda: app.started("work") >= 2)
            normal.sendall(encode_frame({"op": "ping", "id": 1}))
            assert read_messages(normal, 1)[0]["ok"] is True
            assert app.work_done_before("ping") <= 3
            assert app.most["127.0.0.2"] == 2  # threads - 1 while another address is connected
            for sock in attack:
                assert len(read_messages(sock, 8)) == 8  # and every pipeline is answered, in full
                sock.close()
    finally:
        server.shutdown()


def test_a_health_check_is_answered_before_client_work_queued_ahead_of_it() -> None:
    # before: the supervisor's ping waited for a full round of pipelines (8 requests each)
    app = Recording()
    server = Server(app, limits=ServerLimits(threads=3))
    server.start()
    ours, theirs = socket.socketpair()
    try:
        server.adopt(theirs)
        attack = _pipeline_work(server.address, "127.0.0.2", connections=3, each=8)
        _wait_until(lambda: app.started("work") >= 3)
        ours.settimeout(30)
        ours.sendall(encode_frame({"op": "ping", "id": 1}))
        assert read_messages(ours, 1)[0]["ok"] is True
        assert app.work_done_before("ping") <= 4
        for sock in attack:
            sock.close()
    finally:
        ours.close()
        server.shutdown()


def test_when_the_table_is_full_the_longest_idle_connection_gives_way_to_a_new_client() -> None:
    # before: a table full of idle connections answered every new client BUSY until the idle
    # timeout (300 s by default; a ping renews it)
    server = Server(tiny_app(), limits=ServerLimits(max_connections=6, max_connections_per_address=3))
    server.start()
    try:
        idle = [socket.create_connection(server.address, timeout=30, source_address=(source, 0))
                for source in ("127.0.0.2", "127.0.0.3") for _ in range(3)]
        _wait_until(lambda: server.connection_count == 6)
        time.sleep(1.2)  # idle past EVICTABLE_AFTER_S (1 s)
        idle[-1].sendall(encode_frame({"op": "ping", "id": 1}))  # the last one is active again
        assert read_messages(idle[-1], 1)[0]["ok"] is True
        with socket.create_connection(server.address, timeout=30, source_address=("127.0.0.4", 0)) as new:
            new.sendall(encode_frame({"op": "ping", "id": 1}))
            assert read_messages(new, 1)[0]["ok"] is True
        assert idle[0].recv(1) == b""  # the one idle longest was closed
        idle[-1].sendall(encode_frame({"op": "ping", "id": 2}))
        assert read_messages(idle[-1], 1)[0]["ok"] is True
        for sock in idle:
            sock.close()
    finally:
        server.shutdown()
