"""Figure 22 of the eventgrid benchmark (bench.py runs it): publishing over
Event Grid's HTTP data plane (the HTTP listener, README "Using the Azure
SDKs") against publishing in SQL on the same server.

22a. BENCH_HTTP_SENDERS (8) senders, each a process of its own, publish
     batches of 100 Event Grid events (about 1 KB each, bench_src's data)
     to a custom topic for BENCH_HTTP_SECONDS (10):
       - sql:  eventgrid.publish(topic, the batch as jsonb) over libpq, a
               connection each, one transaction per batch;
       - http: Python's Azure SDK, EventGridPublisherClient.send() with
               AzureKeyCredential over HTTPS (TLS 1.3, a connection kept
               per sender), one request per batch.
     Events published per second, alternately twice each; means; and
     the ratio http / sql.
22b. One sender, one event per request: the request's time (p50, p99)
     over HTTPS, and the same publish() over libpq.
"""
import json
import multiprocessing
import os
import statistics
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


class HttpPublish:
    def __init__(self, bench):
        self.b = bench
        self.dsn = f"host={bench.args.host} port={bench.args.port} user=postgres dbname=postgres"

    def run(self):
        b = self.b
        port = b.one("SHOW eventgrid.http_port")
        if port in (None, "0"):
            b.report("http_publish_skipped", "22. HTTP publishing: not measured (eventgrid.http_port is 0)", 0, "")
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
        rates = {"sql": [], "http": []}
        for _ in range(2):
            for kind in ("sql", "http"):
                rates[kind].append(self.batch_rate(kind, senders, seconds, endpoint, key, ca, events, batch_json))
        sql_rate = statistics.mean(rates["sql"])
        http_rate = statistics.mean(rates["http"])
        b.report("http_publish_sql_rate", f"22a. publish() over libpq, {senders} senders, 100 events a call",
                 sql_rate, "events/s")
        b.report("http_publish_http_rate", f"    Azure SDK over HTTPS, {senders} senders, 100 events a request",
                 http_rate, "events/s")
        b.report("http_publish_ratio", "    HTTP / SQL", http_rate / sql_rate if sql_rate else 0, "")
        self.latency(endpoint, key, ca, events[:1], json.dumps([json.loads(batch_json)[0]]))

    def batch_rate(self, kind, senders, seconds, endpoint, key, ca, events, batch_json):
        ctx = multiprocessing.get_context("fork")
        start = ctx.Barrier(senders + 1)
        out = ctx.Queue()
        procs = []
        for _ in range(senders):
            if kind == "sql":
                args = (self.dsn, "http-bench", batch_json, seconds, start, out)
                procs.append(ctx.Process(target=sql_sender, args=args))
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
        b.report("http_publish_one_p50_ms", "22b. one event a request over HTTPS: p50", q(http_ms, 0.5), "ms")
        b.report("http_publish_one_p99_ms", "    p99", q(http_ms, 0.99), "ms")
        b.report("sql_publish_one_p50_ms", "    publish() over libpq: p50", q(sql_ms, 0.5), "ms")
        b.report("sql_publish_one_p99_ms", "    p99", q(sql_ms, 0.99), "ms")
