"""`market backup` and `market restore`: a consistent copy of a live database (SQLite's
online backup API; `mariadb-dump --single-transaction`), written to a new file only its owner
reads, and a new database made from one (a restore refuses a database holding tables).
"""
from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import IO

from sqlalchemy import make_url
from sqlalchemy.engine import URL

SQLITE_HEADER = b"SQLite format 3\x00"
DUMP = ("mariadb-dump", "mysqldump")
CLIENT = ("mariadb", "mysql")
_NAME = re.compile(r"[A-Za-z0-9_$]+")  # a database name used unquoted in statements


class BackupError(Exception):
    """A copy that cannot be made or played back; the message is one line."""


def backup(db_url: str, target: Path) -> str:
    """Copy the database at `db_url` to the new file `target`; a line saying what was done."""
    url = make_url(db_url)
    with _new_file(target) as out:
        if url.get_backend_name() == "sqlite":
            out.close()
            _copy_sqlite(_sqlite_file(url, must_exist=True), target)
        else:
            _mysql(url, DUMP, ["--single-transaction", "--quick", "--hex-blob", "--no-tablespaces",
                               _database(url)], stdout=out)
    return f"backed up {_where(url)} to {target} ({target.stat().st_size} bytes)"


def restore(source: Path, db_url: str) -> str:
    """Make the database at `db_url` (new, or empty) from the copy `source`."""
    url = make_url(db_url)
    try:
        with source.open("rb") as copy:
            is_sqlite_copy = copy.read(len(SQLITE_HEADER)) == SQLITE_HEADER
    except OSError as exc:
        raise BackupError(f"cannot read {source}: {exc.strerror or exc}") from None
    if (url.get_backend_name() == "sqlite") != is_sqlite_copy:
        kind = "an SQLite file" if is_sqlite_copy else "a MariaDB/MySQL dump"
        raise BackupError(f"{source} is {kind}: it restores only to a database of that kind")
    if is_sqlite_copy:
        target = Path(_sqlite_file(url, must_exist=False))
        with _new_file(target, empty_ok=True) as out:
            out.close()
            _copy_sqlite(source, target)
    else:
        name = _database(url)
        tables = _mysql(url.set(database=None), CLIENT, ["-N", "-e", f"CREATE DATABASE IF NOT EXISTS {name} "
                        "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin; SELECT COUNT(*) FROM "
                        f"information_schema.tables WHERE table_schema = '{name}'"]).strip()
        if tables != "0":
            raise BackupError(f"{_where(url)} holds {tables} tables: restore into a new, empty database")
        with source.open("rb") as dump:
            _mysql(url, CLIENT, [name], stdin=dump)
    return f"restored {_where(url)} from {source}"


def _copy_sqlite(source: str | Path, target: Path) -> None:
    with closing(sqlite3.connect(source)) as src, closing(sqlite3.connect(target)) as dst:
        src.backup(dst)


@contextmanager
def _new_file(path: Path, empty_ok: bool = False) -> Iterator[IO[bytes]]:
    """A new file readable by its owner only, removed again if what writes it fails."""
    if empty_ok and path.exists() and path.stat().st_size == 0:
        path.unlink()
    try:
        out = os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb")
    except FileExistsError:
        raise BackupError(f"{path} exists: a backup or a restore never writes over a file") from None
    except OSError as exc:
        raise BackupError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with out:
            yield out
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def _sqlite_file(url: URL, must_exist: bool) -> str:
    path = url.database or ""
    if path in ("", ":memory:") or must_exist and not os.path.exists(path):
        raise BackupError(f"no such database file: {path or '(none)'}")
    return path


def _database(url: URL) -> str:
    if not url.database or not _NAME.fullmatch(url.database):
        raise BackupError(f"the URL must name its database (letters, digits, _ and $): {url.database!r}")
    return url.database


def _where(url: URL) -> str:
    return url.render_as_string(hide_password=True)


def _mysql(url: URL, tools: tuple[str, ...], args: list[str], stdin: IO[bytes] | None = None,
           stdout: IO[bytes] | None = None) -> str:
    """Run MariaDB's client or dump tool against `url` (the password in a file, never on the
    command line); its standard output (unless `stdout` takes it)."""
    tool = next((found for name in tools if (found := shutil.which(name))), None)
    if tool is None:
        raise BackupError(f"{' or '.join(tools)} is not installed (apt-get install mariadb-client)")
    options = {"user": url.username, "password": url.password, "host": url.host, "port": url.port,
               "socket": url.query.get("unix_socket")}
    with tempfile.NamedTemporaryFile("w", prefix="market-", suffix=".cnf") as config:
        config.write("[client]\n" + "".join(f"{key}={value}\n" for key, value in options.items() if value))
        config.flush()
        done = subprocess.run([tool, f"--defaults-extra-file={config.name}", *args], stdin=stdin,
                              stdout=stdout or subprocess.PIPE, stderr=subprocess.PIPE, check=False)
    if done.returncode != 0:
        reason = " ".join(done.stderr.decode(errors="replace").split()) or f"exit status {done.returncode}"
        raise BackupError(f"{os.path.basename(tool)}: {reason}")
    return "" if stdout else done.stdout.decode()
