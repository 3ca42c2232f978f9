"""The schema's versions as Alembic revisions (versions/), and the three things done with them:
make a database current (`upgrade`, under a lock, so two at once are safe), say where it stands
(`revision_of`), and check it at a server's start (`check_current`: an empty one is made).

A database made before migrations has no alembic_version but a schema_info version N: it is
stamped at revision schemaN first. The lock is MariaDB's GET_LOCK, or on SQLite an flock on a
file beside the database; Alembic itself takes none."""
from __future__ import annotations

import fcntl
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, inspect, select, text
from sqlalchemy.exc import DBAPIError

from ..database import Database, DatabaseUnusable
from ..engine import is_sqlite
from ..schema import schema_info

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

log = logging.getLogger("market.db")
# This code's newest revision, written here so that a server whose database is current starts
# without importing Alembic (a sixth of its start-up); a test checks Alembic agrees.
HEAD = "0010_search_vocabulary"
# How long an upgrade waits for another's to finish (a million items took 66 s to index)
LOCK_WAIT_S = 600.0
# MariaDB's named locks are the server's: the name carries the database's (hashed: names are
# at most 64 characters), so upgrades of other databases on one server do not wait for it
_LOCK_NAME = "CONCAT('market_schema_upgrade:', MD5(COALESCE(DATABASE(), '')))"


@dataclass(frozen=True)
class Revision:
    """Where a database stands: its revision (None: no schema at all) and this code's head."""

    current: str | None
    head: str

    @property
    def is_head(self) -> bool:
        return self.current == self.head

    @property
    def is_newer(self) -> bool:
        """Made by a newer version of the marketplace: a revision this code does not know."""
        return self.current is not None and self.current not in _known()


def head() -> str:
    """This code's newest revision."""
    return HEAD


def revision_of(database: Database) -> Revision:
    """The database's revision; DatabaseUnusable when it cannot be read."""
    with _connected(database) as conn:
        return Revision(_current(conn), head())


def upgrade(database: Database, wait_s: float = LOCK_WAIT_S, older: bool = True) -> tuple[Revision, Revision]:
    """Bring the database to head (made from nothing if empty), under the upgrade lock; the
    revisions before and after. DatabaseUnusable for one made by a newer version, and for
    an older one unless `older`."""
    with _connected(database) as conn, upgrade_lock(conn, database, wait_s):
        before = Revision(_current(conn), head())
        if before.is_newer:
            raise DatabaseUnusable(_newer_message(database, before))
        if not older and before.current not in (None, before.head):
            raise DatabaseUnusable(
                f"the database {database.where} is at revision {before.current}, this server needs "
                f"{before.head}: run `market db upgrade --db-url {database.where}`")
        from alembic import command

        config = _config(conn)
        if before.current is not None and not _has_alembic_version(conn):
            command.stamp(config, before.current)  # made before migrations: its schema_info says where
        conn.commit()
        command.upgrade(config, "head")
        database.schema_changed()
        _write_nothing(conn)
        after = Revision(_current(conn), head())
    if before.current not in (None, after.current):  # a new database's tables are no news
        log.info("schema upgraded from revision %s to %s", before.current, after.current)
    return before, after


def make_current(database: Database | str) -> None:
    """Make the database (or the one at a URL) current, whatever it held: what tests,
    market-sim and `market seed` call before using a database."""
    if isinstance(database, Database):
        upgrade(database)
        return
    opened = Database(database, pool_size=1)
    try:
        upgrade(opened)
    finally:
        opened.close()


def check_current(database: Database) -> None:
    """A server's start: nothing if the database is at head; an empty one is made current.
    DatabaseUnusable, saying in one line what to run, for an older or newer one. What is not
    at head is read again under the upgrade lock: it may be another server making it."""
    with _connected(database) as conn:
        if _current(conn) == head():
            _write_nothing(conn)
            return
    upgrade(database, older=False)


def _write_nothing(conn: Connection) -> None:
    """A write changing nothing: a database this code may read but not write is found now."""
    conn.execute(text("UPDATE alembic_version SET version_num = version_num"))
    conn.commit()


def _newer_message(database: Database, found: Revision) -> str:
    return (f"cannot use the database {database.where}: it is at revision {found.current}, newer than "
            f"this code's {found.head}: run a newer version of the marketplace")


def scripts() -> ScriptDirectory:
    """The revisions (Alembic's ScriptDirectory of versions/)."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory(str(Path(__file__).parent))


def _known() -> set[str]:
    return {script.revision for script in scripts().walk_revisions()}


def _config(conn: Connection) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(Path(__file__).parent))
    config.attributes["connection"] = conn
    return config


def _has_alembic_version(conn: Connection) -> bool:
    return inspect(conn).has_table("alembic_version")


def _current(conn: Connection) -> str | None:
    """alembic_version's revision, or schemaN for a database made before migrations."""
    if _has_alembic_version(conn):
        return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    if not inspect(conn).has_table(schema_info.name):
        return None
    version = conn.execute(select(schema_info.c.version)).scalar()
    return None if version is None else f"schema{version}"


@contextmanager
def _connected(database: Database) -> Iterator[Connection]:
    """A connection of the database's own; unusable databases (unreachable, no rights) in one line."""
    try:
        with database.engine.connect() as conn:
            yield conn
    except DBAPIError as exc:
        reason = database.unusable_reason(exc)
        if reason is None:
            raise
        raise DatabaseUnusable(reason) from None


@contextmanager
def upgrade_lock(conn: Connection, database: Database, wait_s: float) -> Iterator[None]:
    """Held around a whole upgrade: a second one waits, then finds the database at head."""
    if not is_sqlite(database.engine):
        with _named_lock(conn, database, wait_s):
            yield
        return
    path = _sqlite_path(database)
    if path is None:
        yield  # a database of this process alone
        return
    try:
        lock_file = open(f"{path}-upgrade.lock", "a")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise DatabaseUnusable(f"cannot use the database {database.where}: cannot open its upgrade "
                               f"lock {path}-upgrade.lock: {exc.strerror}") from None
    with lock_file:
        _flock(lock_file.fileno(), database, wait_s)
        try:
            yield
        finally:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_UN)


def _sqlite_path(database: Database) -> str | None:
    """The SQLite file's path (of a file: URI too); None for an in-memory database."""
    path = database.engine.url.database or ""
    if path.startswith("file:"):
        path = path.removeprefix("file:").split("?")[0]
    return None if path in ("", ":memory:") else path


@contextmanager
def _named_lock(conn: Connection, database: Database, wait_s: float) -> Iterator[None]:
    """MariaDB's GET_LOCK: the session's, so it outlasts the commits DDL makes."""
    got = conn.execute(text(f"SELECT GET_LOCK({_LOCK_NAME}, :wait)"), {"wait": wait_s}).scalar()
    conn.commit()
    if got != 1:
        raise DatabaseUnusable(_locked_message(database, wait_s))
    try:
        yield
    finally:
        conn.execute(text(f"SELECT RELEASE_LOCK({_LOCK_NAME})"))
        conn.commit()


def _flock(fd: int, database: Database, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise DatabaseUnusable(_locked_message(database, wait_s)) from None
            time.sleep(0.05)


def _locked_message(database: Database, wait_s: float) -> str:
    return (f"cannot upgrade the database {database.where}: another upgrade held its lock for over "
            f"{wait_s:g} s; nothing was changed")
