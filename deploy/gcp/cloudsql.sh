#!/usr/bin/env bash
# Cloud SQL for MySQL 8 with a private IP only, highly available with point-in-time recovery,
# the `market` database and user, and the VMs' settings file (with the user's password) in
# Secret Manager. The password is never printed and
# never on a command line: gcloud reads it from its standard input (see private_gcloud).
set -euo pipefail
# shellcheck source=deploy/gcp/config.sh
source "$(dirname "$0")/config.sh"

# High availability (a standby in another zone, failed over to by Cloud SQL), daily backups,
# point-in-time recovery from the binary logs, and deletion protection (teardown.sh lifts it).
protection=(--availability-type="$SQL_AVAILABILITY" --backup-start-time=03:00 --enable-bin-log
            --retained-transaction-log-days="$SQL_LOG_DAYS" --deletion-protection)
if ! exists gcloud sql instances describe "$SQL_INSTANCE" --project "$PROJECT"; then
  gcloud sql instances create "$SQL_INSTANCE" --project "$PROJECT" --region "$REGION" \
    --database-version="$SQL_VERSION" --edition=enterprise --tier="$SQL_TIER" \
    --network="projects/$PROJECT/global/networks/$NETWORK" --no-assign-ip \
    --storage-auto-increase "${protection[@]}"
elif [ "$(gcloud sql instances describe "$SQL_INSTANCE" --project "$PROJECT" \
    --format='value(settings.availabilityType,settings.backupConfiguration.binaryLogEnabled,settings.deletionProtectionEnabled)')" \
    != "$SQL_AVAILABILITY"$'\t'True$'\t'True ]; then
  # an instance made before: brought to the same settings (a change of availability restarts it)
  gcloud sql instances patch "$SQL_INSTANCE" --project "$PROJECT" "${protection[@]}" --quiet
fi
if ! exists gcloud sql databases describe "$DB_NAME" --instance "$SQL_INSTANCE" --project "$PROJECT"; then
  gcloud sql databases create "$DB_NAME" --instance "$SQL_INSTANCE" --project "$PROJECT" \
    --charset=utf8mb4 --collation=utf8mb4_bin
fi

# The settings file of the VMs. The servers reach the database through the Cloud SQL Auth
# Proxy on each VM's loopback. Each call waits for the database over the network, so more
# calls stay in flight than on one machine (MARKET_THREADS 16, not 3): with the database 2 ms
# away, 16 threads served 1.8 times the calls of 3 and 32 no more, and on two cores more
# processes did not help (docs/studies.md#a-remote-database); every other MARKET_* setting
# keeps its default (.env.example). printf is a shell builtin: the password, $1, is not
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
    echo "$ENV_SECRET: the servers' ports are now $BUYER_PORT and $SELLER_PORT; mig.sh (a rolling" \
      "replacement of the VMs) applies them"
  fi
fi
