"""The data layer: schema, engine factory, transaction runner, and the transaction
functions of each area (accounts and sessions, catalog and search, carts, orders).

Every SQL statement of the project lives in this package.
"""
from .database import Database, DatabaseUnusable, RetryTransaction, now_ms

__all__ = ["Database", "DatabaseUnusable", "RetryTransaction", "now_ms"]
