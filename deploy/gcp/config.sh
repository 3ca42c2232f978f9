#!/usr/bin/env bash
# shellcheck disable=SC2034  # the variables are used by the scripts that source this file
# The settings of every deploy/gcp script, sourced at their top. Override any of them from the
# environment, e.g.  PROJECT=my-project REGION=europe-west1 deploy/gcp/up.sh
# Every script takes --dry-run: it prints what it would change, and changes nothing.
set -euo pipefail

PROJECT=${PROJECT:-$(gcloud config get-value project 2>/dev/null)}
REGION=${REGION:-us-central1}
ZONE=${ZONE:-}  # the image builder's zone; empty: the first of REGION's zones (need_zone, below)

NETWORK=${NETWORK:-market-net}
SUBNET=${SUBNET:-market-subnet}
SUBNET_RANGE=${SUBNET_RANGE:-10.20.0.0/24}
PEERING_RANGE=${PEERING_RANGE:-market-sql-peering}  # private services access: Cloud SQL's private IP
SQL_PEERING=servicenetworking-googleapis-com          # the network peering that access makes
CLIENT_RANGES=${CLIENT_RANGES:-}  # who may reach the two ports (CIDR, comma-separated): no open default (network.sh)
BUYER_PORT=${BUYER_PORT:-7001}
SELLER_PORT=${SELLER_PORT:-7002}
SERVER_TAG=market-server
FIREWALL_RULE=${NETWORK}-allow-market
IAP_SSH_RULE=${NETWORK}-allow-iap-ssh                 # only while deploy/gcp/iap-ssh.sh opens it

SQL_INSTANCE=${SQL_INSTANCE:-market-sql}
SQL_VERSION=${SQL_VERSION:-MYSQL_8_0}
SQL_TIER=${SQL_TIER:-db-custom-1-3840}
SQL_AVAILABILITY=${SQL_AVAILABILITY:-REGIONAL}        # a standby in another zone; ZONAL halves the cost
SQL_LOG_DAYS=${SQL_LOG_DAYS:-7}                       # point-in-time recovery: binary logs kept this long
DB_NAME=${DB_NAME:-market}
DB_USER=${DB_USER:-market}
ENV_SECRET=${ENV_SECRET:-market-env}                  # Secret Manager: the VM's /etc/market/market.env
# TLS (tls.sh): the servers' certificate, its key and the CA clients trust, each a secret. Your
# own files in TLS_CERT, TLS_KEY and TLS_CA; else a private CA made in TLS_DIR on this machine.
TLS_CERT_SECRET=${TLS_CERT_SECRET:-market-tls-cert}
TLS_KEY_SECRET=${TLS_KEY_SECRET:-market-tls-key}
TLS_CA_SECRET=${TLS_CA_SECRET:-market-tls-ca}
TLS_CERT=${TLS_CERT:-}
TLS_KEY=${TLS_KEY:-}
TLS_CA=${TLS_CA:-}
TLS_NAMES=${TLS_NAMES:-}                              # host names in the certificate, besides the VM's IP

# The servers: per role, a regional managed instance group of VMs made from a baked image
# (image.sh), behind a regional TCP (passthrough) load balancer on ADDRESS (mig.sh).
GROUP_SIZE=${GROUP_SIZE:-2}                           # VMs per role, spread over REGION's zones
VM_MACHINE_TYPE=${VM_MACHINE_TYPE:-e2-small}
ADDRESS=${ADDRESS:-market-ip}                         # the load balancers' static IP (both ports)
VM_SA_NAME=${VM_SA_NAME:-market-vm}
IMAGE_FAMILY=${IMAGE_FAMILY:-market}                  # the baked images; the newest serves
BUILDER=${BUILDER:-market-image-builder}              # the VM that bakes one (deleted after)
HEALTH_PORT=9100                                      # each VM's /healthz, /readyz, /metrics (the units')
BUCKET=${BUCKET:-${PROJECT}-market-release}           # the release: a wheel, the lock file, the units
PROXY_VERSION=${PROXY_VERSION:-v2.14.1}               # Cloud SQL Auth Proxy
# Its linux.amd64 binary's SHA-256, from the release's page (github.com/GoogleCloudPlatform/
# cloud-sql-proxy/releases): image.sh refuses to bake without it, and the builder checks it.
PROXY_SHA256=${PROXY_SHA256:-}
# Google's health checkers and passthrough load balancers come from these ranges.
HEALTH_CHECK_RANGES=35.191.0.0/16,209.85.152.0/22,209.85.204.0/22
HEALTH_RULE=${NETWORK}-allow-health-checks
ROLES=(buyer seller)

VM_SA=${VM_SA_NAME}@${PROJECT}.iam.gserviceaccount.com
SQL_CONNECTION=${PROJECT}:${REGION}:${SQL_INSTANCE}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)

if [ -z "$PROJECT" ]; then
  echo "set PROJECT (or run: gcloud config set project PROJECT_ID)" >&2
  exit 2
fi

TLS_DIR=${TLS_DIR:-$HOME/.config/market/tls-$PROJECT}  # the private CA's files (ca.pem for the clients)

# True when a `gcloud ... describe` (the arguments) finds the resource.
exists() { "$@" >/dev/null 2>&1; }

# --dry-run (or DRY_RUN=1): gcloud reads (describe, list, ...) run, every change is printed
# instead ("would run: gcloud ..."), so the output is the plan against the project as it is.
DRY_RUN=${DRY_RUN:-}
for arg in "$@"; do
  if [ "$arg" = --dry-run ]; then DRY_RUN=1; fi
done
if [ -n "$DRY_RUN" ]; then
  gcloud() {
    case " $* " in
      *" describe "* | *" describe-from-family "* | *" list "* | *" get-value "* | *" versions access "*)
        command gcloud "$@" ;;
      *" --flags-file=- "* | *" --data-file=- "*)  # read what is piped in, so the writer ends well
        cat >/dev/null
        printf 'would run: gcloud%s\n' "$(printf ' %q' "$@")" ;;
      *) printf 'would run: gcloud%s\n' "$(printf ' %q' "$@")" ;;
    esac
  }
fi
# A step that changes something outside gcloud (a local build, an upload): printed in a dry run.
run() {
  if [ -n "$DRY_RUN" ]; then printf 'would run:%s\n' "$(printf ' %q' "$@")"; else "$@"; fi
}

# gcloud for the commands that see a password or a private key. gcloud logs every command's
# arguments to a file under its configuration folder (~/.config/gcloud/logs, mode 644 under the
# usual umask): these log nothing to a file, nor HTTP bodies anywhere. The secret comes on stdin,
# as a flags file (--flags-file=-) or as data (--data-file=-), never as an argument.
private_gcloud() { CLOUDSDK_CORE_DISABLE_FILE_LOGGING=1 CLOUDSDK_CORE_LOG_HTTP=false gcloud "$@"; }

# Sets ZONE, when empty, to the first of REGION's zones, and checks that it is one of them;
# exits otherwise. Not every region has a zone "-a" (europe-west1 and us-east1 have b, c and d).
# Asks Compute Engine, so its API must be enabled (network.sh enables it).
need_zone() {
  local zones
  if ! zones=$(gcloud compute regions describe "$REGION" --project "$PROJECT" --flatten=zones \
      --format='value(zones.basename())') || [ -z "$zones" ]; then
    echo "cannot list the zones of REGION=$REGION (gcloud compute regions list shows the regions)" >&2
    exit 2
  fi
  zones=$(sort <<<"$zones" | sed '/^$/d')
  ZONE=${ZONE:-${zones%%$'\n'*}}
  if [ -z "$ZONE" ] || ! grep -qxF -- "$ZONE" <<<"$zones"; then
    echo "ZONE=$ZONE is not a zone of REGION=$REGION; its zones: ${zones//$'\n'/ }" >&2
    exit 2
  fi
}
