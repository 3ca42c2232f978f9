#!/usr/bin/env bash
# Set everything up and start both servers on the embedded SQLite default (market.db here).
# Extra arguments go to `market serve`, e.g. --db-url mysql://root@127.0.0.1:3306/market
# shellcheck source=scripts/_venv.sh
source "$(dirname "$0")/_venv.sh" runtime
exec .venv/bin/market serve "$@"
