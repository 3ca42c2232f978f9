"""The data layer: schema, engine factory, transaction runner, and the transaction
functions of each area (accounts and sessions, catalog and search, carts, orders).

Every SQL statement of the servers lives in this package (the measuring tools in
`simulation/` make and drop their databases themselves).
"""
from .database import Database, DatabaseUnusable, RetryTransaction, now_ms

__all__ = ["Database", "DatabaseUnusable", "RetryTransaction", "now_ms"]
