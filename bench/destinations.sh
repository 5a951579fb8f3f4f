#!/usr/bin/env bash
# Destinations (bench figure 27, bench/destinations.py says what it
# measures): the same backlog drained to a webhook (nginx, return 204) and
# to a Redis stream (redis-server) and to a Storage queue (Azurite's Queue
# service, the emulator in test/azurite), single events and with batching
# asked for, in one run.  On a fresh Debian machine (as root or through sudo):
# installs what it needs (nginx-light, redis-server, python3-psycopg2,
# nodejs, python3-azure),
# builds and installs the extension, starts a throwaway cluster with
# eventgrid preloaded, nginx and redis-server on 127.0.0.1, and runs
# bench/destinations.py.  BENCH_DEST_EVENTS (200000) events a drain;
# BENCH_DEST_PERF=<directory>: perf record -g of the delivery workers
# during each drain (linux-perf), perf-<case>.data there.
set -euo pipefail
. "$(dirname "$0")/../scripts/common.sh"
EG_EXTRA_PACKAGES="nginx-light redis-server python3-psycopg2 nodejs python3-azure"
eg_setup "$@"
work=$EG_WORK
port=55439
sink_port=18184
redis_port=18379
queue_port=18101
cleanup() {
    eg_as_postgres pg_ctl -D "$work/data" -m immediate stop >/dev/null 2>&1 || true
    [ -f "$work/nginx.pid" ] && kill "$(cat "$work/nginx.pid")" 2>/dev/null || true
    [ -f "$work/redis.pid" ] && kill "$(cat "$work/redis.pid")" 2>/dev/null || true
    [ -n "${azurite_pid:-}" ] && kill "$azurite_pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
eg_start_cluster "$work" $port <<CONF
shared_buffers = 1GB
max_wal_size = 8GB
checkpoint_timeout = 30min
eventgrid.delivery_workers = 2
eventgrid.max_concurrent_requests = 64
CONF
cat > "$work/nginx.conf" <<CONF
worker_processes 1;
pid $work/nginx.pid;
error_log $work/nginx-error.log;
events { worker_connections 4096; }
http {
    access_log off;
    keepalive_requests 10000000;
    keepalive_timeout 300s;
    client_body_buffer_size 2m;
    server { listen 127.0.0.1:$sink_port; location / { return 204; } }
}
CONF
nginx -c "$work/nginx.conf" -p "$work"
# no persistence: what is measured is eventgrid's side, not Redis's disk
redis-server --port $redis_port --bind 127.0.0.1 --save '' --appendonly no --daemonize yes \
    --pidfile "$work/redis.pid" --logfile "$work/redis.log" --dir "$work"
for _ in $(seq 50); do redis-cli -p $redis_port PING >/dev/null 2>&1 && break; sleep 0.1; done
# Azurite's Queue service (test/azurite): an emulator, in Node.js, on one core
mkdir -p "$work/azurite"
node "$work/test/azurite/azurite-queue.js" --queueHost 127.0.0.1 --queuePort $queue_port --location "$work/azurite" \
    --skipApiVersionCheck --disableTelemetry --silent > "$work/azurite.log" 2>&1 &
azurite_pid=$!
for _ in $(seq 100); do grep -q 'successfully listens' "$work/azurite.log" && break; sleep 0.1; done
/usr/bin/python3 "$work/test/storage_queue.py" "http://127.0.0.1:$queue_port/devstoreaccount1" create bench-q
eg_as_postgres /usr/bin/python3 "$work/bench/destinations.py" --host "$work" --port $port \
    --sink "http://127.0.0.1:$sink_port" --redis "redis://127.0.0.1:$redis_port" --redis-port $redis_port \
    --queue "http://127.0.0.1:$queue_port/devstoreaccount1/bench-q" --data-dir "$work/data"
