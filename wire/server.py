"""The server loop both servers share: a bounded pool of threads, leaders and followers.

One thread of the pool at a time leads: it accepts, reads and decodes frames
(framing.FrameDecoder) for every connection through a selector. Complete requests
queue on their connection, and one thread at a time answers them in order, so
pipelining keeps its order and the thread count stays fixed however many clients
connect. A leader that finds connections with requests queues all but the first behind
the work already waiting, queues the lead behind them, and answers the first itself: each
round of the selector is answered in full before the next round's, so no request waits
behind later ones, and the first goes on with no hand-off to another thread. Waking the
leader never blocks, so nothing keeps the lead from its turn. Exceptions become error
responses in `answer`, the one
place where that translation happens. An observer (wire.observer) hears of connections
and answers: metrics, logs and tracing hang there.

With `aside_threads`, an op that waits on another system (the App's `aside_ops`: the buyer's
purchase, on the payment processor) is answered on threads of its own; its connection stays
busy meanwhile, so its later requests wait and keep their order, and the request threads go
on answering everyone else.

No thread ever waits for a client to read: an answer the socket will not take at once
stays in the connection's outbox, the thread goes back to the pool, and the leader
sends the rest when the socket is writable, then hands the connection's queue to a
thread again. A client that reads nothing of its answer for `send_timeout_s` is closed.

No client can freeze or exhaust the process: waking the leader never blocks and the lead
goes before any queued answering; requests wait undecoded, counted at their frame's size,
and a connection (or the whole process) holding too many stops being read until answers
drain; one address may hold only so many connections and open only so many a second; out
of file descriptors, the leader stops accepting for a moment instead of spinning.
"""
from __future__ import annotations

import collections
import errno
import itertools
import logging
import queue
import selectors
import signal
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from .envelope import error_response, request_id
from .errors import BadFrameError, BusyError, InternalError, ProtocolError
from .framing import DEFAULT_MAX_FRAME, FrameDecoder, encode_frame
from .observer import NO_SERVER_OBSERVER, SUPERVISOR, ServerObserver, now_ns
from .tls import TlsChannel

log = logging.getLogger("market.server")
_READ_SIZE = 65536
_SIGNAL_CHECK_S = 0.2  # how often serve_forever's thread looks for a signal to handle
_PAUSE_AFTER = 64  # queued requests on one connection before we stop reading it
_HOLDS_A_LOT = 65536  # bytes a connection holds that, past the process's limit, stop its reading
_ACCEPT_PAUSE_S = 0.5  # out of file descriptors: how long the listener is left alone
_OUT_OF_DESCRIPTORS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
# why a connection is turned away (the observer's reason): what the client is told, with BUSY
_REFUSALS = {
    "max_connections": "too many connections; try again later",
    "max_connections_per_address": "too many connections from your address; close some and try again",
    "new_connections_per_address": "too many new connections from your address; try again in a moment",
}


class App(Protocol):
    """What the loop serves: a message in, a response message out."""

    def handle(self, message: dict[str, Any], peer: str | None = None) -> dict[str, Any]: ...


@dataclass(frozen=True)
class ServerLimits:
    """Connection limits of one server process."""

    max_connections: int = 1000
    max_frame: int = DEFAULT_MAX_FRAME
    idle_timeout_s: float = 300.0
    frame_deadline_s: float = 10.0
    send_timeout_s: float = 10.0  # how long an answer may wait for its client to read more of it
    threads: int = 3  # on two cores, with the database nearby: the lowest tail (docs/benchmarks.md)
    aside_threads: int = 0  # threads of their own for the App's aside ops; 0: the request threads
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
        return _framed(error_response(None, message))
    try:
        response = app.handle(message, peer)
        return response, encode_frame(response)
    except ProtocolError as exc:
        return _framed(error_response(request_id(message), exc))
    except Exception:
        log.exception("internal error serving op %r", message.get("op"))
        return _framed(error_response(request_id(message), InternalError()))


def _framed(response: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    return response, encode_frame(response)


class _WorkerPool:
    """A fixed set of threads running submitted calls in submission order.

    What ThreadPoolExecutor does minus its per-call Future (a Condition and two locks,
    about a tenth of the GIL time of a loaded server); nothing here waits for a result.
    """

    def __init__(self, threads: int, name: str = "market-worker") -> None:
        self._calls: queue.SimpleQueue[tuple[Callable[[Any], None], Any] | None] = queue.SimpleQueue()
        self._shut = False
        self._shutting = threading.Lock()  # a call is queued before the threads' stops, or refused
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{n}", daemon=True)
                         for n in range(threads)]
        for thread in self._threads:
            thread.start()

    def submit(self, call: Callable[[Any], None], arg: Any) -> None:
        """Run call(arg) on a worker thread."""
        self._calls.put((call, arg))

    def submit_unless_shut(self, call: Callable[[Any], None], arg: Any) -> bool:
        """Run call(arg) on a worker thread; False if the pool is shutting down (not run)."""
        with self._shutting:
            if not self._shut:
                self._calls.put((call, arg))
            return not self._shut

    def shutdown(self) -> None:
        """Finish the calls already submitted, then stop every thread."""
        with self._shutting:
            self._shut = True
        for _ in self._threads:
            self._calls.put(None)
        for thread in self._threads:
            thread.join()

    def _work(self) -> None:
        while (item := self._calls.get()) is not None:
            call, arg = item
            try:
                call(arg)
            except Exception:
                log.exception("a worker's call failed")


class _Connection:
    """One client's socket, decoder and queue of requests awaiting an answer."""

    def __init__(self, sock: socket.socket, max_frame: int, address: str) -> None:
        self.sock = sock
        self.address = address     # the client's IP address: its limits, the App's and the logs'
        self.decoder = FrameDecoder(max_frame)
        # each request's frame (undecoded) with the now_ns() it was read at
        self.pending: collections.deque[tuple[bytes | ProtocolError, int]] = collections.deque()
        self.queued_bytes = 0      # the frames in `pending`
        self.partial_bytes = 0     # of a frame not yet complete, as counted in the process's total
        self.finishing = False     # read while memory is short, to finish the frame it holds
        self.lock = threading.Lock()
        self.busy = False          # a thread is answering `pending`
        self.closing = False       # close once that thread is done
        self.closed = False
        self.reading = True
        self.last_activity = time.monotonic()
        self.frame_started: float | None = None
        self.tls: TlsChannel | None = None
        self.channel: TlsChannel | _Outbox = _Outbox()
        self.blocked_since: float | None = None  # an answer is waiting for the socket
        self.writing = False       # ... and the leader watches the socket for it
        self.events = 0            # what the selector watches the socket for


class _Outbox:
    """What a plaintext connection's socket would not take yet (the TLS channel's twin)."""

    def __init__(self) -> None:
        self._pending = bytearray()  # touched by one thread at a time: the answering one, or the leader

    def send_nowait(self, sock: socket.socket, data: bytes) -> bool:
        """Send what the socket takes now; False if some is left to send (the socket is full)."""
        if not self._pending:
            try:
                sent = sock.send(data, socket.MSG_DONTWAIT)
            except BlockingIOError:
                sent = 0
            if sent == len(data):
                return True
            data = data[sent:]
        self._pending += data
        return False

    def flush_nowait(self, sock: socket.socket) -> bool:
        """Send what is left without waiting; True once nothing is."""
        while self._pending:
            try:
                sent = sock.send(self._pending, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return False
            del self._pending[:sent]
        return True


class Server:
    """A threaded TCP server for one App; see the module docstring."""

    def __init__(self, app: App, host: str = "127.0.0.1", port: int = 0,
                 limits: ServerLimits = ServerLimits(), reuse_port: bool = False,
                 tls: ssl.SSLContext | None = None, observer: ServerObserver = NO_SERVER_OBSERVER) -> None:
        self.app = app
        self.observer = observer
        self.limits = limits
        self.tls = tls
        self._listener = _listen(host, port, reuse_port)
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)  # a full pair already wakes the leader: never wait on it
        self._woken = False
        self._queued = _QueuedBytes(limits.max_queued_bytes)
        self._memory_paused: set[_Connection] = set()  # not read until the process holds less
        self._per_address: collections.Counter[str] = collections.Counter()
        self._arrivals: dict[str, _Bucket] = {}
        self._accept_paused_until: float | None = None
        self._accept_pause_logged = False
        self._calls: collections.deque[Callable[[], None]] = collections.deque()
        self._connections: set[_Connection] = set()
        self._ready: list[_Connection] = []  # connections the leader found requests for
        self._next_sweep = 0.0
        self._pool = _WorkerPool(limits.threads)
        # ops that wait on another system (the buyer's purchase: the payment processor) may run
        # on threads of their own, so that they never hold every request thread
        self._aside_ops: frozenset[str] = frozenset(getattr(app, "aside_ops", ()))
        self._aside = (_WorkerPool(limits.aside_threads, "market-aside")
                       if self._aside_ops and limits.aside_threads else None)
        self._stopping = threading.Event()
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
        """Open client connections."""
        return len(self._connections)

    def serve_forever(self) -> None:
        """Serve until shutdown() is called; then finish in-flight work."""
        self._selector.register(self._listener, selectors.EVENT_READ, "accept")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._next_sweep = time.monotonic() + 0.5
        self._pool.submit(self._lead, None)
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
        """Serve a socket connected elsewhere as if accepted (a supervisor's health checks)."""
        self._call_soon(lambda: self._admit(sock, SUPERVISOR, checked=True))

    # -- the leader ---------------------------------------------------------------

    def _lead(self, _: Any) -> None:
        """Watch the sockets until a connection has requests; then pass the lead on and answer them."""
        ready = self._watch()
        if not ready:  # stopping
            self._lead_ended.set()
            return
        for conn in ready[1:]:
            self._pool.submit(self._drain, conn)
        self._pool.submit(self._lead, None)  # after what was found: each round answered in full
        self._drain(ready[0])

    def _watch(self) -> list[_Connection]:
        """Run the selector until some connection has requests to answer (none once stopped)."""
        try:
            while not self._stopped_serving():
                for key, events in self._selector.select(timeout=0.5):
                    self._dispatch_event(key.data, events)
                if time.monotonic() >= self._next_sweep:
                    self._sweep_timeouts()
                    self._resume_accepting()
                    self._forget_refilled_buckets()
                    self._next_sweep = time.monotonic() + 0.5
                if self._memory_paused:
                    self._relieve_memory_pause()
                if self._ready:
                    ready, self._ready = self._ready, []
                    return ready
        except BaseException as exc:  # serve_forever raises it once everything is closed
            self._failure = exc
            self._stopping.set()
        return []

    def _stopped_serving(self) -> bool:
        """False while serving; once stopping, False while answers are still owed to clients
        that read them, for at most send_timeout_s: a write's answer is not thrown away."""
        if not self._stopping.is_set():
            return False
        if self._stop_deadline is None:
            self._stop_deadline = time.monotonic() + self.limits.send_timeout_s
            self._begin_stopping()
        owed = self._ready or any(conn.busy for conn in self._connections)
        return not owed or time.monotonic() >= self._stop_deadline

    def _past_stop_deadline(self) -> bool:
        """Stopping, and the time for answers owed is up: queued requests are left unanswered."""
        deadline = self._stop_deadline
        return deadline is not None and time.monotonic() >= deadline

    def _begin_stopping(self) -> None:
        """Accept and read no more; what was read is answered (_stopped_serving)."""
        self._close_listener()
        for conn in list(self._connections):
            self._stop_reading(conn)

    def _dispatch_event(self, data: Any, events: int) -> None:
        if data == "accept":
            self._accept_all()
        elif data == "wake":
            self._run_calls()
        else:
            if events & selectors.EVENT_WRITE:
                self._flush(data)
            if events & selectors.EVENT_READ and data.reading and not data.closed:
                self._read(data)

    def _close_listener(self) -> None:
        if self._accept_paused_until is None:
            self._selector.unregister(self._listener)
        self._accept_paused_until = None  # for good: nothing to resume
        self._listener.close()

    def _accept_all(self) -> None:
        while True:
            try:
                sock, peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _OUT_OF_DESCRIPTORS:
                    self._pause_accepting(exc)
                else:  # e.g. ECONNABORTED: that client is gone, the next may be fine
                    log.debug("accept failed: %s", exc)
                return
            self._admit(sock, peer[0])

    def _pause_accepting(self, exc: OSError) -> None:
        """Leave new clients in the backlog a moment (accepting again at once would spin)."""
        if self._accept_paused_until is None and not self._accept_pause_logged:
            log.warning("cannot accept (%s): pausing accepts until connections close; "
                        "raise the descriptor limit (ulimit -n) or lower MARKET_MAX_CONNECTIONS",
                        exc.strerror)
            self._accept_pause_logged = True
        self.observer.connection_refused("", "out_of_descriptors")
        self._selector.unregister(self._listener)
        self._accept_paused_until = time.monotonic() + _ACCEPT_PAUSE_S

    def _resume_accepting(self) -> None:
        if self._accept_paused_until is not None and time.monotonic() >= self._accept_paused_until \
                and not self._stopping.is_set():
            self._accept_paused_until = None
            self._selector.register(self._listener, selectors.EVENT_READ, "accept")

    def _admit(self, sock: socket.socket, address: str, checked: bool = False) -> None:
        refusal = "" if checked else self._refusal(address)
        if refusal:
            self.observer.connection_refused(address, refusal)
            _refuse_busy(sock, _REFUSALS[refusal], plaintext=self.tls is None)
            return
        self._accept_pause_logged = False  # a descriptor shortage is logged again once it recurs
        sock.setblocking(True)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.observer.connection_opened(address)
        conn = _Connection(sock, self.limits.max_frame, address)
        if self.tls is not None:
            conn.tls = conn.channel = TlsChannel(self.tls)
        self._connections.add(conn)
        self._per_address[address] += 1
        self._watch_events(conn)

    def _refusal(self, address: str) -> str:
        """Why a new connection from `address` is turned away, a key of _REFUSALS ("" if it is not)."""
        if len(self._connections) >= self.limits.max_connections:
            return "max_connections"
        if self._per_address[address] >= self.limits.max_connections_per_address:
            return "max_connections_per_address"
        bucket = self._arrivals.get(address)
        if bucket is None:
            bucket = self._arrivals[address] = _Bucket(self.limits.new_connections_per_s_per_address,
                                                       self.limits.max_connections_per_address)
        if not bucket.take():
            return "new_connections_per_address"
        return ""

    def _read(self, conn: _Connection) -> None:
        try:
            data = conn.sock.recv(_READ_SIZE, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        plaintext = self._decrypt(conn, data) if conn.tls is not None else data
        if plaintext is None:
            return
        now = time.monotonic()
        conn.last_activity = now
        conn.decoder.feed(plaintext)
        completed = self._queue_messages(conn)
        self._count_partial(conn, completed)
        if conn.decoder.in_frame or (conn.tls is not None and not conn.tls.handshake_done):
            # the deadline is the started frame's: one begun in this read starts its own
            conn.frame_started = now if completed or conn.frame_started is None else conn.frame_started
        else:
            conn.frame_started = None

    def _decrypt(self, conn: _Connection, data: bytes) -> bytes | None:
        """Plaintext from a TLS connection, or None once it is closed (not TLS, or stuck)."""
        assert conn.tls is not None
        try:
            plaintext = conn.tls.receive(data)
        except ssl.SSLError as exc:
            log.debug("closing a connection that does not speak TLS: %s", exc.reason)
            self.observer.connection_refused(conn.address, "tls_handshake")
            self._close(conn)
            return None
        if not conn.tls.flush_nowait(conn.sock) and conn.blocked_since is None:
            self._close(conn)  # a handshake's answer the socket will not take: stuck
            return None
        return plaintext

    def _queue_messages(self, conn: _Connection) -> int:
        """Queue the connection's complete frames for answering (decoded by the thread that
        answers: a frame waits at its own size); how many there were."""
        frames: list[bytes | ProtocolError] = []
        try:
            while (frame := conn.decoder.next_frame()) is not None:
                frames.append(frame)
        except ProtocolError as exc:
            frames.append(exc)
        if not frames:
            return 0
        size = 0
        for queued in frames:
            if isinstance(queued, bytes):
                size += len(queued)
        read = now_ns()
        self.observer.requests_read(len(frames))
        with conn.lock:
            conn.pending.extend(zip(frames, itertools.repeat(read)))
            conn.queued_bytes += size
            start = not conn.busy
            conn.busy = True
        self._queued.add(size)
        if (isinstance(frames[-1], ProtocolError) or len(conn.pending) > _PAUSE_AFTER
                or conn.queued_bytes >= self.limits.max_queued_bytes_per_connection):
            self._stop_reading(conn)
        if start:
            self._ready.append(conn)
        return len(frames)

    def _count_partial(self, conn: _Connection, completed: int) -> None:
        """Count what the connection holds of an unfinished frame; past the process's limit,
        stop reading it if it holds a lot (a client sending small requests is still read)."""
        partial = conn.decoder.buffered
        self._queued.add_partial(partial - conn.partial_bytes)
        conn.partial_bytes = partial
        if completed:
            conn.finishing = False
        if (conn.reading and not conn.finishing and self._queued.over()
                and conn.queued_bytes + partial >= _HOLDS_A_LOT):
            self._stop_reading(conn)
            self.observer.connection_refused(conn.address, "memory")
            if not conn.busy:  # (a busy one is paused when its answers are sent: _resume_reading)
                self._memory_paused.add(conn)

    def _watch_events(self, conn: _Connection) -> None:
        """Have the selector watch the socket for what the connection waits for (maybe nothing)."""
        events = selectors.EVENT_READ if conn.reading else 0
        events |= selectors.EVENT_WRITE if conn.writing else 0
        if events == conn.events:
            return
        if not conn.events:
            self._selector.register(conn.sock, events, conn)
        elif not events:
            self._selector.unregister(conn.sock)
        else:
            self._selector.modify(conn.sock, events, conn)
        conn.events = events

    def _stop_reading(self, conn: _Connection) -> None:
        if conn.reading and not conn.closed:
            conn.reading = False
            self._watch_events(conn)

    def _resume_reading(self, conn: _Connection) -> None:
        if not conn.reading and not conn.closed and not conn.closing and not self._stopping.is_set():
            if conn.partial_bytes >= _HOLDS_A_LOT and not self._queued.low():
                self._memory_paused.add(conn)  # read again once the process holds less
                return
            self._read_again(conn)

    def _read_again(self, conn: _Connection) -> None:
        if conn.closed or conn.closing or self._stopping.is_set():
            return
        conn.reading = True
        self._watch_events(conn)
        if conn.frame_started is not None:  # the time we did not read is not the client's
            conn.frame_started = time.monotonic()

    def _forget_refilled_buckets(self) -> None:
        """Keep the new-connection counts only of addresses that connected lately."""
        self._arrivals = {address: bucket for address, bucket in self._arrivals.items() if not bucket.full()}

    def _relieve_memory_pause(self) -> None:
        """Read the paused connections again once the process holds half its limit; while no
        answer is under way to free anything, read the one nearest to finishing its frame."""
        if self._queued.low():
            paused, self._memory_paused = self._memory_paused, set()
        elif not self._queued.answering():
            nearest = max(self._memory_paused, key=lambda conn: conn.partial_bytes)
            nearest.finishing = True
            paused = {nearest}
            self._memory_paused -= paused
        else:
            return
        for conn in paused:
            self._read_again(conn)

    def _sweep_timeouts(self) -> None:
        now = time.monotonic()
        for conn in list(self._connections):
            if conn.writing:
                if now - (conn.blocked_since or now) > self.limits.send_timeout_s:
                    log.debug("closing a connection that left its answer unread too long")
                    self._close(conn)
                continue
            if conn.busy or conn in self._memory_paused:
                continue
            if conn.frame_started is not None:
                if now - conn.frame_started > self.limits.frame_deadline_s:
                    log.debug("closing a connection that did not finish its frame in time")
                    self._close(conn)
            elif now - conn.last_activity > self.limits.idle_timeout_s:
                self._close(conn)

    def _close(self, conn: _Connection) -> None:
        """Close now, or when the thread answering it finishes; always on the leader."""
        with conn.lock:
            if conn.closed:
                return
            if conn.busy and not conn.writing:  # (a writing one waits for its client, not a thread)
                conn.closing = True
                self._stop_reading(conn)
                return
            conn.closed = True
            conn.busy = False
        conn.reading = conn.writing = False
        self._watch_events(conn)
        self.observer.connection_closed(conn.address)
        self._connections.discard(conn)
        self._memory_paused.discard(conn)
        self._queued.add_partial(-conn.partial_bytes)
        conn.partial_bytes = 0
        self._per_address[conn.address] -= 1
        if not self._per_address[conn.address]:
            del self._per_address[conn.address]
        self._forget_pending(conn)
        conn.sock.close()

    def _call_soon(self, call: Callable[[], None]) -> None:
        self._calls.append(call)
        self._wake()

    def _wake(self) -> None:
        if self._woken:  # the leader has a wake-up to read already
            return
        self._woken = True
        try:
            self._wake_w.send(b"x")
        except OSError:  # full (the leader will read it) or closed (stopped)
            pass

    def _run_calls(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        self._woken = False  # before the calls are run: a call queued after this wakes us again
        while self._calls:
            self._calls.popleft()()

    def _finish(self) -> None:
        if self._stop_deadline is None:  # stopped by a failure, not shutdown()
            self._close_listener()
        if self._aside is not None:  # first: what it answers goes on with the request threads
            self._aside.shutdown()
        self._pool.shutdown()
        self._run_calls()
        connections = list(self._connections)
        owed = sum(conn.busy for conn in connections)
        for conn in connections:
            conn.busy = False
            _discard_unread(conn.sock)
            self._close(conn)
        took = time.monotonic() - (self._stop_asked or time.monotonic())
        log.info("stopped %.1f s after the stop was asked, closing %d connections (%d still owed "
                 "answers)", took, len(connections), owed)
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()
        self._stopped.set()

    # -- answering (the leader that found the requests, or another thread) -------

    def _drain(self, conn: _Connection) -> None:
        """Answer a connection's queued requests in order (one thread at a time per connection)."""
        self.observer.threads_busy(1)
        try:
            self._drain_queue(conn)
        finally:
            self.observer.threads_busy(-1)

    def _drain_queue(self, conn: _Connection) -> None:
        while True:
            with conn.lock:
                if not conn.pending or conn.closed or self._past_stop_deadline():
                    conn.busy = False
                    break
                frame, read = conn.pending.popleft()
                size = len(frame) if isinstance(frame, bytes) else 0
                conn.queued_bytes -= size
            answering = now_ns()  # before decoding: a request waits undecoded, its decoding is service
            message = _decode(conn, frame)
            if self._aside is not None and _op_of(message) in self._aside_ops and \
                    self._aside.submit_unless_shut(self._answer_aside, (conn, message, read, size)):
                return  # still busy: the aside thread answers (its frame counted till then), in order
            self._release(size)
            self.observer.answering(conn.address, message)
            if not self._answer_one(conn, message, read, answering):
                return
        self._queue_answered(conn)

    def _answer_one(self, conn: _Connection, message: dict[str, Any] | ProtocolError,
                    read: int, answering: int) -> bool:
        """Answer one request; False when its answer waits for the socket (the leader then
        sends the rest and hands the queue on)."""
        response, answer_frame = answer(self.app, message, conn.address)
        answered = now_ns()  # before the send: a client may read the answer before it returns
        sent = self._send(conn, answer_frame)
        self.observer.answer_sent(conn.address, message, response, (read, answering, answered))
        if not sent:
            self._forget_pending(conn)
        elif isinstance(message, ProtocolError):
            self._forget_pending(conn)
            conn.closing = True
        if conn.blocked_since is not None:  # the rest when the client reads: the leader's
            self._call_soon(lambda: self._wait_writable(conn))
            return False
        return True

    def _release(self, size: int) -> None:
        """A request's frame no longer held (being answered, or dropped)."""
        if self._queued.add(-size) and self._memory_paused:
            self._wake()  # the leader reads the paused connections again (or one of them)

    def _answer_aside(self, job: tuple[_Connection, dict[str, Any] | ProtocolError, int, int]) -> None:
        """Answer an aside op's request, then hand the connection's queue back to a request
        thread (the connection stayed busy meanwhile, so its requests keep their order). Past
        the stop's deadline it is left unanswered, as queued requests are."""
        conn, message, read, size = job
        self.observer.threads_busy(1)
        try:
            answering = now_ns()  # its wait for an aside thread counts as waiting, not service
            if self._past_stop_deadline():
                self.observer.requests_read(-1)  # left unanswered
            else:
                self.observer.answering(conn.address, message)
                if not self._answer_one(conn, message, read, answering):
                    return  # the leader sends the rest, then hands the queue on
            self._pool.submit(self._drain, conn)
        finally:
            self._release(size)
            self.observer.threads_busy(-1)

    def _queue_answered(self, conn: _Connection) -> None:
        """Every queued request answered: read the connection again, or close it."""
        conn.last_activity = time.monotonic()
        if conn.closing:
            self._call_soon(lambda: self._close(conn))
        elif not conn.reading:
            self._call_soon(lambda: self._resume_reading(conn))

    def _forget_pending(self, conn: _Connection) -> None:
        """Drop the requests a connection has queued: it is closing, they go unanswered."""
        with conn.lock:
            dropped = len(conn.pending)
            conn.pending.clear()
            size, conn.queued_bytes = conn.queued_bytes, 0
        self._queued.add(-size)
        if dropped:
            self.observer.requests_read(-dropped)

    def _send(self, conn: _Connection, frame: bytes) -> bool:
        """Send, or leave in the outbox what the socket will not take now; False if it failed."""
        try:
            if not conn.channel.send_nowait(conn.sock, frame):
                conn.blocked_since = time.monotonic()
            return True
        except OSError:
            conn.closing = True
            return False

    # -- answers waiting for their client to read (the leader) -------------------

    def _wait_writable(self, conn: _Connection) -> None:
        """Watch a blocked connection's socket until its outbox can go on."""
        if not conn.closed:
            conn.writing = True
            self._watch_events(conn)

    def _flush(self, conn: _Connection) -> None:
        """Send more of the outbox; once it is empty, a thread goes on with the queue."""
        try:
            done = conn.channel.flush_nowait(conn.sock)
        except OSError:
            self._close(conn)
            return
        if not done:  # writable: the client has read some; the clock starts again
            conn.blocked_since = time.monotonic()
            return
        conn.writing, conn.blocked_since = False, None
        self._watch_events(conn)
        self._ready.append(conn)  # still busy: _drain answers the rest, or closes


class _QueuedBytes:
    """The bytes of requests read and not yet answered on all connections, complete frames
    (counted by the leader and the answering threads) and unfinished ones (the leader's)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.complete = 0
        self.partial = 0
        self._lock = threading.Lock()

    @property
    def total(self) -> int:
        """Everything held."""
        return self.complete + self.partial

    def add(self, size: int) -> bool:
        """Count size more of complete frames (or less, if negative); whether paused
        connections may now be read again: down to half the limit, or no answer under way."""
        with self._lock:
            self.complete += size  # below, and in over(): the total inline (a property is a call)
            return self.complete + self.partial <= self.limit // 2 or not self.complete

    def add_partial(self, size: int) -> None:
        """Count size more of unfinished frames (the leader only)."""
        self.partial += size

    def answering(self) -> bool:
        """Some complete frames wait for, or get, their answer: memory will be freed."""
        return self.complete > 0

    def over(self) -> bool:
        """More held than the limit."""
        return self.complete + self.partial > self.limit

    def low(self) -> bool:
        """Down to half the limit: paused connections may be read again."""
        return self.total <= self.limit // 2


class _Bucket:
    """A token bucket: `rate` takes a second on average, `burst` at once."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self.tokens = float(burst)
        self.updated = time.monotonic()

    def take(self) -> bool:
        """Take a token if there is one."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True

    def full(self) -> bool:
        """Refilled to the burst: nothing is remembered that a new bucket would not know."""
        return self.tokens + (time.monotonic() - self.updated) * self.rate >= self.burst


def _decode(conn: _Connection, frame: bytes | ProtocolError) -> dict[str, Any] | ProtocolError:
    """A queued frame as its message, or the error to answer it with."""
    if isinstance(frame, ProtocolError):
        return frame
    try:
        return conn.decoder.decode(frame)
    except ProtocolError as exc:
        return exc
    except Exception:  # a bug in decoding one client's bytes costs that connection only
        log.exception("could not decode a frame; answering BAD_FRAME and closing")
        return BadFrameError("frame could not be decoded")


def _op_of(message: dict[str, Any] | ProtocolError) -> str | None:
    """The request's op name; None when it has none (any other JSON value is no name)."""
    op = None if isinstance(message, ProtocolError) else message.get("op")
    return op if isinstance(op, str) else None


def _listen(host: str, port: int, reuse_port: bool) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def _discard_unread(sock: socket.socket) -> None:
    """Read away what a client sent that will not be answered (at stop): a socket closed with
    unread bytes sends a reset, and the answers still on their way to the client are lost."""
    try:
        for _ in range(64):
            if not sock.recv(_READ_SIZE, socket.MSG_DONTWAIT):
                return
    except OSError:  # nothing more now (BlockingIOError), or the connection is gone
        return


def _refuse_busy(sock: socket.socket, reason: str, plaintext: bool) -> None:
    """Tell a connection over a limit BUSY (unless it expects TLS) and close it, without blocking."""
    try:
        sock.setblocking(False)
        if plaintext:
            sock.send(encode_frame(error_response(None, BusyError(reason))))
    except OSError:
        pass
    finally:
        sock.close()


class StopRequested(Exception):
    """SIGTERM or Ctrl-C arrived before the server was serving: stop without serving."""


class StopSignals:
    """SIGTERM and Ctrl-C as a clean stop, from the moment this is made.

    Made before the server listens, so no signal finds the process listening but without
    its handlers (the default action killed it there: exit status -15, or a traceback).
    Until `hold`, a signal raises StopRequested out of whatever start-up was doing (waiting
    for the database, say); from `hold` on, while threads are started, it is remembered,
    and `serve` stops at once; once serving, it shuts the server down, which answers what
    is in flight."""

    def __init__(self) -> None:
        self._server: Server | None = None
        self._requested = False
        self._signum = 0  # the signal that asked for the stop
        self._interruptible = True
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)

    def _stop(self, signum: int, _frame: Any) -> None:
        log.info("signal %d: stopping", signum)
        self._requested, self._signum = True, signum
        if self._server is not None:
            self._server.shutdown(wait=False)
        elif self._interruptible:
            raise StopRequested(signum)

    def hold(self) -> None:
        """From here on a signal is remembered, not raised: nothing that must finish is cut short."""
        self._interruptible = False

    @contextmanager
    def held(self) -> Iterator[None]:
        """A signal meanwhile is remembered, then raised as StopRequested when the block ends
        (closing connections, say, which a library would otherwise log as failed and go on)."""
        was, self._interruptible = self._interruptible, False
        try:
            yield
        finally:
            self._interruptible = was
        if was and self._requested:
            raise StopRequested(self._signum)

    def serve(self, server: Server, ready: Callable[[Server], None] = lambda _: None) -> None:
        """Serve in the foreground until SIGTERM or Ctrl-C, then stop cleanly; `ready` runs
        once a signal would stop the server (it may already be stopping)."""
        self._server = server
        if self._requested:
            server.shutdown(wait=False)
        ready(server)
        server.serve_forever()


def reserve_port(host: str, port: int) -> socket.socket:
    """A bound, not listening, SO_REUSEPORT socket: holds the port while workers bind it."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    # SO_REUSEPORT alone: the workers' sockets (and what is left of their connections, in
    # TIME_WAIT) share the port with it, while a program binding with SO_REUSEADDR, which
    # may share a port nobody listens on, is refused: the port stays ours while no worker is.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            sock.close()
            raise
        # TIME_WAIT connections of a server that ran without --workers (no SO_REUSEPORT):
        # SO_REUSEADDR lets us past them at the bind, and is cleared once bound, so that a
        # program binding with it later is refused as above (the kernel checks the flag a
        # bound socket has at the time of the other's bind)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            sock.close()
            raise
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
    return sock
