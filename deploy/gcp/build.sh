#!/usr/bin/env bash
# The image builder's startup script (image.sh starts the builder VM with it): installs, once,
# everything a server VM runs, then powers the VM off; image.sh makes the image from its disk.
# Every download is checked: the Cloud SQL Auth Proxy against PROXY_SHA256, the release's files
# against the sums image.sh computed on the operator's machine, the Python packages against the
# lock file's hashes, the Ops Agent and python3-venv by apt against the signed repositories.
# A failure leaves the builder running, its log in the serial console, and no image is made.
set -euo pipefail
trap 'echo "market-image: FAILED at line $LINENO" >&2' ERR

attribute() {
  curl -fsS -H 'Metadata-Flavor: Google' \
    "http://metadata.google.internal/computeMetadata/v1/instance/attributes/$1"
}
BUCKET=$(attribute market-bucket)
PROXY_VERSION=$(attribute proxy-version)
PROXY_SHA256=$(attribute proxy-sha256)
APP=/opt/market
export DEBIAN_FRONTEND=noninteractive

# The Ops Agent from Google's repository, signed by the key the image already trusts for
# packages.cloud.google.com (its gcloud comes from there).
sources=$(grep -rlF packages.cloud.google.com /etc/apt/sources.list.d/ || true)
# shellcheck disable=SC2086  # the file names, one a word
keyring=$( [ -z "$sources" ] || grep -hoiP '(signed-by=|Signed-By: *)\K[^]\s]+' $sources | head -n 1)
[ -s "$keyring" ] || { echo "no keyring for packages.cloud.google.com on this image" >&2; exit 1; }
# shellcheck source=/dev/null
codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
echo "deb [signed-by=$keyring] https://packages.cloud.google.com/apt google-cloud-ops-agent-$codename-2 main" \
  >/etc/apt/sources.list.d/google-cloud-ops-agent.list
apt-get update -qq
apt-get install -y -qq python3-venv google-cloud-ops-agent >/dev/null

proxy=$(mktemp)
curl -fsSLo "$proxy" \
  "https://storage.googleapis.com/cloud-sql-connectors/cloud-sql-proxy/$PROXY_VERSION/cloud-sql-proxy.linux.amd64"
echo "$PROXY_SHA256  $proxy" | sha256sum --check --strict --quiet
install -m 755 "$proxy" /usr/local/bin/cloud-sql-proxy

release=$(mktemp -d)
gcloud storage cp "gs://$BUCKET/release/*" "$release/"
attribute release-sums >"$release.sums"
(cd "$release" && sha256sum --check --strict --quiet "$release.sums")
useradd --system --user-group --home-dir /var/lib/market --create-home --shell /usr/sbin/nologin market
python3 -m venv "$APP/venv"
# The dependencies from the lock file (exact versions, every file's hash checked), then the
# wheel without dependencies: nothing unpinned comes in.
"$APP/venv/bin/pip" install --quiet --require-hashes --no-deps -r "$release/runtime.txt"
"$APP/venv/bin/pip" install --quiet --no-deps "$release"/*.whl
install -m 644 "$release"/*.service /etc/systemd/system/
install -m 644 "$release/ops-agent.yaml" /etc/google-cloud-ops-agent/config.yaml
systemctl daemon-reload
systemctl enable google-cloud-ops-agent
apt-get clean
echo "market-image: built"
poweroff
