#!/usr/bin/env bash
# The VM: a service account allowed to reach Cloud SQL and read the settings secret and the
# release bucket; the release (a wheel of this checkout, the runtime lock file and the systemd
# units); a Debian VM
# with a static IP whose startup script (startup.sh) installs the release at every boot.
# Run again to deploy a new release: the VM is reset, and its startup script installs it.
set -euo pipefail
# shellcheck source=deploy/gcp/config.sh
source "$(dirname "$0")/config.sh"
need_zone

if ! exists gcloud iam service-accounts describe "$VM_SA" --project "$PROJECT"; then
  gcloud iam service-accounts create "$VM_SA_NAME" --project "$PROJECT" --display-name="Marketplace VM"
fi
for role in roles/cloudsql.client roles/logging.logWriter; do
  gcloud projects add-iam-policy-binding "$PROJECT" --member="serviceAccount:$VM_SA" --role="$role" \
    --condition=None >/dev/null
done
for secret in "$ENV_SECRET" "$TLS_CERT_SECRET" "$TLS_KEY_SECRET" "$TLS_CA_SECRET"; do
  gcloud secrets add-iam-policy-binding "$secret" --project "$PROJECT" \
    --member="serviceAccount:$VM_SA" --role=roles/secretmanager.secretAccessor >/dev/null
done

if ! exists gcloud storage buckets describe "gs://$BUCKET" --project "$PROJECT"; then
  gcloud storage buckets create "gs://$BUCKET" --project "$PROJECT" --location="$REGION" \
    --uniform-bucket-level-access
fi
gcloud storage buckets add-iam-policy-binding "gs://$BUCKET" --member="serviceAccount:$VM_SA" \
  --role=roles/storage.objectViewer >/dev/null

release=$(mktemp -d)
trap 'rm -rf "$release"' EXIT
python3 -m pip wheel --quiet --no-deps --wheel-dir "$release" "$REPO"
cp "$HERE"/systemd/*.service "$REPO/requirements/runtime.txt" "$release/"
gcloud storage rsync "$release" "gs://$BUCKET/release" --delete-unmatched-destination-objects

metadata="market-bucket=$BUCKET,market-secret=$ENV_SECRET,proxy-version=$PROXY_VERSION"
metadata+=",market-tls-cert=$TLS_CERT_SECRET,market-tls-key=$TLS_KEY_SECRET,market-tls-ca=$TLS_CA_SECRET"
if exists gcloud compute instances describe "$VM_NAME" --zone "$ZONE" --project "$PROJECT"; then
  gcloud compute instances add-metadata "$VM_NAME" --zone "$ZONE" --project "$PROJECT" \
    --metadata="$metadata" --metadata-from-file=startup-script="$HERE/startup.sh"
  gcloud compute instances reset "$VM_NAME" --zone "$ZONE" --project "$PROJECT"
else
  gcloud compute instances create "$VM_NAME" --project "$PROJECT" --zone "$ZONE" \
    --machine-type="$VM_MACHINE_TYPE" --subnet="$SUBNET" --address="$VM_ADDRESS" \
    --image-family=debian-12 --image-project=debian-cloud \
    --service-account="$VM_SA" --scopes=cloud-platform --tags="$SERVER_TAG" \
    --metadata="$metadata" --metadata-from-file=startup-script="$HERE/startup.sh"
fi

ip=$(gcloud compute addresses describe "$VM_ADDRESS" --region "$REGION" --project "$PROJECT" \
  --format='value(address)')
echo "VM:            $VM_NAME in zone $ZONE"
echo "buyer server:  $ip:$BUYER_PORT"
echo "seller server: $ip:$SELLER_PORT"
ca=${TLS_CA:-$TLS_DIR/ca.pem}
echo "TLS CA:        $ca (the clients' --tls-ca; gcloud secrets versions access latest --secret=$TLS_CA_SECRET)"
echo "check:         market health --tls-ca $ca $ip:$BUYER_PORT && market health --tls-ca $ca $ip:$SELLER_PORT"
