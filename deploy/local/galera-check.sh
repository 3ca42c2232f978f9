#!/usr/bin/env bash
# HAProxy's external check of a Galera node: healthy only while the node is Synced
# (wsrep_local_state 4), so a joining or desynced node gets no connections.
# HAProxy calls it with: PROXY_ADDRESS PROXY_PORT SERVER_ADDRESS SERVER_PORT.
set -euo pipefail
state=$(mariadb --no-defaults --connect-timeout=2 -h "$3" -P "$4" -uroot -Nse \
  "SHOW STATUS LIKE 'wsrep_local_state'" | cut -f2)
[ "$state" = 4 ]
