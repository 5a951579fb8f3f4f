"""Figure 18 of the eventgrid benchmark (bench.py runs it): delivery on a
separate server, fed by logical replication (README "Scaling out").

Two clusters of their own, made here (the bench's cluster is left alone):
an application cluster (wal_level = logical) and a delivery server, both
with eventgrid preloaded and eventgrid.delivery_workers = 1 (the machine
has 2 cores for both), on Unix sockets in the bench's work directory.  The
same events, the same nginx sink, two ways:

  local       the application cluster delivers them itself;
  replicated  the application cluster only publishes (a publication made
              with eventgrid.create_event_publication()); the delivery
              server subscribes and delivers.

18a. CPU of the application cluster's processes per published event (every
     process: the 4 publishing backends, eventgrid's workers, the walsender),
     and of the delivery server's, publishing BENCH_REPL_RATE (2,000)
     single-event transactions a second for BENCH_REPL_SECONDS (10) from 4
     connections and waiting until every event is delivered.
18b. commit to arrival at 1,000 events/s (a receiver in a process of its
     own, as figure 6): p50 and p99, local and replicated.
18c. throughput: BENCH_REPL_EVENTS (100,000) events published in
     transactions of 100 as fast as one connection can, from the first
     commit to the last delivery: events/s, local and replicated.
"""
import os
import subprocess
import time

import psycopg2


def env_int(name, default):
    return int(os.environ.get(name, default))


class Cluster:
    def __init__(self, work, name, port, extra, cluster_cpu, preload=True):
        self.cluster_cpu = cluster_cpu
        self.dir = os.path.join(work, name)
        self.port = port
        os.makedirs(self.dir, exist_ok=True)
        subprocess.run(["initdb", "-D", f"{self.dir}/data", "-A", "trust", "-U", "postgres"],
                       check=True, stdout=subprocess.DEVNULL)
        with open(f"{self.dir}/data/postgresql.conf", "a") as f:
            f.write(("shared_preload_libraries = 'eventgrid'\n" if preload else "") + f"port = {port}\nlisten_addresses = ''\n"
                    f"unix_socket_directories = '{self.dir}'\nshared_buffers = 512MB\nmax_wal_size = 4GB\n"
                    f"eventgrid.delivery_workers = 1\neventgrid.max_concurrent_requests = 64\n{extra}")
        subprocess.run(["pg_ctl", "-D", f"{self.dir}/data", "-l", f"{self.dir}/server.log", "-w", "start"],
                       check=True, stdout=subprocess.DEVNULL)
        self.conn = self.connect()
        if preload:
            self.q("CREATE EXTENSION eventgrid")

    def connect(self):
        c = psycopg2.connect(host=self.dir, port=self.port, user="postgres", dbname="postgres")
        c.autocommit = True
        return c

    def q(self, sql, params=None):
        with self.conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall() if cur.description else None

    def stop(self):
        self.conn.close()
        subprocess.run(["pg_ctl", "-D", f"{self.dir}/data", "-m", "immediate", "stop"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def cpu(self):
        """CPU seconds used so far by the postmaster and its children."""
        return sum(self.cluster_cpu(f"{self.dir}/data").values())

    def delivered(self):
        return self.q("SELECT coalesce(sum(delivered), 0) FROM eventgrid.delivery_statistics")[0][0]


class Replication:
    def __init__(self, bench, arrival_process, cluster_cpu, publish_at_rate):
        self.b = bench
        self.ArrivalProcess = arrival_process
        self.cluster_cpu = cluster_cpu
        self.publish_at_rate = publish_at_rate

    def setup(self, mode, endpoint):
        """An application cluster (and, replicated, a delivery server) with topic
        'orders' and one event subscription to endpoint on the delivering side."""
        work = self.b.args.work
        tag = f"{mode}-{int(time.time() * 1000) % 100000}"
        app = Cluster(work, f"app-{tag}", 55441, "wal_level = logical\n", self.cluster_cpu)
        app.q("SELECT eventgrid.create_topic('orders')")
        if mode == "local":
            app.q("SELECT eventgrid.create_event_subscription('orders', 'sink', %s)", (endpoint,))
            return app, app
        dlv = Cluster(work, f"delivery-{tag}", 55442, "", self.cluster_cpu)
        dlv.q("SELECT eventgrid.create_topic('orders')")
        dlv.q("SELECT eventgrid.create_event_subscription('orders', 'sink', %s)", (endpoint,))
        app.q("SELECT eventgrid.create_event_publication('bench')")
        dlv.q(f"CREATE SUBSCRIPTION bench CONNECTION 'host={app.dir} port={app.port} dbname=postgres user=postgres'"
              " PUBLICATION bench")
        deadline = time.time() + 30
        while time.time() < deadline and not dlv.q(
                "SELECT bool_and(srsubstate = 'r') FROM pg_subscription_rel")[0][0]:
            time.sleep(0.1)
        return app, dlv

    @staticmethod
    def teardown(app, dlv):
        if dlv is not app:
            dlv.stop()
        app.stop()

    @staticmethod
    def wait_delivered(dlv, n, timeout=600):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if dlv.delivered() >= n:
                return time.time()
            time.sleep(0.05)
        raise RuntimeError(f"not delivered within {timeout} s")

    def cpu_per_event(self, mode):
        rate, seconds = env_int("BENCH_REPL_RATE", 2000), env_int("BENCH_REPL_SECONDS", 10)
        app, dlv = self.setup(mode, self.b.args.sink)
        try:
            conns = [app.connect() for _ in range(4)]
            a0, d0 = app.cpu(), dlv.cpu()
            commits = self.publish_at_rate(conns, "orders", "cpu", rate, seconds)
            self.wait_delivered(dlv, len(commits))
            time.sleep(1)           # the last upkeep rounds
            n = len(commits)
            app_us = (app.cpu() - a0) / n * 1e6
            for c in conns:
                c.close()
            self.b.report(f"repl_{mode}_app_cpu_us", f"18a {mode}: application cluster CPU per event", app_us, "us")
            if dlv is not app:
                self.b.report(f"repl_{mode}_delivery_cpu_us", f"18a {mode}: delivery server CPU per event",
                              (dlv.cpu() - d0) / n * 1e6, "us")
            return app_us
        finally:
            self.teardown(app, dlv)

    def latency(self, mode):
        seconds = env_int("BENCH_LATENCY_SECONDS", 20)
        receiver = self.ArrivalProcess()
        app, dlv = self.setup(mode, f"http://127.0.0.1:{receiver.port}/latency")
        try:
            conns = [app.connect() for _ in range(4)]
            commits = self.publish_at_rate(conns, "orders", "lat", 1000, seconds)
            for c in conns:
                c.close()
            self.wait_delivered(dlv, len(commits))
            time.sleep(0.5)
            arrivals = receiver.arrivals()
            lat = sorted((arrivals[k] - v) * 1000 for k, v in commits.items() if k in arrivals)
            p = lambda xs, q: xs[min(len(xs) - 1, int(q * len(xs)))]
            self.b.report(f"repl_{mode}_latency_p50_ms", f"18b {mode}: commit to arrival p50", p(lat, 0.50), "ms")
            self.b.report(f"repl_{mode}_latency_p99_ms", f"18b {mode}: commit to arrival p99", p(lat, 0.99), "ms")
            return p(lat, 0.50), p(lat, 0.99)
        finally:
            self.teardown(app, dlv)

    def throughput(self, mode):
        n = env_int("BENCH_REPL_EVENTS", 100000)
        app, dlv = self.setup(mode, self.b.args.sink)
        try:
            start = time.time()
            for k in range(0, n, 100):
                app.q("INSERT INTO eventgrid.events (topic, event)"
                      " SELECT 'orders', jsonb_build_object('id', 'tp-' || g, 'subject', '/o', 'eventType', 'T',"
                      "        'eventTime', '2024-05-01T12:00:00Z', 'data', jsonb_build_object('n', g))"
                      "   FROM generate_series(%s, %s) g", (k, k + 99))
            published = time.time() - start
            end = self.wait_delivered(dlv, n)
            rate = n / (end - start)
            self.b.report(f"repl_{mode}_publish_s", f"18c {mode}: {n:,} events published in", published, "s")
            self.b.report(f"repl_{mode}_throughput", f"18c {mode}: first commit to last delivery", rate, "events/s")
            return rate
        finally:
            self.teardown(app, dlv)

    def run(self):
        cpu = {m: self.cpu_per_event(m) for m in ("local", "replicated")}
        self.b.report("repl_app_cpu_ratio", "18a application CPU per event, replicated / local",
                      cpu["replicated"] / cpu["local"], "x")
        lat = {m: self.latency(m) for m in ("local", "replicated")}
        self.b.report("repl_added_p50_ms", "18b added by the replication hop, p50", lat["replicated"][0] - lat["local"][0], "ms")
        self.b.report("repl_added_p99_ms", "18b added by the replication hop, p99", lat["replicated"][1] - lat["local"][1], "ms")
        tp = {m: self.throughput(m) for m in ("local", "replicated")}
        self.b.report("repl_throughput_ratio", "18c throughput, replicated / local", tp["replicated"] / tp["local"], "x")
