#!/usr/bin/env bash
# The network: a VPC with one subnet, private services access (Cloud SQL gets a private IP
# in it), one firewall rule letting in the buyer and seller ports from CLIENT_RANGES, one
# letting Google's health checkers reach HEALTH_PORT, nothing else, and the load balancers'
# static external IP (named in the servers' TLS certificate: tls.sh).
set -euo pipefail
# shellcheck source=deploy/gcp/config.sh
source "$(dirname "$0")/config.sh"

gcloud services enable compute.googleapis.com sqladmin.googleapis.com servicenetworking.googleapis.com \
  secretmanager.googleapis.com storage.googleapis.com iam.googleapis.com --project "$PROJECT"
need_zone  # a ZONE that image.sh cannot use stops here, before anything is created

# This machine's public address, as the web sees it (CALLER_ADDRESS skips the question).
caller_address() {
  local address=${CALLER_ADDRESS:-}
  [ -n "$address" ] || address=$(curl -fsS --max-time 10 https://checkip.amazonaws.com 2>/dev/null) || true
  address=$(tr -d '[:space:]' <<<"$address")
  [[ $address =~ ^[0-9]{1,3}(\.[0-9]{1,3}){3}$ ]] && echo "$address"
}

# CLIENT_RANGES has no default that opens the ports to everyone: when it is unset, a terminal
# is asked (this machine's address offered), and a run without one takes this machine's address.
firewall_ranges() {
  local mine answer
  mine=$(caller_address) || mine=""
  if [ -t 0 ]; then
    read -r -p "Addresses that may reach the servers (CIDR ranges, comma-separated)${mine:+ [$mine/32]}: " answer
    answer=${answer:-${mine:+$mine/32}}
  elif [ -n "$mine" ]; then
    answer=$mine/32
    echo "CLIENT_RANGES is not set: only this machine ($answer) may reach the servers" >&2
  fi
  if [ -z "${answer:-}" ]; then
    echo "set CLIENT_RANGES to the addresses of your clients, e.g. CLIENT_RANGES=203.0.113.0/24" >&2
    exit 2
  fi
  echo "$answer"
}

ranges=$CLIENT_RANGES  # asked for before anything is created, when the rule is to be made
if [ -z "$ranges" ] && ! exists gcloud compute firewall-rules describe "$FIREWALL_RULE" --project "$PROJECT"; then
  ranges=$(firewall_ranges)
fi

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

# A custom-mode VPC denies all ingress by default; this rule and the health checks' open the rest.
# A re-run keeps the rule's ranges unless CLIENT_RANGES is given.
if exists gcloud compute firewall-rules describe "$FIREWALL_RULE" --project "$PROJECT"; then
  gcloud compute firewall-rules update "$FIREWALL_RULE" --project "$PROJECT" \
    --rules="tcp:$BUYER_PORT,tcp:$SELLER_PORT" ${ranges:+--source-ranges="$ranges"}
else
  gcloud compute firewall-rules create "$FIREWALL_RULE" --project "$PROJECT" --network "$NETWORK" \
    --direction=INGRESS --action=ALLOW --rules="tcp:$BUYER_PORT,tcp:$SELLER_PORT" \
    --source-ranges="$ranges" --target-tags="$SERVER_TAG"
fi
case ",${CLIENT_RANGES:-}," in
  *,0.0.0.0/0,*) echo "warning: CLIENT_RANGES opens the servers' ports to every address" >&2 ;;
esac

# Health checks (autohealing's and the load balancers') reach each VM's HEALTH_PORT only.
if ! exists gcloud compute firewall-rules describe "$HEALTH_RULE" --project "$PROJECT"; then
  gcloud compute firewall-rules create "$HEALTH_RULE" --project "$PROJECT" --network "$NETWORK" \
    --direction=INGRESS --action=ALLOW --rules="tcp:$HEALTH_PORT" --source-ranges="$HEALTH_CHECK_RANGES" \
    --target-tags="$SERVER_TAG"
fi

if ! exists gcloud compute addresses describe "$ADDRESS" --region "$REGION" --project "$PROJECT"; then
  gcloud compute addresses create "$ADDRESS" --region "$REGION" --project "$PROJECT"
fi
