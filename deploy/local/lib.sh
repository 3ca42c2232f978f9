#!/usr/bin/env bash
# Helpers shared by the deploy/local scripts (sourced): bounded waits, pid files, HAProxy.
set -euo pipefail

die() { echo "$(basename "$0"): $*" >&2; exit 1; }

# admin_socket_fits DIR: HAProxy takes an admin socket path (DIR/haproxy.sock) of at most 97
# characters and refuses its whole configuration otherwise: say so before anything starts.
admin_socket_fits() {
  local path="$1/haproxy.sock"
  [ ${#path} -le 97 ] || die "--dir $1 is too long for HAProxy's admin socket ($path: ${#path} characters, at most 97): choose a shorter one"
}

# wait_for SECONDS COMMAND...: run COMMAND every 0.2 s until it succeeds; fail after SECONDS.
wait_for() {
  local deadline=$((SECONDS + $1)); shift
  until "$@" 2>/dev/null; do
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# stop_pidfile FILE [SECONDS]: SIGTERM the process, SIGKILL it if still there after SECONDS.
stop_pidfile() {
  local file=$1 grace=${2:-20} pid
  [ -f "$file" ] || return 0
  pid=$(cat "$file")
  if kill -TERM "$pid" 2>/dev/null; then
    wait_for "$grace" eval "! kill -0 $pid" || { kill -KILL "$pid" 2>/dev/null || true; }
  fi
  rm -f "$file"
}

# start_haproxy CONFIG PIDFILE: check the configuration, then run HAProxy in the background.
start_haproxy() {
  command -v haproxy >/dev/null || die "haproxy is not installed (apt-get install haproxy)"
  haproxy -c -q -f "$1" || die "invalid HAProxy configuration $1"
  haproxy -D -f "$1" -p "$2"
  wait_for 10 test -s "$2" || die "HAProxy did not start"
}

# haproxy_defaults: the global and defaults sections every generated configuration starts with.
haproxy_defaults() {
  cat <<CFG
global
    maxconn 4096
$(printf '    %s\n' "$@")
defaults
    mode tcp
    timeout connect 2s
    timeout client 1h
    timeout server 1h
    timeout check 2s
    retries 3
    option redispatch
CFG
}
