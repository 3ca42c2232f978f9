"""A call's driver connection, checked out of the engine's pool (`engine.raw_connection()`: 6-16 µs
a checkout and return) and given back at its end."""
from __future__ import annotations

import re
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from .engine import BATCHES_KEY

_CURSOR = "market_cursor"
# What the driver's cursor fills in: %(name)s, with the quoted value; every other % as written
_PARAMETER = re.compile(rb"%\(([^)]+)\)s")
# The driver's errors of a connection that is gone: some arrive as DatabaseError, which
# SQLAlchemy's is_disconnect does not look at
_CONNECTION_LOST = frozenset({2006, 2013, 2014, 2045, 2048, 2055})


class DriverConnection:
    """One driver connection from the pool, and what a unit of work asks of it."""

    def __init__(self, engine: Engine) -> None:
        self.engine, self.dialect = engine, engine.dialect
        dbapi = self.dialect.loaded_dbapi
        try:
            self.proxied = engine.raw_connection()
        except dbapi.Error as exc:  # raised as SQLAlchemy raises a failed connect
            raise DBAPIError.instance(None, None, exc, dbapi.Error, dialect=self.dialect,
                                      connection_invalidated=self.dialect.is_disconnect(exc, None, None),
                                      ) from exc
        self.driver: Any = self.proxied.driver_connection
        self.batches = bool(self.proxied.info.get(BATCHES_KEY, False))
        self.usable = True

    def run(self, sql: str, values: dict[str, Any]) -> tuple[list[Any], int, int | None]:
        """One statement (SQLite): its rows, rowcount and new id, on a cursor kept with the connection."""
        cursor = self.proxied.info.get(_CURSOR)
        if cursor is None:
            cursor = self.proxied.info[_CURSOR] = self.driver.cursor()
        cursor.execute(sql, values)
        return (cursor.fetchall() if cursor.description else []), cursor.rowcount, cursor.lastrowid

    def run_all(self, sql: str, values: dict[str, Any]) -> list[tuple[list[Any], int, int | None]]:
        """One query of one or more statements (MySQL/MariaDB): each one's rows, rowcount and new id.
        Not through the driver's cursor, which parses the SQL to split it (about a third of a
        server's CPU per call). Every result is read, so a later statement's error comes here."""
        cnx = self.driver
        quoted = cnx.prepare_for_mysql(values)
        cnx.cmd_query(_PARAMETER.sub(lambda m: quoted[m[1]], sql.encode()))
        outcomes: list[tuple[list[Any], int, int | None]] = []
        while True:
            if cnx.result_set_available:
                outcomes.append((cnx.get_rows()[0], -1, None))
            else:
                status = cnx.fetch_eof_status()
                outcomes.append(([], status["affected_rows"], status["insert_id"]))
            if not cnx.next_result():
                return outcomes

    def translated(self, exc: Exception, sql: str) -> Exception:
        """A driver error as SQLAlchemy raises it (IntegrityError ...); a lost connection is
        invalidated, and with it every connection of the pool opened before now."""
        dbapi = self.dialect.loaded_dbapi
        if not isinstance(exc, dbapi.Error):
            if getattr(exc, "errno", None) is None:  # not the driver's: a bug, as it is
                return exc
            # the driver's C extension raises a later statement's error untranslated
            exc = dbapi.errors.get_mysql_exception(exc.errno, getattr(exc, "msg", str(exc)),  # type: ignore[attr-defined]
                                                   getattr(exc, "sqlstate", None))
        disconnect = getattr(exc, "errno", None) in _CONNECTION_LOST or \
            self.dialect.is_disconnect(exc, self.driver, None)  # type: ignore[arg-type]
        if disconnect:
            self.usable = False
            self.proxied.invalidate(exc)
            self.engine.dispose(close=False)
        return DBAPIError.instance(sql, None, exc, dbapi.Error, connection_invalidated=disconnect,
                                   dialect=self.dialect)

    def give_back(self) -> None:
        """Return it to the pool; one that died, or is left in a transaction (a failed COMMIT
        whose ROLLBACK failed too, say: it would keep its locks), is closed instead."""
        if self.usable and self.driver.in_transaction:
            self.usable = False
            self.proxied.invalidate()
        self.proxied.close()
