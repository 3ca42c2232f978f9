"""Core statements compiled once per dialect and run on the driver directly.

SQLAlchemy's per-execution machinery costs about 80 µs of CPU per statement here,
several times the cost of a simple indexed query, and a call makes three or four of
them. A Prepared statement keeps SQLAlchemy for what it is good at (one statement
definition, compiled correctly for SQLite or MySQL) and skips it on the hot path.
On MySQL a statement does not even need a cursor (engine's run_statement); on
SQLite it runs on a cursor, which is cheap there. Driver errors are re-raised as
SQLAlchemy's, so Database.run handles them as usual.

Round trips are what a loaded server pays most for on MySQL, so a write whose result
nobody reads can be deferred: it travels with the transaction's next statement, or
with its COMMIT (`Prepared.defer`); statements whose results are all needed can
share one query (`run_together`); and a transaction's last statement can carry its
COMMIT (`Prepared.all_then_commit`). On SQLite, in the same process, all of them
simply run now (and the COMMIT comes when the transaction ends, as usual), and so they
do on a Galera node (engine's _QuietConnection says why).
"""
from __future__ import annotations

from collections import namedtuple
from collections.abc import Iterator, Sequence
from typing import Any

from sqlalchemy import Connection, Dialect, Table, bindparam, insert
from sqlalchemy.sql import ClauseElement

from .engine import WRITE_KEY, count_statement, driver_error


class _Compiled:
    """One statement's SQL and parameter layout for one dialect."""

    def __init__(self, statement: ClauseElement, dialect: Dialect) -> None:
        compiled = statement.compile(dialect=dialect)
        self.sql = str(compiled)
        self.defaults = {k: v for k, v in compiled.params.items() if v is not None}
        for column in getattr(compiled, "insert_prefetch", ()):  # columns left to a Python default
            if column.default is not None and column.default.is_scalar:
                self.defaults.setdefault(column.key, column.default.arg)
        positional = getattr(compiled, "positional", False)
        self.order = list(getattr(compiled, "positiontup", None) or []) if positional else None
        columns = getattr(statement, "selected_columns", None)
        self.row = namedtuple("Row", list(columns.keys()), rename=True) if columns is not None else None

    def parameters(self, params: dict[str, Any]) -> Sequence[Any] | dict[str, Any]:
        values = {**self.defaults, **params}
        return [values[name] for name in self.order] if self.order is not None else values


class Prepared:
    """A statement with named bind parameters, run with plain values."""

    def __init__(self, statement: ClauseElement) -> None:
        self.statement = statement
        self._by_dialect: dict[str, _Compiled] = {}

    def _compiled(self, tx: Connection) -> _Compiled:
        name = tx.dialect.name
        compiled = self._by_dialect.get(name)
        if compiled is None:
            compiled = self._by_dialect[name] = _Compiled(self.statement, tx.dialect)
        return compiled

    def _bound(self, tx: Connection, params: dict[str, Any] | None) -> tuple[str, Any]:
        """Its SQL for this connection's dialect, and the values in the order the SQL takes them."""
        compiled = self._compiled(tx)
        return compiled.sql, compiled.parameters(params or {})

    def execute(self, tx: Connection, params: dict[str, Any] | None = None) -> Any:
        """Run it; a result with fetchall(), fetchone(), rowcount and lastrowid."""
        sql, values = self._bound(tx, params)
        driver = tx.connection.driver_connection
        run_statement = getattr(driver, "run_statement", None)  # MySQL: no cursor needed
        cursor = None if run_statement else driver.cursor()  # type: ignore[union-attr]
        try:
            if run_statement:
                result = run_statement(sql, values)
            else:
                cursor.execute(sql, values)  # type: ignore[union-attr]
                result = cursor
        except tx.dialect.loaded_dbapi.Error as exc:
            raise driver_error(tx, sql, values, exc, cursor) from exc
        count_statement(tx.info)
        return result

    def defer(self, tx: Connection, params: dict[str, Any] | None = None) -> None:
        """Run it with the transaction's next statement or its COMMIT (on MySQL; now elsewhere).

        For a write whose result is not needed: an error it raises arrives with that later
        statement (or from the commit), and the whole transaction rolls back as usual."""
        driver = _batching_driver(tx)
        if driver is None or not _in_write_transaction(tx):
            self.execute(tx, params)
            return
        driver.defer_statement(*self._bound(tx, params))
        count_statement(tx.info)  # counted as sent: Database.run then never retries it elsewhere

    def all(self, tx: Connection, params: dict[str, Any] | None = None) -> Sequence[Any]:
        """Every row, as named tuples."""
        return self.rows_of(tx, self.execute(tx, params))

    def all_then_commit(self, tx: Connection, params: dict[str, Any] | None = None) -> Sequence[Any]:
        """Every row, and on MySQL the transaction's COMMIT in the same query.

        For a write transaction's last statement: once it has run the transaction is
        committed, so nothing after it may fail or send another statement."""
        (result,) = run_together(tx, [(self, params or {})], commit=True)
        return self.rows_of(tx, result)

    def rows_of(self, tx: Connection, result: Any) -> list[Any]:
        """A result of this statement (from run_together, say) as named tuples."""
        row = self._compiled(tx).row
        assert row is not None, "not a SELECT"
        return [row(*values) for values in result.fetchall()]

    def first(self, tx: Connection, params: dict[str, Any] | None = None) -> Any | None:
        """The first row, or None."""
        row = self._compiled(tx).row
        assert row is not None, "not a SELECT"
        values = self.execute(tx, params).fetchone()
        return row(*values) if values is not None else None

    def scalar(self, tx: Connection, params: dict[str, Any] | None = None) -> Any | None:
        """The first column of the first row, or None."""
        values = self.execute(tx, params).fetchone()
        return values[0] if values is not None else None


def _batching_driver(tx: Connection) -> Any | None:
    """The MySQL driver connection, if it may put several statements in one query."""
    driver = tx.connection.driver_connection
    return driver if getattr(driver, "batches", False) else None


def _in_write_transaction(tx: Connection) -> bool:
    """Inside Database.run's transaction of a write (a read runs statement by statement)."""
    return bool(tx.info.get(WRITE_KEY, True)) and tx.in_transaction()


def run_together(tx: Connection, statements: Sequence[tuple[Prepared, dict[str, Any]]],
                 commit: bool = False) -> list[Any]:
    """Run the statements in order, on MySQL in one query (one round trip); their results.

    With `commit`, in a write transaction, the query ends with COMMIT: see
    Prepared.all_then_commit (elsewhere nothing is held for a COMMIT, and none is sent)."""
    driver = _batching_driver(tx)
    commit = commit and _in_write_transaction(tx)
    if driver is None or (len(statements) < 2 and not commit):
        return [prepared.execute(tx, params) for prepared, params in statements]
    sent = [prepared._bound(tx, params) for prepared, params in statements]
    try:
        results = driver.run_statements(sent, commit=commit)
    except tx.dialect.loaded_dbapi.Error as exc:
        raise driver_error(tx, "; ".join(sql for sql, _ in sent), sent, exc, None) from exc
    for _ in sent:
        count_statement(tx.info)
    return results  # type: ignore[no-any-return]


class PreparedRows:
    """An INSERT of many rows in one statement (one Prepared per row count), not executemany.

    SQLAlchemy's executemany path costs about as much Python as the statement itself;
    a multi-row VALUES list also makes one round trip on every driver. Rows go in
    statements of at most `chunk` rows, so few statements are ever compiled.
    """

    def __init__(self, table: Table, columns: Sequence[str], chunk: int = 20) -> None:
        self.table, self.columns, self.chunk = table, tuple(columns), chunk
        self._by_count: dict[int, Prepared] = {}

    def execute(self, tx: Connection, rows: Sequence[dict[str, Any]]) -> None:
        """Insert `rows` (each a dict holding every column)."""
        for statement, params in self._parts(rows):
            statement.execute(tx, params)

    def defer(self, tx: Connection, rows: Sequence[dict[str, Any]]) -> None:
        """Insert `rows` with the transaction's next statement or its COMMIT (see Prepared.defer)."""
        for statement, params in self._parts(rows):
            statement.defer(tx, params)

    def _parts(self, rows: Sequence[dict[str, Any]]) -> Iterator[tuple[Prepared, dict[str, Any]]]:
        for start in range(0, len(rows), self.chunk):
            part = rows[start:start + self.chunk]
            yield self._statement(len(part)), {f"{column}_{n}": row[column]
                                               for n, row in enumerate(part) for column in self.columns}

    def _statement(self, count: int) -> Prepared:
        prepared = self._by_count.get(count)
        if prepared is None:
            values: list[dict[str, Any]] = [{column: bindparam(f"{column}_{n}") for column in self.columns}
                                            for n in range(count)]
            prepared = self._by_count[count] = Prepared(insert(self.table).values(values))
        return prepared
