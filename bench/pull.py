"""Figure 21 of the eventgrid benchmark (bench.py runs it): pull delivery.

21a. Receive + acknowledge: BENCH_PULL_EVENTS (200,000) CloudEvents of
     about 1 KB published to a namespace topic, made receivable to a
     queue subscription by the delivery workers (references in
     eventgrid.queue_batches, no copy of an event; timed apart), then
     BENCH_PULL_CONSUMERS (8) consumers, each a connection of its own in a
     thread, call receive(max_events 100) and acknowledge() the tokens
     until all are acknowledged.  The same events and consumers against a
     plain queue table read the way pgmq reads (UPDATE ... SET vt, read_ct
     of the oldest visible rows FOR UPDATE SKIP LOCKED, RETURNING; then
     DELETE by id), with pgmq's index on vt.  pgmq itself is not in
     Debian; the plain table is what its read and delete do, without its
     functions around them.  Alternately twice each; means.
21b. Commit to receive: one consumer waits in receive(max_events 1) while
     a connection publishes one event every 20 ms for BENCH_PULL_SECONDS
     (10); per event, from its publishing commit's return to the return of
     the receive() that got it: p50, p99, max.
"""
import os
import statistics
import threading
import time

import psycopg2


def env_int(name, default):
    return int(os.environ.get(name, default))


class Pull:
    def __init__(self, bench):
        self.b = bench

    def connect(self):
        return self.b.connect()

    def publish(self, n):
        """n CloudEvents of bench_src's data into topic pull, in transactions of at most 100,000."""
        done = 0
        while done < n:
            k = min(100000, n - done)
            self.b.q("INSERT INTO eventgrid.events (topic, event)"
                     " SELECT 'pull', jsonb_build_object('specversion', '1.0', 'id', 'p-' || %s || '-' || g,"
                     "        'source', '/bench', 'type', 'Bench.OrderCreated', 'data', s.event->'data')"
                     "   FROM generate_series(1, %s) g JOIN bench_src s ON s.event->'data'->>'orderId' = ((g - 1) %% %s + 1)::text",
                     (done, k, self.b.src_n))
            done += k

    def consume(self, n, step):
        """Runs BENCH_PULL_CONSUMERS threads calling step(conn) (returns how many it settled) until n are settled;
        the rate is n over the time from the start to the last settle (a consumer then waiting in receive()
        for more is not counted)."""
        consumers = env_int("BENCH_PULL_CONSUMERS", 8)
        conns = [self.connect() for _ in range(consumers)]
        lock = threading.Lock()
        settled = [0]
        finished = [0.0]    # when the last event was settled: consumers still waiting then are not counted
        errors = []

        def run(conn):
            try:
                while True:
                    with lock:
                        if settled[0] >= n:
                            return
                    got = step(conn)
                    if got == 0:
                        with lock:
                            if settled[0] >= n:
                                return
                        continue
                    with lock:
                        settled[0] += got
                        if settled[0] >= n and not finished[0]:
                            finished[0] = time.time()
            except Exception as e:  # reported after the join
                errors.append(e)

        threads = [threading.Thread(target=run, args=(c,)) for c in conns]
        start = time.time()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        took = (finished[0] or time.time()) - start
        for c in conns:
            c.close()
        if errors:
            raise errors[0]
        return n / took

    def eventgrid_step(self, conn):
        with conn.cursor() as cur:
            cur.execute("SELECT array_agg(lock_token) FROM eventgrid.receive('pull', 'consumers', 100, 10)")
            tokens = cur.fetchone()[0]
            if not tokens:
                return 0
            cur.execute("SELECT count(*) FILTER (WHERE succeeded) FROM eventgrid.acknowledge('pull', 'consumers', %s)",
                        (tokens,))
            return cur.fetchone()[0]

    def plain_step(self, conn):
        with conn.cursor() as cur:
            cur.execute("UPDATE bench_plain_queue q SET vt = clock_timestamp() + interval '300 seconds', read_ct = read_ct + 1"
                        " WHERE q.msg_id IN (SELECT msg_id FROM bench_plain_queue WHERE vt <= clock_timestamp()"
                        "                     ORDER BY msg_id LIMIT 100 FOR UPDATE SKIP LOCKED)"
                        " RETURNING q.msg_id, q.read_ct, q.message")
            ids = [r[0] for r in cur.fetchall()]
            if not ids:
                time.sleep(0.01)
                return 0
            cur.execute("DELETE FROM bench_plain_queue WHERE msg_id = ANY (%s)", (ids,))
            return cur.rowcount

    def pgmq_step(self, conn):
        with conn.cursor() as cur:
            cur.execute("SELECT array_agg(msg_id) FROM pgmq.read('bench', 300, 100)")
            ids = cur.fetchone()[0]
            if not ids:
                time.sleep(0.01)
                return 0
            cur.execute("SELECT count(*) FROM pgmq.delete('bench', %s::bigint[])", (ids,))
            return cur.fetchone()[0]

    def pgmq_run(self, n, script):
        """pgmq itself: its install script run into schema pgmq once (it creates the schema when no extension
        pgmq exists), a fresh queue, the same events sent in batches of 1,000, then the same consumers."""
        if not self.b.one("SELECT to_regnamespace('pgmq') IS NOT NULL"):
            with open(script) as f:
                self.b.q(f.read())
        self.b.q("SELECT pgmq.drop_queue('bench') FROM pgmq.meta WHERE queue_name = 'bench'")
        self.b.q("SELECT pgmq.create('bench')")
        done = 0
        while done < n:
            k = min(1000, n - done)
            self.b.q("SELECT count(*) FROM pgmq.send_batch('bench', ARRAY("
                     " SELECT jsonb_build_object('specversion', '1.0', 'id', 'p-' || %s || '-' || g, 'source', '/bench',"
                     "        'type', 'Bench.OrderCreated', 'data', s.event->'data')"
                     "   FROM generate_series(1, %s) g JOIN bench_src s ON s.event->'data'->>'orderId' = ((g - 1) %% %s + 1)::text))",
                     (done, k, self.b.src_n))
            done += k
        self.b.q("VACUUM ANALYZE pgmq.q_bench")
        rate = self.consume(n, self.pgmq_step)
        left = self.b.one("SELECT count(*) FROM pgmq.q_bench")
        if left:
            raise RuntimeError(f"{left} messages left in pgmq's queue")
        self.b.q("SELECT pgmq.drop_queue('bench')")
        return rate

    def eventgrid_run(self, n):
        self.b.reset_queue()
        self.b.q("SELECT eventgrid.create_topic('pull', 'CloudEventSchemaV1_0', 'namespace')")
        self.b.q("SELECT eventgrid.create_event_subscription('pull', 'consumers', delivery_mode => 'queue',"
                 " receive_lock_duration => 300)")
        self.b.q("VACUUM ANALYZE eventgrid.queue_events")
        start = time.time()
        self.publish(n)
        published = time.time()
        while self.b.one("SELECT receivable_events FROM eventgrid.queue_metrics WHERE event_subscription = 'consumers'") < n:
            time.sleep(0.05)
        moved = time.time() - published
        rate = self.consume(n, self.eventgrid_step)
        left = self.b.one("SELECT (SELECT count(*) FROM eventgrid.queue_events)"
                          " + (SELECT count(*) FROM eventgrid.queue_batches)")
        if left:
            raise RuntimeError(f"{left} events left in the queue")
        return rate, n / moved, n / (published - start)

    def plain_run(self, n):
        self.b.q("DROP TABLE IF EXISTS bench_plain_queue")
        self.b.q("CREATE TABLE bench_plain_queue (msg_id bigserial PRIMARY KEY, read_ct int NOT NULL DEFAULT 0,"
                 " enqueued_at timestamptz NOT NULL DEFAULT now(), vt timestamptz NOT NULL DEFAULT clock_timestamp(),"
                 " message jsonb)")
        self.b.q("CREATE INDEX ON bench_plain_queue (vt)")
        self.b.q("INSERT INTO bench_plain_queue (message)"
                 " SELECT jsonb_build_object('specversion', '1.0', 'id', 'p-' || g, 'source', '/bench',"
                 "        'type', 'Bench.OrderCreated', 'data', s.event->'data')"
                 "   FROM generate_series(1, %s) g JOIN bench_src s ON s.event->'data'->>'orderId' = ((g - 1) %% %s + 1)::text",
                 (n, self.b.src_n))
        self.b.q("VACUUM ANALYZE bench_plain_queue")
        rate = self.consume(n, self.plain_step)
        self.b.q("DROP TABLE bench_plain_queue")
        return rate

    def latency(self):
        seconds = env_int("BENCH_PULL_SECONDS", 10)
        self.b.reset_queue()
        self.b.q("SELECT eventgrid.create_topic('pull', 'CloudEventSchemaV1_0', 'namespace')")
        self.b.q("SELECT eventgrid.create_event_subscription('pull', 'waiting', delivery_mode => 'queue')")
        received = {}
        stop = threading.Event()

        def consumer():
            conn = self.connect()
            with conn.cursor() as cur:
                while not stop.is_set():
                    cur.execute("SELECT lock_token, event->>'id' FROM eventgrid.receive('pull', 'waiting', 1, 10)")
                    rows = cur.fetchall()
                    now = time.time()
                    for token, eid in rows:
                        received[eid] = now
                        cur.execute("SELECT eventgrid.acknowledge('pull', 'waiting', ARRAY[%s])", (token,))
            conn.close()

        t = threading.Thread(target=consumer)
        t.start()
        time.sleep(1)
        pub = self.connect()
        committed = {}
        with pub.cursor() as cur:
            for i in range(seconds * 50):
                eid = f"lat-{i}"
                cur.execute("INSERT INTO eventgrid.events (topic, event) VALUES ('pull', jsonb_build_object("
                            "'specversion', '1.0', 'id', %s, 'source', '/bench', 'type', 'Bench.Latency'))", (eid,))
                committed[eid] = time.time()
                time.sleep(0.02)
        deadline = time.time() + 15
        while len(received) < len(committed) and time.time() < deadline:
            time.sleep(0.05)
        # one more event ends the consumer's wait
        stop.set()
        with pub.cursor() as cur:
            cur.execute("INSERT INTO eventgrid.events (topic, event) VALUES ('pull', jsonb_build_object("
                        "'specversion', '1.0', 'id', 'end', 'source', '/bench', 'type', 'Bench.Latency'))")
        t.join()
        pub.close()
        lat = sorted((received[k] - v) * 1000 for k, v in committed.items() if k in received)
        return lat, len(committed) - len(lat)

    def run(self):
        n = env_int("BENCH_PULL_EVENTS", 200000)
        script = os.environ.get("BENCH_PGMQ_SQL")
        if not script:
            print("figure 21: BENCH_PGMQ_SQL is not set, so pgmq itself is not measured (set it to the path of"
                  " pgmq--1.5.1.sql, pgmq's install script)", flush=True)
        runs = {"eventgrid": [], "plain": [], "pgmq": [], "moved": [], "published": []}
        for _ in range(2):
            rate, moved, published = self.eventgrid_run(n)
            runs["eventgrid"].append(rate)
            runs["moved"].append(moved)
            runs["published"].append(published)
            runs["plain"].append(self.plain_run(n))
            if script:
                runs["pgmq"].append(self.pgmq_run(n, script))
        consumers = env_int("BENCH_PULL_CONSUMERS", 8)
        self.b.report("pull_receive_ack_per_s",
                      f"21 pull: receive(100) + acknowledge, {consumers} consumers, {n:,} events, mean of 2",
                      statistics.mean(runs["eventgrid"]), "events/s")
        self.b.report("pull_plain_queue_per_s", "  a plain SKIP LOCKED queue table read as pgmq reads, the same",
                      statistics.mean(runs["plain"]), "events/s")
        self.b.report("pull_vs_plain", "  ratio", self.b.results["pull_receive_ack_per_s"]
                      / self.b.results["pull_plain_queue_per_s"], "", ">= 1 (ahead)")
        if script:
            self.b.report("pull_pgmq_per_s", "  pgmq 1.5.1: read(300, 100) + delete(ids), the same",
                          statistics.mean(runs["pgmq"]), "events/s")
            self.b.report("pull_vs_pgmq", "  ratio to pgmq", self.b.results["pull_receive_ack_per_s"]
                          / self.b.results["pull_pgmq_per_s"], "", ">= 1 (ahead)")
        self.b.report("pull_published_per_s", "  publish of the backlog (INSERT ... SELECT)",
                      statistics.mean(runs["published"]), "events/s")
        self.b.report("pull_moved_per_s", "  the delivery workers making it receivable after it (references)",
                      statistics.mean(runs["moved"]), "events/s")
        lat, missing = self.latency()
        p = lambda xs, q: xs[min(len(xs) - 1, int(q * len(xs)))]
        self.b.report("pull_latency_p50_ms", "  commit to receive, a waiting consumer, p50", p(lat, 0.50), "ms")
        self.b.report("pull_latency_p99_ms", "  commit to receive p99", p(lat, 0.99), "ms")
        self.b.report("pull_latency_max_ms", "  commit to receive max", lat[-1], "ms")
        if missing:
            self.b.report("pull_latency_missing", "  events not received", missing, "events")
