"""Figure 16 of the eventgrid benchmark (bench.py runs it): several databases.

16a. 1, 4 and 16 busy databases, the same work in total: BENCH_DB_EVENTS
     (320,000) single-event deliveries spread over 16 subscriptions (each on
     a topic of its own), so 16 subscriptions in one database, 4 in each of
     4, or 1 in each of 16; a backlog published while delivery is paused
     and drained to the nginx sink.  Reports deliveries/s, the eventgrid
     workers running in those databases (peak and mean, sampled every
     50 ms), their private memory together (RssAnon, peak of the sum) and
     the CPU of all the cluster's processes per delivery (read every 0.2 s:
     a worker that lived less than that is missed).  The cluster
     keeps its max_worker_processes (the default 8): past it databases take
     turns.
16b. 100 idle databases with the extension (BENCH_IDLE_DATABASES): once
     their workers left (eventgrid.worker_idle_timeout, set to 5 s for the
     figure), the cluster's processes and eventgrid workers, and the CPU
     all of them use per minute (over BENCH_IDLE_SECONDS, 60); then the
     first event's commit-to-arrival in 10 of them after idling.
16c. fairness: a trickle of 10 events/s in one database, commit to arrival
     at a receiver of its own, alone and beside a 100,000-event backlog in
     another database (batches of 5, to the nginx sink).
"""
import os
import statistics
import time

import psycopg2

EG_WORKERS = "backend_type IN ('eventgrid delivery worker', 'eventgrid upkeep worker')"


def env_int(name, default):
    return int(os.environ.get(name, default))


class Databases:
    def __init__(self, bench, arrival_receiver):
        self.b = bench
        self.arrival_receiver = arrival_receiver
        self.conns = {}

    # -- helpers ----------------------------------------------------------------
    def conn(self, db):
        if db not in self.conns:
            c = psycopg2.connect(host=self.b.args.host, port=self.b.args.port, user="postgres", dbname=db)
            c.autocommit = True
            self.conns[db] = c
        return self.conns[db]

    def q(self, db, sql, params=None):
        return self.b.q(sql, params, conn=self.conn(db))

    def close(self, db):
        c = self.conns.pop(db, None)
        if c:
            c.close()

    def create(self, names):
        """Creates the databases not there yet, each with the extension."""
        have = {r[0] for r in self.b.q("SELECT datname FROM pg_database")}
        for db in names:
            if db not in have:
                self.b.q(f'CREATE DATABASE "{db}"')
                self.q(db, "CREATE EXTENSION eventgrid")
                self.close(db)      # 100 databases would take every connection slot

    def drop(self, names):
        for db in names:
            self.close(db)
            self.b.q(f'DROP DATABASE IF EXISTS "{db}"')

    def workers(self, prefix=""):
        """(pid, database) of each eventgrid delivery and upkeep worker running (in databases named prefix...)."""
        return self.b.q(f"SELECT pid, datname FROM pg_stat_activity WHERE {EG_WORKERS} AND datname LIKE %s",
                        (prefix + "%",))

    @staticmethod
    def rss_anon_kb(pids):
        """(sum, largest) of the processes' RssAnon, in kB."""
        total = largest = 0
        for pid in pids:
            try:
                with open(f"/proc/{pid}/status") as f:
                    kb = next(int(line.split()[1]) for line in f if line.startswith("RssAnon:"))
            except (OSError, StopIteration):
                continue
            total, largest = total + kb, max(largest, kb)
        return total, largest

    def wait_no_workers(self, timeout=300):
        deadline = time.time() + timeout
        while self.workers():
            if time.time() > deadline:
                raise RuntimeError("the eventgrid workers did not leave")
            time.sleep(0.5)

    def postmaster_children(self):
        return len(self.b.cluster_cpu()) - 1

    # -- 16a --------------------------------------------------------------------
    def busy(self, k, n_events, nsubs=16):
        dbs = [f"bench_db_{i:02d}" for i in range(k)]
        self.create(dbs)
        per_topic = n_events // nsubs
        self.b.set_guc("eventgrid.delivery_paused", "on")
        for i, db in enumerate(dbs):
            for t in self.q(db, "SELECT name FROM eventgrid.topics"):
                self.q(db, "SELECT eventgrid.drop_topic(%s)", (t[0],))
            for s in range(nsubs // k):
                topic = f"topic-{s}"
                self.q(db, "SELECT eventgrid.create_topic(%s)", (topic,))
                self.q(db, "SELECT eventgrid.create_event_subscription(%s, 'sink', %s)",
                       (topic, f"{self.b.args.sink}/{db}/{topic}"))
                self.q(db, "INSERT INTO eventgrid.events (topic, event) SELECT %s, jsonb_build_object('id', 'e-' || g, "
                       "'subject', '/bench/' || g, 'eventType', 'Bench.Event', 'eventTime', '2024-05-01T12:00:00Z', "
                       "'data', jsonb_build_object('n', g, 'pad', repeat('x', 800))) FROM generate_series(1, %s) g",
                       (topic, per_topic))
        self.b.q("CHECKPOINT")
        cpu0 = self.b.cluster_cpu()
        self.b.set_guc("eventgrid.delivery_paused", "off")
        t0 = time.time() - 0.3
        left = set(dbs)
        samples, peak_workers, peak_rss, peak_one = [], 0, 0, 0
        next_check = 0
        cpu_seen = dict(cpu0)      # workers come and go: each process's CPU as last seen
        while left:
            w = self.workers("bench_db_")
            samples.append(len(w))
            peak_workers = max(peak_workers, len(w))
            rss, one = self.rss_anon_kb([p for p, _ in w])
            peak_rss, peak_one = max(peak_rss, rss), max(peak_one, one)
            if time.time() >= next_check:
                cpu_seen.update(self.b.cluster_cpu())
                for db in list(left):
                    if self.b.drained(conn=self.conn(db)):
                        left.discard(db)
                next_check = time.time() + 0.2
            time.sleep(0.05)
        t1 = time.time()
        cpu_seen.update(self.b.cluster_cpu())
        delivered = failed = 0
        for db in dbs:
            d, f = self.q(db, "SELECT coalesce(sum(delivered), 0), coalesce(sum(failed_attempts + dead_lettered + dropped), 0) "
                          "FROM eventgrid.subscription_counters")[0]
            delivered, failed = delivered + d, failed + f
        total = per_topic * nsubs
        if delivered != total or failed:
            raise RuntimeError(f"{k} databases: {delivered} of {total} delivered, {failed} failures")
        cpu = sum(v - cpu0.get(pid, 0) for pid, v in cpu_seen.items())
        return {"rate": total / (t1 - t0), "peak_workers": peak_workers, "mean_workers": statistics.mean(samples),
                "rss_mb": peak_rss / 1024.0, "rss_one_mb": peak_one / 1024.0, "cpu_us": cpu * 1e6 / total, "total": total}

    # -- 16b --------------------------------------------------------------------
    def idle(self, n_dbs, seconds):
        arrivals = {}
        server = self.arrival_receiver(arrivals)
        url = f"http://127.0.0.1:{server.server_address[1]}"
        dbs = [f"bench_idle_{i:03d}" for i in range(n_dbs)]
        t_create = time.time()
        self.create(dbs)
        for db in dbs:
            self.q(db, "SELECT eventgrid.create_topic('idle'); "
                       "SELECT eventgrid.create_event_subscription('idle', 'first', %s)", (f"{url}/{db}",))
            self.close(db)
        created = time.time() - t_create
        self.wait_no_workers()
        settled = time.time() - t_create
        cpu0, t0 = self.b.cluster_cpu(), time.time()
        peak_workers, procs = 0, []
        while time.time() - t0 < seconds:
            peak_workers = max(peak_workers, len(self.workers()))
            procs.append(self.postmaster_children())
            time.sleep(1)
        cpu1, t1 = self.b.cluster_cpu(), time.time()
        cpu_per_min = sum(v - cpu0.get(pid, 0) for pid, v in cpu1.items()) * 60 / (t1 - t0)
        launcher = self.b.one("SELECT pid FROM pg_stat_activity WHERE backend_type = 'eventgrid launcher'")
        launcher_per_min = (cpu1.get(launcher, 0) - cpu0.get(launcher, 0)) * 60 / (t1 - t0)
        # the first event after idling, in every tenth database (connected beforehand)
        firsts = []
        for db in dbs[:: max(1, n_dbs // 10)]:
            self.conn(db)
            eid = f"first-{db}"
            self.q(db, "SELECT eventgrid.publish('idle', jsonb_build_object('id', %s, 'subject', '/idle', "
                       "'eventType', 'Bench.Idle', 'eventTime', '2024-05-01T12:00:00Z', 'data', '{}'::jsonb))", (eid,))
            committed = time.time()
            while eid not in arrivals and time.time() - committed < 30:
                time.sleep(0.002)
            firsts.append((arrivals.get(eid, float("inf")) - committed) * 1000)
            self.close(db)
        server.shutdown()
        return dbs, {"created_s": created, "settled_s": settled, "peak_workers": peak_workers,
                     "procs": max(procs), "cpu_s_per_min": cpu_per_min, "launcher_cpu_s_per_min": launcher_per_min,
                     "first_ms": sorted(firsts)}

    # -- 16c --------------------------------------------------------------------
    def trickle(self, db, arrivals, n, tag):
        commits = {}
        for i in range(n):
            eid = f"{tag}-{i}"
            self.q(db, "SELECT eventgrid.publish('trickle', jsonb_build_object('id', %s, 'subject', '/t', "
                       "'eventType', 'Bench.Trickle', 'eventTime', '2024-05-01T12:00:00Z', 'data', '{}'::jsonb))", (eid,))
            commits[eid] = time.time()
            time.sleep(0.1)
        deadline = time.time() + 60
        while any(e not in arrivals for e in commits) and time.time() < deadline:
            time.sleep(0.01)
        lat = sorted((arrivals.get(e, float("inf")) - t) * 1000 for e, t in commits.items())
        return lat

    def fairness(self, n):
        arrivals = {}
        server = self.arrival_receiver(arrivals)
        url = f"http://127.0.0.1:{server.server_address[1]}"
        bulk, small = "bench_db_00", "bench_db_01"
        self.create([bulk, small])
        for db in (bulk, small):
            for t in self.q(db, "SELECT name FROM eventgrid.topics"):
                self.q(db, "SELECT eventgrid.drop_topic(%s)", (t[0],))
        self.q(small, "SELECT eventgrid.create_topic('trickle'); "
                      "SELECT eventgrid.create_event_subscription('trickle', 'timed', %s)", (f"{url}/trickle",))
        self.q(bulk, "SELECT eventgrid.create_topic('bulk'); SELECT eventgrid.create_event_subscription('bulk', 'sink', %s, "
                     "max_events_per_batch => 5)", (f"{self.b.args.sink}/bulk",))
        self.trickle(small, arrivals, 1, "warm-up")     # its workers started, as they are while it publishes
        alone = self.trickle(small, arrivals, n, "alone")
        self.q(bulk, "SELECT eventgrid.pause_delivery('bulk', 'sink')")
        self.q(bulk, "INSERT INTO eventgrid.events (topic, event) SELECT 'bulk', jsonb_build_object('id', 'b-' || g, "
                     "'subject', '/b', 'eventType', 'Bench.Bulk', 'eventTime', '2024-05-01T12:00:00Z', "
                     "'data', jsonb_build_object('pad', repeat('x', 800))) FROM generate_series(1, 100000) g")
        self.q(bulk, "SELECT eventgrid.resume_delivery('bulk', 'sink')")
        beside = self.trickle(small, arrivals, n, "beside")
        left = self.q(bulk, "SELECT pending FROM eventgrid.delivery_statistics")[0][0]
        while not self.b.drained(conn=self.conn(bulk)):
            time.sleep(0.2)
        server.shutdown()
        return alone, beside, left

    # -- the figure -------------------------------------------------------------
    def run(self):
        b = self.b
        n_events = env_int("BENCH_DB_EVENTS", 320000)
        slots = b.one("SHOW max_worker_processes")
        old_timeout = b.one("SHOW eventgrid.worker_idle_timeout")
        busy_dbs = [f"bench_db_{i:02d}" for i in range(16)]
        base = None
        for k in (1, 4, 16):
            r = self.busy(k, n_events)
            base = base or r["rate"]
            b.report(f"databases_{k}_deliveries_per_s",
                     f"16 {k} busy database{'s' if k > 1 else ''}, {r['total']:,} deliveries, max_worker_processes {slots}",
                     r["rate"], "deliveries/s", ">= 80 % of 1 database" if k > 1 else None)
            if k > 1:
                b.report(f"databases_{k}_vs_1", "  ratio to 1 database", r["rate"] / base, "")
            b.report(f"databases_{k}_workers_peak", "  eventgrid workers running, peak", r["peak_workers"], "workers")
            b.report(f"databases_{k}_workers_mean", "  eventgrid workers running, mean", r["mean_workers"], "workers")
            b.report(f"databases_{k}_rss_anon_mb", "  their private memory together, peak (RssAnon)", r["rss_mb"], "MB")
            b.report(f"databases_{k}_rss_anon_one_mb", "  the largest worker's private memory, peak", r["rss_one_mb"], "MB")
            b.report(f"databases_{k}_cpu_us_per_delivery", "  CPU of all PostgreSQL processes per delivery", r["cpu_us"], "µs")

        n_trickle = env_int("BENCH_TRICKLE_EVENTS", 100)
        alone, beside, left = self.fairness(n_trickle)
        p95 = lambda lat: lat[min(len(lat) - 1, int(0.95 * len(lat)))]
        b.report("databases_trickle_alone_p95_ms", f"16 trickle of {n_trickle} events at 10/s, commit to arrival p95, alone",
                 p95(alone), "ms")
        b.report("databases_trickle_beside_p95_ms", "  beside a 100,000-event backlog in another database", p95(beside), "ms",
                 "<= 2x alone")
        b.report("databases_trickle_backlog_left", "  backlog left when the trickle ended", left, "deliveries")
        self.drop(busy_dbs)

        b.set_guc("eventgrid.worker_idle_timeout", "5s")
        b.wait_drained()
        dbs, r = self.idle(env_int("BENCH_IDLE_DATABASES", 100), env_int("BENCH_IDLE_SECONDS", 60))
        n = len(dbs)
        b.report("idle_databases_created_s", f"16 {n} idle databases with the extension: created in", r["created_s"], "s")
        b.report("idle_databases_settled_s", "  every worker gone after", r["settled_s"], "s")
        b.report("idle_databases_workers_peak", "  eventgrid workers running over the next minute, peak",
                 r["peak_workers"], "workers", "0")
        b.report("idle_databases_processes", "  processes of the cluster (postmaster's children)", r["procs"], "processes")
        b.report("idle_databases_cpu_s_per_min", "  CPU of all of them per minute", r["cpu_s_per_min"], "s")
        b.report("idle_databases_launcher_cpu_s_per_min", "  of which the eventgrid launcher", r["launcher_cpu_s_per_min"], "s")
        first = r["first_ms"]
        b.report("idle_databases_first_event_median_ms", f"  first event after idling, commit to arrival, median of {len(first)}",
                 statistics.median(first), "ms")
        b.report("idle_databases_first_event_max_ms", "  and the slowest", first[-1], "ms", "<= 1000")
        self.drop(dbs)
        b.set_guc("eventgrid.worker_idle_timeout", old_timeout)
