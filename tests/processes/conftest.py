"""Fixtures of the tests that run real processes."""
from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from support import MARIADBD, PrivateMariaDB


def _or_skip(make: Callable[[], PrivateMariaDB]) -> PrivateMariaDB:
    """make(); a MariaDB that cannot be installed or started skips the test (fails under CI=true)."""
    try:
        if not shutil.which("mariadb-install-db") or not os.path.exists(MARIADBD):
            raise RuntimeError("mariadb-install-db or mariadbd is not installed")
        return make()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true requires a private MariaDB for the outage test: {exc}")
        pytest.skip(f"cannot start a private MariaDB: {exc}")


@pytest.fixture(scope="session")
def installed_mariadb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data directory mariadb-install-db made, once per test process, for private ones to copy."""
    return _or_skip(lambda: PrivateMariaDB(tmp_path_factory.mktemp("installed-mariadb"))).root / "data"


@pytest.fixture
def private_mariadb(installed_mariadb: Path, tmp_path: Path) -> Iterator[PrivateMariaDB]:
    """A MariaDB server only this test uses; skip (fail under CI=true) if it cannot start."""
    def started() -> PrivateMariaDB:
        server = PrivateMariaDB(tmp_path, installed_mariadb)
        server.start()
        return server

    server = _or_skip(started)
    admin = create_engine(server.url.replace("/market", "/mysql"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text("CREATE DATABASE market CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"))
    admin.dispose()
    try:
        yield server
    finally:
        server.kill()
