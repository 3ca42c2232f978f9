#!/usr/bin/env bash
# Builds the checkout that measures the data layer alone (docs/benchmarks.md, "The data
# layer"): the release before it (16047ce) as the data layer's merge rewrote it (f0a2ec6: the
# area modules as plain Core transaction scripts), with this checkout's data layer in place of
# the merge's (the unit of work, the MySQL connection module, the transaction runner, the
# engine, the commit tokens) and the area modules' one later use of it (4ee7f45: an answer read
# with its COMMIT). Nothing else of this release comes along: no storm limits, money in steps
# or search by text (the metrics' package is copied for the runner's hooks; nothing serves it).
# The schema is made by create_all, as before the migrations.
#
#   simulation/studies/data_layer_checkout.sh DIR
#
# Then run the same market-sim in DIR, with this checkout's environment (it has what the
# copied modules import), and in a checkout of 16047ce with its own (scripts/_venv.sh dev in
# it: mysql-connector 9.1.0), taking turns, a fresh database each run; with THIS the folder
# of this checkout:
#   (cd DIR && PYTHONPATH=. THIS/.venv/bin/python -m simulation -n 100 -k 200 -r 1 --db-url URL)
set -euo pipefail
dir=$(realpath -m -- "${1:?usage: $0 DIR}")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
git -C "$here" worktree add --detach "$dir" f0a2ec6
cp "$here"/db/{unit_of_work,mysql_dbapi,database,engine,commit_tokens}.py "$dir/db/"
cp -r "$here/observe" "$dir/"  # the runner's hooks for metrics (nothing is served unless asked)
git -C "$here" show 4ee7f45 -- db/carts.py db/catalog.py | git -C "$dir" apply
python3 - "$dir" "$here" <<'EOF'
import re, sys
from pathlib import Path
dir, here = Path(sys.argv[1]), Path(sys.argv[2])
head_schema = (here / "db/schema.py").read_text()
table = re.search(r"\ncommit_tokens = Table\(.*?\n\)\n", head_schema, re.S).group(0)
(dir / "db/schema.py").write_text((dir / "db/schema.py").read_text() + table)
runner = dir / "db/database.py"
made = re.sub(r"(    def create_schema\(self\) -> None:\n        \"\"\".*?\"\"\"\n).*?make_current\(self\)\n",
              r"""\1        from sqlalchemy import insert, select

        from .schema import SCHEMA_VERSION, metadata, schema_info
        with self.engine.begin() as conn:
            metadata.create_all(conn, checkfirst=True)
            if conn.execute(select(schema_info.c.version)).scalar() is None:
                conn.execute(insert(schema_info).values(version=SCHEMA_VERSION))
""", runner.read_text(), count=1, flags=re.S)
assert "metadata.create_all" in made, "create_schema not found: this checkout's runner changed"
runner.write_text(made)
EOF
echo "built $dir: run it as (cd '$dir' && PYTHONPATH=. '$here/.venv/bin/python' -m simulation ...)"
