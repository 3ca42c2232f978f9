#!/usr/bin/env bash
# The VM's startup script: runs as root at every boot. Installs the Cloud SQL Auth Proxy, the
# release from the bucket into /opt/market/venv (its dependencies from the lock file), the
# settings and the TLS certificate from Secret Manager into /etc/market/, the systemd units, then
# (re)starts the three services.
set -euo pipefail

attribute() {
  curl -fsS -H 'Metadata-Flavor: Google' \
    "http://metadata.google.internal/computeMetadata/v1/instance/attributes/$1"
}
BUCKET=$(attribute market-bucket)
ENV_SECRET=$(attribute market-secret)
TLS_SECRETS=("$(attribute market-tls-cert)" "$(attribute market-tls-key)" "$(attribute market-tls-ca)")
PROXY_VERSION=$(attribute proxy-version)
APP=/opt/market
SERVICES=(cloud-sql-proxy.service market-buyer.service market-seller.service)

apt-get update -qq
apt-get install -y -qq python3-venv >/dev/null
if ! id market >/dev/null 2>&1; then
  useradd --system --user-group --home-dir /var/lib/market --create-home --shell /usr/sbin/nologin market
fi

proxy=/usr/local/bin/cloud-sql-proxy
if ! "$proxy" --version 2>/dev/null | grep -q "${PROXY_VERSION#v}"; then
  curl -fsSLo "$proxy.new" \
    "https://storage.googleapis.com/cloud-sql-connectors/cloud-sql-proxy/$PROXY_VERSION/cloud-sql-proxy.linux.amd64"
  install -m 755 "$proxy.new" "$proxy" && rm -f "$proxy.new"
fi

release=$(mktemp -d)
trap 'rm -rf "$release"' EXIT
gcloud storage cp "gs://$BUCKET/release/*" "$release/"
[ -x "$APP/venv/bin/python" ] || python3 -m venv "$APP/venv"
# The dependencies from the lock file (exact versions, every file's hash checked), then the
# wheel without dependencies: nothing unpinned comes in. Same version, new code: reinstalled.
"$APP/venv/bin/pip" install --quiet --require-hashes --no-deps -r "$release/runtime.txt"
"$APP/venv/bin/pip" install --quiet --force-reinstall --no-deps "$release"/*.whl

install -d -m 750 -o root -g market /etc/market
gcloud secrets versions access latest --secret="$ENV_SECRET" >"$release/market.env"
install -m 640 -o root -g market "$release/market.env" /etc/market/market.env
# TLS: the files the units' MARKET_TLS_CERT, MARKET_TLS_KEY and MARKET_TLS_CA name
install -d -m 750 -o root -g market /etc/market/tls
for pair in "server.pem:${TLS_SECRETS[0]}" "server.key:${TLS_SECRETS[1]}" "ca.pem:${TLS_SECRETS[2]}"; do
  gcloud secrets versions access latest --secret="${pair#*:}" >"$release/tls-file"
  install -m 640 -o root -g market "$release/tls-file" "/etc/market/tls/${pair%%:*}"
done

install -m 644 "$release"/*.service /etc/systemd/system/
systemctl daemon-reload
systemctl enable "${SERVICES[@]}"
systemctl restart "${SERVICES[@]}"
