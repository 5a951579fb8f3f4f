#!/usr/bin/python3
"""eventgrid benchmark driver (started by bench/run.sh).

Measures, in one run against one cluster and one nginx sink on 127.0.0.1:
 1. HTTP limit: wrk POSTing a ~1 KB event body with the worker's connection count
 2. single-event delivery: drain of a published backlog, events/s, and ratio to 1
 3. batched delivery (max_events_per_batch = 100), events/s
 4. fan-out: 10 subscriptions on one topic, deliveries/s
 5. publish cost: INSERT through eventgrid.events vs a plain jsonb table
 6. end-to-end latency at a steady rate: commit to arrival, p50/p99/max, after
    a first second at the same rate (its maximum reported apart)
 7. worker memory while draining a large backlog
 8. table sizes and throughput around a steady run, plainly and while a
    REPEATABLE READ transaction stays open
 10. fan-out with advanced filters: figure 4 again with 5 advanced filters on
    each of the 10 subscriptions (every event passes them, so the deliveries
    are the same and the difference is the cost of the filters)
 12. HTTPS: wrk over TLS (HTTP/1.1) to the same nginx, then single-event
    and batched(100) delivery over TLS 1.3 to an HTTP/1.1 and an HTTP/2
    server, and to an HTTP/1.1 server that demands a client certificate
    (mutual TLS: set_client_certificate), with the full and resumed TLS
    handshakes per 10,000 deliveries (BENCH_TLS_EVENTS, default 100000)
 13. table changes: INSERT ... SELECT of 100,000 rows (BENCH_TABLE_ROWS) into
    a table that publishes its changes, into the same table without a
    publication and with PgQ's pgq.logutriga trigger; COPY of 1,000,000
    rows (BENCH_TABLE_COPY_ROWS) into each; single-row INSERTs with pgbench,
    three rounds of 10 s (BENCH_TABLE_SECONDS / 2) into each; and the
    delivery rate of the events published
 14. signing: single-event and batched(100) delivery with Standard Webhooks
    signatures and without, alternately twice, and the workers' CPU per
    delivery that signing adds
 15. rate limits: a subscription with max_events_per_second 10, 100, 1,000
    and 10,000 drains a backlog to the nginx sink; the rate measured from
    the attempt history over BENCH_RATE_SECONDS (5) after the first second
 11. attempt history: single-event delivery with eventgrid.attempt_history
    off and all, alternately twice, and the drop in events/s it costs
 16. several databases (bench/databases.py): 1, 4 and 16 busy databases
    doing the same work, a trickle beside a backlog in another database,
    and 100 idle databases (their workers, processes, CPU per minute, and
    the first event after idling)
 17. monitoring (bench/monitoring.py): the cost of a Prometheus scrape
    through prometheus-postgres-exporter at 10, 100 and 1,000 event
    subscriptions
 18. delivery on a separate server over logical replication
    (bench/replication.py): the application cluster's CPU per published
    event with local delivery and with delivery on a second cluster, the
    commit-to-arrival latency the replication hop adds, and the throughput
    of a delivery server fed by replication against local delivery
 21. pull delivery (bench/pull.py): receive + acknowledge of 100 events per
    call by 8 consumers against a plain SKIP LOCKED queue table read as pgmq
    reads and, when BENCH_PGMQ_SQL names its install script, pgmq itself
    (read + delete), and commit-to-receive latency for a waiting consumer
 25. WAL sources (bench/wal_sources.py): an application's server with no
    eventgrid read by a WAL source: its bulk INSERT into a published table
    against an unpublished one (and in-database table changes beside),
    source commit to committed here in changes/s, and source commit to
    webhook arrival at 1,000 changes/s
 9. isolation: a healthy subscription's latency beside 500 subscriptions to a
    port where nothing listens and 200 to an endpoint that accepts and never
    answers (30 s response timeout), and the worker's peak descriptors and
    memory (BENCH_ISOLATION_RATE events/s, default 10, for
    BENCH_ISOLATION_SECONDS, default 30)
Figures 2-4 also report, per delivery, the CPU time of all PostgreSQL
processes (the worker with its HTTP thread, WAL writer, checkpointer, and
the benchmark's own polling session) and of the worker alone, and the WAL
written.
Prints each figure as it is measured, a summary table, and last one line
"BENCH_RESULT {json}".  No figure is asserted; this only measures.
"""
import argparse
import io
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg2
import psycopg2.errors

from databases import Databases
from monitoring import Monitoring
from replication import Replication
from pull import Pull
from http_publish import HttpPublish
from wal_sources import WalSources

EVENT_BYTES = 1000  # approximate size of one published event


def env_int(name, default):
    return int(os.environ.get(name, default))


def arrival_receiver(arrivals, key="id"):
    """A receiver on 127.0.0.1 (any free port) that notes when each event id (or another member, key) first arrives."""
    lock = threading.Lock()

    class Receiver(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_POST(self):
            now = time.time()
            body = self.rfile.read(int(self.headers["Content-Length"]))
            with lock:
                for e in json.loads(body):
                    arrivals.setdefault(e[key], now)
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 1024

    server = Server(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def token_endpoint(lifetime_s, counter, token_bytes=1000):
    """An OAuth 2.0 token endpoint on 127.0.0.1 (any free port, plain HTTP) that answers every
    client-credentials request with a new opaque token good for lifetime_s, counting requests
    in counter["requests"] (figure 19: the cost on eventgrid's side, not a token server's)."""
    lock = threading.Lock()

    class Endpoint(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            with lock:
                counter["requests"] += 1
                n = counter["requests"]
            token = f"bench-token-{n}-"
            body = json.dumps({"access_token": token + "x" * max(token_bytes - len(token), 0), "token_type": "Bearer",
                               "expires_in": lifetime_s}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Endpoint)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class ArrivalProcess:
    """arrival_receiver in a process of its own, so that the publisher's threads in
    this one never delay its clock readings (the GIL); arrivals() collects them."""

    def __init__(self, key="id"):
        import multiprocessing
        self._parent, child = multiprocessing.Pipe()
        self._proc = multiprocessing.Process(target=ArrivalProcess._serve, args=(child, key), daemon=True)
        self._proc.start()
        self.port = self._parent.recv()

    @staticmethod
    def _serve(conn, key):
        arrivals = {}
        server = arrival_receiver(arrivals, key)
        conn.send(server.server_address[1])
        conn.recv()                  # asked for the arrivals
        server.shutdown()
        conn.send(dict(arrivals))

    def arrivals(self):
        self._parent.send("done")
        got = self._parent.recv()
        self._proc.join()
        return got


def publish_at_rate(conns, topic, prefix, rate, seconds, after_each=None):
    """Publishes rate events/s for seconds, one per transaction, ids prefix-0, prefix-1, ...;
    returns each id's commit time.  The events are dealt round-robin to the connections conns
    (one thread each), so that one commit's WAL flush (about a millisecond here) does not hold
    back the next event's; after_each() runs after each commit (one connection only)."""
    commits = {}
    start = time.time()
    threads = len(conns)

    def run(k):
        with conns[k].cursor() as cur:
            for i in range(k, rate * seconds, threads):
                delay = start + i / rate - time.time()
                if delay > 0:
                    time.sleep(delay)
                eid = f"{prefix}-{i}"
                cur.execute("INSERT INTO eventgrid.events (topic, event) VALUES (%s, "
                            "jsonb_build_object('id', %s, 'subject', '/' || %s, 'eventType', 'T', "
                            "'eventTime', '2024-05-01T12:00:00Z', 'data', jsonb_build_object('pad', repeat('x', 800))))",
                            (topic, eid, prefix))
                commits[eid] = time.time()
                if after_each:
                    after_each()

    if threads == 1:
        run(0)
        return commits
    ts = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return commits


def cluster_cpu(data_dir):
    """CPU seconds used so far by the postmaster of data_dir and each of its children, by pid."""
    with open(os.path.join(data_dir, "postmaster.pid")) as f:
        postmaster = int(f.readline())
    tick = os.sysconf("SC_CLK_TCK")
    usage = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(entry), int(fields[1])
        if pid == postmaster or ppid == postmaster:
            usage[pid] = (int(fields[11]) + int(fields[12])) / tick
    return usage


class Bench:
    def __init__(self, args):
        self.args = args
        self.conn = self.connect()
        self.results = {}
        self.rows = []

    def connect(self):
        conn = psycopg2.connect(host=self.args.host, port=self.args.port, user="postgres", dbname="postgres")
        conn.autocommit = True
        return conn

    def q(self, sql, params=None, conn=None):
        with (conn or self.conn).cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall() if cur.description else None

    def one(self, sql, params=None, conn=None):
        return self.q(sql, params, conn)[0][0]

    def set_guc(self, name, value):
        self.q(f"ALTER SYSTEM SET {name} = '{value}'")
        self.q("SELECT pg_reload_conf()")
        time.sleep(0.3)

    def report(self, key, label, value, unit, target=None):
        self.results[key] = value
        shown = f"{value:,.1f}" if isinstance(value, float) else f"{value:,}"
        line = f"{label:<58} {shown:>14} {unit:<12}" + (f" target {target}" if target else "")
        self.rows.append(line)
        print(line, flush=True)

    def drained(self, conn=None):
        """Nothing pending (in the database of conn, default postgres): no retry, no chunk in flight, no event past a position."""
        return self.one("SELECT NOT EXISTS (SELECT 1 FROM eventgrid.retries) AND NOT EXISTS (SELECT 1 FROM eventgrid.chunks_in_flight) "
                    "AND NOT EXISTS (SELECT 1 FROM eventgrid.subscription_positions p "
                    "JOIN eventgrid.event_subscriptions s ON s.id = p.subscription_id "
                    "JOIN eventgrid.events e ON e.topic = s.topic AND e.txid >= pg_snapshot_xmin(p.done) "
                    "WHERE NOT pg_visible_in_snapshot(e.txid, p.done))", conn=conn)

    def wait_drained(self, timeout=7200):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.drained():
                return time.time()
            time.sleep(0.02)
        raise RuntimeError("deliveries did not drain")

    def cluster_cpu(self):
        """CPU seconds used so far by the postmaster and each of its children, by pid."""
        return cluster_cpu(self.args.data_dir)

    def worker_pids(self):
        """The delivery workers' pids (eventgrid.delivery_workers of them)."""
        return [r[0] for r in self.q("SELECT pid FROM pg_stat_activity WHERE backend_type = 'eventgrid delivery worker'")]

    def reset_queue(self):
        # The delivery workers may hold these tables in their own order (a
        # claim reads the events and writes chunks_in_flight): a deadlock
        # between them and this TRUNCATE is resolved by cancelling one side,
        # and when it is this one it tries again.
        for attempt in range(10):
            try:
                self.q("TRUNCATE eventgrid.events_0, eventgrid.events_1, eventgrid.events_2, "
                       "eventgrid.retries, eventgrid.chunks_in_flight")
                break
            except psycopg2.errors.DeadlockDetected:
                if attempt == 9:
                    raise
                time.sleep(0.2)
        for t in self.q("SELECT name FROM eventgrid.topics"):
            self.q("SELECT eventgrid.drop_topic(%s)", (t[0],))
        self.q("VACUUM ANALYZE eventgrid.retries, eventgrid.events")

    def publish_backlog(self, topic, n, src="bench_src"):
        """Publishes n ~1 KB events (of table src) in transactions of at most 100,000."""
        done = 0
        while done < n:
            k = min(100000, n - done)
            self.q(f"INSERT INTO eventgrid.events (topic, event) SELECT %s, event FROM {src} "
                   "CROSS JOIN generate_series(1, %s) LIMIT %s", (topic, (k + self.src_n - 1) // self.src_n, k))
            done += k

    def publish_at_rate(self, topic, prefix, rate, seconds, after_each=None, threads=1):
        """publish_at_rate() from threads connections of this cluster, closed after."""
        conns = [self.connect() for _ in range(threads)]
        try:
            return publish_at_rate(conns, topic, prefix, rate, seconds, after_each)
        finally:
            for c in conns:
                c.close()

    # -- set-up ---------------------------------------------------------------
    def setup(self):
        self.src_n = 100000
        self.q("CREATE EXTENSION IF NOT EXISTS eventgrid")
        self.q("DROP TABLE IF EXISTS bench_src")
        self.q("""CREATE TABLE bench_src AS
                  SELECT jsonb_build_object('id', 'evt-' || i, 'subject', '/bench/orders/' || i,
                         'eventType', 'Bench.OrderCreated', 'eventTime', '2024-05-01T12:00:00Z',
                         'data', jsonb_build_object('orderId', i, 'pad', repeat('x', 780))) AS event
                    FROM generate_series(1, %s) i""", (self.src_n,))
        size = self.one("SELECT avg(octet_length(event::text))::int FROM bench_src")
        self.event_size = size
        print(f"# events of {size} bytes; {self.args.host}:{self.args.port}; sink {self.args.sink}", flush=True)

    # -- 1 ----------------------------------------------------------------------
    def fig_http(self):
        body = json.dumps([json.loads(self.one("SELECT event::text FROM bench_src LIMIT 1"))])
        script = os.path.join(self.args.work, "post.lua")
        with open(script, "w") as f:
            f.write('wrk.method = "POST"\nwrk.body = %s\nwrk.headers["Content-Type"] = "application/json"\n'
                    % json.dumps(body))
        conns = self.one("SELECT current_setting('eventgrid.max_concurrent_requests')::int")
        out = subprocess.run(["wrk", "-t2", f"-c{conns}", "-d10s", "-s", script, self.args.sink + "/wrk"],
                             capture_output=True, text=True, check=True).stdout
        rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
        self.report("http_limit_rps", f"1 HTTP limit (wrk, {conns} connections, ~1 KB POST)", rps, "requests/s")

    # -- 2, 3, 4 -------------------------------------------------------------------
    def drain(self, topic, nsubs, n_events, batch=None, filters=None, sink=None, signed=False, client_cert=False,
              token_url=None, ordering_key=None, src="bench_src", stuck=0):
        """Drains n_events published while paused through nsubs subscriptions; returns deliveries
        a second and costs per delivery.  With stuck, that many deliveries (those whose event has
        "fail": true and what waits behind them) are not waited for, and failures are allowed."""
        sink = sink or self.args.sink
        self.reset_queue()
        self.q("SELECT eventgrid.create_topic(%s)", (topic,))
        for i in range(nsubs):
            self.q("SELECT eventgrid.create_event_subscription(%s, %s, %s, max_events_per_batch => %s, "
                   "advanced_filters => %s, ordering_key => %s)",
                   (topic, f"sub-{i}", f"{sink}/{topic}/{i}", batch,
                    json.dumps(filters) if filters else None, ordering_key))
            if stuck:
                # the sink answers 500 to a request with X-Fail: true
                self.q("SELECT eventgrid.set_dynamic_delivery_property(%s, %s, 'X-Fail', 'data.fail')", (topic, f"sub-{i}"))
            if signed:
                self.q("SELECT eventgrid.set_signing_secret(%s, %s)", (topic, f"sub-{i}"))
            if client_cert:
                with open(self.args.client_cert) as c, open(self.args.client_key) as k:
                    self.q("SELECT eventgrid.set_client_certificate(%s, %s, %s, %s)",
                           (topic, f"sub-{i}", c.read(), k.read()))
            if token_url:
                self.q("SELECT eventgrid.set_oauth2_authentication(%s, %s, %s, 'bench', 'bench-secret')",
                       (topic, f"sub-{i}", token_url))
        self.set_guc("eventgrid.delivery_paused", "on")
        self.publish_backlog(topic, n_events, src)
        self.q("CHECKPOINT")
        workers = self.worker_pids()
        cpu0, lsn0 = self.cluster_cpu(), self.one("SELECT pg_current_wal_lsn()")
        self.set_guc("eventgrid.delivery_paused", "off")
        t0 = time.time() - 0.3  # set_guc waited 0.3 s after the reload
        deliveries = n_events * nsubs - stuck
        count = ("SELECT coalesce(sum(c.delivered), 0), coalesce(sum(c.failed_attempts + c.dead_lettered + c.dropped), 0) "
                 "FROM eventgrid.event_subscriptions s JOIN eventgrid.subscription_counters c ON c.subscription_id = s.id "
                 "WHERE s.topic = %s")
        if stuck:
            while self.q(count, (topic,))[0][0] < deliveries:
                time.sleep(0.02)
            t1 = time.time()
        else:
            t1 = self.wait_drained()
        cpu1 = self.cluster_cpu()
        wal = self.one("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (lsn0,))
        # a figure counts only deliveries the sink accepted at the first attempt
        delivered, failed = self.q(count, (topic,))[0]
        if delivered != deliveries or (failed != 0 and not stuck):
            raise RuntimeError(f"{topic}: {delivered} of {deliveries} deliveries accepted, {failed} failures")
        all_cpu = sum(v - cpu0.get(pid, 0) for pid, v in cpu1.items())
        worker_cpu = sum(cpu1.get(w, 0) - cpu0.get(w, 0) for w in workers)
        return deliveries / (t1 - t0), {"cpu": all_cpu * 1e6 / deliveries,
                                        "worker": worker_cpu * 1e6 / deliveries,
                                        "wal": float(wal) / deliveries}

    def report_costs(self, key, costs):
        self.report(f"{key}_cpu_us_per_delivery", "  CPU of all PostgreSQL processes per delivery", costs["cpu"], "µs")
        self.report(f"{key}_worker_cpu_us_per_delivery", "  of which the delivery workers (with their HTTP threads)",
                    costs["worker"], "µs")
        self.report(f"{key}_wal_bytes_per_delivery", "  WAL written per delivery (after a CHECKPOINT)",
                    costs["wal"], "bytes")

    def fig_drains(self):
        n = env_int("BENCH_EVENTS", 200000)
        rate, costs = self.drain("single", 1, n)
        self.report("single_events_per_s", f"2 single-event delivery ({n:,} events)", rate, "events/s", ">= 30,000")
        self.report("single_vs_http_limit", "  ratio to the HTTP limit", rate / self.results["http_limit_rps"], "")
        self.report_costs("single", costs)
        rate, costs = self.drain("batched", 1, n, batch=100)
        self.report("batched_events_per_s", f"3 batched delivery (max_events_per_batch 100)", rate, "events/s",
                    ">= 100,000")
        self.report_costs("batched", costs)
        rate, costs = self.drain("fanout", 10, n // 10)
        self.report("fanout_deliveries_per_s", f"4 fan-out (10 subscriptions, {n // 10:,} events)", rate,
                    "deliveries/s", ">= 50,000")
        self.report_costs("fanout", costs)

    # -- 12 ---------------------------------------------------------------------
    def tls_handshakes(self, port):
        """(full, resumed) TLS handshakes nginx logged so far on port (one line per connection)."""
        full = resumed = 0
        with open(self.args.tls_log) as f:
            for line in f:
                p, reused, _ = line.split(" ", 2)
                if p == str(port):
                    resumed += reused == "r"
                    full += reused != "r"
        return full, resumed

    def fig_tls(self):
        n = env_int("BENCH_TLS_EVENTS", 100000)
        body = json.dumps([json.loads(self.one("SELECT event::text FROM bench_src LIMIT 1"))])
        script = os.path.join(self.args.work, "post.lua")
        with open(script, "w") as f:
            f.write('wrk.method = "POST"\nwrk.body = %s\nwrk.headers["Content-Type"] = "application/json"\n'
                    % json.dumps(body))
        conns = self.one("SELECT current_setting('eventgrid.max_concurrent_requests')::int")
        out = subprocess.run(["wrk", "-t2", f"-c{conns}", "-d10s", "-s", script, self.args.tls_sink + "/wrk"],
                             capture_output=True, text=True, check=True).stdout
        limit = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
        self.report("tls_http_limit_rps", f"12 HTTPS limit (wrk over TLS 1.3, HTTP/1.1, {conns} connections)",
                    limit, "requests/s")
        for label, sink in (("tls", self.args.tls_sink), ("h2", self.args.h2_sink), ("mtls", self.args.mtls_sink)):
            port = int(sink.rsplit(":", 1)[1])
            proto = {"h2": "HTTP/2", "tls": "HTTP/1.1", "mtls": "HTTP/1.1, client certificate"}[label]
            mtls = label == "mtls"
            full0, resumed0 = self.tls_handshakes(port)
            rate, costs = self.drain(f"{label}-single", 1, n, sink=sink, client_cert=mtls)
            full1, resumed1 = self.tls_handshakes(port)
            self.report(f"{label}_single_events_per_s", f"  single-event over TLS, {proto} ({n:,} events)", rate,
                        "events/s")
            self.report(f"{label}_single_vs_tls_limit", "    ratio to the HTTPS limit", rate / limit, "", ">= 0.33")
            self.report(f"{label}_single_worker_cpu_us_per_delivery", "    delivery workers' CPU per delivery",
                        costs["worker"], "µs")
            self.report(f"{label}_full_handshakes_per_10k", "    full TLS handshakes per 10,000 deliveries",
                        (full1 - full0) * 10000 / n, "", "<= connections")
            self.report(f"{label}_resumed_handshakes_per_10k", "    resumed TLS handshakes per 10,000 deliveries",
                        (resumed1 - resumed0) * 10000 / n, "")
            rate, costs = self.drain(f"{label}-batched", 1, n, batch=100, sink=sink, client_cert=mtls)
            self.report(f"{label}_batched_events_per_s", f"  batched(100) over TLS, {proto}", rate, "events/s")
            self.report(f"{label}_batched_vs_tls_limit", "    ratio to the HTTPS limit", rate / limit, "", ">= 1.5")

    # -- 10 ---------------------------------------------------------------------
    def fig_filtered_fanout(self):
        n = env_int("BENCH_EVENTS", 200000)
        filters = [
            {"operatorType": "NumberGreaterThan", "key": "data.orderId", "value": 0},
            {"operatorType": "NumberInRange", "key": "data.orderId", "values": [[0, 1e9]]},
            {"operatorType": "StringBeginsWith", "key": "subject", "values": ["/BENCH/", "/other/"]},
            {"operatorType": "StringIn", "key": "eventType", "values": ["bench.ordercreated", "Bench.OrderShipped"]},
            {"operatorType": "IsNotNull", "key": "data.pad"},
        ]
        rate, costs = self.drain("fanout", 10, n // 10)
        self.report("fanout_unfiltered_deliveries_per_s", f"10 fan-out without filters (10 subscriptions, {n // 10:,} events)",
                    rate, "deliveries/s")
        self.report_costs("fanout_unfiltered", costs)
        rate, costs = self.drain("filtered", 10, n // 10, filters=filters)
        self.report("fanout_filtered_deliveries_per_s", "  the same with 5 advanced filters per subscription", rate,
                    "deliveries/s")
        self.report_costs("fanout_filtered", costs)

    # -- 11 ---------------------------------------------------------------------
    def fig_history(self):
        n = env_int("BENCH_EVENTS", 200000)
        rates = {"off": [], "all": []}
        for mode in ("off", "all", "off", "all"):
            self.set_guc("eventgrid.attempt_history", mode)
            rate, costs = self.drain("history", 1, n)
            rates[mode].append((rate, costs))
        self.set_guc("eventgrid.attempt_history", "all")
        for mode in ("off", "all"):
            rate = statistics.mean(r for r, _ in rates[mode])
            worker = statistics.mean(c["worker"] for _, c in rates[mode])
            wal = statistics.mean(c["wal"] for _, c in rates[mode])
            label = (f"11 single-event delivery, attempt history {mode} ({n:,} events, mean of 2)"
                     if mode == "off" else f"  the same with attempt history {mode}")
            self.report(f"history_{mode}_events_per_s", label, rate, "events/s")
            self.report(f"history_{mode}_worker_cpu_us_per_delivery", "  delivery worker CPU per delivery", worker, "µs")
            self.report(f"history_{mode}_wal_bytes_per_delivery", "  WAL written per delivery", wal, "bytes")
        self.report("history_cost_percent", "  drop in events/s with the full history",
                    100.0 * (1 - self.results["history_all_events_per_s"] / self.results["history_off_events_per_s"]),
                    "%", "<= 10 %")

    # -- 5 ----------------------------------------------------------------------
    def fig_publish_cost(self):
        n = env_int("BENCH_EVENTS", 200000)
        n = min(n, self.src_n)
        self.reset_queue()
        self.set_guc("eventgrid.delivery_paused", "on")
        self.q("SELECT eventgrid.create_topic('cost')")
        self.q("SELECT eventgrid.create_event_subscription('cost', 'one', %s)", (self.args.sink + "/cost",))
        self.q("DROP TABLE IF EXISTS plain_events")
        self.q("CREATE TABLE plain_events (id bigserial PRIMARY KEY, topic text NOT NULL, event jsonb NOT NULL, "
               "publish_time timestamptz NOT NULL DEFAULT now())")
        bulk_eg, bulk_plain, row_eg, row_plain = [], [], [], []
        single = min(n, 10000)
        for _ in range(3):
            self.q("TRUNCATE plain_events")
            self.q("TRUNCATE eventgrid.events_0, eventgrid.events_1, eventgrid.events_2, "
               "eventgrid.retries, eventgrid.chunks_in_flight")
            self.q("CHECKPOINT")
            t = time.time()
            self.q("INSERT INTO plain_events (topic, event) SELECT 'cost', event FROM bench_src LIMIT %s", (n,))
            bulk_plain.append(time.time() - t)
            t = time.time()
            self.q("INSERT INTO eventgrid.events (topic, event) SELECT 'cost', event FROM bench_src LIMIT %s", (n,))
            bulk_eg.append(time.time() - t)
            events = [r[0] for r in self.q("SELECT event::text FROM bench_src LIMIT %s", (single,))]
            for table, acc in (("plain_events", row_plain), ("eventgrid.events", row_eg)):
                with self.conn.cursor() as cur:
                    t = time.time()
                    for e in events:
                        cur.execute(f"INSERT INTO {table} (topic, event) VALUES ('cost', %s)", (e,))
                    acc.append(time.time() - t)
        self.q("TRUNCATE eventgrid.events_0, eventgrid.events_1, eventgrid.events_2, "
               "eventgrid.retries, eventgrid.chunks_in_flight")
        self.set_guc("eventgrid.delivery_paused", "off")
        b_eg, b_plain = statistics.median(bulk_eg), statistics.median(bulk_plain)
        r_eg, r_plain = statistics.median(row_eg), statistics.median(row_plain)
        self.report("publish_bulk_events_per_s", f"5 publish, one INSERT of {n:,} events", n / b_eg, "events/s")
        self.report("plain_bulk_rows_per_s", f"  plain jsonb table, same INSERT", n / b_plain, "rows/s")
        self.report("publish_cost_ratio_bulk", "  publish cost ratio (bulk)", b_eg / b_plain, "x", "<= 1.5")
        self.report("publish_cost_ratio_single_row", f"  publish cost ratio ({single:,} one-row transactions)",
                    r_eg / r_plain, "x", "<= 2.0")

    # -- 13 ---------------------------------------------------------------------
    def fig_table_changes(self):
        """Table changes published as events, beside the same statements on a
        table without a publication and on one with PgQ's logutriga."""
        n = env_int("BENCH_TABLE_ROWS", 100000)
        seconds = env_int("BENCH_TABLE_SECONDS", 20)
        self.reset_queue()
        self.set_guc("eventgrid.delivery_paused", "on")
        self.q("SELECT eventgrid.create_topic('changes')")
        self.q("SELECT eventgrid.create_event_subscription('changes', 'sink', %s)", (self.args.sink + "/changes",))
        self.q("CREATE EXTENSION IF NOT EXISTS pgq")
        self.q("SELECT pgq.create_queue('changes') WHERE NOT EXISTS (SELECT 1 FROM pgq.queue WHERE queue_name = 'changes')")
        for t in ("tc_plain", "tc_published", "tc_pgq"):
            self.q(f"DROP TABLE IF EXISTS {t}")
            self.q(f"CREATE TABLE {t} (id int PRIMARY KEY, qty int, price int, sku text, note text)")
        self.q("SELECT eventgrid.publish_table_changes('tc_published', 'changes', operations => ARRAY['INSERT'])")
        self.q("CREATE TRIGGER tc_pgq AFTER INSERT ON tc_pgq FOR EACH ROW EXECUTE FUNCTION pgq.logutriga('changes')")
        tables = ("tc_plain", "tc_published", "tc_pgq")

        def interleaved(load):
            """Medians of three rounds of load(table) on each table in turn, from empty tables."""
            times = {t: [] for t in tables}
            for _ in range(3):
                self.q(f"TRUNCATE {', '.join(tables)}")
                self.q("TRUNCATE eventgrid.events_0, eventgrid.events_1, eventgrid.events_2, eventgrid.retries,"
                       " eventgrid.chunks_in_flight")
                self.q("CHECKPOINT")
                for t in tables:
                    start = time.time()
                    load(t)
                    times[t].append(time.time() - start)
            return {t: statistics.median(v) for t, v in times.items()}

        insert = "INSERT INTO {t} SELECT i, i %% 100, i %% 1000, 'sku-' || i, 'a note of some length ' || i FROM generate_series(1, %s) i"
        b = interleaved(lambda t: self.q(insert.format(t=t), (n,)))
        self.report("table_changes_bulk_rows_per_s", f"13 table changes: INSERT ... SELECT of {n:,} rows, published",
                    n / b["tc_published"], "rows/s")
        self.report("table_plain_bulk_rows_per_s", "  the same INSERT, no publication", n / b["tc_plain"], "rows/s")
        self.report("table_pgq_bulk_rows_per_s", "  the same INSERT, pgq.logutriga", n / b["tc_pgq"], "rows/s")
        self.report("table_changes_bulk_ratio", "  published / plain (time)", b["tc_published"] / b["tc_plain"], "x", "<= 2.0")
        self.report("table_changes_vs_pgq", "  published / logutriga (time)", b["tc_published"] / b["tc_pgq"], "x", "<= 0.5")
        # COPY of copy_rows rows from the client, each table in turn, three times
        copy_rows = env_int("BENCH_TABLE_COPY_ROWS", 1000000)
        data = "".join(f"{i}\t{i % 100}\t{i % 1000}\tsku-{i}\ta note of some length {i}\n"
                       for i in range(1, copy_rows + 1)).encode()

        def copy(t):
            with self.conn.cursor() as cur:
                cur.copy_expert(f"COPY {t} FROM STDIN", io.BytesIO(data))

        c = interleaved(copy)
        self.report("table_changes_copy_rows_per_s", f"  COPY of {copy_rows:,} rows, published", copy_rows / c["tc_published"], "rows/s")
        self.report("table_plain_copy_rows_per_s", "  the same COPY, no publication", copy_rows / c["tc_plain"], "rows/s")
        self.report("table_pgq_copy_rows_per_s", "  the same COPY, pgq.logutriga", copy_rows / c["tc_pgq"], "rows/s")
        self.report("table_changes_copy_ratio", "  COPY published / plain (time)", c["tc_published"] / c["tc_plain"], "x", "<= 2.0")
        self.report("table_changes_copy_vs_pgq", "  COPY published / logutriga (time)", c["tc_published"] / c["tc_pgq"], "x", "<= 0.5")
        del data
        # single-row INSERTs, each its own transaction: pgbench on each table
        # in turn, three rounds of seconds / 2 s each, medians
        runs = {t: [] for t in tables}
        for t in runs:
            self.q(f"TRUNCATE {t}")
            with open(os.path.join(self.args.work, f"{t}.sql"), "w") as f:
                f.write(f"\\set id random(1, 2000000000)\n"
                        f"INSERT INTO {t} VALUES (:id, 1, 2, 'sku', 'a note of some length') ON CONFLICT DO NOTHING;\n")
        for _ in range(3):
            for t in runs:
                out = subprocess.run(["pgbench", "-n", "-h", self.args.host, "-p", str(self.args.port), "-U", "postgres",
                                      "-c", "2", "-j", "2", "-T", str(max(5, seconds // 2)),
                                      "-f", os.path.join(self.args.work, f"{t}.sql"), "postgres"],
                                     capture_output=True, text=True, check=True).stdout
                runs[t].append(float(re.search(r"tps = ([0-9.]+)", out).group(1)))
        tps = {t: statistics.median(v) for t, v in runs.items()}
        self.report("table_changes_single_tps", f"  single-row INSERTs (pgbench, 2 clients, 3 x {max(5, seconds // 2)} s), published",
                    tps["tc_published"], "tx/s")
        self.report("table_plain_single_tps", "  single-row INSERTs, no publication", tps["tc_plain"], "tx/s")
        self.report("table_pgq_single_tps", "  single-row INSERTs, pgq.logutriga", tps["tc_pgq"], "tx/s")
        self.report("table_changes_single_ratio", "  published / plain (time per row)", tps["tc_plain"] / tps["tc_published"],
                    "x", "<= 1.3")
        # the events the bulk INSERT and pgbench published, delivered
        pending = self.one("SELECT coalesce(sum(pending), 0)::bigint FROM eventgrid.delivery_statistics WHERE topic = 'changes'")
        self.set_guc("eventgrid.delivery_paused", "off")
        start = time.time() - 0.3
        t_end = self.wait_drained()
        self.report("table_changes_delivery_per_s", f"  delivery of the {pending:,} events published (single-event)",
                    pending / (t_end - start), "events/s")
        self.q("SELECT eventgrid.stop_publishing_table_changes('tc_published', 'changes')")

    # -- 14 ---------------------------------------------------------------------
    def fig_signing(self):
        """Single-event and batched(100) delivery with Standard Webhooks
        signatures and without, alternately twice."""
        n = env_int("BENCH_EVENTS", 200000)
        runs = {}
        for signed in (False, True, False, True):
            for label, batch in (("single", None), ("batched", 100)):
                rate, costs = self.drain(f"sign-{label}", 1, n, batch=batch, signed=signed)
                runs.setdefault((label, signed), []).append((rate, costs["worker"]))
        for label in ("single", "batched"):
            for signed in (False, True):
                rate = statistics.mean(r for r, _ in runs[(label, signed)])
                worker = statistics.mean(w for _, w in runs[(label, signed)])
                head = (f"14 {label} delivery ({n:,} events, mean of 2), unsigned" if not signed
                        else "  the same, signed (webhook-signature)")
                tag = f"{label}_{'signed' if signed else 'unsigned'}"
                self.report(f"{tag}_events_per_s", head, rate, "events/s")
                self.report(f"{tag}_worker_cpu_us_per_delivery", "    delivery workers' CPU per delivery", worker, "µs")
            self.report(f"{label}_signing_cost_us", f"  {label}: signing's CPU per delivery",
                        self.results[f"{label}_signed_worker_cpu_us_per_delivery"]
                        - self.results[f"{label}_unsigned_worker_cpu_us_per_delivery"], "µs")

    # -- 19 ---------------------------------------------------------------------
    def fig_tokens(self):
        """Single-event delivery with bearer tokens (OAuth 2.0 client credentials, tokens of
        lifetime BENCH_TOKEN_LIFETIME s, so that a drain spans several) and without,
        alternately twice; the token requests a minute."""
        n = env_int("BENCH_EVENTS", 200000)
        lifetime = env_int("BENCH_TOKEN_LIFETIME", 5)
        token_bytes = env_int("BENCH_TOKEN_BYTES", 1000)
        counter = {"requests": 0}
        server = token_endpoint(lifetime, counter, token_bytes)
        url = f"http://127.0.0.1:{server.server_address[1]}/oauth2/token"
        runs = {}
        for tokens in (False, True, False, True):
            before = counter["requests"]
            t0 = time.time()
            rate, costs = self.drain("tokens", 1, n, token_url=url if tokens else None)
            runs.setdefault(tokens, []).append((rate, costs["worker"], counter["requests"] - before,
                                                time.time() - t0))
        server.shutdown()
        for tokens in (False, True):
            rate = statistics.mean(r for r, _, _, _ in runs[tokens])
            worker = statistics.mean(w for _, w, _, _ in runs[tokens])
            head = (f"19 single-event delivery ({n:,} events, mean of 2), no token" if not tokens
                    else f"  the same, a bearer token on each request ({token_bytes} bytes, good for {lifetime} s)")
            tag = "tokens" if tokens else "no_tokens"
            self.report(f"{tag}_events_per_s", head, rate, "events/s")
            self.report(f"{tag}_worker_cpu_us_per_delivery", "    delivery workers' CPU per delivery", worker, "µs")
        self.report("tokens_vs_no_tokens", "  ratio", self.results["tokens_events_per_s"]
                    / self.results["no_tokens_events_per_s"], "", ">= 0.95")
        requests = sum(k for _, _, k, _ in runs[True])
        seconds = sum(t for _, _, _, t in runs[True])
        self.report("token_requests_per_min", f"  token requests a minute (tokens of {lifetime} s; "
                    "one per lifetime whatever the rate)", requests * 60 / seconds, "",
                    f"<= {60 / (lifetime * 0.9 * 0.9) + 1:.1f}")  # asked for again in the last tenth of 90 %

    # -- 20 ---------------------------------------------------------------------
    def fig_ordered(self):
        """Single-event delivery ordered per key over BENCH_ORDERING_KEYS keys (data.key) and
        unordered, alternately twice; then ordered with one key's first event failing at the
        sink every time (its key stuck behind it), the other keys' deliveries timed."""
        n = env_int("BENCH_EVENTS", 200000)
        nkeys = env_int("BENCH_ORDERING_KEYS", 1000)
        self.q("DROP TABLE IF EXISTS bench_src_keyed")
        # the key of the i-th event; key 0's first event carries "fail": true (used by the stuck run only)
        self.q("""CREATE TABLE bench_src_keyed AS
                  SELECT jsonb_set(jsonb_set(event, '{data,key}', to_jsonb(i %% %s)), '{data,fail}', to_jsonb(i = 0)) AS event
                    FROM (SELECT event, (row_number() OVER ()) - 1 AS i FROM bench_src) x""", (nkeys,))
        runs = {}
        for ordered in (False, True, False, True):
            rate, costs = self.drain("ordered" if ordered else "unordered", 1, n,
                                     ordering_key="data.key" if ordered else None, src="bench_src_keyed")
            runs.setdefault(ordered, []).append((rate, costs["worker"], costs["cpu"]))
        for ordered in (False, True):
            rate = statistics.mean(r for r, _, _ in runs[ordered])
            head = (f"20 single-event delivery ({n:,} events), unordered, mean of 2" if not ordered
                    else f"  the same, ordered per key (ordering_key, {nkeys:,} keys)")
            tag = "ordered" if ordered else "unordered"
            self.report(f"{tag}_events_per_s", head, rate, "events/s")
            self.report(f"{tag}_worker_cpu_us_per_delivery", "    delivery workers' CPU per delivery",
                        statistics.mean(w for _, w, _ in runs[ordered]), "µs")
            self.report(f"{tag}_cpu_us_per_delivery", "    CPU of all PostgreSQL processes per delivery",
                        statistics.mean(c for _, _, c in runs[ordered]), "µs")
        self.report("ordered_vs_unordered", "  ratio", self.results["ordered_events_per_s"]
                    / self.results["unordered_events_per_s"], "", ">= 0.5")
        # key 0's events: its first fails every time, the others wait behind it
        stuck = self.one("SELECT count(*) FROM (SELECT event FROM bench_src_keyed CROSS JOIN generate_series(1, %s) "
                         "LIMIT %s) x WHERE event->'data'->>'key' = '0'", ((n + self.src_n - 1) // self.src_n, n))
        rate, _ = self.drain("stuck", 1, n, ordering_key="data.key", src="bench_src_keyed", stuck=stuck)
        self.report("ordered_one_key_stuck_events_per_s", f"  ordered, one key stuck behind a failing event ({stuck} held)",
                    rate, "events/s")
        self.report("ordered_stuck_cost_pct", "  what the stuck key costs the others",
                    100.0 * (1 - rate / self.results["ordered_events_per_s"]), "%", "< 10")

    # -- 15 ---------------------------------------------------------------------
    def fig_rate_limit(self):
        """Rate limiter accuracy: a backlog drained by a subscription with
        max_events_per_second R, single-event, to the nginx sink; the rate
        measured from the attempt history over W seconds after the first
        second (the full bucket's burst)."""
        window = env_int("BENCH_RATE_SECONDS", 5)
        for rate in (10, 100, 1000, 10000):
            self.reset_queue()
            self.q("SELECT eventgrid.create_topic('rated')")
            self.q("SELECT eventgrid.create_event_subscription('rated', 'limited', %s, max_events_per_second => %s)",
                   (f"{self.args.sink}/rated", rate))
            self.set_guc("eventgrid.delivery_paused", "on")
            self.publish_backlog("rated", rate * (window + 2))
            since = time.time()
            self.set_guc("eventgrid.delivery_paused", "off")
            self.wait_drained(timeout=window * 10 + 60)
            # this run's attempts (the history keeps the earlier runs')
            times = [t for (t,) in self.q("SELECT extract(epoch FROM attempted_at)::float8 FROM eventgrid.delivery_attempts "
                                          "WHERE subscription = 'limited' AND attempted_at >= to_timestamp(%s) ORDER BY 1",
                                          (since,))]
            t0 = times[0] + 1
            n = sum(1 for t in times if t0 <= t < t0 + window)
            measured = n / window
            self.report(f"rate_{rate}_measured", f"15 max_events_per_second {rate:,}: delivered over {window} s",
                        measured, "events/s")
            self.report(f"rate_{rate}_error_pct", "   off the limit by", 100.0 * (measured - rate) / rate, "%")

    # -- 6 ----------------------------------------------------------------------
    def fig_latency(self):
        """Commit to arrival at 1,000 events/s, published by 4 connections (one
        commit's WAL flush does not hold back the next), received in a process of
        its own, after a first second at the same rate (its maximum reported
        apart: the new subscription's first plans and connections); where the time goes: commit to the request's start (the worker's
        wake-up and claim: attempted_at in the attempt history) and from there to
        the arrival (the HTTP hand-off and the request)."""
        seconds = env_int("BENCH_LATENCY_SECONDS", 20)
        rate = 1000
        receiver = ArrivalProcess()
        self.reset_queue()
        self.q("SELECT eventgrid.create_topic('latency')")
        self.q("SELECT eventgrid.create_event_subscription('latency', 'timed', %s)",
               (f"http://127.0.0.1:{receiver.port}/latency",))
        # the first second warms up (the workers' first plans for the new subscription, the
        # receiver's first connections): measured apart, then the steady rate
        warm = self.publish_at_rate("latency", "warm", rate, 1, threads=4)
        start = time.time()
        commits = self.publish_at_rate("latency", "lat", rate, seconds, threads=4)
        achieved = len(commits) / (time.time() - start)
        self.wait_drained()
        time.sleep(0.5)
        arrivals = receiver.arrivals()
        lat = sorted((arrivals[k] - v) * 1000 for k, v in commits.items() if k in arrivals)
        warm_lat = sorted((arrivals[k] - v) * 1000 for k, v in warm.items() if k in arrivals)
        missing = len(commits) + len(warm) - len(lat) - len(warm_lat)
        p = lambda xs, q: xs[min(len(xs) - 1, int(q * len(xs)))]
        self.report("latency_rate", f"6 latency run: {len(commits):,} events at", achieved, "events/s", ">= 1000")
        self.report("latency_p50_ms", "  commit to arrival p50", p(lat, 0.50), "ms")
        self.report("latency_p99_ms", "  commit to arrival p99", p(lat, 0.99), "ms", "<= 5")
        self.report("latency_max_ms", "  commit to arrival max", lat[-1], "ms", "<= 20")
        if warm_lat:
            self.report("latency_warmup_max_ms", f"  commit to arrival max in the first second before ({len(warm):,} events)",
                        warm_lat[-1], "ms")
        if missing:
            self.report("latency_missing", "  events not seen by the receiver", missing, "events")
        # the request's start, from the attempt history (kept: attempt_history = all)
        started = dict(self.q("SELECT e.event->>'id', extract(epoch FROM a.attempted_at)::float8"
                              "  FROM eventgrid.delivery_attempts a CROSS JOIN unnest(a.event_ids) i(id)"
                              "  JOIN eventgrid.events e ON e.id = i.id AND e.topic = 'latency'"
                              " WHERE a.subscription = 'timed'"))
        to_start = sorted((started[k] - v) * 1000 for k, v in commits.items() if k in started)
        to_arrival = sorted((arrivals[k] - started[k]) * 1000 for k in commits if k in started and k in arrivals)
        if to_start and to_arrival:
            self.report("latency_to_start_p50_ms", "  commit to the request's start p50", p(to_start, 0.50), "ms")
            self.report("latency_to_start_p99_ms", "  commit to the request's start p99", p(to_start, 0.99), "ms")
            self.report("latency_to_start_max_ms", "  commit to the request's start max", to_start[-1], "ms")
            self.report("latency_http_p50_ms", "  request's start to arrival p50", p(to_arrival, 0.50), "ms")
            self.report("latency_http_p99_ms", "  request's start to arrival p99", p(to_arrival, 0.99), "ms")
            self.report("latency_http_max_ms", "  request's start to arrival max", to_arrival[-1], "ms")

    # -- 9 ----------------------------------------------------------------------
    def fig_isolation(self):
        """A healthy subscription beside 500 to a refusing port and 200 to an endpoint that never answers."""
        seconds = env_int("BENCH_ISOLATION_SECONDS", 30)
        rate = env_int("BENCH_ISOLATION_RATE", 10)
        arrivals = {}
        server = arrival_receiver(arrivals)
        # accepts connections (the kernel completes them) and never reads or answers
        hang = socket.socket()
        hang.bind(("127.0.0.1", 0))
        hang.listen(4096)
        refusing = socket.socket()
        refusing.bind(("127.0.0.1", 0))
        refused_port = refusing.getsockname()[1]
        refusing.close()
        self.reset_queue()
        self.q("SELECT eventgrid.create_topic('isolation')")
        self.q("SELECT eventgrid.create_event_subscription('isolation', 'refused-' || i, %s) FROM generate_series(1, 500) i",
               (f"http://127.0.0.1:{refused_port}/refused",))
        self.q("SELECT eventgrid.create_event_subscription('isolation', 'hanging-' || i, %s) FROM generate_series(1, 200) i",
               (f"http://127.0.0.1:{hang.getsockname()[1]}/hanging",))
        self.q("SELECT eventgrid.create_event_subscription('isolation', 'healthy', %s)",
               (f"http://127.0.0.1:{server.server_address[1]}/healthy",))
        workers = self.worker_pids()
        peak_fds = 0
        peak_anon = 0

        def sample():
            """Peaks of the busiest delivery worker."""
            nonlocal peak_fds, peak_anon
            for worker in workers:
                try:
                    peak_fds = max(peak_fds, len(os.listdir(f"/proc/{worker}/fd")))
                    with open(f"/proc/{worker}/status") as f:
                        anon = next(int(line.split()[1]) for line in f if line.startswith("RssAnon:"))
                    peak_anon = max(peak_anon, anon)
                except OSError:
                    pass

        commits = self.publish_at_rate("isolation", "iso", rate, seconds, after_each=sample)
        deadline = time.time() + 60
        while time.time() < deadline and len(arrivals) < len(commits):
            time.sleep(0.1)
        server.shutdown()
        hang.close()
        lat = sorted((arrivals[k] - v) * 1000 for k, v in commits.items() if k in arrivals)
        p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]
        self.report("isolation_rate", f"9 isolation: {len(commits):,} events, 500 refused + 200 hanging subs, at", rate, "events/s")
        self.report("isolation_p50_ms", "  healthy subscription, commit to arrival p50", p(0.50), "ms")
        self.report("isolation_p95_ms", "  healthy subscription, commit to arrival p95", p(0.95), "ms", "<= 100")
        self.report("isolation_max_ms", "  healthy subscription, commit to arrival max", lat[-1], "ms")
        self.report("isolation_missing", "  events the healthy subscription did not get", len(commits) - len(lat), "events")
        self.report("isolation_peak_fds", "  worker file descriptors, peak", peak_fds, "fds")
        self.report("isolation_rss_anon_mb", "  worker private memory, peak (RssAnon, sampled)", peak_anon / 1024.0, "MB")
        self.q("SELECT eventgrid.drop_topic('isolation')")

    # -- 7 ----------------------------------------------------------------------
    def fig_memory(self):
        n = env_int("BENCH_BACKLOG", 1000000)
        self.reset_queue()
        self.q("SELECT eventgrid.create_topic('memory')")
        self.q("SELECT eventgrid.create_event_subscription('memory', 'sink', %s)", (self.args.sink + "/memory",))
        self.set_guc("eventgrid.delivery_paused", "on")
        self.publish_backlog("memory", n)
        pids = self.worker_pids()
        peak = {"VmRSS": 0, "RssAnon": 0}

        def sample():
            """Peaks of the delivery worker that uses the most."""
            for pid in pids:
                with open(f"/proc/{pid}/status") as f:
                    for line in f:
                        k, _, v = line.partition(":")
                        if k in peak:
                            peak[k] = max(peak[k], int(v.split()[0]))

        self.set_guc("eventgrid.delivery_paused", "off")
        t0 = time.time() - 0.3
        while not self.drained():
            sample()
            time.sleep(0.05)
        t1 = time.time()
        self.report("worker_peak_private_mb", f"7 worker peak private memory (RssAnon), {n:,} backlog",
                    peak["RssAnon"] / 1024, "MB", "<= 100")
        self.report("worker_peak_rss_mb", "  worker peak RSS incl. shared buffers touched", peak["VmRSS"] / 1024, "MB")
        self.report("backlog_drain_events_per_s", "  drain rate of that backlog", n / (t1 - t0), "events/s")

    # -- 8 ----------------------------------------------------------------------
    def queue_size_mb(self):
        return self.one("SELECT (sum(pg_total_relation_size(c)) / 1048576.0)::float8 FROM unnest(ARRAY["
                        "'eventgrid.events_0', 'eventgrid.events_1', 'eventgrid.events_2', 'eventgrid.retries', "
                        "'eventgrid.chunks_in_flight', 'eventgrid.subscription_positions']::regclass[]) AS c")

    def quick_drain(self, topic):
        """Drain rate of 20,000 events; prints what the worker was doing."""
        n = 20000
        self.set_guc("eventgrid.delivery_paused", "on")
        self.publish_backlog(topic, n)
        self.set_guc("eventgrid.delivery_paused", "off")
        t0 = time.time() - 0.3
        seen = {}
        while not self.drained():
            for row in self.q("SELECT backend_type, coalesce(wait_event, 'CPU'), left(query, 40) FROM pg_stat_activity "
                              "WHERE backend_type IN ('eventgrid delivery worker', 'autovacuum worker') AND state <> 'idle'"):
                seen[row] = seen.get(row, 0) + 1
            time.sleep(0.05)
        rate = n / (time.time() - t0)
        print("  samples during the drain: " + "; ".join(f"{k[0]} {k[1]} '{k[2]}' x{v}" for k, v in
                                                        sorted(seen.items(), key=lambda kv: -kv[1])[:6]), flush=True)
        return rate

    def fig_bloat(self, hold):
        seconds = env_int("BENCH_STEADY_SECONDS", 300)
        rate = env_int("BENCH_STEADY_RATE", 2000)
        tag = "held REPEATABLE READ" if hold else "plain"
        key = "rr" if hold else "plain"
        self.reset_queue()
        self.q("SELECT eventgrid.create_topic('steady')")
        self.q("SELECT eventgrid.create_event_subscription('steady', 'sink', %s)", (self.args.sink + "/steady",))
        before_tp = self.quick_drain("steady")
        before_mb = self.queue_size_mb()
        holder = None
        if hold:
            holder = self.connect()
            holder.autocommit = False
            holder.set_session(isolation_level="REPEATABLE READ")
            self.q("SELECT count(*) FROM eventgrid.topics", conn=holder)
        peak_mb, backlog_max = before_mb, 0
        start = time.time()
        tick = 0.1
        i = 0
        while time.time() - start < seconds:
            due = start + i * tick
            if due > time.time():
                time.sleep(due - time.time())
            self.q("INSERT INTO eventgrid.events (topic, event) SELECT 'steady', event FROM bench_src LIMIT %s",
                   (int(rate * tick),))
            i += 1
            if i % 50 == 0:
                peak_mb = max(peak_mb, self.queue_size_mb())
                backlog_max = max(backlog_max, self.one("SELECT coalesce(sum(pending), 0)::bigint FROM eventgrid.delivery_statistics"))
        published = i * int(rate * tick)
        t_end = self.wait_drained()
        lag = t_end - (start + seconds)
        if holder:
            holder.rollback()
            holder.close()
        peak_mb = max(peak_mb, self.queue_size_mb())
        self.q("VACUUM eventgrid.retries, eventgrid.events")
        after_mb = self.queue_size_mb()
        after_tp = self.quick_drain("steady")
        self.q("VACUUM eventgrid.retries, eventgrid.events")
        final_mb = self.queue_size_mb()
        label = f"8 steady {rate:,}/s for {seconds} s, {tag}"
        print(f"{label}: {published:,} events published, backlog at most {backlog_max:,}, "
              f"drained {lag:.1f} s after the end", flush=True)
        self.report(f"bloat_{key}_size_before_mb", f"{label}: queue size before", before_mb, "MB")
        self.report(f"bloat_{key}_size_peak_mb", f"  queue size peak during the run", peak_mb, "MB")
        self.report(f"bloat_{key}_size_after_mb", f"  queue size after the run and a VACUUM", after_mb, "MB")
        self.report(f"bloat_{key}_size_final_mb", f"  queue size after a second drain and VACUUM", final_mb, "MB")
        self.report(f"bloat_{key}_throughput_before", f"  drain rate before (20,000 events)", before_tp, "events/s")
        self.report(f"bloat_{key}_throughput_after", f"  drain rate after", after_tp, "events/s")
        self.report(f"bloat_{key}_max_backlog", f"  largest backlog during the run", backlog_max, "deliveries")


def main():
    ap = argparse.ArgumentParser(description="eventgrid benchmark driver")
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--sink", required=True)
    ap.add_argument("--tls-sink", required=True)
    ap.add_argument("--h2-sink", required=True)
    ap.add_argument("--mtls-sink", required=True)
    ap.add_argument("--client-cert", required=True)
    ap.add_argument("--client-key", required=True)
    ap.add_argument("--tls-log", required=True)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--only", default="1,2,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,23,25", help="comma-separated figure numbers (2 runs 2-4)")
    args = ap.parse_args()
    only = set(args.only.split(","))
    b = Bench(args)
    b.setup()
    if "1" in only or "2" in only:
        b.fig_http()
    if "2" in only:
        b.fig_drains()
    if "5" in only:
        b.fig_publish_cost()
    if "6" in only:
        b.fig_latency()
    if "7" in only:
        b.fig_memory()
    if "9" in only:
        b.fig_isolation()
    if "10" in only:
        b.fig_filtered_fanout()
    if "11" in only:
        b.fig_history()
    if "12" in only:
        b.fig_tls()
    if "13" in only:
        b.fig_table_changes()
    if "14" in only:
        b.fig_signing()
    if "15" in only:
        b.fig_rate_limit()
    if "19" in only:
        b.fig_tokens()
    if "20" in only:
        b.fig_ordered()
    if "21" in only:
        Pull(b).run()
    if "23" in only:
        HttpPublish(b).run()
    if "16" in only:
        Databases(b, arrival_receiver).run()
    if "17" in only:
        Monitoring(b).run()
    if "18" in only:
        Replication(b, ArrivalProcess, cluster_cpu, publish_at_rate).run()
    if "25" in only:
        WalSources(b, ArrivalProcess).run()
    if "8" in only:
        cases = os.environ.get("BENCH_STEADY_CASES", "plain,rr").split(",")
        if "plain" in cases:
            b.fig_bloat(hold=False)
        if "rr" in cases:
            b.fig_bloat(hold=True)
    print("\n== eventgrid benchmark (%s), eventgrid.delivery_workers = %s"
          % (time.strftime("%Y-%m-%d %H:%M:%S"), b.one("SHOW eventgrid.delivery_workers")))
    for row in b.rows:
        print(row)
    print("BENCH_RESULT " + json.dumps({k: round(v, 2) if isinstance(v, float) else v
                                        for k, v in b.results.items()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
