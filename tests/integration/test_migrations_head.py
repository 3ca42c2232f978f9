"""A server whose database is current starts without loading Alembic, and a SQLite one without
the MySQL driver: the revision it checks against is written in the code, and Alembic agrees."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from db.migrations import HEAD, make_current, scripts


def test_the_head_written_in_the_code_is_alembics() -> None:
    assert HEAD == scripts().get_current_head()


def test_a_start_on_a_current_sqlite_database_loads_neither_alembic_nor_the_mysql_driver(
        tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'current.db'}"
    make_current(url)
    check = ("import sys; from db import Database; from db.migrations import check_current; "
             f"check_current(Database({url!r}, pool_size=1)); "
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'alembic', 'mysql'}))")
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=60,
                         check=True)
    assert out.stdout.split() == ["[]"]
