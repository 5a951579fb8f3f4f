"""Figure 26 of the eventgrid benchmark (bench/subscriptions.sh runs it):
scale in subscriptions (issue "Scale in subscriptions", docs/SPEC.md 20's
figures).  One cluster; a busy topic with one event subscription, and a
domain whose domain topics each have one subscription that receives
nothing ("idle"), grown step by step to each size in BENCH_IDLE_SUBS
(0,10000,100000).  At each size:

  create     idle subscriptions created a second (create_event_subscription()
             of a domain topic, one session, in one DO block per 1,000)
  busy       BENCH_SUB_EVENTS (50,000) single events published to the busy
             topic while it is paused, then resumed: delivered events/s, and
             the ratio to the first size (target >= 0.9)
  spread     the same number of events published to the domain, spread over
             1,000 of its domain topics (or all, if fewer): delivered
             events/s, and the ratio to busy (target >= 0.8)
  idle CPU   nothing published for BENCH_IDLE_SETTLE (40) seconds, then for
             BENCH_IDLE_SECONDS (10) more: CPU of every process of the
             cluster, ms a second (target <= 5)
  memory     the largest delivery worker's private memory (RssAnon, MB;
             target <= 64)

BENCH_SUB_PERF=<directory>: a perf record -g (999 Hz) of eventgrid's
background workers during each drain, perf-<size>-busy.data and
perf-<size>-spread.data there, and the statements that took the most time
in that drain (pg_stat_statements, track = all), statements-<size>-*.txt.

At the largest size, dropping 1,000 subscriptions: drops a second; then
pg_dump (custom format) of the database and pg_restore into a new one:
seconds each (target <= 120).  The last line is BENCH_RESULT with every
figure.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import psycopg2
import yaml

EVENTS = int(os.environ.get("BENCH_SUB_EVENTS", "50000"))
SIZES = [int(x) for x in os.environ.get("BENCH_IDLE_SUBS", "0,10000,100000").split(",")]
IDLE_SECONDS = int(os.environ.get("BENCH_IDLE_SECONDS", "10"))
SETTLE = int(os.environ.get("BENCH_IDLE_SETTLE", "40"))
SPREAD = 1000


def cluster_cpu(data_dir):
    """CPU seconds used so far by the postmaster of data_dir and its children."""
    with open(os.path.join(data_dir, "postmaster.pid")) as f:
        postmaster = int(f.readline())
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(pid) == postmaster or int(fields[1]) == postmaster:
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def rss_anon_mb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--sink", required=True)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--exporter-queries", required=True)
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    conn = psycopg2.connect(host=args.host, port=args.port, dbname="postgres")
    conn.autocommit = True
    cur = conn.cursor()

    def one(sql, params=None):
        cur.execute(sql, params)
        return cur.fetchone()[0]

    ids_of = {}

    def delivered(topic, domain_topics=None):
        # a domain's: only the domain topics published to (summing every
        # idle one's counter at each poll was the bench's own load), by the
        # subscriptions' ids looked up once (joining 1,000 domain topics'
        # names to the subscriptions took 50 ms a poll beside 100,000:
        # about a tenth of a core of the two during the spread drain)
        key = (topic, tuple(domain_topics or ()))
        if key not in ids_of:
            cur.execute("SELECT array_agg(s.id) FROM eventgrid.event_subscriptions s WHERE s.topic = %s"
                        " AND (%s::text[] IS NULL OR s.domain_topic = ANY (%s::text[]))", (topic, domain_topics, domain_topics))
            ids_of[key] = cur.fetchone()[0] or []
        return one("SELECT coalesce(sum(c.delivered), 0) FROM eventgrid.subscription_counters c"
                   " WHERE c.subscription_id = ANY (%s::int8[])", (ids_of[key],))

    def drain(topic, want, limit=1800, domain_topics=None):
        # polled every 50 ms, or ten times as long as a poll takes (summing
        # 1,000 domain topics' counters beside 100,000 subscriptions takes
        # about 15 ms: every 50 ms it was a third of a core of the two)
        t0 = time.monotonic()
        while True:
            p0 = time.monotonic()
            if delivered(topic, domain_topics) >= want:
                return time.monotonic() - t0
            if time.monotonic() - t0 > limit:
                return None
            time.sleep(max(0.05, 10 * (time.monotonic() - p0)))

    def perf(tag):
        # BENCH_SUB_PERF=<directory>: perf record -g of eventgrid's background
        # workers (delivery and upkeep) while a drain runs, perf-<tag>.data there
        if not os.environ.get("BENCH_SUB_PERF"):
            return None
        cur.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        cur.execute("SELECT pg_stat_statements_reset()")
        cur.execute("SELECT string_agg(pid::text, ',') FROM pg_stat_activity WHERE backend_type LIKE 'eventgrid %%'")
        out = os.path.join(os.environ["BENCH_SUB_PERF"], f"perf-{tag}.data")
        return subprocess.Popen(["perf", "record", "-g", "-F", "999", "-o", out, "-p", cur.fetchone()[0]],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def publish_paused(topic, events_sql, before, domain_topics=None, tag=None):
        cur.execute("SELECT eventgrid.pause_delivery(%s)", (topic,))
        cur.execute(events_sql)
        recorder = perf(tag) if tag else None
        t0 = time.monotonic()
        cur.execute("SELECT eventgrid.resume_delivery(%s)", (topic,))
        d = drain(topic, before + EVENTS, domain_topics=domain_topics)
        if recorder:
            recorder.send_signal(2)
            recorder.wait()
            # and the statements that took the time, beside the profile
            cur.execute("SELECT calls, round(total_exec_time), round(mean_exec_time::numeric, 3), rows,"
                        " regexp_replace(left(query, 160), '\\s+', ' ', 'g')"
                        " FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 15")
            with open(os.path.join(os.environ["BENCH_SUB_PERF"], f"statements-{tag}.txt"), "w") as f:
                for r in cur.fetchall():
                    f.write("\t".join(map(str, r)) + "\n")
        return EVENTS / d if d else None, time.monotonic() - t0

    cur.execute("CREATE EXTENSION IF NOT EXISTS eventgrid")
    cur.execute("SELECT eventgrid.create_topic('busy')")
    cur.execute("SELECT eventgrid.create_event_subscription('busy', 'hook', %s)", (args.sink + "/busy",))
    cur.execute("SELECT eventgrid.create_domain('tenants')")
    queries = [b["query"] for b in yaml.safe_load(open(args.exporter_queries)).values()]

    def timed(sql, params=None):
        t0 = time.monotonic()
        cur.execute(sql, params)
        cur.fetchall()
        return round((time.monotonic() - t0) * 1000, 1)

    def scrape(per_topic):
        # every query of monitoring/postgres_exporter.yml, as a scrape runs
        # them (counted in the server: the rows are not sent here)
        cur.execute("SET eventgrid.metrics_per_topic = %s", ("on" if per_topic else "off",))
        t0 = time.monotonic()
        rows = sum(one(f"SELECT count(*) FROM ({q}) q") for q in queries)
        took = time.monotonic() - t0
        cur.execute("RESET eventgrid.metrics_per_topic")
        return round(took, 2), rows

    def reads():
        looks = {"statistics_topic_ms": timed("SELECT * FROM eventgrid.delivery_statistics WHERE topic = 'busy'"),
                 "statistics_domain_topic_ms": timed("SELECT * FROM eventgrid.delivery_statistics"
                                                     " WHERE topic = 'tenants' AND domain_topic = 't-42'"),
                 "statistics_domain_ms": timed("SELECT * FROM eventgrid.delivery_statistics WHERE topic = 'tenants'")}
        looks["scrape_s"], looks["scrape_rows"] = scrape(False)
        looks["scrape_per_topic_s"], looks["scrape_per_topic_rows"] = scrape(True)
        return looks

    print(f"figure 26: scale in subscriptions, {EVENTS:,} events a case, sizes {SIZES}")
    rows = []
    made = 0
    first_busy = None
    for n in SIZES:
        t0 = time.monotonic()
        while made < n:
            k = min(1000, n - made)
            cur.execute("""DO $$ BEGIN FOR i IN %s .. %s LOOP
                             PERFORM eventgrid.create_event_subscription('tenants/t-' || i, 'hook', %s || '/t' || i);
                           END LOOP; END $$""", (made + 1, made + k, args.sink))
            made += k
        created = time.monotonic() - t0
        create_rate = (n - (rows[-1]["subscriptions"] if rows else 0)) / created if created > 0.01 else None
        # steady state: what creating them left for autovacuum and the checkpointer is done before measuring
        cur.execute("VACUUM (ANALYZE)")
        cur.execute("CHECKPOINT")
        before = delivered("busy")
        busy, _ = publish_paused("busy", f"INSERT INTO eventgrid.events (topic, event) SELECT 'busy',"
                                 f" jsonb_build_object('id', 'b-' || g, 'subject', '/b', 'eventType', 'T',"
                                 f" 'eventTime', '2024-05-01T12:00:00Z', 'data', jsonb_build_object('n', g))"
                                 f" FROM generate_series(1, {EVENTS}) g", before, tag=f"{n}-busy")
        first_busy = first_busy or busy
        spread = None
        if n > 0:
            tenants = min(n, SPREAD)
            spread_topics = [f"t-{i}" for i in range(1, tenants + 1)]
            before = delivered("tenants", spread_topics)
            # publish() of 1,000 events a call, each naming its domain topic
            spread, _ = publish_paused("tenants", f"DO $$ BEGIN FOR k IN 0 .. {EVENTS // 1000 - 1} LOOP"
                                       f" PERFORM eventgrid.publish('tenants', (SELECT jsonb_agg(jsonb_build_object("
                                       f"'id', 's-' || g, 'subject', '/s', 'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z',"
                                       f" 'topic', 't-' || (g % {tenants} + 1), 'data', jsonb_build_object('n', g)))"
                                       f" FROM generate_series(k * 1000 + 1, k * 1000 + 1000) g)); END LOOP; END $$", before,
                                       spread_topics, tag=f"{n}-spread")
        # what operators read, right after the drains (events still in the event tables)
        looks = reads()
        # nothing published since: the event tables are emptied by their rotation (3 x 10 s), the upkeep worker goes idle
        time.sleep(SETTLE)
        c0 = cluster_cpu(args.data_dir)
        time.sleep(IDLE_SECONDS)
        idle_ms = (cluster_cpu(args.data_dir) - c0) / IDLE_SECONDS * 1000
        cur.execute("SELECT pid FROM pg_stat_activity WHERE backend_type = 'eventgrid delivery worker'")
        mem = max([rss_anon_mb(r[0]) for r in cur.fetchall()] or [0])
        row = {"subscriptions": n, "create_per_s": create_rate and round(create_rate), "busy_events_per_s": busy and round(busy),
               "busy_ratio": busy and first_busy and round(busy / first_busy, 2), "spread_events_per_s": spread and round(spread),
               "spread_ratio": spread and busy and round(spread / busy, 2), "idle_cpu_ms_per_s": round(idle_ms, 1),
               "worker_rss_anon_mb": round(mem, 1), **looks}
        rows.append(row)
        print(f"  {n:>9,} idle subscriptions: created {row['create_per_s']}/s; busy topic {row['busy_events_per_s']} events/s"
              f" ({row['busy_ratio']} of the first, target >= 0.9); spread over {min(n, SPREAD) if n else 0} domain topics"
              f" {row['spread_events_per_s']} events/s ({row['spread_ratio']} of busy, target >= 0.8);"
              f" idle CPU {row['idle_cpu_ms_per_s']} ms/s (target <= 5); largest worker RssAnon {row['worker_rss_anon_mb']} MB (target <= 64)")
        print(f"            delivery_statistics of one topic {looks['statistics_topic_ms']} ms, of one domain topic"
              f" {looks['statistics_domain_topic_ms']} ms, of the whole domain {looks['statistics_domain_ms']} ms (target <= 50 ms"
              f" for one topic); the exporter's queries per subscription {looks['scrape_s']} s ({looks['scrape_rows']:,} rows),"
              f" per topic {looks['scrape_per_topic_s']} s ({looks['scrape_per_topic_rows']:,} rows) (target <= 5 s)")
    if made >= 1000:
        t0 = time.monotonic()
        cur.execute("""DO $$ BEGIN FOR i IN 1 .. 1000 LOOP
                         PERFORM eventgrid.drop_event_subscription('tenants/t-' || i, 'hook');
                       END LOOP; END $$""")
        drop_rate = 1000 / (time.monotonic() - t0)
        print(f"  dropping 1,000 of {made:,}: {drop_rate:,.0f}/s (target >= 1,000)")
        rows.append({"drop_per_s": round(drop_rate)})
        # pg_dump and pg_restore of the database with its subscriptions (custom format, one job)
        dump = os.path.join(args.host, "subs.dump")
        conn_args = ["-h", args.host, "-p", str(args.port)]
        t0 = time.monotonic()
        subprocess.run(["pg_dump", *conn_args, "-Fc", "-f", dump, "postgres"], check=True)
        dump_s = time.monotonic() - t0
        cur.execute("DROP DATABASE IF EXISTS restored")
        cur.execute("CREATE DATABASE restored")
        t0 = time.monotonic()
        subprocess.run(["pg_restore", *conn_args, "-d", "restored", dump], check=True)
        restore_s = time.monotonic() - t0
        print(f"  pg_dump of {made - 1000:,} subscriptions {dump_s:.1f} s, pg_restore {restore_s:.1f} s (target <= 120 s each)")
        rows.append({"dump_s": round(dump_s, 1), "restore_s": round(restore_s, 1)})
    print("BENCH_RESULT " + json.dumps(rows))


if __name__ == "__main__":
    main()
