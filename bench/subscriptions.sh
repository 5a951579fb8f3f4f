#!/usr/bin/env bash
# Scale in subscriptions (bench figure 26, bench/subscriptions.py says
# what it measures): a busy topic's delivery, a domain's events spread over
# 1,000 domain topics, idle CPU and a delivery worker's memory beside
# 0, 10,000 and 100,000 idle event subscriptions (BENCH_IDLE_SUBS), and
# how fast subscriptions are created and dropped.  On a fresh Debian
# machine (as root or through sudo): installs what it needs (nginx-light,
# python3-psycopg2), builds and installs the extension, starts a throwaway
# cluster with eventgrid preloaded and nginx as the webhook sink (return
# 204, keep-alive) on 127.0.0.1, and runs bench/subscriptions.py.
set -euo pipefail
. "$(dirname "$0")/../scripts/common.sh"
EG_EXTRA_PACKAGES="nginx-light python3-psycopg2 python3-yaml"
eg_setup "$@"
work=$EG_WORK
port=55438
sink_port=18183
cleanup() {
    eg_as_postgres pg_ctl -D "$work/data" -m immediate stop >/dev/null 2>&1 || true
    [ -f "$work/nginx.pid" ] && kill "$(cat "$work/nginx.pid")" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
# BENCH_SUB_PERF=<directory> (bench/subscriptions.py): profiles, and the
# statements' times from pg_stat_statements
statements=""
[ -n "${BENCH_SUB_PERF:-}" ] && statements="shared_preload_libraries = 'eventgrid,pg_stat_statements'
pg_stat_statements.track = all"
eg_start_cluster "$work" $port <<CONF
shared_buffers = 1GB
max_wal_size = 8GB
eventgrid.delivery_workers = 2
eventgrid.max_concurrent_requests = 64
$statements
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
eg_as_postgres /usr/bin/python3 "$work/bench/subscriptions.py" --host "$work" --port $port --sink "http://127.0.0.1:$sink_port" \
    --data-dir "$work/data" --exporter-queries "$work/monitoring/postgres_exporter.yml"
