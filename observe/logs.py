"""One logging set-up for the servers, their supervisor and `market serve`: plain text, or JSON
lines (MARKET_LOG_FORMAT=json) with the request's id, op and client address on every line
logged while it is answered. Loggers: "market.security", "market.access", "market.business".
"""
from __future__ import annotations

import contextvars
import logging
import sys
import threading
import time
from datetime import UTC, datetime
from typing import Any

import orjson

FORMATS = ("text", "json")
# the request a thread is answering: (request id, op, client address); set by the server's observer
REQUEST: contextvars.ContextVar[tuple[Any, str, str] | None] = contextvars.ContextVar("market_request",
                                                                                       default=None)
_REQUEST_FIELDS = ("request_id", "op", "client")
security = logging.getLogger("market.security")
access = logging.getLogger("market.access")
business = logging.getLogger("market.business")  # sign-ups, logins, payments, purchases, admin actions
# what a record's `extra` may carry into a JSON line (a password, token or card never is one)
_FIELDS = ("request_id", "op", "code", "duration_ms", "client", "username", "reason", "events",
           "user_id", "order_id", "amount_cents", "outcome", "action", "target")
_BURST_S = 1.0  # at most one line per this many seconds for each kind of event (Bursts)


class Bursts:
    """Keeps a storm of one event to a line a second, saying how many it stands for."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def due(self, kind: str) -> int:
        """0 if this event's line is held back; else how many events the line stands for."""
        now = time.monotonic()
        with self._lock:
            held = self._held.get(kind, 0) + 1
            if now < self._next.get(kind, 0.0):
                self._held[kind] = held
                return 0
            self._next[kind], self._held[kind] = now + _BURST_S, 0
            return held


class _RequestFields(logging.Filter):
    """Copies the current request's id, op and client address onto each record."""

    def filter(self, record: logging.LogRecord) -> bool:
        request = REQUEST.get()
        if request is not None:
            for name, value in zip(_REQUEST_FIELDS, request, strict=True):
                if not hasattr(record, name):
                    setattr(record, name, value)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, server, pid, and the request's fields."""

    def __init__(self, server: str) -> None:
        super().__init__()
        self.server = server

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": _rfc3339(record.created),
            "level": record.levelname, "logger": record.name, "message": record.getMessage(),
            "server": self.server, "pid": record.process, **_fields(record),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {name: value for name in _FIELDS if (value := getattr(record, name, None)) is not None}


def _rfc3339(created: float) -> str:
    """2026-01-31T12:00:00.123Z: UTC, milliseconds (what Cloud Logging and fluent-bit parse)."""
    moment = datetime.fromtimestamp(created, UTC)
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{moment.microsecond // 1000:03d}Z"


class TextFormatter(logging.Formatter):
    """The plain text line, with the request's fields appended as key=value."""

    def __init__(self, server: str) -> None:
        super().__init__(f"%(asctime)s {server} %(process)d %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(f"{name}={value}" for name, value in _fields(record).items())
        text = super().format(record)
        return f"{text} [{fields}]" if fields else text


def configure(server: str, level: str = "INFO", fmt: str = "text") -> None:
    """Send every log record to stderr in the chosen format (replacing earlier handlers)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(server) if fmt == "json" else TextFormatter(server))
    handler.addFilter(_RequestFields())
    logging.basicConfig(handlers=[handler], level=level.upper(), force=True)


def configure_leniently(server: str, level: str, fmt: str) -> None:
    """configure(), an unknown level or format read as the default (for `market serve`, which
    has no server Settings; the servers it starts check the values and refuse wrong ones)."""
    level, fmt = level.upper(), fmt.lower()
    configure(server, level if level in logging.getLevelNamesMapping() else "INFO",
              fmt if fmt in FORMATS else "text")
