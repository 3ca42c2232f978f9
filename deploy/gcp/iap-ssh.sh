#!/usr/bin/env bash
# Optional: `open` lets SSH in from Google's Identity-Aware Proxy only (35.235.240.0/20, no
# public SSH), for `gcloud compute ssh --tunnel-through-iap`; `close` removes that rule again.
set -euo pipefail
# shellcheck source=deploy/gcp/config.sh
source "$(dirname "$0")/config.sh"

case "${1:-}" in
  open)
    if ! exists gcloud compute firewall-rules describe "$IAP_SSH_RULE" --project "$PROJECT"; then
      gcloud compute firewall-rules create "$IAP_SSH_RULE" --project "$PROJECT" --network "$NETWORK" \
        --direction=INGRESS --action=ALLOW --rules=tcp:22 --source-ranges=35.235.240.0/20 \
        --target-tags="$SERVER_TAG"
    fi
    ;;
  close)
    if exists gcloud compute firewall-rules describe "$IAP_SSH_RULE" --project "$PROJECT"; then
      gcloud compute firewall-rules delete "$IAP_SSH_RULE" --project "$PROJECT" --quiet
    fi
    ;;
  *)
    echo "usage: $0 open|close" >&2
    exit 2
    ;;
esac
