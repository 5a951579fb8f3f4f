#!/usr/bin/env bash
# What scripts/package.sh --check runs, as root, on a server where eventgrid
# came from its .deb (no compiler, no PostgreSQL headers): a throwaway
# cluster with the packaged library preloaded, the test receiver
# (test/receiver.py) on 127.0.0.1, and one event subscription of each kind
# the package must serve: push, batched, ordered, dead-lettered, table
# changes and pull (a queue subscription).  Prints what arrived and ends with
# "N passed, N failed"; exits non-zero on any failure.
#   test/package/smoke.sh MAJOR
set -uo pipefail
major=$1
here=$(cd "$(dirname "$0")" && pwd)
bin=/usr/lib/postgresql/$major/bin
work=$(mktemp -d /tmp/eventgrid-smoke-XXXXXX)
port=55499
rport=18499
passed=0
failed=0
chown postgres:postgres "$work"
as_pg() { runuser -u postgres -- env PATH="$bin:/usr/bin:/bin" HOME=/tmp "$@"; }
psql_q() { as_pg psql -X -q -t -A -v ON_ERROR_STOP=1 -h "$work" -p $port -d postgres "$@"; }
check() {   # check NAME EXPECTED ACTUAL
    if [ "$2" = "$3" ]; then
        echo "ok - $1"
        passed=$((passed + 1))
    else
        echo "not ok - $1: expected '$2', got '$3'"
        failed=$((failed + 1))
    fi
}
cleanup() {
    as_pg pg_ctl -D "$work/data" -m fast stop >/dev/null 2>&1 || true
    [ -f "$work/receiver.pid" ] && kill "$(cat "$work/receiver.pid")" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

for tool in gcc cc; do
    command -v $tool >/dev/null 2>&1 && { echo "not ok - a server without build tools has $tool"; exit 1; }
done
[ -d /usr/include/postgresql/$major/server ] &&
    { echo "not ok - the server has PostgreSQL's server headers (postgresql-server-dev-$major)"; exit 1; }
echo "ok - no compiler and no PostgreSQL server headers on this server"
check "the package installed the library" yes "$([ -f /usr/lib/postgresql/$major/lib/eventgrid.so ] && echo yes || echo no)"

as_pg initdb -D "$work/data" -A trust -U postgres >/dev/null
cat >> "$work/data/postgresql.conf" <<EOF
shared_preload_libraries = 'eventgrid'
port = $port
listen_addresses = ''
unix_socket_directories = '$work'
EOF
as_pg pg_ctl -D "$work/data" -l "$work/server.log" -w start >/dev/null || { tail -n 30 "$work/server.log"; exit 1; }
cp "$here/../receiver.py" "$work/"    # (this tree may be where postgres cannot read)
as_pg /usr/bin/python3 "$work/receiver.py" --port $rport --log "$work/received.jsonl" \
    --pid-file "$work/receiver.pid" >"$work/receiver.out" 2>&1 &
for _ in $(seq 50); do [ -f "$work/receiver.pid" ] && break; sleep 0.1; done
[ -f "$work/receiver.pid" ] || { echo "not ok - the receiver did not start"; cat "$work/receiver.out"; exit 1; }

receiver="http://127.0.0.1:$rport"
psql_q -v receiver="$receiver" >"$work/setup.out" <<'SQL' || { cat "$work/setup.out"; exit 1; }
CREATE EXTENSION eventgrid;
SELECT eventgrid.create_topic('smoke');
SELECT eventgrid.create_event_subscription('smoke', 'push', :'receiver' || '/status/200/push');
SELECT eventgrid.create_event_subscription('smoke', 'batched', :'receiver' || '/status/200/batched',
       max_events_per_batch => 10);
SELECT eventgrid.create_event_subscription('smoke', 'ordered', :'receiver' || '/status/200/ordered',
       ordering_key => 'subject');
SELECT eventgrid.create_event_subscription('smoke', 'refused', :'receiver' || '/status/400/refused',
       deadletter => true);
CREATE TABLE orders (id int PRIMARY KEY, total numeric);
SELECT eventgrid.create_topic('table-changes');
SELECT eventgrid.create_event_subscription('table-changes', 'rows', :'receiver' || '/status/200/rows');
SELECT eventgrid.publish_table_changes('orders', 'table-changes');
SELECT eventgrid.create_topic('pull', 'CloudEventSchemaV1_0', 'namespace');
SELECT eventgrid.create_event_subscription('pull', 'consumer', delivery_mode => 'queue');
INSERT INTO eventgrid.events (topic, event)
SELECT 'smoke', jsonb_build_object('id', 'e-' || i, 'subject', '/key/' || (i % 2), 'eventType', 'Smoke.Test',
                                   'eventTime', '2026-01-01T00:00:00Z', 'data', jsonb_build_object('n', i),
                                   'dataVersion', '1')
  FROM generate_series(1, 5) i;
INSERT INTO orders VALUES (1, 10), (2, 20);
INSERT INTO eventgrid.events (topic, event)
SELECT 'pull', jsonb_build_object('specversion', '1.0', 'id', 'p-' || i, 'source', '/smoke', 'type', 'Smoke.Pulled',
                                   'data', jsonb_build_object('n', i))
  FROM generate_series(1, 3) i;
SQL

# what each path received, as "path events" (a batch counts its events)
received() {
    python3 - "$work/received.jsonl" <<'PY'
import json, sys, collections
n = collections.Counter()
for line in open(sys.argv[1]):
    r = json.loads(line)
    body = json.loads(r["body"])
    n[r["path"]] += len(body) if isinstance(body, list) else 1
for p in sorted(n):
    print(p, n[p])
PY
}
for _ in $(seq 300); do
    [ -f "$work/received.jsonl" ] && [ "$(received | wc -l)" -ge 5 ] &&
        [ "$(psql_q -c "SELECT count(*) FROM eventgrid.dead_letters")" = 5 ] && break
    sleep 0.1
done
got=$(received)
echo "$got" | sed 's/^/# received: /'
check "push: 5 events" 5 "$(echo "$got" | awk '$1 == "/status/200/push" {print $2}')"
check "batched: 5 events" 5 "$(echo "$got" | awk '$1 == "/status/200/batched" {print $2}')"
check "batched: fewer requests than events" yes \
    "$([ "$(grep -c '"/status/200/batched"' "$work/received.jsonl")" -lt 5 ] && echo yes || echo no)"
check "ordered: 5 events" 5 "$(echo "$got" | awk '$1 == "/status/200/ordered" {print $2}')"
check "ordered: each key in publish order" "e-1 e-3 e-5 e-2 e-4" "$(python3 - "$work/received.jsonl" <<'PY'
import json, sys
ids = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["path"] == "/status/200/ordered":
        body = json.loads(r["body"])
        for e in (body if isinstance(body, list) else [body]):
            ids.setdefault(e["subject"], []).append(e["id"])
print(" ".join(ids.get("/key/1", []) + ids.get("/key/0", [])))
PY
)"
check "table changes: 2 rows" 2 "$(echo "$got" | awk '$1 == "/status/200/rows" {print $2}')"
check "dead-lettered: 5 refused events" "5 BadRequest" \
    "$(psql_q -c "SELECT count(*) || ' ' || min(last_delivery_outcome) FROM eventgrid.dead_letters WHERE subscription_name = 'refused'")"
pull=$(psql_q <<'SQL'
CREATE TEMP TABLE got (lock_token text, event jsonb);
DO $$
BEGIN
    FOR i IN 1..3 LOOP
        EXIT WHEN (SELECT count(*) FROM got) >= 3;
        INSERT INTO got SELECT lock_token, event FROM eventgrid.receive('pull', 'consumer', 10, 10);
    END LOOP;
END $$;
SELECT coalesce(string_agg(event->>'id', ' ' ORDER BY event->>'id'), 'none') FROM got;
SELECT count(*) FILTER (WHERE succeeded)
  FROM eventgrid.acknowledge('pull', 'consumer', (SELECT array_agg(lock_token) FROM got));
SQL
)
check "pull: received" "p-1 p-2 p-3" "$(echo "$pull" | sed -n 1p)"
check "pull: acknowledged" 3 "$(echo "$pull" | sed -n 2p)"
echo "$passed passed, $failed failed"
[ $failed -eq 0 ] || { echo "# server log:"; tail -n 40 "$work/server.log"; exit 1; }
