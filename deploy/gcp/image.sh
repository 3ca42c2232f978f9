#!/usr/bin/env bash
# The servers' image: the VMs' service account and its rights, the release in a bucket (a wheel
# of this checkout, the runtime lock file, the systemd units, the Ops Agent's configuration),
# then a builder VM that installs it all (build.sh) and powers off, and an image made from its
# disk in the family IMAGE_FAMILY. mig.sh rolls the newest image of the family out.
set -euo pipefail
# shellcheck source=deploy/gcp/config.sh
source "$(dirname "$0")/config.sh"
need_zone
if [ -z "$PROXY_SHA256" ]; then
  echo "set PROXY_SHA256 to the SHA-256 of cloud-sql-proxy.linux.amd64 $PROXY_VERSION (its release" \
    "page lists it: https://github.com/GoogleCloudPlatform/cloud-sql-proxy/releases/tag/$PROXY_VERSION)" >&2
  exit 2
fi

if ! exists gcloud iam service-accounts describe "$VM_SA" --project "$PROJECT"; then
  gcloud iam service-accounts create "$VM_SA_NAME" --project "$PROJECT" --display-name="Marketplace VMs"
fi
for role in roles/cloudsql.client roles/logging.logWriter roles/monitoring.metricWriter; do
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

# The release, and the sums of its files: the builder checks what it downloads against them.
release=$(mktemp -d)
trap 'rm -rf "$release" "$release.sums"' EXIT
run python3 -m pip wheel --quiet --no-deps --wheel-dir "$release" "$REPO"
cp "$HERE"/systemd/*.service "$HERE/ops-agent.yaml" "$REPO/requirements/runtime.txt" "$release/"
(cd "$release" && sha256sum -- *) >"$release.sums"
gcloud storage rsync "$release" "gs://$BUCKET/release" --delete-unmatched-destination-objects

image=$IMAGE_FAMILY-$(date -u +%Y%m%d-%H%M%S)
if exists gcloud compute instances describe "$BUILDER" --zone "$ZONE" --project "$PROJECT"; then
  gcloud compute instances delete "$BUILDER" --zone "$ZONE" --project "$PROJECT" --quiet  # a failed run's
fi
gcloud compute instances create "$BUILDER" --project "$PROJECT" --zone "$ZONE" --machine-type=e2-medium \
  --subnet="$SUBNET" --image-family=debian-12 --image-project=debian-cloud \
  --service-account="$VM_SA" --scopes=cloud-platform \
  --metadata="market-bucket=$BUCKET,proxy-version=$PROXY_VERSION,proxy-sha256=$PROXY_SHA256" \
  --metadata-from-file="startup-script=$HERE/build.sh,release-sums=$release.sums"
if [ -z "$DRY_RUN" ]; then
  status=""
  for _ in $(seq 120); do  # the builder powers itself off once the image's disk is ready
    status=$(gcloud compute instances describe "$BUILDER" --zone "$ZONE" --project "$PROJECT" \
      --format='value(status)')
    [ "$status" = TERMINATED ] && break
    sleep 10
  done
  if [ "$status" != TERMINATED ]; then
    echo "the builder did not finish in 20 minutes; its log: gcloud compute instances" \
      "get-serial-port-output $BUILDER --zone $ZONE (delete it with teardown.sh or the next image.sh)" >&2
    exit 1
  fi
fi
gcloud compute images create "$image" --project "$PROJECT" --source-disk="$BUILDER" \
  --source-disk-zone="$ZONE" --family="$IMAGE_FAMILY"
gcloud compute instances delete "$BUILDER" --zone "$ZONE" --project "$PROJECT" --quiet
echo "image: $image (family $IMAGE_FAMILY); deploy it with deploy/gcp/mig.sh"
