#!/usr/bin/env bash
# Cloud SQL for MySQL 8 with a private IP only, the `market` database and user, and the VM's
# settings file (with the user's password) in Secret Manager. The password is never printed.
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
# setting keeps its default (.env.example).
market_env() {
  cat <<ENV
# /etc/market/market.env, written by deploy/gcp/cloudsql.sh; .env.example lists every setting.
MARKET_HOST=0.0.0.0
MARKET_BUYER_PORT=$BUYER_PORT
MARKET_SELLER_PORT=$SELLER_PORT
MARKET_DB_URL=mysql://$DB_USER:$1@127.0.0.1:3306/$DB_NAME
MARKET_THREADS=16
CLOUD_SQL_INSTANCE=$SQL_CONNECTION
ENV
}

# A new password only when there is no settings secret yet, so re-runs keep the working one.
if ! exists gcloud secrets describe "$ENV_SECRET" --project "$PROJECT"; then
  password=$(openssl rand -hex 24)  # hex: nothing to escape in a URL
  if gcloud sql users list --instance "$SQL_INSTANCE" --project "$PROJECT" --format='value(name)' \
      | grep -qx "$DB_USER"; then
    gcloud sql users set-password "$DB_USER" --host=% --instance "$SQL_INSTANCE" --project "$PROJECT" \
      --password="$password"
  else
    gcloud sql users create "$DB_USER" --host=% --instance "$SQL_INSTANCE" --project "$PROJECT" \
      --password="$password"
  fi
  market_env "$password" | gcloud secrets create "$ENV_SECRET" --project "$PROJECT" \
    --replication-policy=automatic --data-file=-
fi
