"""The MySQL/MariaDB connection the engine uses: a small DB-API 2.0 module over the C API
of mysql-connector-python (`_mysql_connector.MySQL`, documented in the driver's manual as
its C Extension API), which the driver's own connection class wraps.

SQLAlchemy's mysqlconnector dialect runs on it unchanged (`create_engine(module=...)`):
the exceptions are the driver's (mysql.connector.errors), values are quoted by the C API as
the driver quotes them, rows come converted by the C API as the driver returns them. What it
adds is `Connection.run`: a query of several statements and each one's rows, read straight
from the C API (and `run_filled`: the statements' values quoted in one call of the C API
and filled into templates cut once per statement). The driver's public connection does the
same through `cmd_query` and `get_rows`, building each result's column descriptions twice
and looking at every value of every row in Python, which `run` leaves to the C API. Only
what this project asks of a connection is offered; any other connection option is refused by
name at connect.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import _mysql_connector  # the driver's C extension, documented as its C Extension API
from mysql.connector import __version__
from mysql.connector.constants import ClientFlag, ServerFlag
from mysql.connector.dbapi import (
    BINARY,
    DATETIME,
    NUMBER,
    ROWID,
    STRING,
    Binary,
    Date,
    DateFromTicks,
    Time,
    TimeFromTicks,
    Timestamp,
    TimestampFromTicks,
    apilevel,
    paramstyle,
    threadsafety,
)
from mysql.connector.errors import (
    DatabaseError,
    DataError,
    Error,
    IntegrityError,
    InterfaceError,
    InternalError,
    NotSupportedError,
    OperationalError,
    ProgrammingError,
    Warning,
    get_mysql_exception,
)

__all__ = [  # a DB-API module's names: the driver's, but for `connect`
    "BINARY", "DATETIME", "NUMBER", "ROWID", "STRING", "Binary", "Connection", "Cursor", "DataError",
    "DatabaseError", "Date", "DateFromTicks", "Error", "IntegrityError", "InterfaceError", "InternalError",
    "NotSupportedError", "OperationalError", "ProgrammingError", "Time", "TimeFromTicks", "Timestamp",
    "TimestampFromTicks", "Warning", "__version__", "apilevel", "connect", "paramstyle", "threadsafety"]

Outcome = tuple[list[Any], int, int]  # one statement's rows, rowcount, last insert id
_NAMED = re.compile(rb"%\(([^)]+)\)s")  # the driver's forms: %(name)s for a dict of values,
_POSITIONAL = re.compile(rb"%s")  # %s for a sequence; any other % stays as written
_INSERT_VALUES = re.compile(rb"\A(\s*INSERT\s.*?\sVALUES\s*)(\(.*\))\s*;?\s*\Z", re.I | re.S)
_ON_DUPLICATE = re.compile(rb"\sON\s+DUPLICATE\s+KEY\s", re.I)
_MANY_BYTES = 1 << 20  # executemany's INSERT of many rows: at most this much a query
_TEMPLATES: dict[str | bytes, tuple[list[bytes], list[str]]] = {}  # statement: texts, names
_MAX_TEMPLATES = 4096  # statements made per call (rare) must not grow it without end
# Errors of a connection that is gone, raised as OperationalError whatever the driver's table
# says (2006 and 2014 would be DatabaseError): SQLAlchemy then discards the connection.
_CONNECTION_LOST = frozenset({2006, 2013, 2014, 2045, 2048, 2055})
_GONE = "MySQL Connection not available."  # SQLAlchemy's is_disconnect knows these words
_OPTIONS = frozenset({
    "host", "port", "user", "password", "database", "unix_socket", "client_flags", "charset",
    "collation", "connection_timeout", "connect_timeout", "buffered", "use_pure", "use_unicode",
    "autocommit", "compress", "ssl_ca", "ssl_cert", "ssl_key", "ssl_verify_cert",
    "ssl_verify_identity", "ssl_disabled", "read_timeout", "write_timeout"})


_YES_NO = frozenset({"compress", "ssl_verify_cert", "ssl_verify_identity", "ssl_disabled", "autocommit",
                    "buffered", "use_pure", "use_unicode"})
_NUMBERS = frozenset({"port", "connection_timeout", "connect_timeout", "read_timeout", "write_timeout"})


def connect(**options: Any) -> Connection:
    """A connection (the DB-API's `connect`), with the driver's names for the options; those
    of a URL's query string arrive as text (`?ssl_disabled=true&read_timeout=30`)."""
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise InterfaceError(f"connection options not supported here: {', '.join(unknown)}")
    options = {name: _typed(name, value) for name, value in options.items()}
    if options.get("use_pure") or options.get("use_unicode") is False or options.get("buffered") is False:
        raise InterfaceError("this connection is the C extension's, buffered, returning str")
    return Connection(**options)


def _typed(name: str, value: Any) -> Any:
    """An option given as text made the type it has (yes/no, a number); InterfaceError if not."""
    if not isinstance(value, str) or name not in _YES_NO | _NUMBERS:
        return value
    if name in _NUMBERS and value.strip().isdigit():
        return int(value)
    word = value.strip().lower()
    if name in _YES_NO and word in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return word in ("1", "true", "yes", "on")
    kind = "number" if name in _NUMBERS else "yes/no"
    raise InterfaceError(f"connection option {name}={value!r}: not a {kind}")


@contextmanager
def _translated() -> Iterator[None]:
    """The C API's errors raised as the driver raises them (IntegrityError, ...)."""
    try:
        yield
    except _mysql_connector.MySQLInterfaceError as exc:
        raise _driver_error(exc) from exc


def _driver_error(exc: _mysql_connector.MySQLInterfaceError) -> Error:
    """The driver's exception for an error of its C API."""
    errno = getattr(exc, "errno", None)
    msg, sqlstate = getattr(exc, "msg", str(exc)), getattr(exc, "sqlstate", None)
    if not errno:
        return InterfaceError(str(exc))
    if errno in _CONNECTION_LOST:
        return OperationalError(msg=msg, errno=errno, sqlstate=sqlstate)
    return get_mysql_exception(errno, msg=msg, sqlstate=sqlstate)  # type: ignore[return-value]


class Connection:
    """One connection to the server: DB-API 2.0, plus `quote` and `run` for the unit of work."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 3306, user: str = "root",
                 password: str = "", database: str | None = None, unix_socket: str | None = None,
                 client_flags: int | Sequence[int] | None = None, charset: str = "utf8mb4",
                 collation: str | None = None,
                 connection_timeout: int | None = None, connect_timeout: int | None = None,
                 autocommit: bool = False, compress: bool = False, ssl_ca: str | None = None,
                 ssl_cert: str | None = None, ssl_key: str | None = None, ssl_verify_cert: bool = False,
                 ssl_verify_identity: bool = False, ssl_disabled: bool = False,
                 read_timeout: int | None = None, write_timeout: int | None = None,
                 **_driver_only: Any) -> None:
        self.charset = charset  # MySQL's name, read by SQLAlchemy
        self.encoding = "utf-8" if charset.startswith("utf8") else charset  # Python's name
        self._c: Any = _mysql_connector.MySQL(
            buffered=True, raw=False, charset_name=charset, use_unicode=True,
            connection_timeout=connection_timeout or connect_timeout or 0, plugin_dir=plugin_dir())
        ssl_disabled = ssl_disabled or bool(unix_socket)  # as the driver: no TLS over a local socket
        tls = {} if ssl_disabled else {
            "ssl_ca": ssl_ca, "ssl_cert": ssl_cert, "ssl_key": ssl_key,
            "ssl_verify_cert": ssl_verify_cert, "ssl_verify_identity": ssl_verify_identity}
        with _translated():
            self._c.connect(host=host, user=user, password=password, database=database, port=int(port),
                            unix_socket=unix_socket, compress=compress,
                            client_flags=_client_flags(client_flags),
                            ssl_disabled=ssl_disabled, read_timeout=read_timeout or 0,
                            write_timeout=write_timeout or 0, **tls)
            self._c.set_character_set(charset)
        if collation:
            if not (charset.isidentifier() and collation.isidentifier()):
                raise InterfaceError(f"charset {charset!r}, collation {collation!r}: not names")
            self.run(f"SET NAMES '{charset}' COLLATE '{collation}'".encode())
        self._autocommit = not autocommit  # so that the next line tells the server
        self.autocommit = autocommit

    # -- filling and running statements: the unit of work's run_filled, the cursor's fill ----

    def fill(self, sql: str | bytes, values: dict[str, Any]) -> bytes:
        """`sql` with its %(name)s placeholders replaced by the quoted `values`, every other %
        as written; the statement is cut at its placeholders once (`template`)."""
        texts, names = template(sql)
        if not names:
            return texts[0]
        try:
            ordered = [values[name] for name in names]
        except KeyError as exc:
            raise ProgrammingError(f"no value for the parameter {exc.args[0]}") from None
        return b"".join(_interleaved(texts, self.quote(ordered)))

    def quote(self, values: Sequence[Any]) -> Sequence[bytes]:
        """Each value as an SQL literal (strings quoted and escaped), as the driver quotes it."""
        try:
            return self._live().convert_to_mysql(*values)  # type: ignore[no-any-return]
        except _mysql_connector.MySQLInterfaceError as exc:
            raise _driver_error(exc) from exc

    def run_filled(self, statements: Sequence[tuple[Sequence[bytes], Sequence[Any]]]) -> list[Outcome]:
        """`run` the statements, each a `template`'s texts and the values of its placeholders in
        order, in one query: every value quoted in one call of the C API."""
        values = [value for _, given in statements for value in given]
        quoted = self.quote(values) if values else ()
        parts: list[bytes] = []
        used = 0
        for texts, given in statements:
            parts += _interleaved(texts, quoted[used:used + len(given)])
            parts.append(b";")
            used += len(given)
        return self.run(b"".join(parts[:-1]))

    def run(self, query: bytes) -> list[Outcome]:
        """Send `query` (one statement or several) and read every result: the rows, rowcount
        and last insert id of each. An error of a later statement (after which the server
        runs nothing more) is raised here, as the driver's exception."""
        c = self._c
        if c is None:
            raise OperationalError(_GONE)
        outcomes: list[Outcome] = []
        try:
            c.query(query)
            while True:
                outcomes.append(_outcome(c))
                if not c.more_results():
                    return outcomes
                c.next_result()  # raises the next statement's error, if it failed
        except _mysql_connector.MySQLInterfaceError as exc:
            raise _driver_error(exc) from exc

    # -- DB-API 2.0 ---------------------------------------------------------------------------

    def cursor(self, **_options: Any) -> Cursor:
        return Cursor(self)

    def commit(self) -> None:
        self.run(b"COMMIT")

    def rollback(self) -> None:
        self.run(b"ROLLBACK")

    def close(self) -> None:
        c, self._c = self._c, None
        if c is not None:
            try:
                c.close()
            except _mysql_connector.MySQLInterfaceError:
                pass  # already gone

    @property
    def autocommit(self) -> bool:
        return self._autocommit

    @autocommit.setter
    def autocommit(self, value: bool) -> None:
        if bool(value) != self._autocommit:
            with _translated():
                self._live().autocommit(bool(value))
            self._autocommit = bool(value)

    @property
    def in_transaction(self) -> bool:
        """Whether the server has a transaction open on this connection."""
        return bool(self._c is not None and self._c.st_server_status() & ServerFlag.STATUS_IN_TRANS)

    @property
    def connection_id(self) -> int:
        """The server's id of this connection (as KILL CONNECTION takes it)."""
        return int(self._live().thread_id())

    def ping(self, reconnect: bool = False, attempts: int = 1, delay: int = 0) -> None:
        """Raise, as the driver does, unless the server answers. It never reconnects (the
        pool replaces a connection found dead), whatever `reconnect` says."""
        with _translated():
            if not self._live().ping():
                raise InterfaceError(_GONE)

    def get_server_version(self) -> tuple[int, ...]:
        return tuple(self._live().get_server_version())

    @property
    def c_api(self) -> Any:
        """The C API's connection object underneath (None once closed)."""
        return self._c

    def _live(self) -> Any:
        if self._c is None:
            raise OperationalError(_GONE)
        return self._c


def _outcome(c: Any) -> Outcome:
    """The current result's rows (all read and freed), rowcount and last insert id."""
    if not c.have_result_set:
        return [], c.affected_rows(), c.insert_id()
    rows: list[Any] = []
    fetch, keep = c.fetch_row, rows.append
    while (row := fetch()) is not None:
        keep(row)
    c.free_result()
    return rows, len(rows), 0


class Cursor:
    """A buffered cursor: every row is read when the statement runs."""

    arraysize = 1

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.description: list[tuple[Any, ...]] | None = None
        self.rowcount, self.lastrowid = -1, 0
        self._rows: list[Any] = []
        self._next = 0

    def execute(self, operation: str | bytes, params: Sequence[Any] | dict[str, Any] | None = None) -> None:
        query = operation.encode(self.connection.encoding) if isinstance(operation, str) else operation
        if params:
            query = _bound(query, params, self.connection)
        self._read(query)

    def executemany(self, operation: str | bytes, seq_of_params: Sequence[Any]) -> None:
        """Each parameter set; an INSERT ... VALUES (...) as INSERTs of many rows each, of at
        most _MANY_BYTES (the driver's is one INSERT of them all); one with ON DUPLICATE KEY
        UPDATE, or any other statement, run once per set."""
        query = operation.encode(self.connection.encoding) if isinstance(operation, str) else operation
        insert = None if _ON_DUPLICATE.search(query) else _INSERT_VALUES.match(query)
        total = 0
        if insert is None or not seq_of_params:
            for params in seq_of_params:
                self.execute(query, params)
                total += max(self.rowcount, 0)
        else:
            head, row = insert.groups()
            for rows in _chunks([_bound(row, params, self.connection) for params in seq_of_params]):
                self._read(head + b",".join(rows))
                total += self.rowcount
        self.rowcount = total

    def _read(self, query: bytes) -> None:
        c = self.connection._live()
        with _translated():
            c.query(query)
            fields = c.fetch_fields() if c.have_result_set else None
            self._rows, self.rowcount, self.lastrowid = _outcome(c)
            while c.more_results():  # a query of several statements: the first one's result
                c.next_result()
                _outcome(c)
        self.description = None if fields is None else [
            (f[4], f[8], None, None, None, None, not f[9] & 1, f[9], f[6]) for f in fields]
        self._next = 0

    def fetchone(self) -> Any | None:
        if self._next >= len(self._rows):
            return None
        self._next += 1
        return self._rows[self._next - 1]

    def fetchmany(self, size: int | None = None) -> list[Any]:
        start, self._next = self._next, min(len(self._rows), self._next + (size or self.arraysize))
        return self._rows[start:self._next]

    def fetchall(self) -> list[Any]:
        start, self._next = self._next, len(self._rows)
        return self._rows[start:]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.fetchall())

    def close(self) -> None:
        self._rows = []

    def setinputsizes(self, *_sizes: Any) -> None:
        pass

    def setoutputsizes(self, *_sizes: Any) -> None:
        pass


def _bound(query: bytes, params: Sequence[Any] | dict[str, Any], connection: Connection) -> bytes:
    """`query` with the driver's placeholders replaced by quoted values: %(name)s from a dict,
    %s from a sequence (all of it used); every other % stays as written, as the driver leaves it."""
    if isinstance(params, dict):
        return connection.fill(query, params)
    values = iter(connection.quote(list(params)))

    def value(_match: re.Match[bytes]) -> bytes:
        try:
            return next(values)  # type: ignore[no-any-return]
        except StopIteration:
            raise ProgrammingError("Not enough parameters for the SQL statement") from None

    bound = _POSITIONAL.sub(value, query)
    if next(values, None) is not None:
        raise ProgrammingError("Not all parameters were used in the SQL statement")
    return bound


def template(sql: str | bytes) -> tuple[list[bytes], list[str]]:
    """`sql` cut at its %(name)s placeholders: the texts around them (UTF-8) and their names,
    in order (a name used twice is there twice); cut once per statement, then kept."""
    found = _TEMPLATES.get(sql)
    if found is None:
        if len(_TEMPLATES) >= _MAX_TEMPLATES:
            _TEMPLATES.clear()
        pieces = _NAMED.split(sql if isinstance(sql, bytes) else sql.encode())  # text, name, ..., text
        found = _TEMPLATES[sql] = (pieces[::2], [name.decode() for name in pieces[1::2]])
    return found


def _interleaved(texts: Sequence[bytes], quoted: Sequence[bytes]) -> list[bytes]:
    """A template's texts with the quoted values between them (one value fewer than texts),
    put in place by slices: no Python call a value."""
    if len(texts) != len(quoted) + 1:
        raise ProgrammingError(f"{len(texts) - 1} placeholders, {len(quoted)} values")
    pieces: list[bytes] = [b""] * (2 * len(texts) - 1)
    pieces[0::2] = texts
    pieces[1::2] = quoted
    return pieces


def _chunks(rows: list[bytes]) -> Iterator[list[bytes]]:
    """Rows grouped into queries of at most _MANY_BYTES (one row at least)."""
    chunk: list[bytes] = []
    size = 0
    for row in rows:
        if chunk and size + len(row) > _MANY_BYTES:
            yield chunk
            chunk, size = [], 0
        chunk.append(row)
        size += len(row) + 1
    if chunk:
        yield chunk


def _client_flags(given: int | Sequence[int] | None) -> int:
    """The client flags: a number, or the driver's form, a list of flags set (or unset if
    negative) over its defaults."""
    if isinstance(given, int):
        return given
    flags = ClientFlag.get_default()
    for flag in given or ():
        flags = flags | flag if flag > 0 else flags & ~-flag
    return flags


def plugin_dir() -> str:
    """The authentication plugins: those bundled with the driver, else the system's."""
    bundled = os.path.join(os.path.dirname(os.path.abspath(_mysql_connector.__file__)),
                           "mysql", "vendor", "plugin")
    if os.path.exists(bundled):
        return bundled
    return "/usr/lib64/mysql/plugin" if os.path.exists("/usr/lib64/mysql/plugin") else "/usr/lib/mysql/plugin"
