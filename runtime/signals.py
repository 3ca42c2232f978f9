"""What signals do to a server process (and to the supervisor of `--workers N`):

- SIGTERM, SIGINT (Ctrl-C) and SIGQUIT: the graceful stop (no more accepting or reading,
  what was read is answered, then exit);
- SIGHUP (logrotate's), SIGUSR1 and SIGUSR2: ignored. Logs go to the standard streams, so
  there is no file to reopen; none of them may end a server that clients rely on.
"""
from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .server import Server

log = logging.getLogger("market.server")
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGQUIT})
IGNORED_SIGNALS = (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def handle_signals(stop: Callable[[int, Any], None]) -> None:
    """Stop signals to `stop`; the others ignored (see the module docstring)."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, stop)
    for signum in IGNORED_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


class StopRequested(Exception):
    """A stop signal arrived before the server was serving: stop without serving."""


class StopSignals:
    """The stop signals as a clean stop, from the moment this is made (before the server
    listens). Until `hold` a signal raises StopRequested out of start-up; from then on it is
    remembered and `serve` stops at once; once serving, it shuts the server down."""

    def __init__(self) -> None:
        self._server: Server | None = None
        self._signum = 0  # the signal that asked for the stop, once one did
        self._interruptible = True
        handle_signals(self._stop)

    def _stop(self, signum: int, _frame: Any) -> None:
        log.info("signal %d: stopping", signum)
        self._signum = signum
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
        if was and self._signum:
            raise StopRequested(self._signum)

    def serve(self, server: Server, ready: Callable[[Server], None] = lambda _: None) -> None:
        """Serve in the foreground until a stop signal, then stop cleanly; `ready` runs
        once a signal would stop the server (it may already be stopping)."""
        self._server = server
        if self._signum:
            server.shutdown(wait=False)
        ready(server)
        server.serve_forever()
