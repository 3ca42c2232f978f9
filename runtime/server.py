"""The server loop both servers share: a fixed set of request threads taking turns (runtime.scheduler),
the lead's reading every socket (runtime.reader). No thread waits for a client to read: what its
socket will not take waits in its outbox for the leader. Exceptions become errors in `answer` only.
"""
from __future__ import annotations

import logging
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from wire.app import App
from wire.envelope import error_response, request_id
from wire.errors import InternalError, ProtocolError
from wire.framing import DEFAULT_MAX_FRAME, FrameDecoder, encode_frame
from wire.observer import NO_SERVER_OBSERVER, SUPERVISOR, ServerObserver, now_ns

from .admission import REFUSALS, evictable, listen, refuse_busy
from .connection import Connection, Outbox, TlsChannel
from .reader import Reader
from .scheduler import LEAD, Scheduler

log = logging.getLogger("market.server")
_SIGNAL_CHECK_S = 0.2  # how often serve_forever's thread looks for a signal to handle
_BATCH = 8  # requests of one connection answered in a turn while nobody else waits


@dataclass(frozen=True)
class ServerLimits:
    """Connection limits of one server process."""

    max_connections: int = 1000
    max_frame: int = DEFAULT_MAX_FRAME
    idle_timeout_s: float = 300.0
    frame_deadline_s: float = 10.0
    send_timeout_s: float = 10.0  # how long an answer may wait for its client to read more of it
    threads: int = 3  # on two cores, with the database nearby: the lowest tail (docs/benchmarks.md)
    # the simulator's 100 clients to one server from one address, twice over (docs/reliability.md)
    max_connections_per_address: int = 200
    new_connections_per_s_per_address: float = 100.0  # bursts of max_connections_per_address
    max_queued_bytes_per_connection: int = 4 * DEFAULT_MAX_FRAME  # requests read, not yet answered
    max_queued_bytes: int = 64 * DEFAULT_MAX_FRAME  # ... on all connections of the process


def answer(app: App, message: dict[str, Any] | ProtocolError,
           peer: str | None = None) -> tuple[dict[str, Any], bytes]:
    """The response to one decoded message (or to a framing error), and its frame; never raising.
    `peer` is the client's address, for the App's limits per address."""
    if isinstance(message, ProtocolError):
        response = error_response(None, message)
    else:
        try:
            response = app.handle(message, peer)
            return response, encode_frame(response)
        except ProtocolError as exc:
            response = error_response(request_id(message), exc)
        except Exception:
            log.exception("internal error serving op %r", message.get("op"))
            response = error_response(request_id(message), InternalError())
    return response, encode_frame(response)


class Server(Reader):
    """A threaded TCP server for one App, each connection's frames read by `decoder(max_frame)`;
    see the module docstring."""

    def __init__(self, app: App, host: str = "127.0.0.1", port: int = 0,
                 limits: ServerLimits = ServerLimits(), listener: socket.socket | None = None,
                 tls: ssl.SSLContext | None = None, observer: ServerObserver = NO_SERVER_OBSERVER,
                 decoder: Callable[[int], FrameDecoder] = FrameDecoder) -> None:
        super().__init__(listener if listener is not None else listen(host, port), limits, observer)
        self.app, self.tls, self.decoder = app, tls, decoder
        self._scheduler = Scheduler(limits.threads, self._admission.addresses)
        self._threads: list[threading.Thread] = []
        self._lead_ended = threading.Event()
        self._failure: BaseException | None = None
        self._stopped = threading.Event()
        self._stop_asked = 0.0
        self._stop_deadline: float | None = None  # answers still owed at stop are sent until then

    @property
    def address(self) -> tuple[str, int]:
        """The (host, port) actually bound."""
        host, port = self._listener.getsockname()[:2]
        return host, port

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    @property
    def waiting_to_write(self) -> int:
        """Connections whose answer waits for their client to read."""
        return sum(1 for conn in list(self._connections) if conn.writing)

    @property
    def queued_bytes(self) -> int:
        """Bytes of requests read and not yet answered, complete frames or not (flow control)."""
        return self._queued.total

    @property
    def stopping(self) -> bool:
        """Whether a stop was asked (the server drains: /readyz says so)."""
        return self._stopping.is_set()

    def serve_forever(self) -> None:
        """Serve until shutdown() is called; then finish in-flight work."""
        self._selector.register(self._listener, selectors.EVENT_READ, "accept")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._scheduler.put(lead=True)
        self._threads = [threading.Thread(target=self._work, name=f"market-worker-{n}", daemon=True)
                         for n in range(self.limits.threads)]
        for thread in self._threads:
            thread.start()
        try:
            # Woken now and then: Python runs signal handlers on the main thread only, and a
            # signal the kernel hands to another thread would otherwise wait for this one.
            while not self._lead_ended.wait(_SIGNAL_CHECK_S):
                pass
        finally:
            self._finish()
        if self._failure is not None:
            raise self._failure

    def start(self) -> threading.Thread:
        """serve_forever in a daemon thread (for tests and embedding)."""
        thread = threading.Thread(target=self.serve_forever, name="market-io", daemon=True)
        thread.start()
        return thread

    def shutdown(self, wait: bool = True) -> None:
        """Stop accepting, answer what is queued, close everything."""
        if not self._stopping.is_set():
            self._stop_asked = time.monotonic()
        self._stopping.set()
        self._wake()
        if wait:
            self._stopped.wait()

    def adopt(self, sock: socket.socket) -> None:
        """Serve a socket connected elsewhere, in plaintext and over no limit (the supervisor's
        health checks, over a socket pair made before the worker was forked)."""
        self._call_soon(lambda: self._admit(sock, SUPERVISOR, checked=True))

    # -- the turns ----------------------------------------------------------------

    def _work(self) -> None:
        finished, again = None, False
        while (turn := self._scheduler.take(finished, again)) is not None:
            finished, again = None, False
            try:
                if turn is LEAD:
                    self._lead()
                else:
                    finished = turn
                    again = self._turn(turn)
            except Exception:  # a bug costs one turn, never a thread of the pool
                log.exception("a request thread's turn failed")

    def _lead(self) -> None:
        """Watch the sockets until a turn waits; the connections found, then the lead, go to the ring."""
        try:
            while not self._stopped_serving():
                runnable = self._scheduler.runnable()
                for key, events in self._selector.select(timeout=0 if runnable else 0.5):
                    self._dispatch_event(key.data, events)
                self._housekeep()
                if self._ready or runnable:
                    ready, self._ready = self._ready, []
                    self._scheduler.put(*ready, lead=True)
                    return
        except BaseException as exc:  # serve_forever raises it once everything is closed
            self._failure = exc
            self._stopping.set()
        self._lead_ended.set()

    def _turn(self, conn: Connection) -> bool:
        """Answer a connection's next request, or a few while nobody else waits; whether it goes
        to the back of its address's queue (more wait)."""
        self.observer.threads_busy(1)
        try:
            for _ in range(_BATCH):
                if not self._answer_next(conn):
                    return False
                if conn.pending and self._scheduler.waiting():
                    return True
            return True
        finally:
            self.observer.threads_busy(-1)

    def _answer_next(self, conn: Connection) -> bool:
        """Answer the connection's next request; False when its queue is done with for now:
        answered, or an answer waits for its client to read (the leader sends the rest, then
        hands the queue on)."""
        deadline = self._stop_deadline  # once it passes, queued requests are left unanswered
        with conn.lock:
            done = not conn.pending or conn.closed or deadline is not None and time.monotonic() >= deadline
            if done:
                conn.busy = False
            else:
                frame, read = conn.pending.popleft()
                size = len(frame) if isinstance(frame, bytes) else 0
                conn.queued_bytes -= size
        if done:
            self._queue_answered(conn)
            return False
        answering = now_ns()  # before decoding: a request waits undecoded, its decoding is service
        message = conn.decode(frame)
        self._release(size)
        self.observer.answering(conn.address, message)
        response, answer_frame = answer(self.app, message, conn.address)
        answered = now_ns()  # before the send: a client may read the answer before it returns
        try:
            if not conn.channel.send_nowait(conn.sock, answer_frame):
                conn.blocked_since = time.monotonic()
            failed = False
        except OSError:
            failed = True
        self.observer.answer_sent(conn.address, message, response, (read, answering, answered))
        if failed or isinstance(message, ProtocolError):
            self._forget_pending(conn)
            conn.closing = True
        if conn.blocked_since is not None:
            self._call_soon(lambda: self._wait_writable(conn))
            return False
        return True

    # -- admission (the leader) ---------------------------------------------------

    def _admit(self, sock: socket.socket, address: str, checked: bool = False) -> None:
        refusal = "" if checked else self._refusal(address)
        if refusal:
            self.observer.connection_refused(address, refusal)
            refuse_busy(sock, REFUSALS[refusal], plaintext=self.tls is None)
            return
        self._accept_pause_logged = False  # a descriptor shortage is logged again once it recurs
        sock.setblocking(True)
        if not checked:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.observer.connection_opened(address)
        channel = TlsChannel(self.tls) if self.tls is not None and not checked else Outbox()
        conn = Connection(sock, self.decoder(self.limits.max_frame), address, channel)
        self._connections.add(conn)
        self._admission.opened(address)
        self._watch_events(conn)

    def _refusal(self, address: str) -> str:
        """Why a new connection is turned away ("" if it is not); a full table first makes
        room by closing the connection idle longest, if one has been idle a while."""
        refusal = self._admission.refusal(address, len(self._connections))
        if refusal == "max_connections" and (idle := evictable(self._connections)) is not None:
            self.observer.connection_refused(idle.address, "idle_evicted")
            self._close(idle)
            refusal = self._admission.refusal(address, len(self._connections))
        return refusal

    # -- stopping ------------------------------------------------------------------

    def _stopped_serving(self) -> bool:
        """False while serving; once stopping, False while answers are still owed to clients
        that read them, for at most send_timeout_s: a write's answer is not thrown away."""
        if not self._stopping.is_set():
            return False
        if self._stop_deadline is None:  # accept and read no more; what was read is answered
            self._stop_deadline = time.monotonic() + self.limits.send_timeout_s
            self._close_listener()
            for conn in list(self._connections):
                self._stop_reading(conn)
        owed = self._ready or any(conn.busy for conn in self._connections)
        return not owed or time.monotonic() >= self._stop_deadline

    def _finish(self) -> None:
        if self._stop_deadline is None:  # stopped by a failure, not shutdown()
            self._close_listener()
        self._scheduler.close()
        for thread in self._threads:
            thread.join()
        self._run_calls()
        connections = list(self._connections)
        owed = sum(conn.busy for conn in connections)
        for conn in connections:
            conn.busy = False
            conn.discard_unread()
            self._close(conn)
        took = time.monotonic() - (self._stop_asked or time.monotonic())
        log.info("stopped %.1f s after the stop was asked, closing %d connections (%d still owed "
                 "answers)", took, len(connections), owed)
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()
        self._stopped.set()
