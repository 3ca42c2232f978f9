#!/usr/bin/env bash
# Set everything up and run the whole test suite (MariaDB tests skip when no server
# answers on 127.0.0.1:3306, unless CI=true). Extra arguments go to pytest.
# The tests run in parallel (pytest-xdist), MARKET_TEST_WORKERS processes (default 6): much of
# a test's time is spent waiting (on MariaDB's disk, on timeouts), so on two cores six workers
# ran the suite in 273 s against 297 s with four. 0 runs them in this one process.
# shellcheck source=scripts/_venv.sh
source "$(dirname "$0")/_venv.sh" dev
.venv/bin/ruff check .
.venv/bin/mypy wire db runtime buyer_server seller_server client simulation observe operate
exec .venv/bin/python -m pytest -n "${MARKET_TEST_WORKERS:-6}" --dist loadgroup "$@"
