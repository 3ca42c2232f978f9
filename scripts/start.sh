#!/usr/bin/env bash
# Set everything up and start both servers on the embedded SQLite default (market.db here).
# Extra arguments go to `market serve`, e.g. --db-url mysql://root@127.0.0.1:3306/market, or
# --metrics-port 7660 (the buyer's /metrics on 7660, the seller's on 7661)
# shellcheck source=scripts/_venv.sh
source "$(dirname "$0")/_venv.sh" runtime
# On the SQLite default (market.db here) the servers upgrade its schema themselves; another
# database is upgraded by its own step first: market db upgrade --db-url URL.
db_url=${MARKET_DB_URL:-$( { [ ! -f .env ] || sed -n 's/^MARKET_DB_URL=//p' .env; } | tail -n 1)}
for ((i = 1; i < $#; i++)); do
  if [ "${!i}" = --db-url ]; then next=$((i + 1)); db_url=${!next}; fi
done
if [ "${db_url:-sqlite:///market.db}" = sqlite:///market.db ]; then
  export MARKET_UPGRADE_SCHEMA=${MARKET_UPGRADE_SCHEMA:-1}
fi
exec .venv/bin/market serve "$@"
