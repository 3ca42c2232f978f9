#!/usr/bin/env bash
# Delete everything up.sh created: the VM and its IP, the bucket, the service account, the
# secrets (settings, TLS), the Cloud SQL instance (and its data!), the firewall rules and the
# network. The private CA made on this machine (TLS_DIR) stays.
# Asks first unless YES=1. A deleted Cloud SQL instance's name stays taken for about a week.
# Run it with the settings (REGION, ZONE, names) up.sh ran with. Safe to run again.
set -euo pipefail
# shellcheck source=deploy/gcp/config.sh
source "$(dirname "$0")/config.sh"
need_zone

if [ "${YES:-}" != 1 ]; then
  read -r -p "Delete the marketplace in project $PROJECT, database included? [y/N] " answer
  [ "$answer" = y ] || exit 1
fi

if exists gcloud compute instances describe "$VM_NAME" --zone "$ZONE" --project "$PROJECT"; then
  gcloud compute instances delete "$VM_NAME" --zone "$ZONE" --project "$PROJECT" --quiet
fi
if exists gcloud compute addresses describe "$VM_ADDRESS" --region "$REGION" --project "$PROJECT"; then
  gcloud compute addresses delete "$VM_ADDRESS" --region "$REGION" --project "$PROJECT" --quiet
fi
if exists gcloud storage buckets describe "gs://$BUCKET" --project "$PROJECT"; then
  gcloud storage rm --recursive "gs://$BUCKET" --project "$PROJECT"
fi
for role in roles/cloudsql.client roles/logging.logWriter; do
  gcloud projects remove-iam-policy-binding "$PROJECT" --member="serviceAccount:$VM_SA" --role="$role" \
    --condition=None >/dev/null 2>&1 || true
done
if exists gcloud iam service-accounts describe "$VM_SA" --project "$PROJECT"; then
  gcloud iam service-accounts delete "$VM_SA" --project "$PROJECT" --quiet
fi
for secret in "$ENV_SECRET" "$TLS_CERT_SECRET" "$TLS_KEY_SECRET" "$TLS_CA_SECRET"; do
  if exists gcloud secrets describe "$secret" --project "$PROJECT"; then
    gcloud secrets delete "$secret" --project "$PROJECT" --quiet
  fi
done
if exists gcloud sql instances describe "$SQL_INSTANCE" --project "$PROJECT"; then
  gcloud sql instances delete "$SQL_INSTANCE" --project "$PROJECT" --quiet
fi
for rule in "$FIREWALL_RULE" "$IAP_SSH_RULE"; do
  if exists gcloud compute firewall-rules describe "$rule" --project "$PROJECT"; then
    gcloud compute firewall-rules delete "$rule" --project "$PROJECT" --quiet
  fi
done
# Private services access: the network's peering with Cloud SQL's. `gcloud services vpc-peerings
# delete` is refused for hours or days after the instance is deleted ("Producer services ... are
# still using this connection"), so the peering is removed from this network's side, as the
# console does; then the range, the subnet and the network can go.
peerings=$(gcloud compute networks describe "$NETWORK" --project "$PROJECT" --flatten=peerings \
  --format='value(peerings.name)' 2>/dev/null || true)
if grep -qxF "$SQL_PEERING" <<<"$peerings"; then
  gcloud compute networks peerings delete "$SQL_PEERING" --network="$NETWORK" --project "$PROJECT" --quiet
fi
if exists gcloud compute addresses describe "$PEERING_RANGE" --global --project "$PROJECT"; then
  gcloud compute addresses delete "$PEERING_RANGE" --global --project "$PROJECT" --quiet
fi
if exists gcloud compute networks subnets describe "$SUBNET" --region "$REGION" --project "$PROJECT"; then
  gcloud compute networks subnets delete "$SUBNET" --region "$REGION" --project "$PROJECT" --quiet
fi
if exists gcloud compute networks describe "$NETWORK" --project "$PROJECT"; then
  gcloud compute networks delete "$NETWORK" --project "$PROJECT" --quiet
fi
