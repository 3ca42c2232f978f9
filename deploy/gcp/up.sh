#!/usr/bin/env bash
# Everything, in order: the network and firewall, Cloud SQL, the TLS certificate, the servers'
# image, then the two instance groups behind their load balancers. --dry-run: the plan alone.
# Safe to run again: what exists is kept, and the groups roll onto a new image.
set -euo pipefail
here=$(dirname "$0")
"$here/network.sh" "$@"
"$here/cloudsql.sh" "$@"
"$here/tls.sh" "$@"
"$here/image.sh" "$@"
"$here/mig.sh" "$@"
