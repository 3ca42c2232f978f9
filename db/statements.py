"""Statements compiled once per dialect, for the unit of work to run on the driver's connection.

A `Compiled` holds a statement's SQL, its placeholders' order and its type conversions;
`STATEMENTS` keeps them by statement, so a module's statement is compiled once per dialect.
"""
from __future__ import annotations

import operator
import weakref
from collections import namedtuple
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Delete, Dialect, Insert, Select, Update, bindparam, insert
from sqlalchemy.exc import InvalidRequestError
from sqlalchemy.sql import ClauseElement


class Compiled:
    """One statement's SQL, parameter layout, and type conversions for one dialect."""

    def __init__(self, statement: ClauseElement, dialect: Dialect) -> None:
        compiled = statement.compile(dialect=dialect)
        self.sql = str(compiled)
        self.writes = isinstance(statement, Insert | Update | Delete)
        self.expanding = "POSTCOMPILE" in self.sql  # an IN of a list: SQLAlchemy renders it per call
        self.defaults = {k: v for k, v in compiled.params.items() if v is not None}
        for column in getattr(compiled, "insert_prefetch", ()):  # columns left to a Python default
            if column.default is not None and column.default.is_scalar:
                self.defaults.setdefault(column.key, column.default.arg)
        self.binds = {name: processor for name, bind in getattr(compiled, "binds", {}).items()
                      if (processor := bind.type.dialect_impl(dialect).bind_processor(dialect))}
        self.merges = bool(self.defaults or self.binds)  # parameters needs more than the caller's
        self.texts: list[bytes] | None = None  # MySQL: the SQL cut at its placeholders
        if getattr(compiled, "positional", False):  # SQLite's ? placeholders
            self.order = list(getattr(compiled, "positiontup", None) or [])
        else:  # MySQL's %(name)s: cut once, the driver fills the values in (db.mysql_dbapi)
            from .mysql_dbapi import template

            self.texts, self.order = template(self.sql)
        self._pick = _picker(self.order)
        columns = getattr(statement, "selected_columns", None) if isinstance(statement, Select) else None
        self.row = _row_type(list(columns.keys())) if columns is not None else None
        self.results = [c.type.dialect_impl(dialect).result_processor(dialect, None)
                        for c in columns] if columns is not None else []
        self.converts = any(self.results)

    def parameters(self, params: dict[str, Any]) -> Sequence[Any]:
        """The values in the order of the statement's placeholders, as the driver takes them."""
        values = params
        if self.merges:
            values = {**self.defaults, **params}
            for name, processor in self.binds.items():
                if name in values:
                    values[name] = processor(values[name])
        try:
            return self._pick(values)
        except KeyError as exc:
            raise InvalidRequestError(f"a value is required for the parameter {exc.args[0]!r}") from None

    def rows(self, raw: Sequence[Sequence[Any]]) -> list[Any]:
        """Driver rows as named tuples, each value converted as its column's type says."""
        assert self.row is not None
        if self.converts:
            return [self.row(*[p(v) if p else v for p, v in zip(self.results, values, strict=True)])
                    for values in raw]
        return [self.row(*values) for values in raw]


def _picker(names: list[str]) -> Callable[[dict[str, Any]], Sequence[Any]]:
    """A function of a dict that gives the values of `names` in order (KeyError if one lacks)."""
    if not names:
        return lambda _values: ()
    if len(names) == 1:
        name = names[0]
        return lambda values: (values[name],)
    return operator.itemgetter(*names)


def _row_type(names: list[str]) -> type:
    base = namedtuple("Row", names, rename=True)  # type: ignore[misc]
    return type("Row", (base,), {"__slots__": (), "_mapping": property(lambda self: self._asdict())})


class StatementCache:
    """Statements compiled once per dialect. A statement seen once is held weakly: one made
    per call (with its values in it) is compiled per call and freed with it. One seen again
    (a module's statement, reused) goes to a plain dict, where the unit of work finds it
    without a Python call (a weak dict's lookup is one); should that dict reach
    MAX_STATEMENTS (a statement made per call and run twice, many times over), it starts again."""

    MAX_STATEMENTS = 4096

    def __init__(self) -> None:
        self._by_dialect: dict[str, dict[Any, Compiled]] = {}
        self._seen_once: dict[str, weakref.WeakKeyDictionary[Any, Compiled]] = {}
        self._rows: dict[tuple[Any, tuple[str, ...], int], Insert] = {}

    def of(self, dialect: Dialect) -> dict[Any, Compiled]:
        """The dialect's statements seen more than once, compiled, by statement (read it only)."""
        found = self._by_dialect.get(dialect.name)
        if found is None:
            found = self._by_dialect.setdefault(dialect.name, {})
        return found

    def compiled(self, statement: ClauseElement, dialect: Dialect) -> Compiled:
        """The statement compiled for the dialect."""
        reused = self.of(dialect)
        found = reused.get(statement)
        if found is not None:
            return found
        seen_once = self._seen_once.get(dialect.name)
        if seen_once is None:
            seen_once = self._seen_once.setdefault(dialect.name, weakref.WeakKeyDictionary())
        found = seen_once.get(statement)
        if found is None:
            found = seen_once[statement] = Compiled(statement, dialect)
        else:  # seen again: a statement that is reused
            if len(reused) >= self.MAX_STATEMENTS:
                reused.clear()
            reused[statement] = found
        return found

    def rows_insert(self, statement: Insert, columns: tuple[str, ...], count: int) -> Insert:
        """An INSERT of `count` rows in one VALUES list (parameters `column_n`)."""
        key = (statement.table, columns, count)
        found = self._rows.get(key)
        if found is None:
            values: list[dict[str, Any]] = [{c: bindparam(f"{c}_{n}") for c in columns} for n in range(count)]
            found = self._rows[key] = insert(statement.table).values(values)  # type: ignore[arg-type]
        return found


STATEMENTS = StatementCache()
