"""The unit of work: the transaction object Database.run hands to a transaction function
(docs/design.md, "Data layer"). A write is held and answered with a pending Result, sent before
the next read, at COMMIT, or when its result is read; on MySQL/MariaDB in the query of the
statement that follows it (START TRANSACTION and COMMIT too).
"""
from __future__ import annotations

import re
from collections import defaultdict, namedtuple
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar, cast
from weakref import WeakKeyDictionary

from sqlalchemy import Dialect, Insert, Select, bindparam, insert, text
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler

from .commit_tokens import WRITE_TOKEN, CommitToken
from .engine import begin_immediate

T = TypeVar("T")
ROW_CHUNK = 20  # rows per INSERT of many rows
_PLACEHOLDER = re.compile(r"%\(([^)]+)\)s")
Held = tuple["Statement", dict[str, Any], "Result | None"]


class Statement:
    """A Core statement compiled for one dialect: its SQL, its own values, how values and rows convert."""

    def __init__(self, statement: ClauseElement, dialect: Dialect) -> None:
        compiled = statement.compile(dialect=dialect, compile_kwargs={"render_postcompile": True})
        self.sql = str(compiled)
        reads = bool(getattr(statement, "is_select", False))  # a SELECT, or a UNION of them
        self.writes = not reads
        self.defaults = {k: v for k, v in (compiled.params or {}).items() if v is not None}
        binds = compiled.binds if isinstance(compiled, SQLCompiler) else {}  # none in DDL
        self.binds = {name: processor for name, bind in binds.items()
                      if (processor := bind.type.dialect_impl(dialect).bind_processor(dialect))}
        columns = statement.selected_columns if reads else None  # type: ignore[attr-defined]
        self.row = namedtuple("Row", list(columns.keys()), rename=True) if columns is not None else None  # type: ignore[misc]
        self.results = [c.type.dialect_impl(dialect).result_processor(dialect, None)
                        for c in columns] if columns is not None else []
        self._placed: dict[int, str] = {}

    def values(self, params: dict[str, Any]) -> dict[str, Any]:
        """The caller's values with the statement's own, each converted as its type says."""
        if not (self.defaults or self.binds):
            return params
        values = {**self.defaults, **params}
        for name, processor in self.binds.items():
            if name in values:
                values[name] = processor(values[name])
        return values

    def placed(self, n: int) -> str:
        """The SQL with each %(name)s renamed %(name__n)s (MySQL: several in one query)."""
        sql = self._placed.get(n)
        if sql is None:
            sql = self._placed[n] = _PLACEHOLDER.sub(rf"%(\1__{n})s", self.sql)
        return sql

    def rows(self, raw: Sequence[Sequence[Any]]) -> list[Any]:
        """Driver rows as named tuples, converted as their columns' types say (text() SQL's as they are)."""
        if self.row is None:
            return list(raw)
        if any(self.results):
            return [self.row(*[p(v) if p else v for p, v in zip(self.results, r, strict=True)])  # type: ignore[misc,arg-type]
                    for r in raw]
        return [self.row(*r) for r in raw]


_START, _COMMIT, _ROLLBACK = text("START TRANSACTION"), text("COMMIT"), text("ROLLBACK")
_AFTER_ANSWER = "nothing runs in a transaction after its answer (UnitOfWork.answer)"
# by dialect, by statement (two threads making a dialect's at once: one is kept, no harm)
_COMPILED: defaultdict[str, WeakKeyDictionary[Any, Statement]] = defaultdict(WeakKeyDictionary)


def compiled(statement: ClauseElement, dialect: Dialect) -> Statement:
    """The statement compiled for the dialect: a module's once, one made per call per call."""
    key = f"{dialect.name}:{dialect.paramstyle}"  # the SQL's placeholders depend on both
    by_statement = _COMPILED[key]
    found = by_statement.get(statement)
    if found is None:
        found = by_statement[statement] = Statement(statement, dialect)
    return found


class Result:
    """A statement's rows, or its row count and new id; reading it sends what is held."""

    filled = False  # the database's answer arrived

    def __init__(self, uow: UnitOfWork | None = None) -> None:
        self._uow = uow
        self._rows: list[Any] = []
        self._rowcount, self._lastrowid = -1, cast("int | None", None)  # -1 also: its answer was lost

    def fill(self, rows: list[Any], rowcount: int, lastrowid: int | None) -> None:
        self._rows, self._rowcount, self._lastrowid, self._uow = rows, rowcount, lastrowid, None
        self.filled = True

    def _ready(self) -> Result:
        if self._uow is not None:
            self._uow.flush(demanded=self)
        return self

    @property
    def rowcount(self) -> int:
        return self._ready()._rowcount

    @property
    def lastrowid(self) -> int | None:
        return self._ready()._lastrowid

    def all(self) -> list[Any]:
        return list(self._ready()._rows)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.all())

    def first(self) -> Any | None:
        return next(iter(self._ready()._rows), None)

    def one(self) -> Any:
        rows = self._ready()._rows
        if len(rows) != 1:
            raise ValueError(f"expected one row, found {len(rows)}")
        return rows[0]

    def scalar(self) -> Any | None:
        row = self.first()
        return row[0] if row is not None else None

    def scalar_one(self) -> Any:
        return self.one()[0]

    def scalars(self) -> _Scalars:
        return _Scalars(row[0] for row in self.all())


class _Scalars(list[Any]):
    def all(self) -> list[Any]:
        return list(self)


class Answer(Generic[T]):
    """A read made last (UnitOfWork.answer), and how its rows become the answer."""

    def __init__(self, statement: Select, params: dict[str, Any], shape: Callable[[list[Any]], T]) -> None:
        self.statement, self.params, self.shape = statement, params, shape
        self.result = Result()  # filled by the query that carries the COMMIT


class ReplayUnheld(Exception):
    """A held write broke a constraint: run the transaction again with nothing held, so that
    its error arrives at the statement that made it, where the caller may handle it."""


class CommitUnanswered(Exception):
    """The connection was lost in the query that carried the COMMIT: the transaction may have
    committed or not, and its token says which (db.commit_tokens.committed)."""

    def __init__(self, token: CommitToken) -> None:
        super().__init__("the connection was lost before the COMMIT was answered")
        self.token = token
        self.result: Any = None  # what the transaction returned: it stands if it committed


class UnitOfWork:
    """One transaction's statements on one driver connection: what it holds fails with the statement
    it is sent with, and the transaction rolls back."""

    def __init__(self, conn: Any, write: bool, hold: bool, token: CommitToken | None) -> None:
        self.conn, self.dialect = conn, conn.dialect
        self._sqlite = self.dialect.name == "sqlite"
        self.write, self.token = write, token
        self.sent = 0  # statements sent: Database.run retries a call that sent none
        self._batches = hold and conn.batches
        self._begin_pending = self._open = False
        self._held: list[Held] = []
        self._answer: Answer[Any] | None = None

    def execute(self, statement: Any, params: dict[str, Any] | Sequence[dict[str, Any]] | None = None) -> Any:
        """Run a Core statement: a write is held, a read runs now; a list of rows for an INSERT goes
        in INSERTs of up to ROW_CHUNK rows."""
        if self._answer is not None:
            raise RuntimeError(_AFTER_ANSWER)
        if isinstance(params, Sequence):  # the rows of a plain INSERT
            for part, values in _row_chunks(statement, params):
                self.execute(part, values)
            return None
        result = Result(self)
        prepared = compiled(statement, self.dialect)
        self._held.append((prepared, params or {}, result))
        if not (prepared.writes and self.write and self._batches):  # a read: sent now
            self.flush(demanded=result)
        return result

    def flush(self, demanded: Result | None = None) -> None:
        """Send every held statement now. Should one held before (not `demanded` now) break a
        constraint, ReplayUnheld: the code that made it may be waiting for that error."""
        if not self._held and not self._begin_pending:
            return
        held, self._held = self._held, []
        try:
            self._send(held)
        except IntegrityError:
            if any(s.writes and r is not demanded for s, _, r in held):
                raise ReplayUnheld from None
            raise

    def answer(self, statement: Select, params: dict[str, Any], shape: Callable[[list[Any]], T]) -> Answer[T]:
        """The transaction's answer, a read made after everything else (with the COMMIT, on
        MySQL/MariaDB in its query): Database.run hands back `shape(rows)` once committed."""
        if self._answer is not None:
            raise RuntimeError(_AFTER_ANSWER)
        self._answer = Answer(statement, params, shape)
        return self._answer

    def begin(self) -> None:
        """Open the write transaction (on MySQL with its first statement)."""
        if not self.write:
            return
        self._open = True
        if self._sqlite:
            self._guarded(lambda: begin_immediate(self.conn.proxied), "BEGIN IMMEDIATE")
        else:  # even on Galera: nothing can be aborted before the first statement
            self._begin_pending = True

    def commit(self) -> None:
        """Send what is held with COMMIT; nothing to commit when nothing was ever sent.
        CommitUnanswered if the connection is lost meanwhile and the token was written."""
        if self._answer is not None:
            answer = self._answer
            self._held.append((compiled(answer.statement, self.dialect), answer.params, answer.result))
            if not (self._open and self._batches):  # a read transaction, or a Galera node
                self.flush()
        if self._open and not self._begin_pending or self._held:
            self._held.append((compiled(_COMMIT, self.dialect), {}, None))
            try:
                self.flush()
            except DBAPIError as exc:
                if exc.connection_invalidated and self.token is not None:  # the token went first
                    raise CommitUnanswered(self.token) from exc
                raise
        self._begin_pending = self._open = False

    def rollback(self) -> None:
        """Forget what is held and end the transaction, if the server has one open."""
        self._held, self._begin_pending, self._answer = [], False, None
        if self._open and self.conn.usable and self.conn.driver.in_transaction:
            self._send([(compiled(_ROLLBACK, self.dialect), {}, None)])
        self._open = False

    def _send(self, batch: list[Held]) -> None:
        """Send the statements: in one query on MySQL/MariaDB, one by one on SQLite."""
        # the values first: a type's error leaves the transaction as it was (unopened)
        values = [s.values(p) for s, p, _ in batch]
        if self._begin_pending:  # START TRANSACTION, and the commit token if there is one
            opening: list[Held] = [(compiled(_START, self.dialect), {}, None)]
            if self.token is not None:
                opening.append((compiled(WRITE_TOKEN, self.dialect), self.token, None))
            batch, self._begin_pending = opening + batch, False
            values[:0] = [s.values(p) for s, p, _ in opening]
        if self._sqlite:
            outcomes = [self._guarded(lambda s=s, v=v: self.conn.run(s.sql, v), s.sql)  # type: ignore[misc]
                        for (s, _, _), v in zip(batch, values, strict=True)]
        elif len(batch) == 1:
            sql = batch[0][0].sql
            outcomes = self._guarded(lambda: self.conn.run_all(sql, values[0]), sql)
        else:
            placed = {f"{k}__{n}": v for n, given in enumerate(values) for k, v in given.items()}
            sql = ";".join(s.placed(n) for n, (s, _, _) in enumerate(batch))
            outcomes = self._guarded(lambda: self.conn.run_all(sql, placed), sql)
        for (statement, _, result), (rows, rowcount, lastrowid) in zip(batch, outcomes, strict=False):
            if result is not None:
                result.fill(statement.rows(rows), rowcount, lastrowid)
        self.sent += len(batch)

    def _guarded(self, send: Callable[[], T], sql: str) -> T:
        """Run `send`; a driver error raised as SQLAlchemy raises it (IntegrityError ...)."""
        try:
            return send()
        except Exception as exc:
            self._held = []
            error = self.conn.translated(exc, sql)
            if error is exc:  # not the driver's: as it is
                raise
            raise error from exc


_ROWS: dict[tuple[Any, tuple[str, ...], int], Insert] = {}  # an INSERT by table, columns, rows


def _row_chunks(statement: Insert, rows: Sequence[dict[str, Any]]) -> Iterator[tuple[Insert, dict[str, Any]]]:
    """INSERTs of up to ROW_CHUNK rows each, and their values (parameters `column_n`)."""
    columns = tuple(rows[0]) if rows else ()
    for start in range(0, len(rows), ROW_CHUNK):
        part = rows[start:start + ROW_CHUNK]
        key = (statement.table, columns, len(part))
        if key not in _ROWS:
            values: list[dict[str, Any]] = [{c: bindparam(f"{c}_{n}") for c in columns}
                                            for n in range(len(part))]
            _ROWS[key] = insert(statement.table).values(values)  # type: ignore[arg-type]
        yield _ROWS[key], {f"{c}_{n}": row[c] for n, row in enumerate(part) for c in columns}
