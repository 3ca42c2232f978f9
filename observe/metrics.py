"""The servers' Prometheus metrics (prometheus_client), defined once for every process.

With `--workers N` the supervisor points PROMETHEUS_MULTIPROC_DIR at a fresh folder before
this module is first imported: every worker then writes its values to files there, and the
supervisor's /metrics sums them (multiprocess mode). docs/operations.md lists what each means.
"""
from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

# Set at start (observe.serving.prepare) when /metrics is served: gauges changed on every
# call (DB_CONNECTIONS_IN_USE) are kept only then; nobody could read them otherwise.
served = False

# 0.1 ms to 10 s: a cached read answers in a fraction of a millisecond, a login hashes for tens
DURATION_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                    0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
UNKNOWN_OP = "unknown"  # every op name the server does not serve, so a client cannot grow the labels
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
                              "Database connections taken by a transaction right now.",
                              multiprocess_mode="livesum")
DB_RETRIES = Counter("market_db_retries",
                     "Transactions run again, by cause (deadlock, reconnect, conflict), or given up "
                     "after a lock wait (lock_wait).", ["cause"])
LOGINS_REFUSED = Counter("market_logins_refused",
                         "Logins refused, by reason (wrong_credentials, throttled, address_throttled, busy, "
                         "address_busy).",
                         ["reason"])
SIGNUPS_REFUSED = Counter("market_signups_refused", "Sign-ups refused, by reason (address_limit, busy, "
                          "address_busy).",
                          ["reason"])
PAYMENTS = Counter("market_payments", "Card charges at purchase, by outcome (approved, declined, error).",
                   ["outcome"])
