"""The server loop both servers share: a bounded pool of threads, leaders and followers.

One thread of the pool at a time leads: it accepts, reads and decodes frames
(framing.FrameDecoder) for every connection through a selector. Complete requests
queue on their connection, and one thread at a time answers them in order, so
pipelining keeps its order and the thread count stays fixed however many clients
connect. When a connection has requests to answer, the leader hands the lead to the
next free thread and answers them itself: the request goes on with no hand-off to
another thread on its way. Exceptions become error responses in `answer`, the one
place where that translation happens. An observer (wire.observer) hears of connections
and answers: metrics, logs and tracing hang there.

No thread ever waits for a client to read: an answer the socket will not take at once
stays in the connection's outbox, the thread goes back to the pool, and the leader
sends the rest when the socket is writable, then hands the connection's queue to a
thread again. A client that reads nothing of its answer for `send_timeout_s` is closed.
"""
from __future__ import annotations

import collections
import errno
import logging
import queue
import selectors
import signal
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .envelope import error_response, request_id
from .errors import BadFrameError, BusyError, InternalError, ProtocolError
from .framing import DEFAULT_MAX_FRAME, FrameDecoder, encode_frame
from .observer import NO_SERVER_OBSERVER, ServerObserver, now_ns
from .tls import TlsChannel

log = logging.getLogger("market.server")
_READ_SIZE = 65536
_SIGNAL_CHECK_S = 0.2  # how often serve_forever's thread looks for a signal to handle
_PAUSE_AFTER = 64  # queued requests on one connection before we stop reading it


class App(Protocol):
    """What the loop serves: a message in, a response message out."""

    def handle(self, message: dict[str, Any]) -> dict[str, Any]: ...


@dataclass(frozen=True)
class ServerLimits:
    """Connection limits of one server process."""

    max_connections: int = 1000
    max_frame: int = DEFAULT_MAX_FRAME
    idle_timeout_s: float = 300.0
    frame_deadline_s: float = 10.0
    send_timeout_s: float = 10.0  # how long an answer may wait for its client to read more of it
    threads: int = 3  # on two cores, with the database nearby: the lowest tail (docs/benchmarks.md)


def answer(app: App, message: dict[str, Any] | ProtocolError) -> tuple[dict[str, Any], bytes]:
    """The response to one decoded message (or to a framing error), and its frame; never raising."""
    if isinstance(message, ProtocolError):
        return _framed(error_response(None, message))
    try:
        response = app.handle(message)
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

    def __init__(self, threads: int) -> None:
        self._calls: queue.SimpleQueue[tuple[Callable[[Any], None], Any] | None] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name=f"market-worker-{n}", daemon=True)
                         for n in range(threads)]
        for thread in self._threads:
            thread.start()

    def submit(self, call: Callable[[Any], None], arg: Any) -> None:
        """Run call(arg) on a worker thread."""
        self._calls.put((call, arg))

    def shutdown(self) -> None:
        """Finish the calls already submitted, then stop every thread."""
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

    def __init__(self, sock: socket.socket, max_frame: int, peer: str) -> None:
        self.sock = sock
        self.peer = peer           # "host:port", for the observer
        self.decoder = FrameDecoder(max_frame)
        # each request with the now_ns() it was read at
        self.pending: collections.deque[tuple[dict[str, Any] | ProtocolError, int]] = collections.deque()
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
        self._calls: collections.deque[Callable[[], None]] = collections.deque()
        self._connections: set[_Connection] = set()
        self._ready: list[_Connection] = []  # connections the leader found requests for
        self._next_sweep = 0.0
        self._pool = _WorkerPool(limits.threads)
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

    # -- the leader ---------------------------------------------------------------

    def _lead(self, _: Any) -> None:
        """Watch the sockets until a connection has requests; then pass the lead on and answer them."""
        ready = self._watch()
        if not ready:  # stopping
            self._lead_ended.set()
            return
        for conn in ready[1:]:
            self._pool.submit(self._drain, conn)
        self._pool.submit(self._lead, None)
        self._drain(ready[0])

    def _watch(self) -> list[_Connection]:
        """Run the selector until some connection has requests to answer (none once stopped)."""
        try:
            while not self._stopped_serving():
                for key, events in self._selector.select(timeout=0.5):
                    self._dispatch_event(key.data, events)
                if time.monotonic() >= self._next_sweep:
                    self._sweep_timeouts()
                    self._next_sweep = time.monotonic() + 0.5
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
        self._selector.unregister(self._listener)
        self._listener.close()
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

    def _accept_all(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. EMFILE: leave it in the backlog for now
                log.warning("accept failed: %s", exc)
                return
            self._admit(sock)

    def _admit(self, sock: socket.socket) -> None:
        peer = _peer(sock)
        if len(self._connections) >= self.limits.max_connections:
            self.observer.connection_refused(peer, "max_connections")
            _refuse_busy(sock, plaintext=self.tls is None)
            return
        sock.setblocking(True)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.observer.connection_opened(peer)
        conn = _Connection(sock, self.limits.max_frame, peer)
        if self.tls is not None:
            conn.tls = conn.channel = TlsChannel(self.tls)
        self._connections.add(conn)
        self._watch_events(conn)

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
            self.observer.connection_refused(conn.peer, "tls_handshake")
            self._close(conn)
            return None
        if not conn.tls.flush_nowait(conn.sock) and conn.blocked_since is None:
            self._close(conn)  # a handshake's answer the socket will not take: stuck
            return None
        return plaintext

    def _queue_messages(self, conn: _Connection) -> int:
        """Queue the connection's complete requests for answering; how many there were."""
        messages: list[dict[str, Any] | ProtocolError] = []
        try:
            while (message := conn.decoder.next_message()) is not None:
                messages.append(message)
        except ProtocolError as exc:
            messages.append(exc)
        except Exception:  # a bug in decoding one client's bytes costs that connection only
            log.exception("could not decode a frame; answering BAD_FRAME and closing")
            messages.append(BadFrameError("frame could not be decoded"))
        if not messages:
            return 0
        if isinstance(messages[-1], ProtocolError):
            self._stop_reading(conn)
        read = now_ns()
        self.observer.requests_read(len(messages))
        with conn.lock:
            conn.pending.extend((message, read) for message in messages)
            start = not conn.busy
            conn.busy = True
        if len(conn.pending) > _PAUSE_AFTER:
            self._stop_reading(conn)
        if start:
            self._ready.append(conn)
        return len(messages)

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
            conn.reading = True
            self._watch_events(conn)
            if conn.frame_started is not None:  # the time we did not read is not the client's
                conn.frame_started = time.monotonic()

    def _sweep_timeouts(self) -> None:
        now = time.monotonic()
        for conn in list(self._connections):
            if conn.writing:
                if now - (conn.blocked_since or now) > self.limits.send_timeout_s:
                    log.debug("closing a connection that left its answer unread too long")
                    self._close(conn)
                continue
            if conn.busy:
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
            self._drop_pending(conn)
        conn.reading = conn.writing = False
        self._watch_events(conn)
        self.observer.connection_closed(conn.peer)
        self._connections.discard(conn)
        conn.sock.close()

    def _call_soon(self, call: Callable[[], None]) -> None:
        self._calls.append(call)
        self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def _run_calls(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        while self._calls:
            self._calls.popleft()()

    def _finish(self) -> None:
        if self._stop_deadline is None:  # stopped by a failure, not shutdown()
            self._selector.unregister(self._listener)
            self._listener.close()
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
                message, read = conn.pending.popleft()
            self.observer.answering(conn.peer, message)
            answering = now_ns()
            response, frame = answer(self.app, message)
            answered = now_ns()  # before the send: a client may read the answer before it returns
            sent = self._send(conn, frame)
            self.observer.answer_sent(conn.peer, message, response, (read, answering, answered))
            if not sent:
                self._drop_pending(conn)
            elif isinstance(message, ProtocolError):
                self._drop_pending(conn)
                conn.closing = True
            if conn.blocked_since is not None:  # the rest when the client reads: the leader's
                self._call_soon(lambda: self._wait_writable(conn))
                return
        conn.last_activity = time.monotonic()
        if conn.closing:
            self._call_soon(lambda: self._close(conn))
        elif not conn.reading:
            self._call_soon(lambda: self._resume_reading(conn))

    def _drop_pending(self, conn: _Connection) -> None:
        """Forget the connection's queued requests: they will not be answered."""
        if conn.pending:
            self.observer.requests_read(-len(conn.pending))
            conn.pending.clear()

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


def _peer(sock: socket.socket) -> str:
    """The client's "host:port" (empty once it has gone)."""
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return ""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


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


def _refuse_busy(sock: socket.socket, plaintext: bool) -> None:
    """Tell a connection over the limit BUSY (unless it expects TLS) and close it, without blocking."""
    try:
        sock.setblocking(False)
        if plaintext:
            sock.send(encode_frame(error_response(None, BusyError("too many connections; try again later"))))
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
        self._interruptible = True
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)

    def _stop(self, signum: int, _frame: Any) -> None:
        log.info("signal %d: stopping", signum)
        self._requested = True
        if self._server is not None:
            self._server.shutdown(wait=False)
        elif self._interruptible:
            raise StopRequested(signum)

    def hold(self) -> None:
        """From here on a signal is remembered, not raised: nothing that must finish is cut short."""
        self._interruptible = False

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
