#!/usr/bin/env bash
# A server VM's startup script, at every boot. Nothing is installed here (the image holds it
# all: build.sh): the settings and the TLS files from Secret Manager into /etc/market/, then
# the Cloud SQL Auth Proxy, the schema's upgrade (many VMs boot at once: it waits for its
# lock, and is a no-op when done) and the one server of the VM's role.
set -euo pipefail

attribute() {
  curl -fsS -H 'Metadata-Flavor: Google' \
    "http://metadata.google.internal/computeMetadata/v1/instance/attributes/$1"
}
ROLE=$(attribute market-role)
ENV_SECRET=$(attribute market-secret)
TLS_SECRETS=("$(attribute market-tls-cert)" "$(attribute market-tls-key)" "$(attribute market-tls-ca)")
APP=/opt/market
case $ROLE in
  buyer | seller) ;;
  *) echo "market-role is $ROLE: buyer or seller expected" >&2; exit 1 ;;
esac

fetched=$(mktemp -d)
trap 'rm -rf "$fetched"' EXIT
install -d -m 750 -o root -g market /etc/market /etc/market/tls
gcloud secrets versions access latest --secret="$ENV_SECRET" >"$fetched/market.env"
install -m 640 -o root -g market "$fetched/market.env" /etc/market/market.env
# TLS: the files the units' MARKET_TLS_CERT, MARKET_TLS_KEY and MARKET_TLS_CA name
for pair in "server.pem:${TLS_SECRETS[0]}" "server.key:${TLS_SECRETS[1]}" "ca.pem:${TLS_SECRETS[2]}"; do
  gcloud secrets versions access latest --secret="${pair#*:}" >"$fetched/tls-file"
  install -m 640 -o root -g market "$fetched/tls-file" "/etc/market/tls/${pair%%:*}"
done

# The schema's upgrade, a step of its own between the proxy and the server (which refuses a
# database not at its release's revision): as the servers' user, with their settings; tried
# for a minute while the proxy comes up.
systemctl restart cloud-sql-proxy.service
upgraded=no
for _ in $(seq 30); do
  if systemd-run --wait --collect --quiet --pipe --uid=market --gid=market \
      -p EnvironmentFile=/etc/market/market.env -p WorkingDirectory=/var/lib/market \
      "$APP/venv/bin/market" db upgrade; then
    upgraded=yes
    break
  fi
  sleep 2
done
[ "$upgraded" = yes ] || { echo "market db upgrade failed: the server is not started" >&2; exit 1; }
systemctl restart "market-$ROLE.service"
