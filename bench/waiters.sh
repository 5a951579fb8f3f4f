#!/usr/bin/env bash
# Idle waiting consumers (bench figure 22): what 1,000 (BENCH_WAITERS)
# receive() calls waiting on an empty queue subscription cost while another
# queue subscription of the database gets about 200 events a second, one
# commit each: their CPU (utime + stime of their backends, from /proc) and
# memory (the sum of their backends' proportional set size, Pss, from
# /proc/<pid>/smaps_rollup), and how long after one commit of 1,000 events
# every one of them has returned with its event.  On a fresh Debian machine
# (as root or through sudo): installs what it needs (python3-psycopg2),
# builds and installs the extension, starts a throwaway cluster
# (max_connections 1100) with eventgrid preloaded and runs bench/waiters.py.
set -euo pipefail
. "$(dirname "$0")/../scripts/common.sh"
EG_EXTRA_PACKAGES="python3-psycopg2"
eg_setup "$@"
work=$EG_WORK
port=55436
trap 'eg_as_postgres pg_ctl -D "$work/data" -m immediate stop >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
eg_start_cluster "$work" $port <<CONF
max_connections = 1100
CONF
eg_as_postgres /usr/bin/python3 "$work/bench/waiters.py" --host "$work" --port $port
