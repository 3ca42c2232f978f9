"""Fixtures of the tests that run real processes."""
from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from support import MARIADBD, PrivateMariaDB


@pytest.fixture
def private_mariadb(tmp_path: Path) -> Iterator[PrivateMariaDB]:
    """A MariaDB server only this test uses; skip (fail under CI=true) if it cannot start."""
    try:
        if not shutil.which("mariadb-install-db") or not os.path.exists(MARIADBD):
            raise RuntimeError("mariadb-install-db or mariadbd is not installed")
        server = PrivateMariaDB(tmp_path)
        server.start()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true requires a private MariaDB for the outage test: {exc}")
        pytest.skip(f"cannot start a private MariaDB: {exc}")
    admin = create_engine(server.url.replace("/market", "/mysql"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text("CREATE DATABASE market CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"))
    admin.dispose()
    try:
        yield server
    finally:
        server.kill()
