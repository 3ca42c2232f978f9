"""Seeing the servers run: Prometheus metrics, structured logs, request ids and traces.

`server` observes the server loop (through wire.observer's hooks), `events` counts and logs
what the data layer and the ops see, `logs` sets up logging, `tracing` gives each request its
id and (configured) its OpenTelemetry span, `trace` writes timestamps for the tail analysis,
and `serving` wires it all into a server process (and the supervisor of `--workers N`).
"""
