"""The servers' Prometheus metrics, defined once for every process (with `--workers N`, in
prometheus_client's multiprocess mode: see observe.serving). docs/operations.md lists them.
"""
from __future__ import annotations

import platform

from prometheus_client import Counter, Gauge, Histogram

from wire import PROTOCOL_VERSION, __version__

# Set by start(): /metrics is served. Gauges changed on every call (DB_CONNECTIONS_IN_USE)
# are kept only then; nobody could read them otherwise.
served = False
server = ""  # the `server` label of this process's own events (start() names it: buyer, seller)

# 0.1 ms to 10 s: a cached read answers in a fraction of a millisecond, a login hashes for tens
DURATION_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                    0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
FRAME_ERROR_OP = "frame"  # a frame that could not be read has no op

REQUESTS = Counter("market_requests", "Requests answered, by op and answer code (OK or the error code).",
                   ["server", "op", "code"])
DURATION = Histogram("market_request_duration_seconds",
                     "Seconds from reading a request to handing its answer to the socket.",
                     ["server", "op"], buckets=DURATION_BUCKETS)
CONNECTIONS_OPEN = Gauge("market_connections_open", "Client connections open.", ["server"],
                         multiprocess_mode="livesum")
CONNECTIONS_REFUSED = Counter("market_connections_refused",
                              "Connections turned away, by reason (max_connections, "
                              "max_connections_per_address, new_connections_per_address, tls_handshake, "
                              "out_of_descriptors), or left unread a while (memory).",
                              ["server", "reason"])
THREADS_BUSY = Gauge("market_threads_busy", "Worker threads answering requests.", ["server"],
                     multiprocess_mode="livesum")
REQUESTS_QUEUED = Gauge("market_requests_queued", "Requests read and waiting for a thread.", ["server"],
                        multiprocess_mode="livesum")
DB_CONNECTIONS_IN_USE = Gauge("market_db_connections_in_use",
                              "Database connections taken by a transaction right now.", ["server"],
                              multiprocess_mode="livesum")
DB_RETRIES = Counter("market_db_retries",
                     "Transactions run again, by cause (deadlock, reconnect, conflict, commit_lost), or "
                     "given up after a lock wait (lock_wait).", ["server", "cause"])
LOGINS_REFUSED = Counter("market_logins_refused",
                         "Logins refused, by reason (wrong_credentials, throttled, address_throttled, busy, "
                         "address_busy).", ["server", "reason"])
SIGNUPS_REFUSED = Counter("market_signups_refused", "Sign-ups refused, by reason (address_limit, busy, "
                          "address_busy).", ["server", "reason"])
PAYMENTS = Counter("market_payments", "Card charges at purchase, by outcome (approved, declined, error).",
                   ["server", "outcome"])
SETTLEMENT_DUE = Gauge("market_settlement_due",
                       "Orders the settler found pending past their time at its last pass; one that "
                       "stays up is a backlog it cannot settle (the database or the processor failing).",
                       ["server"], multiprocess_mode="livemax")
BUILD_INFO = Gauge("market_build_info", "1, labelled with the running code's version, protocol and Python.",
                   ["server", "version", "protocol", "python"], multiprocess_mode="max")

# Every value each label takes, so each series exists at 0 from the start (rate() sees 0, not no data).
LABEL_VALUES = (
    (CONNECTIONS_REFUSED, ("max_connections", "max_connections_per_address", "new_connections_per_address",
                           "tls_handshake", "out_of_descriptors", "memory")),
    (DB_RETRIES, ("deadlock", "reconnect", "conflict", "commit_lost", "lock_wait")),
    (LOGINS_REFUSED, ("wrong_credentials", "throttled", "address_throttled", "busy", "address_busy")),
    (SIGNUPS_REFUSED, ("address_limit", "busy", "address_busy")),
    (PAYMENTS, ("approved", "declined", "error")),
)


def start(role: str, serve: bool = False) -> None:
    """Name this process's server `role` and make every series it reports at 0, each reason
    and outcome (the requests' are made by its observer, observe.observers); `serve`: /metrics
    is served (--metrics-port)."""
    global server, served
    server, served = role, serve
    BUILD_INFO.labels(role, __version__, PROTOCOL_VERSION, platform.python_version()).set(1)
    for gauge in (CONNECTIONS_OPEN, THREADS_BUSY, REQUESTS_QUEUED, DB_CONNECTIONS_IN_USE, SETTLEMENT_DUE):
        gauge.labels(role)
    for metric, values in LABEL_VALUES:
        for value in values:
            metric.labels(role, value)
