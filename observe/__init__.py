"""Seeing the servers run: Prometheus metrics, structured logs, request ids, OpenTelemetry
spans (`tracing`) and per-request timestamps for simulation.tail (`trace`)."""
