#!/usr/bin/env bash
# Delete everything up.sh created: the load balancers, the instance groups, their templates and
# health checks, the images, the IP, the bucket, the service account, the secrets (settings,
# TLS), the Cloud SQL instance (its deletion protection lifted: its data goes too!), the
# firewall rules and the network. The private CA made on this machine (TLS_DIR) stays.
# Asks first unless YES=1. A deleted Cloud SQL instance's name stays taken for about a week.
# Run it with the settings (REGION, names) up.sh ran with. Safe to run again; --dry-run prints.
set -euo pipefail
# shellcheck source=deploy/gcp/config.sh
source "$(dirname "$0")/config.sh"
need_zone

if [ "${YES:-}" != 1 ] && [ -z "$DRY_RUN" ]; then
  read -r -p "Delete the marketplace in project $PROJECT, database included? [y/N] " answer
  [ "$answer" = y ] || exit 1
fi

for role in "${ROLES[@]}"; do
  for kind in forwarding-rules backend-services "instance-groups managed"; do
    # shellcheck disable=SC2086  # "instance-groups managed": two words
    if exists gcloud compute $kind describe "market-$role" --region "$REGION" --project "$PROJECT"; then
      gcloud compute $kind delete "market-$role" --region "$REGION" --project "$PROJECT" --quiet
    fi
  done
  for check in "market-$role-live" "market-$role-ready"; do
    if exists gcloud compute health-checks describe "$check" --region "$REGION" --project "$PROJECT"; then
      gcloud compute health-checks delete "$check" --region "$REGION" --project "$PROJECT" --quiet
    fi
  done
done
for template in $(gcloud compute instance-templates list --project "$PROJECT" \
    --filter="name ~ ^market-(buyer|seller)-" --format='value(name)'); do
  gcloud compute instance-templates delete "$template" --project "$PROJECT" --quiet
done
for image in $(gcloud compute images list --project "$PROJECT" --no-standard-images \
    --filter="family=$IMAGE_FAMILY" --format='value(name)'); do
  gcloud compute images delete "$image" --project "$PROJECT" --quiet
done
if exists gcloud compute instances describe "$BUILDER" --zone "$ZONE" --project "$PROJECT"; then
  gcloud compute instances delete "$BUILDER" --zone "$ZONE" --project "$PROJECT" --quiet
fi
if exists gcloud compute addresses describe "$ADDRESS" --region "$REGION" --project "$PROJECT"; then
  gcloud compute addresses delete "$ADDRESS" --region "$REGION" --project "$PROJECT" --quiet
fi
if exists gcloud storage buckets describe "gs://$BUCKET" --project "$PROJECT"; then
  gcloud storage rm --recursive "gs://$BUCKET" --project "$PROJECT"
fi
for role in roles/cloudsql.client roles/logging.logWriter roles/monitoring.metricWriter; do
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
  gcloud sql instances patch "$SQL_INSTANCE" --project "$PROJECT" --no-deletion-protection --quiet
  gcloud sql instances delete "$SQL_INSTANCE" --project "$PROJECT" --quiet
fi
for rule in "$FIREWALL_RULE" "$HEALTH_RULE" "$IAP_SSH_RULE"; do
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
