#!/usr/bin/env bash
# eventgrid end to end on a fresh Debian machine (its suite's PostgreSQL major): installs packages,
# builds and installs the extension, starts a throwaway PostgreSQL cluster
# with eventgrid preloaded and a real webhook receiver on 127.0.0.1, publishes
# the sample events of demo/events.sql with INSERT, and shows in psql what
# the receiver got: deliveries, a batch, retries of an endpoint that fails
# twice and then accepts, an event dead-lettered after its maximum delivery
# attempts (the retry schedule is driven by moving the worker's clock with
# eventgrid.clock_offset), the attempt history and the metrics.
#
#   ./scripts/demo.sh          everything is removed at exit
#   ./scripts/demo.sh --keep   the cluster and the receiver keep running;
#                              prints how to connect with psql and stop them
# Ports: EG_DEMO_PORT (PostgreSQL, a Unix socket only; default 55432) and
# EG_DEMO_RECEIVER_PORT (the receiver on 127.0.0.1; default 18080).
set -euo pipefail
args=("$@")
keep=0
if [ "${1:-}" = "--keep" ]; then
    keep=1
    shift
fi
if [ $# -gt 0 ]; then
    echo "usage: $0 [--keep]" >&2
    exit 2
fi
. "$(dirname "$0")/common.sh"
# an installed build made from these sources is used as it is (the tests' run leaves one)
EG_REUSE_BUILD=1
eg_setup "${args[@]}"
work=$EG_WORK
port=${EG_DEMO_PORT:-55432}
rport=${EG_DEMO_RECEIVER_PORT:-18080}
stop_all() {
    eg_as_postgres pg_ctl -D "$work/data" -m fast stop >/dev/null 2>&1 || true
    # the receiver runs under runuser: stop it by the pid it wrote, not runuser's
    if [ -f "$work/receiver.pid" ]; then
        kill "$(cat "$work/receiver.pid")" 2>/dev/null || true
    fi
    rm -rf "$work"
}
cleanup() {
    if [ $keep = 1 ] && [ "${demo_done:-0}" = 1 ]; then
        return
    fi
    stop_all
}
trap cleanup EXIT

echo "== starting a throwaway cluster and the receiver"
eg_start_cluster "$work" $port </dev/null
eg_as_postgres /usr/bin/python3 "$work/test/receiver.py" --port $rport --log "$work/received.jsonl" \
    --pid-file "$work/receiver.pid" >/dev/null 2>&1 &
psql() { eg_as_postgres psql -X -h "$work" -p $port -U postgres -d postgres "$@"; }
for _ in $(seq 50); do [ -s "$work/receiver.pid" ] && break; sleep 0.1; done
if [ ! -s "$work/receiver.pid" ]; then
    echo "the receiver did not start on 127.0.0.1:$rport (port taken? set EG_DEMO_RECEIVER_PORT)" >&2
    exit 1
fi

# waits up to $2 seconds (default 10) until the query $1 returns t
wait_until() {
    for _ in $(seq $((${2:-10} * 10))); do
        [ "$(psql -Atc "$1")" = t ] && return 0
        sleep 0.1
    done
    echo "   (gave up waiting for: $1)"
}

# prints the receiver's log from request number $1 on; bodies longer than
# 300 characters are cut, and say so
show_received() {
    /usr/bin/python3 - "$work/received.jsonl" "$1" <<'PY'
import json, sys
for n, line in enumerate(open(sys.argv[1]), 1):
    if n < int(sys.argv[2]):
        continue
    r = json.loads(line)
    h = r["headers"]
    body = json.loads(r["body"])
    count = len(body) if isinstance(body, list) else 1
    print(f'POST {r["path"]} -> {r["status"]}  {count} event(s)  content-type: {h.get("content-type")}  '
          f'aeg-subscription-name: {h.get("aeg-subscription-name")}  '
          f'aeg-delivery-count: {h.get("aeg-delivery-count")}  x-api-key: {h.get("x-api-key", "-")}')
    text = json.dumps(body)
    shown = text if len(text) <= 300 else text[:300] + f" ... (cut: 300 of {len(text)} characters shown)"
    print("  " + shown)
PY
}
received() { wc -l < "$work/received.jsonl"; }

echo "== configuring topics and event subscriptions (demo/setup.sql)"
psql -q -v ON_ERROR_STOP=1 -v receiver="http://127.0.0.1:$rport" -f "$work/demo/setup.sql" >/dev/null
psql -c "SELECT topic, name, endpoint, included_event_types, advanced_filters IS NOT NULL AS advanced_filters, max_events_per_batch, max_delivery_attempts, deadletter FROM eventgrid.event_subscriptions ORDER BY id"

echo "== publishing the sample events (demo/events.sql)"
psql -v ON_ERROR_STOP=1 -f "$work/demo/events.sql"
wait_until "SELECT coalesce(sum(pending - retrying), 0) = 0 AND sum(retrying) = 2 FROM eventgrid.delivery_statistics"

echo "== what the receiver got (first attempts; flaky-endpoint and always-failing failed and wait for a retry)"
show_received 1
seen=$(($(received) + 1))

echo "== the retries wait on Event Grid's schedule (10 s after the first failure, 30 s after the second, plus up to 10 % jitter)"
psql -c "SELECT s.name AS subscription, r.attempts, r.last_outcome, r.last_http_status, r.next_attempt_at - r.last_attempt_at AS waits FROM eventgrid.retries r JOIN eventgrid.event_subscriptions s ON s.id = r.subscription_id ORDER BY 1"
echo "== moving the worker's clock 15 s ahead (ALTER SYSTEM SET eventgrid.clock_offset = '15s'): the retries come due"
psql -qc "ALTER SYSTEM SET eventgrid.clock_offset = '15s'" -c "SELECT pg_reload_conf()" >/dev/null
wait_until "SELECT count(*) = 2 FROM eventgrid.retries WHERE attempts = 2 AND lease_owner IS NULL"
show_received $seen
seen=$(($(received) + 1))
echo "== and 45 s more (clock_offset = '60s'): flaky-endpoint accepts the third attempt; always-failing used its 3 attempts"
psql -qc "ALTER SYSTEM SET eventgrid.clock_offset = '60s'" -c "SELECT pg_reload_conf()" >/dev/null
wait_until "SELECT coalesce(sum(pending), 0) = 0 FROM eventgrid.delivery_statistics"
show_received $seen
seen=$(($(received) + 1))

echo "== table changes published as events (demo/table-changes.sql): an UPDATE of shop_orders reaches the receiver"
psql -q -v ON_ERROR_STOP=1 -v receiver="http://127.0.0.1:$rport" -f "$work/demo/table-changes.sql" >/dev/null
psql -c "SELECT source_table, topic, operations, columns, update_columns, event_type_prefix FROM eventgrid.table_change_publications"
wait_until "SELECT delivered = 1 FROM eventgrid.delivery_statistics WHERE subscription = 'shipping'"
show_received $seen

echo "== delivery statistics"
psql -c "SELECT * FROM eventgrid.delivery_statistics ORDER BY topic, subscription"
echo "== dead letters"
psql -c "SELECT subscription_name, dead_letter_reason, delivery_attempts, last_delivery_outcome, last_http_status_code, event_id FROM eventgrid.dead_letter_events ORDER BY id"
psql -c "SELECT jsonb_pretty(dead_letter_event) AS dead_letter_event FROM eventgrid.dead_letter_events ORDER BY id"
echo "== the attempt history (eventgrid.delivery_attempts): one row per HTTP request, a batch names all its events"
psql -c "SELECT id, attempted_at::time(0) AS at, subscription, event_ids, attempt, http_status, outcome, round(duration_ms::numeric, 1) AS ms FROM eventgrid.delivery_attempts ORDER BY id"
echo "== metrics with Event Grid's names (eventgrid.metrics)"
psql -c "SELECT topic, coalesce(event_subscription, '') AS event_subscription, metric_name, aggregation, round(value::numeric, 1) AS value FROM eventgrid.metrics WHERE metric_name <> 'DestinationProcessingDurationInMs' AND value > 0 ORDER BY 1, 2, 3"

demo_done=1
# the clock goes back to the real one: what comes after (the tutorial on a
# kept cluster) is timed and scheduled by the real clock
psql -qc "ALTER SYSTEM RESET eventgrid.clock_offset" -c "SELECT pg_reload_conf()" >/dev/null
cat <<SUMMARY
== what this showed
   - events published with INSERT, delivered in Event Grid's and CloudEvents' shapes, filtered and batched
   - a failing endpoint retried on Event Grid's schedule until it accepted; one that never did, dead-lettered
   - an application table whose UPDATE became an event (eventgrid.publish_table_changes)
   - every attempt in eventgrid.delivery_attempts, Event Grid's metrics in eventgrid.metrics
   next: ./scripts/demo.sh --keep, and try those views in psql; ./scripts/test.sh runs every test
SUMMARY
if [ $keep = 1 ]; then
    cat <<EOF
== the cluster and the receiver keep running (--keep)
   connect (as root): runuser -u postgres -- $PG_BINDIR/psql -h $work -p $port -d postgres -v receiver=http://127.0.0.1:$rport
   try:       SELECT * FROM eventgrid.delivery_attempts;
   receiver:  http://127.0.0.1:$rport, the psql variable :'receiver' (it logs to $work/received.jsonl)
   stop both (as root): runuser -u postgres -- $PG_BINDIR/pg_ctl -D $work/data stop; kill $(cat "$work/receiver.pid"); rm -rf $work
EOF
fi
