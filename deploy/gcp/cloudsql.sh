#!/usr/bin/env bash
# Cloud SQL for MySQL 8 with a private IP only, the `market` database and user, and the VM's
# settings file (with the user's password) in Secret Manager. The password is never printed and
# never on a command line: gcloud reads it from its standard input (see private_gcloud).
set -euo pipefail
# shellcheck source=deploy/gcp/config.sh
source "$(dirname "$0")/config.sh"

if ! exists gcloud sql instances describe "$SQL_INSTANCE" --project "$PROJECT"; then
  gcloud sql instances create "$SQL_INSTANCE" --project "$PROJECT" --region "$REGION" \
    --database-version="$SQL_VERSION" --edition=enterprise --tier="$SQL_TIER" \
    --network="projects/$PROJECT/global/networks/$NETWORK" --no-assign-ip \
    --storage-auto-increase --backup-start-time=03:00
fi
if ! exists gcloud sql databases describe "$DB_NAME" --instance "$SQL_INSTANCE" --project "$PROJECT"; then
  gcloud sql databases create "$DB_NAME" --instance "$SQL_INSTANCE" --project "$PROJECT" \
    --charset=utf8mb4 --collation=utf8mb4_bin
fi

# The settings file of the VM. The servers reach the database through the Cloud SQL Auth
# Proxy on the VM's loopback. Each call waits for the database over the network, so more
# calls stay in flight than on one machine (MARKET_THREADS 16, not 3); every other MARKET_*
# setting keeps its default (.env.example). printf is a shell builtin: the password, $1, is not
# on any command line.
market_env() {
  printf '%s\n' \
    "# /etc/market/market.env, written by deploy/gcp/cloudsql.sh; .env.example lists every setting." \
    "MARKET_HOST=0.0.0.0" \
    "MARKET_BUYER_PORT=$BUYER_PORT" \
    "MARKET_SELLER_PORT=$SELLER_PORT" \
    "MARKET_DB_URL=mysql://$DB_USER:$1@127.0.0.1:3306/$DB_NAME" \
    "MARKET_THREADS=16" \
    "CLOUD_SQL_INSTANCE=$SQL_CONNECTION"
}

# The settings file on stdin, with this run's ports (the ports network.sh opened); every other
# line as it is, edits included.
with_ports() {
  local line buyer="" seller=""
  while IFS= read -r line || [ -n "$line" ]; do
    case $line in
      MARKET_BUYER_PORT=*) line=MARKET_BUYER_PORT=$BUYER_PORT buyer=1 ;;
      MARKET_SELLER_PORT=*) line=MARKET_SELLER_PORT=$SELLER_PORT seller=1 ;;
    esac
    printf '%s\n' "$line"
  done
  [ -n "$buyer" ] || printf 'MARKET_BUYER_PORT=%s\n' "$BUYER_PORT"
  [ -n "$seller" ] || printf 'MARKET_SELLER_PORT=%s\n' "$SELLER_PORT"
}

if ! exists gcloud secrets describe "$ENV_SECRET" --project "$PROJECT"; then
  # A new password only when there is no settings secret yet, so re-runs keep the working one.
  password=$(openssl rand -hex 24)  # hex: nothing to escape in a URL or in YAML
  if gcloud sql users list --instance "$SQL_INSTANCE" --project "$PROJECT" --format='value(name)' \
      | grep -qx "$DB_USER"; then
    verb=set-password
  else
    verb=create
  fi
  printf -- "--password: '%s'\n" "$password" | private_gcloud sql users "$verb" "$DB_USER" --host=% \
    --instance "$SQL_INSTANCE" --project "$PROJECT" --flags-file=-
  market_env "$password" | private_gcloud secrets create "$ENV_SECRET" --project "$PROJECT" \
    --replication-policy=automatic --data-file=-
else
  # Settings written before: a new version only when the ports changed, the password kept.
  current=$(private_gcloud secrets versions access latest --secret="$ENV_SECRET" --project "$PROJECT")
  updated=$(printf '%s\n' "$current" | with_ports)
  if [ "$updated" != "$current" ]; then
    printf '%s\n' "$updated" | private_gcloud secrets versions add "$ENV_SECRET" --project "$PROJECT" \
      --data-file=-
    echo "$ENV_SECRET: the servers' ports are now $BUYER_PORT and $SELLER_PORT; vm.sh (or a reset of" \
      "the VM) applies them"
  fi
fi
