#!/usr/bin/env bash
# eventgrid soak on a fresh Debian 12 machine (as root or through sudo):
# installs packages (python3-psycopg2 besides the build dependencies),
# builds and installs the extension, starts a throwaway PostgreSQL 15
# cluster with eventgrid preloaded, and runs bench/soak.py against it: 30
# minutes (SOAK_MINUTES) of publishing into 50 event subscriptions over three
# databases (also over the HTTP listener, into an event domain of 1,000
# tenants, to an event subscription that expires halfway, and pulled over
# HTTP) while receivers misbehave and the server is restarted, workers
# killed, tables vacuumed full, DDL run, a topic paused and a snapshot held;
# then it drains and prints what was published, delivered, lost and sent
# twice, the workers' memory and the queue, and p99 commit-to-arrival per
# 5-minute window.  SOAK_RATE (10 events/s per database) and SOAK_EVERY (40 s
# between troubles) set the pace.
set -euo pipefail
. "$(dirname "$0")/../scripts/common.sh"
EG_EXTRA_PACKAGES="python3-psycopg2"
eg_setup "$@"
work=$EG_WORK
port=55434
http_port=55435
cleanup() {
    eg_as_postgres pg_ctl -D "$work/data" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

eg_start_cluster "$work" $port <<CONF
eventgrid.delivery_workers = 2
eventgrid.response_timeout = '5s'
eventgrid.event_table_rotation = '10s'
eventgrid.http_port = $http_port
max_worker_processes = 24
restart_after_crash = on
CONF

eg_as_postgres /usr/bin/python3 "$work/bench/soak.py" --host "$work" --port $port --data-dir "$work/data" --http-port $http_port "$@"
