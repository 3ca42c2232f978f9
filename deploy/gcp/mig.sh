#!/usr/bin/env bash
# The servers, per role: an instance template of the newest image in IMAGE_FAMILY (image.sh), a
# regional managed instance group of GROUP_SIZE VMs spread over the region's zones (no external
# IP), autohealed on GET /healthz, behind a regional TCP passthrough load balancer (a backend
# service checking GET /readyz, and a forwarding rule on ADDRESS and the role's port).
# Run again after image.sh, or after a settings change: the groups roll onto a new template,
# adding VMs before removing any (no capacity lost), each VM removed from its load balancer
# and drained for 60 s before it stops, its server answering what it owes before it exits.
set -euo pipefail
# shellcheck source=deploy/gcp/config.sh
source "$(dirname "$0")/config.sh"

image=$(gcloud compute images describe-from-family "$IMAGE_FAMILY" --project "$PROJECT" \
  --format='value(name)' 2>/dev/null || true)
if [ -z "$image" ]; then
  [ -n "$DRY_RUN" ] || { echo "no image in the family $IMAGE_FAMILY: run deploy/gcp/image.sh first" >&2; exit 2; }
  image="(the image image.sh makes)"
fi
metadata="market-secret=$ENV_SECRET,market-tls-cert=$TLS_CERT_SECRET,market-tls-key=$TLS_KEY_SECRET"
metadata+=",market-tls-ca=$TLS_CA_SECRET"
checks=projects/$PROJECT/regions/$REGION/healthChecks

# A health check of each VM's HEALTH_PORT at `path`, made once.
health_check() {
  if ! exists gcloud compute health-checks describe "$1" --region "$REGION" --project "$PROJECT"; then
    gcloud compute health-checks create http "$1" --region "$REGION" --project "$PROJECT" \
      --port="$HEALTH_PORT" --request-path="$2" --check-interval=5s --timeout=4s \
      --unhealthy-threshold="$3" --healthy-threshold=2
  fi
}

# The template of this image, machine type, settings and startup script: a new name when any
# of them changes, so that the group rolls onto it (and does nothing when none did).
template_of() {
  local hash
  hash=$( { echo "$image $VM_MACHINE_TYPE $metadata"; cat "$HERE/startup.sh"; } | sha256sum | cut -c1-10)
  echo "market-$1-$hash"
}

deploy_role() {
  local role=$1 port=$2 group=market-$1 template
  template=$(template_of "$role")
  health_check "$group-live" /healthz 3   # the process answers: else autohealing recreates the VM
  health_check "$group-ready" /readyz 2   # its database answers and it is not stopping: else no traffic
  if ! exists gcloud compute instance-templates describe "$template" --project "$PROJECT"; then
    gcloud compute instance-templates create "$template" --project "$PROJECT" \
      --machine-type="$VM_MACHINE_TYPE" --region="$REGION" --subnet="$SUBNET" --no-address \
      --image="$image" --image-project="$PROJECT" --service-account="$VM_SA" --scopes=cloud-platform \
      --tags="$SERVER_TAG" --shielded-secure-boot --metadata="market-role=$role,$metadata" \
      --metadata-from-file="startup-script=$HERE/startup.sh"
  fi
  if ! exists gcloud compute instance-groups managed describe "$group" --region "$REGION" --project "$PROJECT"; then
    gcloud compute instance-groups managed create "$group" --region "$REGION" --project "$PROJECT" \
      --template="$template" --size="$GROUP_SIZE" --target-distribution-shape=EVEN \
      --health-check="$checks/$group-live" --initial-delay=300
  else
    gcloud compute instance-groups managed rolling-action start-update "$group" --region "$REGION" \
      --project "$PROJECT" --version="template=$template" --type=proactive --replacement-method=substitute \
      --max-surge=3 --max-unavailable=0 --min-ready=60s
    gcloud compute instance-groups managed resize "$group" --region "$REGION" --project "$PROJECT" \
      --size="$GROUP_SIZE"
  fi
  if ! exists gcloud compute backend-services describe "$group" --region "$REGION" --project "$PROJECT"; then
    gcloud compute backend-services create "$group" --region "$REGION" --project "$PROJECT" \
      --load-balancing-scheme=EXTERNAL --protocol=TCP --health-checks="$group-ready" \
      --health-checks-region="$REGION" --connection-draining-timeout=60
    gcloud compute backend-services add-backend "$group" --region "$REGION" --project "$PROJECT" \
      --instance-group="$group" --instance-group-region="$REGION"
  fi
  if ! exists gcloud compute forwarding-rules describe "$group" --region "$REGION" --project "$PROJECT"; then
    gcloud compute forwarding-rules create "$group" --region "$REGION" --project "$PROJECT" \
      --load-balancing-scheme=EXTERNAL --ip-protocol=TCP --ports="$port" --address="$ADDRESS" \
      --backend-service="$group"
  fi
}

deploy_role buyer "$BUYER_PORT"
deploy_role seller "$SELLER_PORT"

ip=$(gcloud compute addresses describe "$ADDRESS" --region "$REGION" --project "$PROJECT" \
  --format='value(address)') || [ -n "$DRY_RUN" ]  # a dry run before network.sh made it
ca=${TLS_CA:-$TLS_DIR/ca.pem}
echo "image:         $image, $GROUP_SIZE VMs per role"
echo "buyer server:  $ip:$BUYER_PORT"
echo "seller server: $ip:$SELLER_PORT"
echo "TLS CA:        $ca (the clients' --tls-ca; gcloud secrets versions access latest --secret=$TLS_CA_SECRET)"
echo "check:         market health --tls-ca $ca $ip:$BUYER_PORT && market health --tls-ca $ca $ip:$SELLER_PORT"
echo "rollout:       gcloud compute instance-groups managed describe market-buyer --region $REGION"
