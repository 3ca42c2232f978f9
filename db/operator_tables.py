"""The tables of the operator's commands (suspensions, admin_actions): revision 0006_admin.

One function, `upgrade(conn)`, safe to run twice (each table is created only if missing):
on MySQL a CREATE TABLE ends the transaction, and two servers may upgrade at once.
"""
from __future__ import annotations

from sqlalchemy import Connection

from .schema import admin_actions, suspensions


def upgrade(conn: Connection) -> None:
    """Create the suspensions and admin_actions tables of a database of the revision before."""
    for table in (suspensions, admin_actions):
        table.create(conn, checkfirst=True)
