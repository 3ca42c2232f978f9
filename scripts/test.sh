#!/usr/bin/env bash
# Set everything up and run the whole test suite (MariaDB tests skip when no server
# answers on 127.0.0.1:3306, unless CI=true). Extra arguments go to pytest.
# shellcheck source=scripts/_venv.sh
source "$(dirname "$0")/_venv.sh" dev
.venv/bin/ruff check .
.venv/bin/mypy wire db runtime buyer_server seller_server client simulation observe
exec .venv/bin/python -m pytest "$@"
