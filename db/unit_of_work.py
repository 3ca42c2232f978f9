"""The unit of work: the transaction object Database.run hands to a transaction function.

It runs plain SQLAlchemy Core statements (`tx.execute(statement, params)`) and owns every
batching rule, so that the area modules need none. A write (INSERT, UPDATE, DELETE) is held
and answered with a pending result; what is held is sent before the next read, before a call
that leaves the database (`call_outside`), at COMMIT, or when a held write's result is read.
On MySQL/MariaDB what is held travels in the same query as the statement that follows it
(START TRANSACTION and COMMIT too), through the driver's documented multi-statement support:
one round trip instead of several. A write transaction given a commit token writes it in the
query of its START TRANSACTION (db.commit_tokens), so that a COMMIT whose answer is lost can
be asked about. A transaction whose answer is a read made last (`answer`) sends that read
with its COMMIT too. Statements are compiled once per dialect (StatementCache) and run straight on
the driver's connection (SQLite: one cursor per connection; MySQL: db.mysql_dbapi's `run`),
skipping SQLAlchemy's per-execution machinery; anything else (DDL, text(), executemany) goes
through SQLAlchemy, after a flush.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any, Generic, TypeVar

from sqlalchemy import Connection, Delete, Insert, Select, Update
from sqlalchemy.exc import DBAPIError, IntegrityError

from .commit_tokens import WRITE_TOKEN, CommitToken
from .engine import BATCHES_KEY, PROGRESS_KEY, begin_immediate
from .statements import STATEMENTS, Compiled

T = TypeVar("T")
_CURSOR_KEY = "market_cursor"  # connection info: the driver cursor statements run on
ROW_CHUNK = 20  # rows per INSERT of many rows: few statements are ever compiled
Outcome = tuple[list[Any], int, "int | None"]  # a statement's rows, rowcount, new id


class Result:
    """A statement's rows, or its row count and new id; reading it sends what is held.
    A write whose query lost its answer (a COMMIT asked about after) has rowcount -1: not known."""

    def __init__(self, uow: UnitOfWork | None = None) -> None:
        self._uow = uow
        self._rows: list[Any] = []
        self._rowcount = -1
        self._lastrowid: int | None = None

    def fill(self, rows: list[Any], rowcount: int, lastrowid: int | None) -> None:
        self._rows, self._rowcount, self._lastrowid, self._uow = rows, rowcount, lastrowid, None
        self.filled = True

    filled = False  # the database's answer arrived

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

    @property
    def inserted_primary_key(self) -> tuple[int | None]:
        return (self.lastrowid,)

    def all(self) -> list[Any]:
        return list(self._ready()._rows)

    fetchall = all

    def __iter__(self) -> Iterator[Any]:
        return iter(self.all())

    def first(self) -> Any | None:
        rows = self._ready()._rows
        return rows[0] if rows else None

    fetchone = first

    def one(self) -> Any:
        rows = self._ready()._rows
        if len(rows) != 1:
            raise ValueError(f"expected one row, found {len(rows)}")
        return rows[0]

    def one_or_none(self) -> Any | None:
        rows = self._ready()._rows
        return self.one() if rows else None

    def scalar(self) -> Any | None:
        row = self.first()
        return row[0] if row is not None else None

    def scalar_one(self) -> Any:
        return self.one()[0]

    def scalar_one_or_none(self) -> Any | None:
        row = self.one_or_none()
        return row[0] if row is not None else None

    def scalars(self) -> _Scalars:
        return _Scalars([row[0] for row in self.all()])

    def mappings(self) -> _Scalars:
        return _Scalars([row._asdict() for row in self.all()])


class _Scalars(list[Any]):
    def all(self) -> list[Any]:
        return list(self)

    def first(self) -> Any | None:
        return self[0] if self else None


class Answer(Generic[T]):
    """What a transaction function returns when its answer is a read made last (UnitOfWork.answer):
    the read, and how its rows become the answer. Database.run hands back `shape(rows)`."""

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


class UnitOfWork:
    """One transaction's statements; behaves like a SQLAlchemy Connection for `execute`.

    Rules it keeps so callers need not: a write is held until something needs it sent (a
    read, a held write's result read, `call_outside`, `flush`, commit); whatever it holds
    fails with the statement it was sent with, and the whole transaction rolls back.
    """

    def __init__(self, conn: Connection, info: dict[Any, Any], driver: Any, write: bool, hold: bool = True,
                 token: CommitToken | None = None) -> None:
        """`info` and `driver`: the Connection's, as its holder read them once (each read of
        them through the Connection is a few SQLAlchemy calls)."""
        self.core = conn  # the SQLAlchemy Connection underneath: for DDL and inspection
        dialect = conn.dialect
        self._sqlite = dialect.name == "sqlite"
        self._statements = STATEMENTS.of(dialect)  # looked up by every execute
        self._info, self._driver = info, driver
        self._progress: list[int] | None = info.get(PROGRESS_KEY)  # statements sent, for Database.run
        self.write = write
        self.token = token  # written with START TRANSACTION (MySQL), if given
        self._token_sent = False
        self._batches = hold and bool(info.get(BATCHES_KEY, False))
        self._went_outside = False  # call_outside was called: no replay past that point
        self._held: list[tuple[Any, dict[str, Any], Result | None]] = []
        self._begin_pending = False  # START TRANSACTION waits for the next statement (MySQL)
        self._open = False  # a transaction was begun on the server
        self._answer: Answer[Any] | None = None  # the read sent with the COMMIT

    def __getattr__(self, name: str) -> Any:
        return getattr(self.core, name)  # dialect, info, engine ... as the Connection has them

    def execute(self, statement: Any, params: dict[str, Any] | Sequence[dict[str, Any]] | None = None) -> Any:
        """Run a Core statement: a write is held (see the class notes), a read runs now."""
        if self._answer is not None:
            self._before_answer()
        compiled = self._statements.get(statement)
        if compiled is None or compiled.expanding or (params is not None and type(params) is not dict):
            return self._execute_other(statement, params)
        return self._execute_compiled(compiled, params)

    def _execute_compiled(self, compiled: Compiled, params: dict[str, Any] | None) -> Result:
        result = Result(self)
        if compiled.writes and self.write and self._batches:
            self._held.append((compiled, params or {}, result))
        elif self._held or self._begin_pending:
            self._held.append((compiled, params or {}, result))
            self.flush(demanded=result)
        else:  # most reads: nothing to send before it
            self._send([(compiled, params or {}, result)])
        return result

    def _execute_other(self, statement: Any, params: Any) -> Any:
        """A statement not yet compiled, or one the unit of work leaves to SQLAlchemy (DDL,
        text(), RETURNING, an IN of a list: after a flush), or an INSERT of a list of rows."""
        if isinstance(params, Sequence) and isinstance(statement, Insert) and _plain(statement):
            for part, values in _row_chunks(statement, params):
                self.execute(part, values)
            return None
        if not (isinstance(statement, Select | Insert | Update | Delete) and _plain(statement)) \
                or (params is not None and not isinstance(params, dict)):
            self.flush()
            return self.core.execute(statement, params)
        compiled = STATEMENTS.compiled(statement, self.core.dialect)
        if compiled.expanding:
            self.flush()
            return self.core.execute(statement, params)
        return self._execute_compiled(compiled, dict(params) if params is not None else None)

    def flush(self, demanded: Result | None = None) -> None:
        """Send every held statement now (one query on MySQL/MariaDB).

        Should one that was held (not `demanded` now) break a constraint (a duplicate key, say),
        ReplayUnheld: the code that made it may be waiting for that error at the statement."""
        if not self._held and not self._begin_pending:
            return
        held, self._held = self._held, []
        try:
            self._send(held)
        except DBAPIError as exc:
            was_held = any(c.writes and r is not demanded for c, _, r in held)
            if was_held and not self._went_outside and isinstance(exc, IntegrityError):
                raise ReplayUnheld from exc
            raise

    def call_outside(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call something that leaves the database (a payment): what is held is sent first,
        so that the call happens only once the writes before it have succeeded."""
        self._before_answer()
        self.flush()
        self._went_outside = True
        return call(*args, **kwargs)

    def answer(self, statement: Select, params: dict[str, Any], shape: Callable[[list[Any]], T]) -> Answer[T]:
        """The transaction's answer, a read made after everything else: return what this
        returns, and Database.run hands back `shape(rows)` once the transaction has committed.
        The read goes with the COMMIT (on MySQL/MariaDB in its query: a round trip fewer); no
        statement or outside call may follow it (execute and call_outside raise). `shape` runs
        after the COMMIT, so it only shapes rows: an error there is reported though the change
        was made."""
        self._before_answer()
        if STATEMENTS.compiled(statement, self.core.dialect).expanding:
            raise ValueError("an answer's read is compiled once: no IN of a list")
        self._answer = Answer(statement, params, shape)
        return self._answer

    def _before_answer(self) -> None:
        if self._answer is not None:
            raise RuntimeError("nothing runs in a transaction after its answer (UnitOfWork.answer)")

    def begin(self) -> None:
        """Open the write transaction (on MySQL with its first statement)."""
        if not self.write:
            return
        self._open = True
        if self._sqlite:
            self._guarded("BEGIN IMMEDIATE", partial(begin_immediate, self._driver))
        else:  # even on Galera: nothing can be aborted before the first statement
            self._begin_pending = True

    def commit(self) -> None:
        """Send what is held with COMMIT; nothing to commit when nothing was ever sent.
        CommitUnanswered if the connection is lost meanwhile and the token was written."""
        if self._answer is not None:
            answer = self._answer
            self._held.append((STATEMENTS.compiled(answer.statement, self.core.dialect), answer.params,
                               answer.result))
            if not (self._open and self._batches):  # a read transaction, or a Galera node
                self.flush()
        if self._open and not self._begin_pending or self._held:
            self._held.append((_COMMIT, {}, None))
            try:
                self.flush()
            except DBAPIError as exc:
                if exc.connection_invalidated and self.token is not None and self._token_sent:
                    raise CommitUnanswered(self.token) from exc
                raise
        self._begin_pending = self._open = False
        if self.core.in_transaction():  # SQLAlchemy's own bookkeeping, for statements it ran
            self.core.commit()

    def rollback(self) -> None:
        """Forget what is held and end the transaction, if the server has one open."""
        self._held, self._begin_pending, self._answer = [], False, None
        if self._open and not self.core.invalidated and _in_server_transaction(self._driver):
            self._send([(_ROLLBACK, {}, None)])
        self._open = False
        if self.core.in_transaction():
            self.core.rollback()

    def _send(self, batch: list[tuple[Any, dict[str, Any], Result | None]]) -> None:
        """Send the statements (each with its parameters and the Result it fills): in one
        query on MySQL/MariaDB, one by one on SQLite."""
        # the values first: a bind processor's error leaves the transaction as it was (unopened)
        statements = [(c, c.parameters(p)) for c, p, _ in batch]
        if self._begin_pending:
            opening = self._opening()
            batch = opening + batch  # a new list: the caller's is what it held
            statements[:0] = [(c, c.parameters(p)) for c, p, _ in opening]
            self._begin_pending = False
        if self._sqlite:
            cursor = self._cursor()
            outcomes = [self._guarded(c.sql, partial(_run_sqlite, cursor, c.sql, values))
                        for c, values in statements]
        else:
            outcomes = self._guarded(batch, partial(_run_mysql, self._driver, statements))
        for (compiled, _, result), (rows, rowcount, lastrowid) in zip(batch, outcomes, strict=False):
            if result is not None:
                result.fill(compiled.rows(rows) if compiled.row is not None else [], rowcount, lastrowid)
        if self._progress is not None:
            self._progress[0] += len(batch)

    def _opening(self) -> list[tuple[Any, dict[str, Any], Result | None]]:
        """START TRANSACTION, and the commit token if there is one."""
        opening: list[tuple[Any, dict[str, Any], Result | None]] = [(_START, {}, None)]
        if self.token is not None:
            opening.append((STATEMENTS.compiled(WRITE_TOKEN, self.core.dialect), self.token.params, None))
            self._token_sent = True
        return opening

    def _cursor(self) -> Any:
        driver = self._driver
        kept = self._info.get(_CURSOR_KEY)
        if kept is None or kept[0] is not driver:  # one per connection: the driver pings for each new one
            kept = self._info[_CURSOR_KEY] = (driver, driver.cursor())
        return kept[1]

    def _guarded(self, sent: str | list[tuple[Any, Any, Any]], send: Callable[[], T]) -> T:
        """Run `send`; a driver error raised as SQLAlchemy would raise it (IntegrityError ...),
        naming the SQL `sent` (a statement, or the batch whose statements were sent)."""
        dialect = self.core.dialect
        try:
            return send()
        except dialect.loaded_dbapi.Error as exc:
            self._held = []
            disconnect = dialect.is_disconnect(exc, self.core.connection.dbapi_connection, None)  # type: ignore[arg-type]
            if disconnect:  # as SQLAlchemy does: every pooled connection of this age is suspect
                self._info.pop(_CURSOR_KEY, None)
                self.core.invalidate(exc)
                self.core.engine.dispose(close=False)
            sql = sent if isinstance(sent, str) else ";".join(c.sql for c, _, _ in sent)
            error = DBAPIError.instance(sql, None, exc, dialect.loaded_dbapi.Error,
                                        connection_invalidated=disconnect, dialect=dialect)
            raise error from exc


class _Bare:
    """A statement without parameters or rows: START TRANSACTION, COMMIT, ROLLBACK."""

    row = None
    writes = False  # read by flush when a query fails: a COMMIT alone (on Galera) is no held write

    def __init__(self, sql: str) -> None:
        self.sql, self.texts = sql, [sql.encode()]

    def parameters(self, _params: dict[str, Any]) -> list[Any]:
        return []


_START: Any = _Bare("START TRANSACTION")
_COMMIT: Any = _Bare("COMMIT")
_ROLLBACK: Any = _Bare("ROLLBACK")


def _plain(statement: Any) -> bool:
    """A statement the unit of work runs itself: no RETURNING, no multi-table options."""
    return not getattr(statement, "_returning", ()) and not getattr(statement, "_post_values_clause", None)


def _row_chunks(statement: Insert, rows: Sequence[dict[str, Any]]) -> Iterator[tuple[Insert, dict[str, Any]]]:
    """Rows for INSERTs of up to ROW_CHUNK rows each (one round trip, no executemany)."""
    if not rows:
        return
    columns = tuple(rows[0])
    for start in range(0, len(rows), ROW_CHUNK):
        part = rows[start:start + ROW_CHUNK]
        yield (STATEMENTS.rows_insert(statement, columns, len(part)),
               {f"{c}_{n}": row[c] for n, row in enumerate(part) for c in columns})


def _in_server_transaction(driver: Any) -> bool:
    return bool(getattr(driver, "in_transaction", True))


def _run_sqlite(cursor: Any, sql: str, values: Any) -> Outcome:
    cursor.execute(sql, values)
    rows = cursor.fetchall() if cursor.description else []
    return rows, cursor.rowcount, cursor.lastrowid


def _run_mysql(driver: Any, statements: list[tuple[Any, list[Any]]]) -> list[Outcome]:
    """The statements (each compiled, with its values in order) in one query, each one's
    outcome; every result is read, so that an error of a later statement (after which
    MariaDB runs nothing more) is raised here. The connection is db.mysql_dbapi's, over the
    driver's C API: it fills the values into each statement's texts, cut once (`Compiled`)."""
    return driver.run_filled([(compiled.texts, values) for compiled, values in statements])  # type: ignore[no-any-return]
