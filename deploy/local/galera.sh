#!/usr/bin/env bash
set -euo pipefail
# A 3-node MariaDB Galera cluster on loopback, each node with its own ports and data folder,
# behind HAProxy: node 1 takes the connections, nodes 2 and 3 are its backups, and a node
# counts as healthy only while it is Synced (galera-check.sh).
#
#   deploy/local/galera.sh start [--dir DIR] [--base-port B]   bootstrap (or restart) the cluster
#   deploy/local/galera.sh stop  [--dir DIR]                   stop the nodes, 3 then 2 then 1
#   deploy/local/galera.sh status [--dir DIR]
#   deploy/local/galera.sh kill-node N [--dir DIR]             SIGKILL one node (a crash drill)
#   deploy/local/galera.sh start-node N [--dir DIR]            start one node; it rejoins by IST
#   deploy/local/galera.sh config N [--dir DIR] [--base-port B] print node N's my.cnf; starts nothing
#
# Ports (B = --base-port, default 4560): the balancer B, node N's SQL port B+N, group
# communication B+10+N, IST B+20+N, SST (rsync) B+30+N. The database URL is printed at start:
# mysql://root@127.0.0.1:B/market (user root, no password: loopback only).
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=deploy/local/lib.sh
source "$HERE/lib.sh"

DIR=/tmp/market-galera BASE=4560 NODE=""
PROVIDER=/usr/lib/galera/libgalera_smm.so

parse_options() {
  while [ $# -gt 0 ]; do
    case $1 in
      --dir) DIR=$2; shift 2 ;;
      --base-port) BASE=$2; shift 2 ;;
      [123]) NODE=$1; shift ;;
      *) die "unknown option $1" ;;
    esac
  done
}

node_config() {
  local n=$1 node="$DIR/node$1"
  cat <<CNF
[mysqld]
# as root, the rsync daemon of a state transfer would write as nobody: run as mysql
user=mysql
datadir=$node/data
# a tmpdir of its own: mariadbd deletes every #sql* file in its tmpdir when it starts, and
# in /tmp those are the live temporary tables of any other MariaDB here (it crashes then)
tmpdir=$node/tmp
socket=$node/sock
pid-file=$node/pid
log-error=$node/error.log
port=$((BASE + n))
bind-address=127.0.0.1
innodb_buffer_pool_size=32M
innodb_log_file_size=16M
innodb_flush_log_at_trx_commit=2
max_connections=300
binlog_format=ROW
default_storage_engine=InnoDB
innodb_autoinc_lock_mode=2
wsrep_on=ON
wsrep_provider=$PROVIDER
wsrep_cluster_name=market
wsrep_cluster_address=gcomm://127.0.0.1:$((BASE + 11)),127.0.0.1:$((BASE + 12)),127.0.0.1:$((BASE + 13))
wsrep_node_name=node$n
wsrep_node_address=127.0.0.1:$((BASE + 10 + n))
wsrep_node_incoming_address=127.0.0.1:$((BASE + n))
# A dead node is dropped after 3 s of silence (suspect_timeout). The install timeout, by
# default half of inactive_timeout, is set on its own: at 3 s a loaded machine could miss it
# while a restarted node rejoined, and the two others then split into non-primary halves.
wsrep_provider_options="gmcast.listen_addr=tcp://127.0.0.1:$((BASE + 10 + n));ist.recv_addr=127.0.0.1:$((BASE + 20 + n));gcache.size=64M;evs.suspect_timeout=PT3S;evs.inactive_timeout=PT15S;evs.install_timeout=PT10S;evs.keepalive_period=PT0.5S;evs.inactive_check_period=PT0.5S"
wsrep_sst_method=rsync
wsrep_sst_receive_address=127.0.0.1:$((BASE + 30 + n))
wsrep_slave_threads=2
# causal reads: a read waits until this node has applied what the cluster committed before it
wsrep_sync_wait=1
CNF
}

sql() { mariadb --no-defaults --socket="$DIR/node$1/sock" -uroot -Nse "$2"; }

synced() { [ "$(sql "$1" "SHOW STATUS LIKE 'wsrep_local_state_comment'" | cut -f2)" = Synced ]; }

# The position a crashed node had reached, so that it rejoins by IST instead of a full copy.
recovered_position() {
  local node="$DIR/node$1"
  mariadbd --defaults-file="$node/my.cnf" --wsrep-recover --log-error="$node/recover.log" >/dev/null 2>&1 || true
  sed -n 's/.*WSREP: Recovered position: *\([^ ]*\).*/\1/p' "$node/recover.log" | tail -1
}

# launch N [ARGS...]: start node N's mariadbd in the background and wait until it is Synced.
launch() {
  local n=$1 node="$DIR/node$1"; shift
  alive "$node/pid" && die "node $n is already running"
  mkdir -p "$node/data" "$node/tmp"
  node_config "$n" >"$node/my.cnf"
  touch "$node/error.log"
  chown -R mysql:mysql "$node"
  mariadbd --defaults-file="$node/my.cnf" "$@" >>"$node/console.log" 2>&1 &
  local pid=$!
  wait_for 180 synced_or_gone "$n" "$pid" || true
  synced "$n" || die "node $n did not reach Synced; see $node/error.log"
}

synced_or_gone() { synced "$1" || ! kill -0 "$2" 2>/dev/null; }

start_node() {
  local n=$1 position; shift
  if [ -f "$DIR/node$n/data/grastate.dat" ] && grep -q '^seqno: *-1' "$DIR/node$n/data/grastate.dat"; then
    position=$(recovered_position "$n")
    [ -n "$position" ] && set -- --wsrep-start-position="$position"
  fi
  launch "$n" "$@"
}

bootstrap_node() {  # the node that may start a new cluster: a fresh one, or the last to stop
  local n
  for n in 1 2 3; do
    grep -qs '^safe_to_bootstrap: *1' "$DIR/node$n/data/grastate.dat" && { echo "$n"; return; }
  done
  [ -d "$DIR/node1/data/mysql" ] && die "no node is safe to bootstrap; see grastate.dat in $DIR/node*/data"
  echo 1
}

balancer_config() {
  haproxy_defaults "insecure-fork-wanted" "external-check" "stats socket $DIR/haproxy.sock mode 600 level admin"
  cat <<CFG
listen mariadb
    bind 127.0.0.1:$BASE
    option external-check
    external-check path "/usr/bin:/bin:/usr/sbin"
    external-check command $HERE/galera-check.sh
    default-server inter 1s fall 2 rise 2 on-marked-down shutdown-sessions
    server node1 127.0.0.1:$((BASE + 1)) check
    server node2 127.0.0.1:$((BASE + 2)) check backup
    server node3 127.0.0.1:$((BASE + 3)) check backup
CFG
}

start() {
  [ -x "$PROVIDER" ] || [ -f "$PROVIDER" ] || die "galera is not installed ($PROVIDER; apt-get install galera-4)"
  command -v rsync >/dev/null || die "rsync is not installed (needed for state transfer)"
  admin_socket_fits "$DIR"
  mkdir -p "$DIR" && chmod 755 "$DIR"  # the nodes run as mysql
  alive "$DIR/haproxy.pid" && die "already running in $DIR (stop it first)"
  local first n
  first=$(bootstrap_node)
  if [ ! -d "$DIR/node$first/data/mysql" ]; then
    # the bootstrap server's tmpdir too: at start mariadbd deletes every #sql* file there
    mkdir -p "$DIR/node$first/tmp" && chown mysql:mysql "$DIR/node$first/tmp"
    mariadb-install-db --no-defaults --datadir="$DIR/node$first/data" --user=mysql \
      --tmpdir="$DIR/node$first/tmp" \
      --auth-root-authentication-method=normal --skip-test-db >"$DIR/install.log" 2>&1 \
      || die "mariadb-install-db failed; see $DIR/install.log"
  fi
  launch "$first" --wsrep-new-cluster
  sql "$first" "CREATE DATABASE IF NOT EXISTS market CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
  for n in 1 2 3; do
    [ "$n" = "$first" ] || start_node "$n"
  done
  balancer_config >"$DIR/haproxy.cfg"
  start_haproxy "$DIR/haproxy.cfg" "$DIR/haproxy.pid"
  wait_for 20 port_open "$BASE" || die "the balancer does not answer on $BASE"
  echo "$BASE" >"$DIR/base-port"
  echo "cluster of 3 synced; database mysql://root@127.0.0.1:$BASE/market"
}

stop() {
  stop_pidfile "$DIR/haproxy.pid" 10
  for n in 3 2 1; do
    stop_pidfile "$DIR/node$n/pid" 60
  done
  echo "stopped"
}

status() {
  local n
  for n in 1 2 3; do
    if alive "$DIR/node$n/pid"; then
      echo "node$n: $(sql "$n" "SHOW STATUS LIKE 'wsrep_local_state_comment'" | cut -f2)," \
        "cluster size $(sql "$n" "SHOW STATUS LIKE 'wsrep_cluster_size'" | cut -f2)"
    else
      echo "node$n: stopped"
    fi
  done
}

command=${1:-}
[ $# -gt 0 ] && shift
parse_options "$@"
[ -f "$DIR/base-port" ] && [ "$command" != start ] && BASE=$(cat "$DIR/base-port")
case $command in
  start) start ;;
  stop) stop ;;
  status) status ;;
  kill-node) [ -n "$NODE" ] || die "which node?"; kill -KILL "$(cat "$DIR/node$NODE/pid")" ;;
  start-node) [ -n "$NODE" ] || die "which node?"; start_node "$NODE" ;;
  config) [ -n "$NODE" ] || die "which node?"; node_config "$NODE" ;;
  *) die "usage: $0 start|stop|status|kill-node N|start-node N|config N [--dir DIR] [--base-port B]" ;;
esac
