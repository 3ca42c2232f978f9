#!/usr/bin/env bash
set -euo pipefail
# Several buyer and seller server processes on loopback behind HAProxy (TCP mode), which
# health-checks each one with the protocol's ping frame. Clients use the balancer's ports.
#
#   deploy/local/servers.sh start [options]   start the set; prints the two balancer addresses
#   deploy/local/servers.sh stop  [--dir DIR] stop HAProxy and every server (SIGTERM, then SIGKILL)
#   deploy/local/servers.sh status [--dir DIR]
#
# Options: --dir DIR (run folder: config, logs, pid files; default /tmp/market-local)
#          --db-url URL (default $MARKET_DB_URL, else a SQLite file in DIR)
#          --buyers N --sellers N (instances per role, default 2)
#          --workers N (processes per instance, default 1)
#          --threads N (workers per process; default $MARKET_THREADS, else the servers' own default)
#          --buyer-port P --seller-port P (the balancer's ports, default 7001 and 7002)
#          --stats-port P (HAProxy's statistics page on 127.0.0.1:P; default none)
# HAProxy's admin socket is DIR/haproxy.sock ("show servers state", "disable server ...").
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
# shellcheck source=deploy/local/lib.sh
source "$HERE/lib.sh"

PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
DIR=/tmp/market-local BUYERS=2 SELLERS=2 WORKERS=1 THREADS=${MARKET_THREADS:-}
BUYER_PORT=7001 SELLER_PORT=7002 STATS_PORT="" DB_URL=${MARKET_DB_URL:-}
# The ping request as a frame: 4-byte big-endian length (13), then {"op":"ping"}.
PING_FRAME=0000000d7b226f70223a2270696e67227d

parse_options() {
  while [ $# -gt 0 ]; do
    case $1 in
      --dir) DIR=$2 ;;
      --db-url) DB_URL=$2 ;;
      --buyers) BUYERS=$2 ;;
      --sellers) SELLERS=$2 ;;
      --workers) WORKERS=$2 ;;
      --threads) THREADS=$2 ;;
      --buyer-port) BUYER_PORT=$2 ;;
      --seller-port) SELLER_PORT=$2 ;;
      --stats-port) STATS_PORT=$2 ;;
      *) die "unknown option $1" ;;
    esac
    shift 2
  done
}

# start_instance ROLE N: one server on a free port; prints the port once it is listening.
start_instance() {
  local name="$1-$2" port
  # behind HAProxy every client comes from HAProxy's address: no limit on sign-ups per address
  MARKET_SIGNUPS_PER_ADDRESS_HOUR=${MARKET_SIGNUPS_PER_ADDRESS_HOUR:-0} "$PYTHON" -m "$1_server" --host 127.0.0.1 --port 0 --db-url "$DB_URL" \
    --workers "$WORKERS" ${THREADS:+--threads "$THREADS"} >"$DIR/$name.out" 2>"$DIR/$name.log" &
  echo $! >"$DIR/$name.pid"
  wait_for 60 grep -q '^listening on ' "$DIR/$name.out" \
    || die "$name did not start; see $DIR/$name.log"
  port=$(sed -n 's/^listening on .*:\([0-9]*\)$/\1/p' "$DIR/$name.out")
  echo "$port" >"$DIR/$name.port"
  echo "$port"
}

# backend ROLE COUNT FRONT_PORT: a frontend and its backend of COUNT started instances.
backend() {
  local role=$1 count=$2 front=$3 i port
  cat <<CFG
frontend $role
    bind 127.0.0.1:$front
    default_backend ${role}_servers
backend ${role}_servers
    balance leastconn
    option tcp-check
    tcp-check connect
    tcp-check send-binary $PING_FRAME
    tcp-check expect string '"ok":true'
    # a connection error marks the instance down at once, not only the next failed ping
    default-server inter 500ms fall 2 rise 2 on-marked-down shutdown-sessions observe layer4 error-limit 1 on-error mark-down
CFG
  for i in $(seq 1 "$count"); do
    port=$(start_instance "$role" "$i")
    echo "    server $role$i 127.0.0.1:$port check"
  done
}

# all_checked SOCKET: every instance has passed a health check since HAProxy started
# (until then HAProxy shows it as "UP 1/2": presumed up, not yet checked).
all_checked() {
  "$PYTHON" - "$1" <<'PY'
import socket, sys
with socket.socket(socket.AF_UNIX) as sock:
    sock.connect(sys.argv[1])
    sock.sendall(b"show stat\n")
    data = b"".join(iter(lambda: sock.recv(65536), b""))
header, *rows = data.decode().splitlines()
names = header.lstrip("# ").split(",")
stats = [dict(zip(names, row.split(","))) for row in rows if row]
states = [s["status"] for s in stats if s["svname"] not in ("FRONTEND", "BACKEND")]
sys.exit(0 if states and all(state == "UP" for state in states) else 1)
PY
}

# undo_failed_start: on the way out of a start that failed, stop what it had started (else
# the instances would run on, and a second start would overwrite their pid files).
undo_failed_start() {
  local status=$?
  [ "$status" -eq 0 ] && return
  echo "$(basename "$0"): start failed; stopping what it started" >&2
  stop >/dev/null 2>&1 || true
  exit "$status"
}

start() {
  admin_socket_fits "$DIR"
  mkdir -p "$DIR"
  local file
  for file in "$DIR"/haproxy.pid "$DIR"/buyer-*.pid "$DIR"/seller-*.pid; do
    alive "$file" && die "already running in $DIR (stop it first)"
  done
  trap undo_failed_start EXIT
  [ -n "$DB_URL" ] || DB_URL="sqlite:///$DIR/market.db"
  # the schema's upgrade first, once: the servers refuse a database not at their revision
  "$PYTHON" -m client.main db upgrade --db-url "$DB_URL" >"$DIR/upgrade.log" 2>&1 \
    || die "market db upgrade failed: $(tail -n 1 "$DIR/upgrade.log")"
  {
    haproxy_defaults "stats socket $DIR/haproxy.sock mode 600 level admin"
    backend buyer "$BUYERS" "$BUYER_PORT"
    backend seller "$SELLERS" "$SELLER_PORT"
    if [ -n "$STATS_PORT" ]; then
      printf 'listen stats\n    mode http\n    bind 127.0.0.1:%s\n    stats enable\n    stats uri /\n' "$STATS_PORT"
    fi
  } >"$DIR/haproxy.cfg"
  start_haproxy "$DIR/haproxy.cfg" "$DIR/haproxy.pid"
  for port in "$BUYER_PORT" "$SELLER_PORT"; do
    wait_for 20 "$PYTHON" -m client.main health "127.0.0.1:$port" >/dev/null \
      || die "no healthy server behind 127.0.0.1:$port"
  done
  wait_for 20 all_checked "$DIR/haproxy.sock" || die "not every instance passed its health check"
  trap - EXIT
  echo "buyer 127.0.0.1:$BUYER_PORT ($BUYERS instances), seller 127.0.0.1:$SELLER_PORT ($SELLERS instances)"
}

stop() {
  stop_pidfile "$DIR/haproxy.pid" 10
  for file in "$DIR"/buyer-*.pid "$DIR"/seller-*.pid; do
    [ -e "$file" ] && stop_pidfile "$file" 20
  done
  echo "stopped"
}

status() {
  alive "$DIR/haproxy.pid" && echo "haproxy: running" || echo "haproxy: stopped"
  for file in "$DIR"/buyer-*.pid "$DIR"/seller-*.pid; do
    [ -e "$file" ] || continue
    if alive "$file"; then
      echo "$(basename "$file" .pid): running on 127.0.0.1:$(cat "${file%.pid}.port")"
    else
      echo "$(basename "$file" .pid): stopped"
    fi
  done
}

command=${1:-}
[ $# -gt 0 ] && shift
parse_options "$@"
case $command in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) die "usage: $0 start|stop|status [options]" ;;
esac
