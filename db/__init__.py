"""The data layer: schema, engine factory, transaction runner, and the transaction functions of
each area. Every SQL statement of the servers lives in this package (docs/design.md, "Data layer").
"""
from .database import Database, DatabaseUnusable, RetryTransaction, now_ms

__all__ = ["Database", "DatabaseUnusable", "RetryTransaction", "now_ms"]
