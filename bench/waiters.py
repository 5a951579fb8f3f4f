"""Figure 22 of the eventgrid benchmark (bench/waiters.sh runs it): idle
waiting consumers.  BENCH_WAITERS (1,000) connections each wait in
receive('idle', 'waiting', 1, 120), with nothing to receive, while one
connection publishes to topic 'busy' (a queue subscription of its own) one
event per commit, about 200 a second, for BENCH_WAITERS_SECONDS (20).
Printed: the waiters' CPU over that time (clock ticks of their backends,
and as a share of one core), their memory (sum of Pss), and, after one
commit publishes BENCH_WAITERS events to 'idle', the time until every
waiter has returned with one.
"""
import argparse
import os
import select
import time

import psycopg2
import psycopg2.extensions


def wait(conn):
    while True:
        state = conn.poll()
        if state == psycopg2.extensions.POLL_OK:
            return
        if state == psycopg2.extensions.POLL_READ:
            select.select([conn.fileno()], [], [])
        elif state == psycopg2.extensions.POLL_WRITE:
            select.select([], [conn.fileno()], [])


def ticks(pids):
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return total


def pss_kb(pids):
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    n = int(os.environ.get("BENCH_WAITERS", "1000"))
    seconds = int(os.environ.get("BENCH_WAITERS_SECONDS", "20"))
    dsn = f"host={args.host} port={args.port} dbname=postgres user=postgres"
    admin = psycopg2.connect(dsn)
    admin.autocommit = True
    cur = admin.cursor()
    cur.execute("CREATE EXTENSION IF NOT EXISTS eventgrid")
    for topic, sub in (("idle", "waiting"), ("busy", "busy")):
        cur.execute("SELECT eventgrid.create_topic(%s, 'CloudEventSchemaV1_0', 'namespace')", (topic,))
        cur.execute("SELECT eventgrid.create_event_subscription(%s, %s, delivery_mode => 'queue')", (topic, sub))

    conns = []
    for _ in range(n):
        c = psycopg2.connect(dsn, async_=1)
        wait(c)
        conns.append(c)
    pids = [c.get_backend_pid() for c in conns]
    base_pss = pss_kb(pids)
    curs = [c.cursor() for c in conns]
    for k in curs:
        k.execute("SELECT count(*) FROM eventgrid.receive('idle', 'waiting', 1, 120)")
    while True:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'Extension'"
                    " AND query LIKE '%%receive(''idle''%%'")
        if cur.fetchone()[0] >= n:
            break
        time.sleep(0.2)
    print(f"22. {n} consumers waiting in receive() on an empty queue subscription")
    t0 = ticks(pids)
    time.sleep(seconds)
    idle_ticks = ticks(pids) - t0
    print(f"    idle, {seconds} s: {idle_ticks} clock ticks ({idle_ticks / os.sysconf('SC_CLK_TCK') / seconds * 100:.2f} % of a core)")

    t0 = ticks(pids)
    start = time.time()
    published = 0
    while time.time() - start < seconds:
        cur.execute("SELECT eventgrid.publish('busy', jsonb_build_object('specversion', '1.0', 'id', %s,"
                    " 'source', '/bench', 'type', 'Bench.Busy'))", (f"b{published}",))
        published += 1
        time.sleep(0.005)
    busy_secs = time.time() - start
    busy_ticks = ticks(pids) - t0
    print(f"    while another queue subscription got {published / busy_secs:.0f} events/s for {busy_secs:.0f} s:"
          f" {busy_ticks} clock ticks ({busy_ticks / os.sysconf('SC_CLK_TCK') / busy_secs * 100:.2f} % of a core)")
    pss = pss_kb(pids)
    print(f"    memory of the {n} waiting backends: {pss / 1024:.0f} MB Pss ({pss / n:.0f} kB each;"
          f" {base_pss / n:.0f} kB each when connected, before receive())")

    start = time.time()
    cur.execute("SELECT eventgrid.publish('idle', jsonb_agg(jsonb_build_object('specversion', '1.0', 'id', 'i' || g,"
                " 'source', '/bench', 'type', 'Bench.Idle'))) FROM generate_series(1, %s) g", (n,))
    got = 0
    for c, k in zip(conns, curs):
        wait(c)
        got += k.fetchone()[0]
    done = time.time() - start
    print(f"    one commit of {n} events: every waiter returned after {done:.2f} s, {got} with an event")


if __name__ == "__main__":
    main()
