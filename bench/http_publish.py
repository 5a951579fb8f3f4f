"""Figure 23 of the eventgrid benchmark (bench.py runs it): publishing over
Event Grid's HTTP data plane (the HTTP listener, README "Using the Azure
SDKs") against publishing in SQL on the same server.

23a. BENCH_HTTP_SENDERS (8) senders publish batches of 100 Event Grid
     events (about 1 KB each, bench_src's data) to a custom topic for
     BENCH_HTTP_SECONDS (10):
       - sql:    eventgrid.publish(topic, the batch as jsonb) over libpq, a
                 process and a connection each, one transaction per batch;
       - js:     the JavaScript Azure SDK (@azure/eventgrid,
                 EventGridPublisherClient.send() with AzureKeyCredential)
                 over HTTPS (TLS 1.3, a connection kept per sender), the
                 senders concurrent in one Node.js process (bench/http_sender.js);
       - python: Python's Azure SDK the same way, a process per sender;
       - raw:    the same request bodies, serialized once, sent by
                 http.client (a process per sender): what the listener
                 takes when the clients cost nothing.
     Events published per second, alternately twice each; means; the
     ratios to sql; and where the CPU went in the second js run (the
     listener, its database connections, everything else).
23b. One sender, one event per request: the request's time (p50, p99)
     over HTTPS, and the same publish() over libpq.
23c. Pull: BENCH_HTTP_PULL_EVENTS (20,000) CloudEvents in a queue
     subscription, received 100 at a time and acknowledged by 8 consumers
     until all are: the JavaScript SDK's EventGridReceiverClient over HTTPS
     (concurrent in one Node.js process, bench/http_consumer.js) against
     receive() and acknowledge() over libpq (a process each).
"""
import json
import multiprocessing
import os
import statistics
import subprocess
import time

import psycopg2


def env_int(name, default):
    return int(os.environ.get(name, default))


def sql_sender(dsn, topic, batch_json, seconds, start, out):
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    cur = conn.cursor()
    start.wait()
    n = 0
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        cur.execute("SELECT eventgrid.publish(%s, %s::jsonb)", (topic, batch_json))
        n += 1
    out.put(n)
    conn.close()


def http_sender(endpoint, key, ca, events, seconds, start, out):
    from azure.core.credentials import AzureKeyCredential
    from azure.eventgrid import EventGridPublisherClient
    client = EventGridPublisherClient(endpoint, AzureKeyCredential(key), connection_verify=ca)
    client.send(events[:1])     # the TLS connection made before the clock starts
    start.wait()
    n = 0
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        client.send(events)
        n += 1
    out.put(n)


def sql_consumer(dsn, total, acked, last):
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    cur = conn.cursor()
    while acked.value < total:
        cur.execute("SELECT lock_token FROM eventgrid.receive('http-pull', 'q-bench', 100, 10)")
        tokens = [r[0] for r in cur.fetchall()]
        if not tokens:
            continue
        cur.execute("SELECT count(*) FILTER (WHERE succeeded) FROM eventgrid.acknowledge('http-pull', 'q-bench', %s)",
                    (tokens,))
        n = cur.fetchone()[0]
        with acked.get_lock():
            acked.value += n
            last.value = time.monotonic()
    conn.close()


def raw_sender(endpoint, key, ca, batch_json, seconds, start, out):
    import http.client
    import ssl
    import urllib.parse
    u = urllib.parse.urlsplit(endpoint)
    conn = http.client.HTTPSConnection(u.hostname, u.port, context=ssl.create_default_context(cafile=ca))
    body = batch_json.encode()
    headers = {"aeg-sas-key": key, "Content-Type": "application/json; charset=utf-8"}
    start.wait()
    n = 0
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        conn.request("POST", u.path + "?api-version=2018-01-01", body=body, headers=headers)
        r = conn.getresponse()
        r.read()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}")
        n += 1
    out.put(n)


class HttpPublish:
    def __init__(self, bench):
        self.b = bench
        self.dsn = f"host={bench.args.host} port={bench.args.port} user=postgres dbname=postgres"

    def run(self):
        b = self.b
        port = b.one("SHOW eventgrid.http_port")
        if port in (None, "0"):
            b.report("http_publish_skipped", "23. HTTP publishing: not measured (eventgrid.http_port is 0)", 0, "")
            return
        ca = os.path.join(b.args.work, "ca.pem")
        b.q("SELECT eventgrid.create_topic('http-bench') WHERE NOT EXISTS "
            "(SELECT 1 FROM eventgrid.topics WHERE name = 'http-bench')")
        key = b.one("SELECT key1 FROM eventgrid.topic_keys WHERE topic = 'http-bench'")
        endpoint = f"https://127.0.0.1:{port}/postgres/topics/http-bench/api/events"
        data = [json.loads(r[0]) for r in b.q("SELECT (event->'data')::text FROM bench_src LIMIT 100")]
        from azure.eventgrid import EventGridEvent
        events = [EventGridEvent(subject=f"orders/{i}", event_type="Bench.OrderCreated", data=data[i % len(data)],
                                 data_version="1.0") for i in range(100)]
        batch_json = json.dumps([{"id": f"b-{i}", "subject": f"orders/{i}", "eventType": "Bench.OrderCreated",
                                  "eventTime": "2026-11-28T00:00:00Z", "dataVersion": "1.0",
                                  "data": data[i % len(data)]} for i in range(100)])
        senders = env_int("BENCH_HTTP_SENDERS", 8)
        seconds = env_int("BENCH_HTTP_SECONDS", 10)
        self.data_json = json.dumps(data)
        kinds = ("sql", "js", "python", "raw")
        rates = {k: [] for k in kinds}
        for _ in range(2):
            for kind in kinds:
                cpu = self.cpu()
                rates[kind].append(self.batch_rate(kind, senders, seconds, endpoint, key, ca, events, batch_json))
                if kind == "js":
                    js_cpu = [after - before for before, after in zip(cpu, self.cpu())]
        sql_rate = statistics.mean(rates["sql"])
        labels = {"sql": f"23a. publish() over libpq, {senders} senders, 100 events a call",
                  "js": f"    JavaScript SDK over HTTPS, {senders} senders, 100 a request",
                  "python": f"    Python SDK over HTTPS, {senders} senders, 100 a request",
                  "raw": f"    http.client over HTTPS, {senders} senders, 100 a request"}
        for kind in kinds:
            rate = statistics.mean(rates[kind])
            b.report(f"http_publish_{kind}_rate", labels[kind], rate, "events/s")
            if kind != "sql":
                b.report(f"http_publish_{kind}_percent_of_sql", f"      {kind} / sql", 100 * rate / sql_rate if sql_rate else 0, "%")
        total = sum(js_cpu) or 1
        b.report("http_publish_js_cpu_listener", "    CPU of the js run: the listener", 100 * js_cpu[0] / total, "%")
        b.report("http_publish_js_cpu_backends", "      its database connections", 100 * js_cpu[1] / total, "%")
        b.report("http_publish_js_cpu_rest", "      the rest (the senders, the other processes)", 100 * js_cpu[2] / total, "%")
        self.latency(endpoint, key, ca, events[:1], json.dumps([json.loads(batch_json)[0]]))
        self.pull(port, ca)

    def cpu(self):
        """Clock ticks so far of the listener, of its database connections, and of the whole machine."""
        def ticks(pid):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                return int(fields[11]) + int(fields[12])
            except OSError:
                return 0
        listener = sum(ticks(r[0]) for r in self.b.q(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'eventgrid HTTP listener'"))
        backends = sum(ticks(r[0]) for r in self.b.q(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend'"
            " AND application_name = 'eventgrid HTTP listener'"))
        with open("/proc/stat") as f:
            busy = sum(int(x) for x in f.readline().split()[1:4])
        return [listener, backends, busy - listener - backends]

    def batch_rate(self, kind, senders, seconds, endpoint, key, ca, events, batch_json):
        if kind == "js":
            env = dict(os.environ, NODE_EXTRA_CA_CERTS=ca)
            here = os.path.dirname(os.path.abspath(__file__))
            out = subprocess.run(["node", os.path.join(here, "http_sender.js"), endpoint, key, str(senders),
                                  str(seconds), self.data_json], env=env, check=True, capture_output=True, text=True)
            got = json.loads(out.stdout)
            return got["requests"] * 100 / got["seconds"]
        ctx = multiprocessing.get_context("fork")
        start = ctx.Barrier(senders + 1)
        out = ctx.Queue()
        procs = []
        for _ in range(senders):
            if kind == "sql":
                args = (self.dsn, "http-bench", batch_json, seconds, start, out)
                procs.append(ctx.Process(target=sql_sender, args=args))
            elif kind == "raw":
                args = (endpoint, key, ca, batch_json, seconds, start, out)
                procs.append(ctx.Process(target=raw_sender, args=args))
            else:
                args = (endpoint, key, ca, events, seconds, start, out)
                procs.append(ctx.Process(target=http_sender, args=args))
        for p in procs:
            p.start()
        start.wait()
        t0 = time.monotonic()
        calls = sum(out.get() for _ in procs)
        elapsed = time.monotonic() - t0
        for p in procs:
            p.join()
        return calls * 100 / elapsed

    def latency(self, endpoint, key, ca, one_event, one_json):
        from azure.core.credentials import AzureKeyCredential
        from azure.eventgrid import EventGridPublisherClient
        client = EventGridPublisherClient(endpoint, AzureKeyCredential(key), connection_verify=ca)
        client.send(one_event)
        http_ms = []
        for _ in range(500):
            t = time.perf_counter()
            client.send(one_event)
            http_ms.append((time.perf_counter() - t) * 1000)
        conn = psycopg2.connect(self.dsn)
        conn.autocommit = True
        cur = conn.cursor()
        sql_ms = []
        for _ in range(500):
            t = time.perf_counter()
            cur.execute("SELECT eventgrid.publish('http-bench', %s::jsonb)", (one_json,))
            sql_ms.append((time.perf_counter() - t) * 1000)
        conn.close()
        q = lambda xs, p: sorted(xs)[int(len(xs) * p) - 1]
        b = self.b
        b.report("http_publish_one_p50_ms", "23b. one event a request over HTTPS: p50", q(http_ms, 0.5), "ms")
        b.report("http_publish_one_p99_ms", "    p99", q(http_ms, 0.99), "ms")
        b.report("sql_publish_one_p50_ms", "    publish() over libpq: p50", q(sql_ms, 0.5), "ms")
        b.report("sql_publish_one_p99_ms", "    p99", q(sql_ms, 0.99), "ms")

    def fill_queue(self, n):
        """n CloudEvents of about 1 KB in queue subscription q-bench, receivable (moved by the delivery workers)."""
        b = self.b
        b.q("INSERT INTO eventgrid.events (topic, event)"
            " SELECT 'http-pull', jsonb_build_object('specversion', '1.0', 'id', 'h-' || g, 'source', '/bench',"
            "        'type', 'Bench.OrderCreated', 'data', (SELECT event->'data' FROM bench_src LIMIT 1))"
            "   FROM generate_series(1, %s) g", (n,))
        until = time.monotonic() + 300
        while time.monotonic() < until:
            if b.one("SELECT receivable_events FROM eventgrid.queue_metrics"
                     " WHERE topic = 'http-pull' AND event_subscription = 'q-bench'") >= n:
                return
            time.sleep(0.2)
        raise RuntimeError("the queue was not filled")

    def pull(self, port, ca):
        b = self.b
        n = env_int("BENCH_HTTP_PULL_EVENTS", 20000)
        b.q("SELECT eventgrid.create_topic('http-pull', 'CloudEventSchemaV1_0', 'namespace') WHERE NOT EXISTS "
            "(SELECT 1 FROM eventgrid.topics WHERE name = 'http-pull')")
        b.q("SELECT eventgrid.create_event_subscription('http-pull', 'q-bench', delivery_mode => 'queue') WHERE NOT EXISTS "
            "(SELECT 1 FROM eventgrid.event_subscriptions WHERE topic = 'http-pull' AND name = 'q-bench')")
        key = b.one("SELECT key1 FROM eventgrid.topic_keys WHERE topic = 'http-pull'")
        rates = {"sql": [], "js": []}
        for _ in range(2):
            for kind in ("sql", "js"):
                self.fill_queue(n)
                if kind == "js":
                    env = dict(os.environ, NODE_EXTRA_CA_CERTS=ca)
                    here = os.path.dirname(os.path.abspath(__file__))
                    out = subprocess.run(["node", os.path.join(here, "http_consumer.js"), f"https://127.0.0.1:{port}/postgres",
                                          key, "http-pull", "q-bench", "8", str(n)],
                                         env=env, check=True, capture_output=True, text=True)
                    got = json.loads(out.stdout)
                    rates[kind].append(got["acked"] / got["seconds"])
                else:
                    ctx = multiprocessing.get_context("fork")
                    acked = ctx.Value("q", 0)
                    last = ctx.Value("d", 0.0)
                    t0 = time.monotonic()
                    procs = [ctx.Process(target=sql_consumer, args=(self.dsn, n, acked, last)) for _ in range(8)]
                    for p in procs:
                        p.start()
                    for p in procs:
                        p.join()
                    rates[kind].append(acked.value / (last.value - t0))
        sql_rate = statistics.mean(rates["sql"])
        js_rate = statistics.mean(rates["js"])
        b.report("http_pull_sql_rate", "23c. receive() + acknowledge() over libpq, 8 consumers, 100 a call", sql_rate, "events/s")
        b.report("http_pull_js_rate", "    JavaScript SDK over HTTPS, 8 consumers, 100 a call", js_rate, "events/s")
        b.report("http_pull_js_percent_of_sql", "      js / sql", 100 * js_rate / sql_rate if sql_rate else 0, "%")
