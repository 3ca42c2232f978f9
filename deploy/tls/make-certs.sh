#!/usr/bin/env bash
# For TLS without a certificate of your own: a private certificate authority and a server
# certificate it signs, in DIR. Usage: make-certs.sh DIR [NAME ...], where the NAMEs are the host
# names and IP addresses clients connect to, separated by spaces or commas (localhost, 127.0.0.1
# and ::1 are always named).
#   DIR/ca.pem                   give it to the clients: market buyer --tls-ca ca.pem
#   DIR/server.pem, server.key   the servers' MARKET_TLS_CERT and MARKET_TLS_KEY
#   DIR/ca.key                   signs new server certificates: keep it private, or delete it
# A server certificate and key already in DIR are kept (yours, or made before): safe to run at
# every start. To make a new one, delete DIR/server.pem first; the CA is kept while ca.key is.
set -euo pipefail

if [ $# -lt 1 ] || [ "${1:0:1}" = - ]; then
  echo "usage: $0 DIR [HOST-NAME-OR-IP ...]" >&2
  exit 2
fi
dir=$1
shift
if [ -s "$dir/server.pem" ] && [ -s "$dir/server.key" ]; then
  echo "keeping the server certificate in $dir"
  exit 0
fi

umask 077  # the keys readable by their owner alone; the certificates are made readable below
mkdir -p "$dir"
names="DNS:localhost,IP:127.0.0.1,IP:::1"
IFS=', ' read -r -a given <<<"$*"
for name in "${given[@]}"; do
  if [[ $name =~ ^[0-9.]+$ || $name == *:* ]]; then names+=",IP:$name"; else names+=",DNS:$name"; fi
done
curve=(-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes)

if [ ! -s "$dir/ca.key" ] || [ ! -s "$dir/ca.pem" ]; then
  openssl req -x509 "${curve[@]}" -days 3650 -subj "/CN=Marketplace private CA" \
    -keyout "$dir/ca.key" -out "$dir/ca.pem" \
    -addext "basicConstraints=critical,CA:TRUE,pathlen:0" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    2>/dev/null
fi
extensions=$(mktemp)
trap 'rm -f "$extensions" "$dir/server.csr"' EXIT
printf '%s\n' "subjectAltName=$names" "basicConstraints=critical,CA:FALSE" \
  "keyUsage=critical,digitalSignature" "extendedKeyUsage=serverAuth" >"$extensions"
openssl req "${curve[@]}" -subj "/CN=${given[0]:-localhost}" -keyout "$dir/server.key" -out "$dir/server.csr" \
  2>/dev/null
# 825 days: the longest validity clients such as Apple's accept for a server certificate
openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
  -set_serial "0x$(openssl rand -hex 16)" -days 825 -extfile "$extensions" -out "$dir/server.pem" 2>/dev/null
chmod 644 "$dir/ca.pem" "$dir/server.pem"
echo "made $dir/server.pem for $names, signed by $dir/ca.pem (give ca.pem to the clients)"
