"""The leader's side of the server loop (runtime.server): accepting, reading and decoding
frames, flow control, sending what a blocked socket would not take, timeouts and closing.
Only the thread leading runs these, except `_call_soon` and `_release`, which any may.
"""
from __future__ import annotations

import collections
import errno
import itertools
import logging
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

from wire.errors import ProtocolError
from wire.observer import ServerObserver, now_ns

from .admission import Admission
from .connection import READ_SIZE, Connection, TlsChannel
from .flow import HOLDS_A_LOT, PAUSE_AFTER, QueuedBytes

log = logging.getLogger("market.server")
_ACCEPT_PAUSE_S = 0.5  # out of file descriptors: how long the listener is left alone
_OUT_OF_DESCRIPTORS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


class Reader:
    """The leader's methods of Server, and the state they keep."""

    def __init__(self, listener: socket.socket, limits: Any, observer: ServerObserver) -> None:
        self.limits, self.observer, self._listener = limits, observer, listener
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)  # a full pair already wakes the leader: never wait on it
        self._woken = False
        self._calls: collections.deque[Callable[[], None]] = collections.deque()
        self._queued = QueuedBytes(limits.max_queued_bytes)
        self._memory_paused: set[Connection] = set()  # not read until the process holds less
        self._admission = Admission(limits.max_connections, limits.max_connections_per_address,
                                    limits.new_connections_per_s_per_address)
        self._accept_paused_until: float | None = None
        self._accept_pause_logged = False
        self._connections: set[Connection] = set()
        self._ready: list[Connection] = []  # connections the leader found requests for
        self._stopping = threading.Event()
        self._next_sweep = 0.0

    def _admit(self, sock: socket.socket, address: str, checked: bool = False) -> None:
        raise NotImplementedError  # the Server's

    def _housekeep(self) -> None:
        """Now and then: timeouts, accepting again, forgetting old arrivals; memory pauses."""
        if time.monotonic() >= self._next_sweep:
            self._sweep_timeouts()
            self._resume_accepting()
            self._admission.forget_refilled_buckets()
            self._next_sweep = time.monotonic() + 0.5
        if self._memory_paused:
            self._relieve_memory_pause()

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

    # -- accepting ----------------------------------------------------------------

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

    # -- reading ------------------------------------------------------------------

    def _read(self, conn: Connection) -> None:
        try:
            data = conn.sock.recv(READ_SIZE, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        plaintext = self._decrypt(conn, data)
        if plaintext is None:
            return
        now = time.monotonic()
        conn.last_activity = now
        conn.decoder.feed(plaintext)
        completed = self._queue_messages(conn)
        self._count_partial(conn, completed)
        if conn.decoder.in_frame or not conn.channel.handshake_done:
            # the deadline is the started frame's: one begun in this read starts its own
            conn.frame_started = now if completed or conn.frame_started is None else conn.frame_started
        else:
            conn.frame_started = None

    def _decrypt(self, conn: Connection, data: bytes) -> bytes | None:
        """The plaintext of bytes read, or None once the connection is closed (not TLS, or stuck)."""
        if not isinstance(conn.channel, TlsChannel):  # (its outbox is the answering thread's)
            return data
        try:
            plaintext = conn.channel.receive(data)
        except ssl.SSLError as exc:
            log.debug("closing a connection that does not speak TLS: %s", exc.reason)
            self.observer.connection_refused(conn.address, "tls_handshake")
            self._close(conn)
            return None
        if not conn.channel.flush_nowait(conn.sock) and conn.blocked_since is None:
            self._close(conn)  # a handshake's answer the socket will not take: stuck
            return None
        return plaintext

    def _queue_messages(self, conn: Connection) -> int:
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
        size = sum(len(queued) for queued in frames if isinstance(queued, bytes))
        read = now_ns()
        self.observer.requests_read(len(frames))
        with conn.lock:
            conn.pending.extend(zip(frames, itertools.repeat(read)))
            conn.queued_bytes += size
            start = not conn.busy
            conn.busy = True
        self._queued.add(size)
        if (isinstance(frames[-1], ProtocolError) or len(conn.pending) > PAUSE_AFTER
                or conn.queued_bytes >= self.limits.max_queued_bytes_per_connection):
            self._stop_reading(conn)
        if start:
            self._ready.append(conn)
        return len(frames)

    def _count_partial(self, conn: Connection, completed: int) -> None:
        """Count what the connection holds of an unfinished frame; past the process's limit,
        stop reading it if it holds a lot (a client sending small requests is still read)."""
        partial = conn.decoder.buffered
        self._queued.add_partial(partial - conn.partial_bytes)
        conn.partial_bytes = partial
        if completed:
            conn.finishing = False
        if (conn.reading and not conn.finishing and self._queued.over()
                and conn.queued_bytes + partial >= HOLDS_A_LOT):
            self._stop_reading(conn)
            self.observer.connection_refused(conn.address, "memory")
            if not conn.busy:  # (a busy one is paused when its answers are sent: _resume_reading)
                self._memory_paused.add(conn)

    def _watch_events(self, conn: Connection) -> None:
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

    def _stop_reading(self, conn: Connection) -> None:
        if conn.reading and not conn.closed:
            conn.reading = False
            self._watch_events(conn)

    def _resume_reading(self, conn: Connection, memory_checked: bool = False) -> None:
        if conn.reading or conn.closed or conn.closing or self._stopping.is_set():
            return
        if not memory_checked and conn.partial_bytes >= HOLDS_A_LOT and not self._queued.low():
            self._memory_paused.add(conn)  # read again once the process holds less
            return
        conn.reading = True
        self._watch_events(conn)
        if conn.frame_started is not None:  # the time we did not read is not the client's
            conn.frame_started = time.monotonic()

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
            self._resume_reading(conn, memory_checked=True)

    def _release(self, size: int) -> None:
        """A request's frame no longer held (being answered, or dropped)."""
        if self._queued.add(-size) and self._memory_paused:
            self._wake()  # the leader reads the paused connections again (or one of them)

    # -- answers done, answers waiting for their client to read --------------------

    def _queue_answered(self, conn: Connection) -> None:
        """Every queued request answered: read the connection again, or close it."""
        conn.last_activity = time.monotonic()
        if conn.closing:
            self._call_soon(lambda: self._close(conn))
        elif not conn.reading:
            self._call_soon(lambda: self._resume_reading(conn))

    def _forget_pending(self, conn: Connection) -> None:
        """Drop the requests a connection has queued: it is closing, they go unanswered."""
        with conn.lock:
            dropped = len(conn.pending)
            conn.pending.clear()
            size, conn.queued_bytes = conn.queued_bytes, 0
        self._queued.add(-size)
        if dropped:
            self.observer.requests_read(-dropped)

    def _wait_writable(self, conn: Connection) -> None:
        """Watch a blocked connection's socket until its outbox can go on."""
        if not conn.closed:
            conn.writing = True
            self._watch_events(conn)

    def _flush(self, conn: Connection) -> None:
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
        self._ready.append(conn)  # still busy: a turn answers the rest, or closes

    # -- timeouts and closing ----------------------------------------------------

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

    def _close(self, conn: Connection) -> None:
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
        self._admission.closed(conn.address)
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
