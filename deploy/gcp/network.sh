#!/usr/bin/env bash
# The network: a VPC with one subnet, private services access (Cloud SQL gets a private IP
# in it), and one firewall rule letting in the buyer and seller ports, nothing else.
set -euo pipefail
# shellcheck source=deploy/gcp/config.sh
source "$(dirname "$0")/config.sh"

gcloud services enable compute.googleapis.com sqladmin.googleapis.com servicenetworking.googleapis.com \
  secretmanager.googleapis.com storage.googleapis.com iam.googleapis.com --project "$PROJECT"
need_zone  # a ZONE that vm.sh cannot use stops here, before anything is created

if ! exists gcloud compute networks describe "$NETWORK" --project "$PROJECT"; then
  gcloud compute networks create "$NETWORK" --project "$PROJECT" --subnet-mode=custom
fi
if ! exists gcloud compute networks subnets describe "$SUBNET" --region "$REGION" --project "$PROJECT"; then
  gcloud compute networks subnets create "$SUBNET" --project "$PROJECT" --region "$REGION" \
    --network "$NETWORK" --range "$SUBNET_RANGE" --enable-private-ip-google-access
fi

if ! exists gcloud compute addresses describe "$PEERING_RANGE" --global --project "$PROJECT"; then
  gcloud compute addresses create "$PEERING_RANGE" --project "$PROJECT" --global \
    --purpose=VPC_PEERING --prefix-length=16 --network="$NETWORK"
fi
if ! gcloud services vpc-peerings list --network="$NETWORK" --project "$PROJECT" --format='value(peering)' \
    | grep -q .; then
  gcloud services vpc-peerings connect --project "$PROJECT" --service=servicenetworking.googleapis.com \
    --ranges="$PEERING_RANGE" --network="$NETWORK"
fi

# A custom-mode VPC denies all ingress by default; this is the only rule that opens anything.
if exists gcloud compute firewall-rules describe "$FIREWALL_RULE" --project "$PROJECT"; then
  gcloud compute firewall-rules update "$FIREWALL_RULE" --project "$PROJECT" \
    --rules="tcp:$BUYER_PORT,tcp:$SELLER_PORT" --source-ranges="$CLIENT_RANGES"
else
  gcloud compute firewall-rules create "$FIREWALL_RULE" --project "$PROJECT" --network "$NETWORK" \
    --direction=INGRESS --action=ALLOW --rules="tcp:$BUYER_PORT,tcp:$SELLER_PORT" \
    --source-ranges="$CLIENT_RANGES" --target-tags="$SERVER_TAG"
fi
