"""Figure 25 of the eventgrid benchmark (bench.py runs it): WAL sources
(README "Events from managed PostgreSQL"): an application's server with
nothing of eventgrid installed, read by a WAL source of a delivery server.

Two clusters of their own, made here (the bench's cluster is left alone),
on Unix sockets in the bench's work directory: the application's (no
eventgrid, wal_level = logical) and the delivery server (eventgrid
preloaded, eventgrid.delivery_workers = 1: the machine has 2 cores for
both).  The WAL source is made by the superuser (no password needed).

25a. the application's cost: a bulk INSERT ... SELECT of BENCH_WAL_ROWS
     (100,000) 500-byte rows into a table whose changes the WAL source
     publishes (its slot consumed while the INSERT runs) against the same
     into a table in no publication, both with wal_level = logical (median
     of 3); beside them, in-database table changes (a trigger) against a
     plain table on the delivery server.
25b. source commit to committed here: BENCH_WAL_ROWS changes written while
     the source is paused, in transactions of 1,000 rows and of one row
     (BENCH_WAL_SINGLE, 20,000), then resumed: changes/s until every one
     is published here (delivery paused meanwhile).  BENCH_WAL_PERF names
     a directory for a perf record -g of the WAL source worker and the
     walsender during each drain.
25c. source commit to webhook arrival at 1,000 changes/s (single-row
     transactions from 4 connections for BENCH_LATENCY_SECONDS, 20): p50
     and p99 at a receiver in a process of its own.
"""
import os
import statistics
import subprocess
import threading
import time

from replication import Cluster, env_int


class WalSources:
    def __init__(self, bench, arrival_process):
        self.b = bench
        self.ArrivalProcess = arrival_process

    def setup(self, endpoint):
        work = self.b.args.work
        tag = int(time.time() * 1000) % 100000
        app = Cluster(work, f"walapp-{tag}", 55451, "wal_level = logical\nmax_wal_senders = 4\n", None,
                      preload=False)
        app.q("CREATE TABLE published_t (id int PRIMARY KEY, pad text)")
        app.q("CREATE TABLE plain_t (id int PRIMARY KEY, pad text)")
        app.q("CREATE TABLE lat_t (id int PRIMARY KEY, pad text)")
        app.q("CREATE PUBLICATION bench FOR TABLE published_t, lat_t")
        dlv = Cluster(work, f"waldlv-{tag}", 55452, "", None)
        for topic in ("changes", "lat"):
            dlv.q("SELECT eventgrid.create_topic(%s)", (topic,))
        dlv.q("SELECT eventgrid.create_event_subscription('changes', 'sink', %s, max_events_per_batch => 100)",
              (self.b.args.sink,))
        dlv.q("SELECT eventgrid.create_event_subscription('lat', 'sink', %s)", (endpoint,))
        dlv.q("BEGIN; SELECT eventgrid.create_wal_source('app', %s, 'bench');"
              " SELECT eventgrid.publish_table_changes('public.published_t', 'changes', source => 'app');"
              " SELECT eventgrid.publish_table_changes('public.lat_t', 'lat', source => 'app'); COMMIT;",
              (f"host={app.dir} port={app.port} dbname=postgres user=postgres",))
        self.wait(dlv, "SELECT state = 'streaming' FROM eventgrid.wal_sources", 60)
        return app, dlv

    @staticmethod
    def wait(cluster, sql, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if cluster.q(sql)[0][0]:
                return time.time()
            time.sleep(0.01)
        raise RuntimeError(f"waited {timeout} s for {sql}")

    @staticmethod
    def delivery_paused(dlv, value):
        dlv.q(f"ALTER SYSTEM SET eventgrid.delivery_paused = {value}")
        dlv.q("SELECT pg_reload_conf()")

    @staticmethod
    def published(dlv):
        return dlv.q("SELECT events_published FROM eventgrid.wal_sources")[0][0]

    def timed(self, cluster, sql, params=None):
        start = time.time()
        cluster.q(sql, params)
        return time.time() - start

    def bulk_cost(self, app, dlv):
        n = env_int("BENCH_WAL_ROWS", 100000)
        ins = "INSERT INTO {} SELECT g, repeat('x', 500) FROM generate_series(1, %s) g"
        # delivery paused: the application's cost of being read, not of the delivery server's work on the same 2 cores
        self.delivery_paused(dlv, "on")
        times = {"plain_t": [], "published_t": []}
        for _ in range(3):
            for t in ("plain_t", "published_t"):
                app.q(f"TRUNCATE {t}")
                app.q("CHECKPOINT")
                before = self.published(dlv)
                times[t].append(self.timed(app, ins.format(t), (n,)))
                if t == "published_t":      # the source streamed it: wait for all of it here
                    self.wait(dlv, f"SELECT events_published >= {before + n} FROM eventgrid.wal_sources", 600)
        plain, published = statistics.median(times["plain_t"]), statistics.median(times["published_t"])
        self.b.report("wal_bulk_plain_s", f"25a application: INSERT ... SELECT of {n:,} rows, no publication", plain, "s")
        self.b.report("wal_bulk_published_s", "  the same into a table a WAL source publishes", published, "s")
        self.b.report("wal_bulk_ratio", "  published / plain (time)", published / plain, "x", "<= 1.1")
        self.delivery_paused(dlv, "off")
        # in-database table changes on the delivery server, for comparison
        dlv.q("CREATE TABLE tc_plain (id int PRIMARY KEY, pad text)")
        dlv.q("CREATE TABLE tc_published (id int PRIMARY KEY, pad text)")
        dlv.q("SELECT eventgrid.publish_table_changes('tc_published', 'changes', operations => ARRAY['INSERT'])")
        self.delivery_paused(dlv, "on")
        tc = {"tc_plain": [], "tc_published": []}
        for _ in range(3):
            for t in ("tc_plain", "tc_published"):
                dlv.q(f"TRUNCATE {t}")
                dlv.q("CHECKPOINT")
                tc[t].append(self.timed(dlv, ins.format(t), (n,)))
        self.delivery_paused(dlv, "off")
        ratio = statistics.median(tc["tc_published"]) / statistics.median(tc["tc_plain"])
        self.b.report("wal_bulk_trigger_ratio", "  in-database table changes (trigger): published / plain", ratio, "x")

    def throughput(self, app, dlv):
        n = env_int("BENCH_WAL_ROWS", 100000)
        single = env_int("BENCH_WAL_SINGLE", 20000)
        self.delivery_paused(dlv, "on")
        for label, rows, per_txn in (("1,000-row transactions", n, 1000), ("single-row transactions", single, 1)):
            app.q("TRUNCATE published_t")
            dlv.q("SELECT eventgrid.pause_wal_source('app')")
            before = self.published(dlv)
            if per_txn == 1:
                app.q("CREATE OR REPLACE PROCEDURE one_by_one(n int) LANGUAGE plpgsql AS $$"
                      " BEGIN FOR i IN 1 .. n LOOP INSERT INTO published_t VALUES (i, repeat('x', 500)); COMMIT; END LOOP; END $$")
                app.q("CALL one_by_one(%s)", (rows,))
            else:
                for k in range(0, rows, per_txn):
                    app.q("INSERT INTO published_t SELECT g, repeat('x', 500) FROM generate_series(%s, %s) g",
                          (k + 1, k + per_txn))
            start = time.time()
            dlv.q("SELECT eventgrid.resume_wal_source('app')")
            perf = self.perf(app, dlv, f"{per_txn}") if os.environ.get("BENCH_WAL_PERF") else None
            end = self.wait(dlv, f"SELECT events_published >= {before + rows} FROM eventgrid.wal_sources", 1200)
            if perf:
                perf.send_signal(2)
                perf.wait()
            key = "wal_throughput_batched" if per_txn > 1 else "wal_throughput_single"
            self.b.report(key, f"25b source commit to committed here, {rows:,} changes in {label}",
                          rows / (end - start), "changes/s", ">= 50000" if per_txn > 1 else "")
        self.delivery_paused(dlv, "off")

    def perf(self, app, dlv, tag):
        """BENCH_WAL_PERF=<directory>: perf record -g of the WAL source worker and the source's
        walsender until the drain ends (perf-<tag>.data there)."""
        self.wait(dlv, "SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'eventgrid WAL source'", 30)
        self.wait(app, "SELECT count(*) = 1 FROM pg_stat_replication", 30)
        pids = [dlv.q("SELECT pid FROM pg_stat_activity WHERE backend_type = 'eventgrid WAL source'")[0][0],
                app.q("SELECT pid FROM pg_stat_replication")[0][0]]
        out = os.path.join(os.environ["BENCH_WAL_PERF"], f"perf-{tag}.data")
        return subprocess.Popen(["perf", "record", "-g", "-F", "999", "-o", out, "-p", ",".join(map(str, pids))],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def latency(self, app, dlv, receiver):
        seconds = env_int("BENCH_LATENCY_SECONDS", 20)
        rate = 1000
        conns = [app.connect() for _ in range(4)]
        commits = {}
        start = time.time()

        def run(k):
            with conns[k].cursor() as cur:
                for i in range(k, rate * seconds, len(conns)):
                    delay = start + i / rate - time.time()
                    if delay > 0:
                        time.sleep(delay)
                    cur.execute("INSERT INTO lat_t VALUES (%s, repeat('x', 500))", (i,))
                    commits[f"/public/lat_t/{i}"] = time.time()

        ts = [threading.Thread(target=run, args=(k,)) for k in range(len(conns))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        for c in conns:
            c.close()
        deadline = time.time() + 120
        while time.time() < deadline and dlv.q(
                "SELECT coalesce(sum(delivered), 0) FROM eventgrid.delivery_statistics WHERE topic = 'lat'")[0][0] < len(commits):
            time.sleep(0.05)
        time.sleep(0.5)
        arrivals = receiver.arrivals()
        lat = sorted((arrivals[k] - v) * 1000 for k, v in commits.items() if k in arrivals)
        p = lambda xs, q: xs[min(len(xs) - 1, int(q * len(xs)))]
        self.b.report("wal_latency_arrived", f"25c changes arrived of {len(commits):,}", len(lat), "")
        self.b.report("wal_latency_p50_ms", "25c source commit to webhook arrival at 1,000 changes/s, p50", p(lat, 0.50), "ms")
        self.b.report("wal_latency_p99_ms", "  p99", p(lat, 0.99), "ms", "<= 50")

    def run(self):
        receiver = self.ArrivalProcess(key="subject")
        app, dlv = self.setup(f"http://127.0.0.1:{receiver.port}/latency")
        try:
            self.latency(app, dlv, receiver)
            self.throughput(app, dlv)
            self.bulk_cost(app, dlv)
        finally:
            dlv.stop()
            app.stop()
