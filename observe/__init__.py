"""Seeing the servers run: Prometheus metrics, structured logs and per-request tracing.

`server` observes the server loop (through wire.observer's hooks), `events` counts what the
data layer sees, `logs` sets up logging, `trace` writes timestamps for the tail analysis,
and `serving` wires it all into a server process (and the supervisor of `--workers N`).
"""
