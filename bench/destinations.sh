#!/usr/bin/env bash
# Destinations (bench figures 27 and 28, bench/destinations.py says what it
# measures): the same backlog drained to a webhook (nginx, return 204), to
# a Redis stream (redis-server), to a Storage queue (Azurite's Queue
# service, the emulator in test/azurite) and to a RabbitMQ queue
# (rabbitmq-server), single events and with batching asked for, in one
# run.  On a fresh Debian machine (as root or through sudo): installs what
# it needs (nginx-light, redis-server, python3-psycopg2, nodejs,
# python3-azure, rabbitmq-server, python3-pika),
# builds and installs the extension, starts a throwaway cluster with
# eventgrid preloaded, nginx, redis-server and rabbitmq-server on
# 127.0.0.1, and runs
# bench/destinations.py.  BENCH_DEST_EVENTS (200000) events a drain;
# BENCH_DEST_PERF=<directory>: perf record -g of the delivery workers
# during each drain (linux-perf), perf-<case>.data there.
set -euo pipefail
. "$(dirname "$0")/../scripts/common.sh"
EG_EXTRA_PACKAGES="nginx-light redis-server python3-psycopg2 nodejs python3-azure rabbitmq-server python3-pika"
eg_setup "$@"
work=$EG_WORK
port=55439
sink_port=18184
redis_port=18379
queue_port=18101
amqp_port=18672
rabbit_env=(HOME="$work/rabbitmq" RABBITMQ_NODENAME=eventgrid-bench@localhost ERL_EPMD_PORT=18369)
cleanup() {
    eg_as_postgres pg_ctl -D "$work/data" -m immediate stop >/dev/null 2>&1 || true
    [ -f "$work/nginx.pid" ] && kill "$(cat "$work/nginx.pid")" 2>/dev/null || true
    [ -f "$work/redis.pid" ] && kill "$(cat "$work/redis.pid")" 2>/dev/null || true
    [ -n "${azurite_pid:-}" ] && kill "$azurite_pid" 2>/dev/null || true
    if [ -n "${rabbit_pid:-}" ]; then
        eg_as_postgres env "${rabbit_env[@]}" /usr/lib/rabbitmq/bin/rabbitmqctl stop >/dev/null 2>&1 || true
        eg_as_postgres env "${rabbit_env[@]}" epmd -port 18369 -kill >/dev/null 2>&1 || true
    fi
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
# RabbitMQ: a broker of its own (its own node name and ports), a durable queue
mkdir -p "$work/rabbitmq"
printf 'listeners.tcp.default = 127.0.0.1:%s\n' $amqp_port > "$work/rabbitmq/rabbitmq.conf"
chown -R postgres: "$work/rabbitmq"
eg_as_postgres env "${rabbit_env[@]}" RABBITMQ_DIST_PORT=18673 RABBITMQ_MNESIA_BASE="$work/rabbitmq/mnesia" \
    RABBITMQ_LOG_BASE="$work/rabbitmq/log" RABBITMQ_CONFIG_FILE="$work/rabbitmq/rabbitmq.conf" \
    RABBITMQ_ENABLED_PLUGINS_FILE="$work/rabbitmq/enabled_plugins" RABBITMQ_PID_FILE="$work/rabbitmq/pid" \
    /usr/lib/rabbitmq/bin/rabbitmq-server > "$work/rabbitmq.log" 2>&1 &
rabbit_pid=$!
for _ in $(seq 120); do
    eg_as_postgres env "${rabbit_env[@]}" /usr/lib/rabbitmq/bin/rabbitmqctl -q await_startup >/dev/null 2>&1 && break
    sleep 1
done
/usr/bin/python3 "$work/test/rabbitmq.py" "amqp://guest:guest@127.0.0.1:$amqp_port/%2F" queue bench-q
eg_as_postgres /usr/bin/python3 "$work/bench/destinations.py" --host "$work" --port $port \
    --sink "http://127.0.0.1:$sink_port" --redis "redis://127.0.0.1:$redis_port" --redis-port $redis_port \
    --queue "http://127.0.0.1:$queue_port/devstoreaccount1/bench-q" \
    --amqp "amqp://127.0.0.1:$amqp_port/?routing_key=bench-q" --broker-pid-file "$work/rabbitmq/pid" \
    --data-dir "$work/data"
