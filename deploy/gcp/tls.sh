#!/usr/bin/env bash
# The servers' TLS certificate in Secret Manager: three secrets (certificate, key, and the CA the
# clients trust) that the VM's startup script installs. Your own files when TLS_CERT, TLS_KEY
# and TLS_CA are set; else a private CA and a certificate naming the load balancers' IP (and
# TLS_NAMES), made in TLS_DIR on this machine by deploy/tls/make-certs.sh. Secrets that exist
# are kept: to replace the certificate, add versions (docs/deploy.md) and reset the VM.
set -euo pipefail
# shellcheck source=deploy/gcp/config.sh
source "$(dirname "$0")/config.sh"

if exists gcloud secrets describe "$TLS_CERT_SECRET" --project "$PROJECT"; then
  echo "$TLS_CERT_SECRET: kept (the servers' certificate)"
  exit 0
fi
if [ -n "$TLS_CERT$TLS_KEY$TLS_CA" ]; then
  if [ ! -s "$TLS_CERT" ] || [ ! -s "$TLS_KEY" ] || [ ! -s "$TLS_CA" ]; then
    echo "TLS_CERT, TLS_KEY and TLS_CA go together: the certificate, its key, the CA that signed it" >&2
    exit 2
  fi
  cert=$TLS_CERT key=$TLS_KEY ca=$TLS_CA
else
  ip=$(gcloud compute addresses describe "$ADDRESS" --region "$REGION" --project "$PROJECT" \
    --format='value(address)') || [ -n "$DRY_RUN" ]  # a dry run before network.sh made it
  run "$REPO/deploy/tls/make-certs.sh" "$TLS_DIR" "$ip" "$TLS_NAMES"
  cert=$TLS_DIR/server.pem key=$TLS_DIR/server.key ca=$TLS_DIR/ca.pem
fi
# The files on standard input: the key is never in an argument nor in gcloud's log files
# (private_gcloud). A secret left by a run that stopped half-way gets a new version.
put_secret() {
  if exists gcloud secrets describe "$1" --project "$PROJECT"; then
    private_gcloud secrets versions add "$1" --project "$PROJECT" --data-file=- <"$2"
  else
    private_gcloud secrets create "$1" --project "$PROJECT" --replication-policy=automatic --data-file=- <"$2"
  fi
}
if [ -n "$DRY_RUN" ]; then
  echo "would put $cert, $key and $ca in Secret Manager"
  exit 0
fi
put_secret "$TLS_KEY_SECRET" "$key"
put_secret "$TLS_CA_SECRET" "$ca"
put_secret "$TLS_CERT_SECRET" "$cert"  # last: its secret is the sign that the three are there
echo "TLS: the servers' certificate is in Secret Manager; the clients trust $ca (--tls-ca)"
