"""Figure 17 of the eventgrid benchmark (bench.py runs it): the cost of a scrape.

Debian's prometheus-postgres-exporter, started as monitoring/README.md says
(monitoring/postgres_exporter.yml, a role with only pg_monitor, the
default collectors too), is scraped BENCH_SCRAPES (20) times, one after
the other, at 10, 100 and 1,000 event subscriptions (BENCH_SCRAPE_SUBSCRIPTIONS),
each with counters and histograms that have rows (every subscription got
10 deliveries, to the nginx sink) and 100 events waiting for a paused one
(so the backlog counts have work).  Reports the time per scrape (the
exporter's answer to GET /metrics), the CPU a scrape costs PostgreSQL (all
its processes, those that exited included: the exporter's connections come
and go; the workers are idle meanwhile) and the exporter itself, and what that
CPU comes to at one scrape every 15 s, as a share of one core.
"""
import os
import socket
import subprocess
import statistics
import time
import urllib.request

EXPORTER = "/usr/bin/prometheus-postgres-exporter"


def env_int(name, default):
    return int(os.environ.get(name, default))


def proc_cpu(pid, children=False):
    """CPU seconds (user + system) a process has used (children: those of its children it reaped)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    first = 13 if children else 11
    return (int(fields[first]) + int(fields[first + 1])) / os.sysconf("SC_CLK_TCK")


class Monitoring:
    def __init__(self, bench):
        self.b = bench

    def setup(self, n):
        b = self.b
        for t in b.q("SELECT name FROM eventgrid.topics"):
            b.q("SELECT eventgrid.drop_topic(%s)", (t[0],))
        b.q("SELECT eventgrid.create_topic('scrape')")
        b.q("SELECT eventgrid.create_event_subscription('scrape', 'sub-' || g, %s || '/scrape/' || g) "
            "FROM generate_series(1, %s) g", (b.args.sink, n))
        b.q("INSERT INTO eventgrid.events (topic, event) SELECT 'scrape', jsonb_build_object('id', 's-' || g, "
            "'subject', '/s', 'eventType', 'Bench.Scrape', 'eventTime', '2024-05-01T12:00:00Z', 'data', '{}'::jsonb) "
            "FROM generate_series(1, 10) g")
        b.wait_drained()
        b.q("SELECT eventgrid.create_topic('scrape-held')")
        b.q("SELECT eventgrid.create_event_subscription('scrape-held', 'held', %s)", (b.args.sink + "/held",))
        b.q("SELECT eventgrid.pause_delivery('scrape-held', 'held')")
        b.q("INSERT INTO eventgrid.events (topic, event) SELECT 'scrape-held', jsonb_build_object('id', 'h-' || g, "
            "'subject', '/s', 'eventType', 'Bench.Scrape', 'eventTime', '2024-05-01T12:00:00Z', 'data', '{}'::jsonb) "
            "FROM generate_series(1, 100) g")
        b.q("ANALYZE")

    def cluster_cpu(self):
        """CPU seconds of the cluster so far: its processes alive now, and those that exited
        (the exporter's connections come and go), which the postmaster reaped."""
        with open(os.path.join(self.b.args.data_dir, "postmaster.pid")) as f:
            postmaster = int(f.readline())
        return sum(self.b.cluster_cpu().values()) + proc_cpu(postmaster, children=True)

    def scrape(self, url):
        t0 = time.time()
        with urllib.request.urlopen(url, timeout=60) as r:
            body = r.read().decode()
        return time.time() - t0, body

    def run(self):
        b = self.b
        b.q("DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'eventgrid_exporter') THEN "
            "CREATE ROLE eventgrid_exporter LOGIN IN ROLE pg_monitor; END IF; END $$")
        with socket.socket() as sock:           # a free port
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        env = dict(os.environ, DATA_SOURCE_NAME=f"host={b.args.host} port={b.args.port} user=eventgrid_exporter "
                                                 f"dbname=postgres sslmode=disable")
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        log = os.path.join(b.args.work, "exporter.log")
        exporter = subprocess.Popen([EXPORTER, f"--web.listen-address=127.0.0.1:{port}",
                                     f"--extend.query-path={root}/monitoring/postgres_exporter.yml",
                                     "--auto-discover-databases", "--include-databases=postgres"],
                                    env=env, stdout=subprocess.DEVNULL, stderr=open(log, "w"))
        url = f"http://127.0.0.1:{port}/metrics"
        n_scrapes = env_int("BENCH_SCRAPES", 20)
        try:
            for _ in range(100):
                try:
                    self.scrape(url)
                    break
                except OSError:
                    time.sleep(0.1)
            sizes = [int(s) for s in os.environ.get("BENCH_SCRAPE_SUBSCRIPTIONS", "10,100,1000").split(",")]
            for n in sizes:
                self.setup(n)
                _, body = self.scrape(url)        # warm: the exporter's connection and its plans
                series = sum(1 for line in body.splitlines() if line.startswith("eventgrid_"))
                if "pg_exporter_last_scrape_error 0" not in body or series == 0:
                    with open(log) as f:
                        raise RuntimeError("the exporter's scrape failed: " + f.read()[-2000:])
                walls = []
                cpu_pg0, cpu_ex0 = self.cluster_cpu(), proc_cpu(exporter.pid)
                for _ in range(n_scrapes):
                    wall, _ = self.scrape(url)
                    walls.append(wall)
                cpu_pg = (self.cluster_cpu() - cpu_pg0) / n_scrapes
                cpu_ex = (proc_cpu(exporter.pid) - cpu_ex0) / n_scrapes
                b.report(f"scrape_{n}_ms", f"17 scrape at {n:,} event subscriptions ({series:,} eventgrid series), median",
                         statistics.median(walls) * 1000, "ms")
                b.report(f"scrape_{n}_pg_cpu_ms", "  CPU of PostgreSQL per scrape (its connections, all processes)", cpu_pg * 1000, "ms")
                b.report(f"scrape_{n}_exporter_cpu_ms", "  CPU of the exporter per scrape", cpu_ex * 1000, "ms")
                b.report(f"scrape_{n}_core_percent", "  both, one scrape every 15 s, share of one core",
                         (cpu_pg + cpu_ex) / 15 * 100, "%", "< 1" if n == 1000 else None)
        finally:
            exporter.terminate()
            exporter.wait()
            for t in b.q("SELECT name FROM eventgrid.topics WHERE name LIKE 'scrape%'"):
                b.q("SELECT eventgrid.drop_topic(%s)", (t[0],))
