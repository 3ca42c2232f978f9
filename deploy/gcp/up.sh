#!/usr/bin/env bash
# Everything, in order: the network and firewall, Cloud SQL, the TLS certificate, then the VM
# running both servers.
# Safe to run again: what exists is kept, and the VM is given the current release.
set -euo pipefail
here=$(dirname "$0")
"$here/network.sh"
"$here/cloudsql.sh"
"$here/tls.sh"
"$here/vm.sh"
