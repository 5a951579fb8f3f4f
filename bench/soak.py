#!/usr/bin/python3
"""eventgrid soak (started by bench/soak.sh): at-least-once under a long run
of mixed trouble, counted at the receivers.

For --minutes (default 30), three databases each publish at a steady rate
(--rate events a second per database) to one topic with their share of 50
event subscriptions (some batching), whose receivers, in this process on
127.0.0.1, misbehave by path:
  ok      answers 200
  slow    answers 200 after 0.2-1.5 s
  flap    answers 200 for 40 s, then 503 for 20 s, again and again
  busy    answers 429 with Retry-After: 2 to one request in three
  away    a receiver of its own that goes away (its port closed) for 60 s
          every 5 minutes
Meanwhile the script, every --every seconds, takes the next of: restart the
server (fast), restart it (immediate), kill -9 a delivery worker, VACUUM
FULL eventgrid's tables, DDL (a table created and published, an event
subscription created and dropped, both dropped again), pause a topic for
20 s and resume it; and once, at a third of the run, holds a REPEATABLE READ
snapshot open for 5 minutes (no restart or kill meanwhile: either would
end it).

Beside them: an ordered event subscription (ordering_key data.key, 20 keys)
in soak_a, whose receiver checks each key's order (an event may come again
right after itself, never after a later one of its key), and a namespace
topic 'jobs' in soak_b with a queue event subscription that three consumer
threads receive from and acknowledge (pull delivery), fed by a publisher of
its own at the same rate.

The paths of 0.21.0 and 0.22.0 beside them: a publisher over the HTTP
listener (Event Grid's data plane, with soak_c's key, into soak_c's topic:
a 200 counts as published), one of the pull consumers over HTTP (receive
and acknowledge), an event domain 'tenants' in soak_c whose publisher
spreads its events over 1,000 domain topics (a domain-scope subscription
gets them all, a domain-topic one only tenant-7's), and an event
subscription of soak_a that expires halfway (deadletter on): every event
committed before its expiration time must have arrived or be dead-lettered
with reason SubscriptionExpired.

Then the trouble stops, every receiver answers 200, and the workers' clock
(eventgrid.clock_offset) moves ahead until nothing is pending, so that the
retries still waiting come due.  Prints: events published (commits that
returned), deliveries expected (published x matching subscriptions),
delivered at least once (counted at the receivers), lost (expected and
never arrived: must be 0), duplicates (arrivals beyond the first), delivery
workers' memory (RssAnon) and the queue (pending) near the start and at the
end, and p99 commit-to-arrival of first arrivals per 5-minute window.  The
last line is "SOAK_RESULT {json}".  Nothing is asserted: this measures.
"""
import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import urllib.error
import urllib.request

import psycopg2
import psycopg2.errors

DATABASES = ['soak_a', 'soak_b', 'soak_c']
SUBSCRIPTIONS = 50
KINDS = ['ok', 'slow', 'flap', 'busy', 'away']


class Arrivals:
    """What the receivers got: first arrival time per (subscription, event id), and every arrival;
    of ordered ones, per key the sequence numbers in arrival order."""

    def __init__(self):
        self.lock = threading.Lock()
        self.first = {}
        self.total = 0
        self.keys = {}

    def add(self, sub, ids):
        now = time.time()
        with self.lock:
            for i in ids:
                self.total += 1
                self.first.setdefault((sub, i), now)

    def add_ordered(self, sub, events):
        with self.lock:
            for e in events:
                self.keys.setdefault((sub, e['data']['key']), []).append(e['data']['n'])

    def order_violations(self):
        """Keys whose arrivals, each run of one event arriving again right after itself counted once, are
        not in increasing order: (key, the arrivals)."""
        bad = []
        with self.lock:
            for k, seen in self.keys.items():
                once = [n for i, n in enumerate(seen) if i == 0 or n != seen[i - 1]]
                if any(b <= a for a, b in zip(once, once[1:])):
                    bad.append((k, seen))
        return bad


ARRIVALS = Arrivals()
STATE = {'calm': False, 'started': time.time()}


class Handler(BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get('Content-Length', 0)))
        _, kind, sub = self.path.split('/')[:3]
        status, extra = 200, {}
        if not STATE['calm']:
            if kind == 'slow':
                time.sleep(random.uniform(0.2, 1.5))
            elif kind == 'flap' and (time.time() - STATE['started']) % 60 >= 40:
                status = 503
            elif kind == 'busy' and random.random() < 1 / 3:
                status, extra = 429, {'Retry-After': '2'}
        if status == 200:
            doc = json.loads(body)
            events = doc if isinstance(doc, list) else [doc]
            ARRIVALS.add(sub, [e['id'] for e in events])
            if kind == 'ordered':
                ARRIVALS.add_ordered(sub, events)
        self.send_response(status)
        for k, v in extra.items():
            self.send_header(k, v)
        self.send_header('Content-Length', '0')
        self.end_headers()


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        pass  # a connection reset by a worker killed or restarted: part of the soak


def serve(port):
    server = Server(('127.0.0.1', port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def free_port():
    import socket
    s = socket.socket()
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Soak:
    def __init__(self, args):
        self.args = args
        self.stop = threading.Event()
        self.committed = {db: {} for db in DATABASES}  # event id -> commit time
        self.committed['jobs'] = {}  # the pulled topic's events
        self.committed['domain'] = {}  # the domain's events, and of those tenant-7's
        self.committed['tenant-7'] = {}
        self.subs = {}  # subscription name -> the key of self.committed its events are in
        self.holding = False
        self.crashes = ('restart (fast)', 'restart (immediate)', 'kill -9 a delivery worker')
        self.log = []

    def connect(self, db='postgres'):
        c = psycopg2.connect(host=self.args.host, port=self.args.port, dbname=db, user='postgres',
                             connect_timeout=5)
        c.autocommit = True
        return c

    def sql(self, db, q, retry=True):
        for attempt in range(600):
            try:
                c = self.connect(db)
                try:
                    cur = c.cursor()
                    cur.execute(q)
                    return cur.fetchall() if cur.description else None
                finally:
                    c.close()
            except psycopg2.errors.QueryCanceled:
                raise  # cancelled by hand (an OperationalError too): not a restart to wait out
            except psycopg2.OperationalError:
                if not retry:
                    raise
                time.sleep(0.5)
        raise RuntimeError('the server did not come back')

    def note(self, what):
        line = '%7.1f s  %s' % (time.time() - self.t0, what)
        self.log.append(line)
        print(line, flush=True)

    # --- set-up
    def set_up(self, ok_url, away_url):
        for db in DATABASES:
            self.sql('postgres', 'DROP DATABASE IF EXISTS %s' % db)
            self.sql('postgres', 'CREATE DATABASE %s' % db)
            self.sql(db, 'CREATE EXTENSION eventgrid')
            self.sql(db, "SELECT eventgrid.create_topic('orders')")
        for k in range(SUBSCRIPTIONS):
            db = DATABASES[k % len(DATABASES)]
            kind = KINDS[k % len(KINDS)]
            name = 'sub-%02d-%s' % (k, kind)
            url = (away_url if kind == 'away' else ok_url) + '/%s/%s' % (kind, name)
            batch = ', max_events_per_batch => 10' if k % 4 == 3 else ''
            self.sql(db, "SELECT eventgrid.create_event_subscription('orders', '%s', '%s'%s)" % (name, url, batch))
            self.subs[name] = db
        # an ordered subscription (its receiver checks each key's order), and a pulled queue
        self.sql(DATABASES[0], "SELECT eventgrid.create_event_subscription('orders', 'sub-ordered', '%s/ordered/sub-ordered',"
                               " ordering_key => 'data.key')" % ok_url)
        self.subs['sub-ordered'] = DATABASES[0]
        self.sql(DATABASES[1], "SELECT eventgrid.create_topic('jobs', 'CloudEventSchemaV1_0', 'namespace')")
        self.sql(DATABASES[1], "SELECT eventgrid.create_event_subscription('jobs', 'sub-pulled', delivery_mode => 'queue',"
                               " receive_lock_duration => 60)")
        self.subs['sub-pulled'] = 'jobs'
        # the HTTP data plane's keys; an event domain of 1,000 tenants; a subscription that expires halfway
        self.http_key = self.sql(DATABASES[2], "SELECT key1 FROM eventgrid.topic_keys WHERE topic = 'orders'")[0][0]
        self.jobs_key = self.sql(DATABASES[1], "SELECT key1 FROM eventgrid.topic_keys WHERE topic = 'jobs'")[0][0]
        self.sql(DATABASES[2], "SELECT eventgrid.create_domain('tenants')")
        self.sql(DATABASES[2], "SELECT eventgrid.create_event_subscription('tenants', 'sub-domain', '%s/ok/sub-domain')" % ok_url)
        self.subs['sub-domain'] = 'domain'
        self.sql(DATABASES[2], "SELECT eventgrid.create_event_subscription('tenants/tenant-7', 'sub-tenant-7',"
                               " '%s/ok/sub-tenant-7')" % ok_url)
        self.subs['sub-tenant-7'] = 'tenant-7'
        self.expires_at = self.sql(DATABASES[0], "SELECT extract(epoch FROM eventgrid._now() + interval '%d seconds')"
                                   % int(self.args.minutes * 30))[0][0]
        self.expires_at = float(self.expires_at)
        self.sql(DATABASES[0], "SELECT eventgrid.create_event_subscription('orders', 'sub-expiring', '%s/ok/sub-expiring',"
                               " deadletter => true, expiration_time => to_timestamp(%f))" % (ok_url, self.expires_at))

    # --- publishers
    def publisher(self, db):
        seq = 0
        interval = 1.0 / self.args.rate
        c = None
        next_at = time.time()
        while not self.stop.is_set():
            next_at += interval
            delay = next_at - time.time()
            if delay > 0:
                time.sleep(delay)
            seq += 1
            eid = '%s-%d' % (db, seq)
            if db == 'jobs':
                eid = 'job-%d' % seq
                event = json.dumps({'specversion': '1.0', 'id': eid, 'source': '/soak', 'type': 'Soak.Job',
                                    'data': {'n': seq, 'pad': 'x' * 200}})
            else:
                event = json.dumps({'id': eid, 'subject': '/orders/%d' % seq, 'eventType': 'Shop.OrderCreated',
                                    'eventTime': '2026-11-26T00:00:00Z',
                                    'data': {'n': seq, 'key': 'k%d' % (seq % 20), 'pad': 'x' * 200}})
            try:
                if c is None:
                    c = self.connect(DATABASES[1] if db == 'jobs' else db)
                cur = c.cursor()
                cur.execute("INSERT INTO eventgrid.events (topic, event) VALUES (%s, %s)",
                            ('jobs' if db == 'jobs' else 'orders', event))
                self.committed[db][eid] = time.time()
            except psycopg2.Error:
                # the commit's outcome is unknown: not counted as published (arrivals of it are extra)
                try:
                    c.close()
                except Exception:
                    pass
                c = None
                time.sleep(0.2)
                next_at = time.time()

    def http_post(self, path, body, key, content_type='application/json', timeout=20):
        req = urllib.request.Request('http://127.0.0.1:%d%s' % (self.args.http_port, path), data=body.encode(),
                                     method='POST', headers={'aeg-sas-key': key, 'Content-Type': content_type})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()

    def http_publisher(self):
        """Publishes soak_c's events over the HTTP listener; a 200 is a commit."""
        seq = 0
        interval = 1.0 / self.args.rate
        next_at = time.time()
        while not self.stop.is_set():
            next_at += interval
            delay = next_at - time.time()
            if delay > 0:
                time.sleep(delay)
            seq += 1
            eid = 'http-%d' % seq
            body = json.dumps([{'id': eid, 'subject': '/orders/h%d' % seq, 'eventType': 'Shop.OrderCreated',
                                'eventTime': '2026-11-26T00:00:00Z', 'dataVersion': '1',
                                'data': {'n': seq, 'pad': 'x' * 200}}])
            try:
                status, _ = self.http_post('/%s/topics/orders/api/events' % DATABASES[2], body, self.http_key)
                if status == 200:
                    self.committed[DATABASES[2]][eid] = time.time()
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)  # the listener restarts with the server: not counted
                next_at = time.time()

    def domain_publisher(self):
        """Publishes to the domain, each event to one of 1,000 domain topics."""
        seq = 0
        interval = 1.0 / self.args.rate
        c = None
        next_at = time.time()
        while not self.stop.is_set():
            next_at += interval
            delay = next_at - time.time()
            if delay > 0:
                time.sleep(delay)
            seq += 1
            eid = 'dom-%d' % seq
            tenant = 'tenant-%d' % (seq % 1000)
            event = json.dumps({'id': eid, 'subject': '/orders/%d' % seq, 'eventType': 'Shop.OrderCreated',
                                'eventTime': '2026-11-26T00:00:00Z', 'topic': tenant, 'data': {'n': seq}})
            try:
                if c is None:
                    c = self.connect(DATABASES[2])
                c.cursor().execute("INSERT INTO eventgrid.events (topic, event) VALUES ('tenants', %s)", (event,))
                now = time.time()
                self.committed['domain'][eid] = now
                if tenant == 'tenant-7':
                    self.committed['tenant-7'][eid] = now
            except psycopg2.Error:
                try:
                    c.close()
                except Exception:
                    pass
                c = None
                time.sleep(0.2)
                next_at = time.time()

    def http_consumer(self):
        """A pull consumer over HTTP: receive and acknowledge through the listener."""
        path = '/%s/topics/jobs/eventsubscriptions/sub-pulled' % DATABASES[1]
        while not (self.stop.is_set() and STATE.get('pull_done')):
            try:
                status, body = self.http_post(path + ':receive?maxEvents=10&maxWaitTime=10', '', self.jobs_key, timeout=40)
                got = json.loads(body).get('value', []) if status == 200 else []
                if not got:
                    continue
                ARRIVALS.add('sub-pulled', [g['event']['id'] for g in got])
                tokens = [g['brokerProperties']['lockToken'] for g in got]
                self.http_post(path + ':acknowledge', json.dumps({'lockTokens': tokens}), self.jobs_key)
            except (urllib.error.URLError, OSError, ValueError):
                time.sleep(0.5)

    # --- pull consumers
    def consumer(self):
        """Receives up to 10 events of the pulled queue at a time and acknowledges them; a received event
        counts as arrived (at least once); reconnects after a restart."""
        c = None
        while not (self.stop.is_set() and STATE.get('pull_done')):
            try:
                if c is None:
                    c = self.connect(DATABASES[1])
                cur = c.cursor()
                cur.execute("SELECT lock_token, event->>'id' FROM eventgrid.receive('jobs', 'sub-pulled', 10, 10)")
                rows = cur.fetchall()
                if not rows:
                    continue
                ARRIVALS.add('sub-pulled', [r[1] for r in rows])
                if not STATE['calm'] and random.random() < 0.05:
                    continue  # now and then a consumer forgets to settle: the locks expire, the events come again
                cur.execute("SELECT count(*) FILTER (WHERE succeeded) FROM eventgrid.acknowledge('jobs', 'sub-pulled', %s)",
                            ([r[0] for r in rows],))
            except psycopg2.Error:
                try:
                    c.close()
                except Exception:
                    pass
                c = None
                time.sleep(0.5)

    # --- measurements
    def worker_memory_kb(self):
        """The delivery workers' RssAnon (kB), how many there are, and what
        their memory contexts hold (kB: PostgreSQL's palloc, from
        pg_log_backend_memory_contexts() in the server log); RssAnon also
        counts what malloc keeps after a peak and libcurl's and OpenSSL's
        memory."""
        total, n, pids = 0, 0, []
        try:
            log_from = os.path.getsize(self.args.log)
        except OSError:
            log_from = None
        for db in DATABASES:
            for (pid,) in self.sql(db, "SELECT pid FROM pg_stat_activity WHERE backend_type = 'eventgrid delivery worker'"
                                       " AND datname = current_database()"):
                try:
                    with open('/proc/%d/status' % pid) as f:
                        for line in f:
                            if line.startswith('RssAnon:'):
                                total += int(line.split()[1])
                                n += 1
                                pids.append(pid)
                except OSError:
                    pass
                self.sql(db, 'SELECT pg_log_backend_memory_contexts(%d)' % pid)
        contexts = 0
        if log_from is not None:
            time.sleep(3)
            with open(self.args.log, errors='replace') as f:
                f.seek(log_from)
                for line in f:
                    m = re.search(r'\[(\d+)\] LOG:  Grand total: (\d+) bytes', line)
                    if m and int(m.group(1)) in pids:
                        contexts += int(m.group(2)) // 1024
        return total, n, contexts

    def queue(self):
        return sum(self.sql(db, 'SELECT coalesce(sum(pending), 0)::bigint FROM eventgrid.delivery_statistics')[0][0]
                   for db in DATABASES)

    # --- trouble
    def delivery_worker_pid(self):
        db = random.choice(DATABASES)
        rows = self.sql(db, "SELECT pid FROM pg_stat_activity WHERE backend_type = 'eventgrid delivery worker'"
                            " AND datname = current_database()")
        return rows[0][0] if rows else None

    def pg_ctl(self, *args):
        subprocess.run(['pg_ctl', '-D', self.args.data_dir, '-l', self.args.log, '-w', '-t', '120'] + list(args),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)

    def actions(self):
        def restart_fast():
            self.pg_ctl('restart', '-m', 'fast')
        def restart_immediate():
            self.pg_ctl('restart', '-m', 'immediate')
        def kill_worker():
            pid = self.delivery_worker_pid()
            if pid:
                os.kill(pid, signal.SIGKILL)
        def vacuum_full():
            for db in DATABASES:
                self.sql(db, 'VACUUM FULL eventgrid.retries, eventgrid.subscription_positions,'
                             ' eventgrid.chunks_in_flight, eventgrid.subscription_counters')
        def ddl():
            db = random.choice(DATABASES)
            self.sql(db, 'CREATE TABLE IF NOT EXISTS churn (id int PRIMARY KEY, v text)')
            self.sql(db, "SELECT eventgrid.create_topic('churn') WHERE NOT EXISTS"
                         " (SELECT FROM eventgrid.topics WHERE name = 'churn')")
            self.sql(db, "SELECT eventgrid.publish_table_changes('churn', 'churn')")
            self.sql(db, "INSERT INTO churn VALUES (1, 'a') ON CONFLICT DO NOTHING")
            self.sql(db, "SELECT eventgrid.create_event_subscription('orders', 'transient', '%s/ok/transient')"
                     % self.ok_url)
            self.sql(db, "SELECT eventgrid.drop_event_subscription('orders', 'transient')")
            self.sql(db, 'DROP TABLE churn')
            self.sql(db, "SELECT eventgrid.drop_topic('churn')")
        def pause():
            db = random.choice(DATABASES)
            self.sql(db, "SELECT eventgrid.pause_delivery('orders')")
            time.sleep(20)
            self.sql(db, "SELECT eventgrid.resume_delivery('orders')")
        return [('restart (fast)', restart_fast), ('restart (immediate)', restart_immediate),
                ('kill -9 a delivery worker', kill_worker), ('VACUUM FULL', vacuum_full),
                ('DDL', ddl), ('pause a topic 20 s', pause)]

    def hold_snapshot(self):
        self.holding = True
        try:
            c = self.connect(DATABASES[0])
            c.autocommit = False
            c.set_session(isolation_level='REPEATABLE READ')
            c.cursor().execute('SELECT count(*) FROM pg_class')
            self.note('a REPEATABLE READ snapshot held open for 5 minutes')
            self.stop.wait(300)
            c.rollback()
            c.close()
            self.note('the snapshot let go')
        except psycopg2.Error as e:
            self.note('the held snapshot ended early: %s' % str(e).strip())
        self.holding = False

    def trouble(self):
        actions = self.actions()
        k = 0
        snapshot_at = self.t0 + self.args.minutes * 60 / 3
        held = False
        while not self.stop.wait(self.args.every):
            if not held and time.time() >= snapshot_at:
                held = True
                threading.Thread(target=self.hold_snapshot, daemon=True).start()
                time.sleep(1)
            name, act = actions[k % len(actions)]
            k += 1
            if self.holding and name in self.crashes:
                # a restart or a crashed worker (the postmaster restarts every
                # backend) would end the held snapshot: not while it is held
                self.note('%s skipped: the snapshot is held' % name)
                continue
            try:
                act()
                self.note(name)
            except Exception as e:  # a step failing is part of the soak's record, not its end
                self.note('%s failed: %s' % (name, str(e).strip()))

    def away(self, port):
        server = serve(port)
        while not self.stop.is_set():
            if self.stop.wait(240):
                break
            server.shutdown()
            server.server_close()
            self.note('the away receiver is gone for 60 s')
            if self.stop.wait(60):
                server = serve(port)
                break
            server = serve(port)
            self.note('the away receiver is back')
        self.away_server = server

    def run(self):
        a = self.args
        port, away_port = free_port(), free_port()
        serve(port)
        self.ok_url = 'http://127.0.0.1:%d' % port
        away_url = 'http://127.0.0.1:%d' % away_port
        self.t0 = time.time()
        STATE['started'] = self.t0
        self.set_up(self.ok_url, away_url)
        threads = [threading.Thread(target=self.publisher, args=(db,), daemon=True) for db in DATABASES + ['jobs']]
        threads += [threading.Thread(target=self.http_publisher, daemon=True),
                    threading.Thread(target=self.domain_publisher, daemon=True)]
        threads.append(threading.Thread(target=self.away, args=(away_port,), daemon=True))
        consumers = [threading.Thread(target=self.consumer, daemon=True) for _ in range(2)]
        consumers.append(threading.Thread(target=self.http_consumer, daemon=True))
        for t in consumers:
            t.start()
        for t in threads:
            t.start()
        time.sleep(60)
        mem_start, queue_start = self.worker_memory_kb(), self.queue()
        self.note('after a minute: delivery workers %d kB RssAnon (%d workers; %d kB in memory contexts), %d pending' %
                  (mem_start + (queue_start,)))
        trouble = threading.Thread(target=self.trouble, daemon=True)
        trouble.start()
        self.stop.wait(a.minutes * 60 - 60)
        self.stop.set()
        for t in threads:
            t.join(timeout=360)
        trouble.join(timeout=360)
        mem_end_busy, queue_end = self.worker_memory_kb(), self.queue()
        self.note('trouble over: delivery workers %d kB RssAnon (%d workers; %d kB in memory contexts), %d pending' %
                  (mem_end_busy + (queue_end,)))
        STATE['calm'] = True
        # the retries still waiting come due: the workers' clock moves ahead
        offset = 0
        drain_start = time.time()
        while self.queue() > 0 and time.time() - drain_start < a.drain_seconds:
            offset += 600
            self.sql('postgres', "ALTER SYSTEM SET eventgrid.clock_offset = '%ds'" % offset)
            self.sql('postgres', 'SELECT pg_reload_conf()')
            time.sleep(10)
        pending_left = self.queue()
        STATE['pull_done'] = True
        for t in consumers:
            t.join(timeout=30)
        mem_end = self.worker_memory_kb()
        self.sql('postgres', 'ALTER SYSTEM RESET eventgrid.clock_offset')
        self.sql('postgres', 'SELECT pg_reload_conf()')
        time.sleep(3)
        self.report(mem_start, queue_start, mem_end_busy, mem_end, queue_end, pending_left, offset)

    def report(self, mem_start, queue_start, mem_end_busy, mem_end, queue_end, pending_left, offset):
        published = sum(len(v) for v in self.committed.values())
        expected = lost = 0
        latencies = {}
        lost_examples = []
        # the expiring subscription: what was committed before its expiration time arrived or was dead-lettered
        expired_dead = set(r[0] for r in self.sql(DATABASES[0], "SELECT event->>'id' FROM eventgrid.dead_letters"
                                                  " WHERE subscription_name = 'sub-expiring'"
                                                  " AND dead_letter_reason = 'SubscriptionExpired'"))
        expiring_owed = [eid for eid, at in self.committed[DATABASES[0]].items() if at < self.expires_at - 1]
        expiring_lost = [eid for eid in expiring_owed
                         if ('sub-expiring', eid) not in ARRIVALS.first and eid not in expired_dead]
        for sub, db in self.subs.items():
            for eid, at in self.committed[db].items():
                expected += 1
                got = ARRIVALS.first.get((sub, eid))
                if got is None:
                    lost += 1
                    if len(lost_examples) < 10:
                        lost_examples.append('%s %s' % (sub, eid))
                else:
                    latencies.setdefault(int((at - self.t0) // 300), []).append((got - at) * 1000)
        delivered = expected - lost
        duplicates = ARRIVALS.total - len(ARRIVALS.first)
        disorder = ARRIVALS.order_violations()
        pulled = len(self.committed['jobs'])
        pulled_got = sum(1 for eid in self.committed['jobs'] if ('sub-pulled', eid) in ARRIVALS.first)
        ordered_got = sum(1 for eid in self.committed[DATABASES[0]] if ('sub-ordered', eid) in ARRIVALS.first)
        print()
        print('| figure | value |')
        print('| --- | --- |')
        rows = [
            ('minutes of trouble', self.args.minutes),
            ('events published (commits that returned)', published),
            ('deliveries expected (events x subscriptions)', expected),
            ('delivered at least once (at the receivers)', delivered),
            ('lost', lost),
            ('duplicates (arrivals beyond the first)', duplicates),
            ('ordered subscription: delivered of published', '%d of %d' % (ordered_got, len(self.committed[DATABASES[0]]))),
            ('ordered subscription: keys out of order', len(disorder)),
            ('pulled queue: received of published (2 SQL consumers, 1 over HTTP)', '%d of %d' % (pulled_got, pulled)),
            ('published over HTTP (200s), into soak_c', sum(1 for e in self.committed[DATABASES[2]] if e.startswith('http-'))),
            ('domain: events over 1,000 domain topics; of them tenant-7\'s',
             '%d; %d' % (len(self.committed['domain']), len(self.committed['tenant-7']))),
            ('expiring subscription: committed before it expired / of them arrived / of them dead-lettered'
             ' SubscriptionExpired / lost; dead-lettered in all (also those committed until it was dropped)',
             '%d / %d / %d / %d; %d' % (len(expiring_owed),
                                        sum(1 for e in expiring_owed if ('sub-expiring', e) in ARRIVALS.first),
                                        sum(1 for e in expiring_owed if e in expired_dead),
                                        len(expiring_lost), len(expired_dead))),
            ('delivery workers RssAnon after 1 min, kB (workers; in memory contexts, kB)', '%d (%d; %d)' % mem_start),
            ('delivery workers RssAnon when the trouble stopped, kB (workers; in memory contexts, kB)', '%d (%d; %d)' % mem_end_busy),
            ('delivery workers RssAnon at the end, kB (workers; in memory contexts, kB)', '%d (%d; %d)' % mem_end),
            ('pending after 1 min', queue_start),
            ('pending when the trouble stopped', queue_end),
            ('pending at the end (clock moved %d s ahead to drain)' % offset, pending_left),
        ]
        for k in sorted(latencies):
            v = sorted(latencies[k])
            rows.append(('p99 commit to arrival, minutes %d-%d, ms (%d deliveries)' % (k * 5, k * 5 + 5, len(v)),
                         '%.0f' % v[min(len(v) - 1, int(len(v) * 0.99))]))
        for name, value in rows:
            print('| %s | %s |' % (name, value))
        if lost_examples:
            print('lost, first ones: ' + ', '.join(lost_examples))
        for (sub, key), seen in disorder[:5]:
            print('out of order: %s key %s: %s' % (sub, key, ','.join(map(str, seen[:60]))))
        print('SOAK_RESULT ' + json.dumps({'published': published, 'expected': expected, 'delivered': delivered,
                                           'lost': lost, 'expiring_lost': len(expiring_lost),
                                           'duplicates': duplicates, 'pending_left': pending_left,
                                           'out_of_order_keys': len(disorder)}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--host', required=True)
    p.add_argument('--port', type=int, required=True)
    p.add_argument('--data-dir', required=True)
    p.add_argument('--log', help='the server log (restarts append to it; memory contexts are read from it)')
    p.add_argument('--http-port', type=int, required=True)
    p.add_argument('--minutes', type=float, default=float(os.environ.get('SOAK_MINUTES', 30)))
    p.add_argument('--rate', type=float, default=float(os.environ.get('SOAK_RATE', 10)))
    p.add_argument('--every', type=float, default=float(os.environ.get('SOAK_EVERY', 40)))
    p.add_argument('--drain-seconds', type=float, default=900)
    args = p.parse_args()
    if not args.log:  # bench/soak.sh's: server.log beside the data directory
        args.log = os.path.join(os.path.dirname(os.path.abspath(args.data_dir)), 'server.log')
    Soak(args).run()


if __name__ == '__main__':
    main()
