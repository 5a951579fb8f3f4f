#!/usr/bin/env bash
# eventgrid benchmark on a fresh Debian machine (as root or through sudo),
# on the PostgreSQL major of its Debian suite, or with --pg N (first
# argument) inside the chroot of the suite that ships N (scripts/chroot.sh;
# bench/majors.sh compares majors):
# installs packages (nginx-light, wrk, python3-psycopg2 besides the build
# dependencies), builds and installs the extension, starts a throwaway
# PostgreSQL cluster with eventgrid preloaded and nginx as the webhook
# sink (return 204, access log off, keep-alive) on 127.0.0.1, then runs
# bench/bench.py, which prints a table of figures and, last, one line
# "BENCH_RESULT {json}".  For figure 12 (HTTPS) the sink also listens with
# TLS 1.3, HTTP/1.1 and HTTP/2, on a certificate from a throwaway CA that
# openssl makes here, which eventgrid.ssl_ca_file names; the HTTP/2 server
# reads each body and passes the request to the plain sink; a fourth server
# (TLS, HTTP/1.1) demands a client certificate from the same CA (mutual TLS).  Sizes and
# durations come from the environment:
#   BENCH_EVENTS (200000)  BENCH_BACKLOG (1000000)  BENCH_LATENCY_SECONDS (20)
#   BENCH_STEADY_SECONDS (300)  BENCH_STEADY_RATE (2000)  BENCH_STEADY_CASES (plain,rr)
#   BENCH_WORKERS (2: eventgrid.delivery_workers, one per core of the 2-core machine)
#   BENCH_DB_EVENTS (320000)  BENCH_TRICKLE_EVENTS (100)  BENCH_IDLE_DATABASES (100)  BENCH_IDLE_SECONDS (60): figure 16
#   BENCH_SCRAPES (20)  BENCH_SCRAPE_SUBSCRIPTIONS (10,100,1000): figure 17
#   BENCH_REPL_RATE (2000)  BENCH_REPL_SECONDS (10)  BENCH_REPL_EVENTS (100000): figure 18 (two clusters of its own)
#   BENCH_TOKEN_LIFETIME (5)  BENCH_TOKEN_BYTES (1000, about a JWT of Entra ID): figure 19 (bearer tokens; the token endpoint is a Python server in bench.py)
#   BENCH_ORDERING_KEYS (1000): figure 20 (ordered delivery per key)
#   BENCH_PULL_EVENTS (200000)  BENCH_PULL_CONSUMERS (8)  BENCH_PULL_SECONDS (10): figure 21 (pull delivery)
#   BENCH_PGMQ_SQL (unset): figure 21 runs pgmq itself beside eventgrid from this install script (pgmq--1.5.1.sql)
#   BENCH_HTTP_PORT (18480)  BENCH_HTTP_SENDERS (8)  BENCH_HTTP_SECONDS (10): figure 23 (publishing over HTTPS
#     with Python's Azure SDK, python3-azure, against publish() over libpq; the listener serves the sink's certificate)
# Arguments go to bench.py, e.g. --only 1,2 for figures 1-4.
set -euo pipefail
. "$(dirname "$0")/../scripts/common.sh"
if [ "${1:-}" = "--pg" ]; then
    [ $# -ge 2 ] || { echo "usage: $0 [--pg 15|17|18] [bench.py arguments]" >&2; exit 2; }
    eg_need_root "$@"
    major=$2
    shift 2
    eg_in_chroot "$major" bench/run.sh "$@"
    exit $?
fi
EG_EXTRA_PACKAGES="nginx-light wrk python3-psycopg2 postgresql-$PG_MAJOR-pgq3 prometheus-postgres-exporter python3-azure"
eg_setup "$@"
work=$EG_WORK
port=55433
sink_port=18181
tls_port=18443        # TLS, HTTP/1.1 only
h2_port=18444         # TLS, HTTP/2 offered by ALPN
mtls_port=18445       # TLS, HTTP/1.1, a client certificate demanded
cleanup() {
    eg_as_postgres pg_ctl -D "$work/data" -m immediate stop >/dev/null 2>&1 || true
    [ -f "$work/nginx.pid" ] && kill "$(cat "$work/nginx.pid")" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# a throwaway CA and the sink's certificate for 127.0.0.1
openssl req -x509 -newkey rsa:2048 -nodes -keyout "$work/ca.key" -out "$work/ca.pem" -days 2 \
    -subj "/CN=eventgrid bench CA" -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
openssl req -newkey rsa:2048 -nodes -keyout "$work/sink.key" -out "$work/sink.csr" -subj "/CN=127.0.0.1" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1\nauthorityKeyIdentifier=keyid,issuer\n' > "$work/sink.ext"
openssl x509 -req -in "$work/sink.csr" -CA "$work/ca.pem" -CAkey "$work/ca.key" -CAcreateserial \
    -days 2 -extfile "$work/sink.ext" -out "$work/sink.pem" 2>/dev/null
# and a client certificate for the subscriptions that present one (figure 12, mutual TLS)
openssl req -newkey rsa:2048 -nodes -keyout "$work/client.key" -out "$work/client.csr" -subj "/CN=eventgrid bench" 2>/dev/null
openssl x509 -req -in "$work/client.csr" -CA "$work/ca.pem" -CAkey "$work/ca.key" -CAcreateserial \
    -days 2 -out "$work/client.pem" 2>/dev/null
chown postgres "$work"/ca.pem "$work"/client.pem "$work"/client.key "$work"/sink.pem "$work"/sink.key

eg_start_cluster "$work" $port <<CONF
shared_buffers = 1GB
max_wal_size = 8GB
checkpoint_timeout = 30min
eventgrid.max_concurrent_requests = 64
eventgrid.delivery_workers = ${BENCH_WORKERS:-2}
eventgrid.ssl_ca_file = '$work/ca.pem'
eventgrid.http_port = ${BENCH_HTTP_PORT:-18480}
eventgrid.http_ssl_cert_file = '$work/sink.pem'
eventgrid.http_ssl_key_file = '$work/sink.key'
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
    client_max_body_size 16m;
    # (figure 20: a request with X-Fail: true is answered 500)
    server { listen 127.0.0.1:$sink_port; location / { if (\$http_x_fail = "true") { return 500; } return 204; } }
    # TLS: each connection logged once, at its first request, with whether it resumed a session
    ssl_protocols TLSv1.3;
    ssl_certificate $work/sink.pem;
    ssl_certificate_key $work/sink.key;
    ssl_session_cache shared:tls:10m;
    map \$connection_requests \$first_request { 1 1; default 0; }
    log_format handshakes '\$server_port \$ssl_session_reused \$server_protocol';
    server { listen 127.0.0.1:$tls_port ssl; access_log $work/tls.log handshakes if=\$first_request;
             location / { return 204; } }
    # HTTP/2: the body is read before the answer (proxied to the plain sink), as an application
    # reads it; "return 204" would answer first and reset the stream, which libcurl 7.88 can
    # report as a failed transfer (README, HTTPS)
    server { listen 127.0.0.1:$mtls_port ssl; access_log $work/tls.log handshakes if=\$first_request;
             ssl_verify_client on; ssl_client_certificate $work/ca.pem;
             location / { return 204; } }
    upstream plain_sink { server 127.0.0.1:$sink_port; keepalive 64; }
    server { listen 127.0.0.1:$h2_port ssl http2; access_log $work/tls.log handshakes if=\$first_request;
             location / { proxy_pass http://plain_sink; proxy_http_version 1.1; proxy_set_header Connection ""; } }
}
CONF
nginx -c "$work/nginx.conf" -p "$work"

eg_as_postgres /usr/bin/python3 "$work/bench/bench.py" --host "$work" --port $port "$@" \
    --sink "http://127.0.0.1:$sink_port" --tls-sink "https://127.0.0.1:$tls_port" \
    --h2-sink "https://127.0.0.1:$h2_port" --mtls-sink "https://127.0.0.1:$mtls_port" \
    --client-cert "$work/client.pem" --client-key "$work/client.key" --tls-log "$work/tls.log" --data-dir "$work/data" --work "$work"
