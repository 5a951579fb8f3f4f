#!/usr/bin/env bash
# eventgrid end to end on a fresh Debian 12 machine: installs packages,
# builds and installs the extension, starts a throwaway PostgreSQL cluster
# with eventgrid preloaded and a real webhook receiver on 127.0.0.1, publishes
# the sample events of demo/events.sql with INSERT, and shows what the
# receiver got and the dead letters in psql.  Everything is removed at exit.
set -euo pipefail
. "$(dirname "$0")/common.sh"
eg_setup "$@"
work=$EG_WORK
port=55432
rport=18080
cleanup() {
    eg_as_postgres pg_ctl -D "$work/data" -m fast stop >/dev/null 2>&1 || true
    # the receiver runs under runuser: stop it by its path, not runuser's pid
    pkill -f "$work/test/receiver.py" 2>/dev/null || true
    sleep 0.2
    pkill -KILL -f "$work/test/receiver.py" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

echo "== starting a throwaway cluster and the receiver"
eg_start_cluster "$work" $port </dev/null
eg_as_postgres /usr/bin/python3 "$work/test/receiver.py" --port $rport --log "$work/received.jsonl" >/dev/null 2>&1 &
psql() { eg_as_postgres psql -X -h "$work" -p $port -U postgres -d postgres "$@"; }
for _ in $(seq 50); do [ -f "$work/received.jsonl" ] && break; sleep 0.1; done

echo "== configuring topics and event subscriptions (demo/setup.sql)"
psql -q -v ON_ERROR_STOP=1 -v receiver="http://127.0.0.1:$rport" -f "$work/demo/setup.sql" >/dev/null
psql -c "SELECT topic, name, endpoint, event_delivery_schema, included_event_types, advanced_filters IS NOT NULL AS advanced_filters, deadletter FROM eventgrid.event_subscriptions ORDER BY id"

echo "== publishing the sample events (demo/events.sql)"
psql -v ON_ERROR_STOP=1 -f "$work/demo/events.sql"
for _ in $(seq 100); do
    [ "$(psql -Atc 'SELECT coalesce(sum(pending), 0) FROM eventgrid.delivery_statistics')" = 0 ] && break
    sleep 0.1
done

echo "== what the receiver got"
/usr/bin/python3 - "$work/received.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    h = r["headers"]
    print(f'POST {r["path"]} -> {r["status"]}  content-type: {h.get("content-type")}  '
          f'aeg-subscription-name: {h.get("aeg-subscription-name")}  x-api-key: {h.get("x-api-key", "-")}')
    print("  " + json.dumps(json.loads(r["body"]))[:300])
PY

echo "== delivery statistics"
psql -c "SELECT * FROM eventgrid.delivery_statistics ORDER BY topic, subscription"
echo "== dead letters"
psql -c "SELECT subscription_name, dead_letter_reason, delivery_attempts, last_delivery_outcome, last_http_status_code FROM eventgrid.dead_letter_events"
psql -c "SELECT jsonb_pretty(dead_letter_event) AS dead_letter_event FROM eventgrid.dead_letter_events"
