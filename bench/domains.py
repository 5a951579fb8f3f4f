"""Figure 24 of the eventgrid benchmark (bench/domains.sh runs it): event
domains at SaaS scale.  For each size in BENCH_DOMAIN_TOPICS (10000,100000)
a domain of that many domain topics, each with one event subscription, and
beside it a plain topic with one subscription.  BENCH_DOMAIN_EVENTS (20,000)
Event Grid events of about 300 bytes are published with publish(), 100 a
call, one session, while delivery is paused (pause_delivery(): what is
measured is the publish alone): to the plain topic, and to the domain, each
event naming the next domain topic in turn.  Printed per case: publish
events/s and the ratio to the plain topic, and then, delivery resumed, how
long until every event was delivered (events/s), and the planner's view of
one domain topic's read (the index it uses).
"""
import argparse
import json
import os
import sys
import time

import psycopg2

EVENTS = int(os.environ.get("BENCH_DOMAIN_EVENTS", "20000"))
SIZES = [int(x) for x in os.environ.get("BENCH_DOMAIN_TOPICS", "10000,100000").split(",")]
BATCH = 100


def event(i, topic=None):
    e = {"id": f"e-{i}", "subject": f"/orders/{i}", "eventType": "Shop.OrderCreated",
         "eventTime": "2024-05-01T12:00:00Z", "data": {"orderId": i, "note": "x" * 120}}
    if topic is not None:
        e["topic"] = topic
    return e


def publish(cur, topic, events):
    t0 = time.monotonic()
    for k in range(0, len(events), BATCH):
        cur.execute("SELECT eventgrid.publish(%s, %s::jsonb)", (topic, json.dumps(events[k:k + BATCH])))
    return time.monotonic() - t0


def delivered(cur, topic):
    cur.execute("SELECT coalesce(sum(c.delivered), 0) FROM eventgrid.subscription_counters c"
                " JOIN eventgrid.event_subscriptions s ON s.id = c.subscription_id WHERE s.topic = %s", (topic,))
    return cur.fetchone()[0]


def drain(cur, topic, want, limit=1800):
    t0 = time.monotonic()
    while delivered(cur, topic) < want:
        if time.monotonic() - t0 > limit:
            return None
        time.sleep(0.2)
    return time.monotonic() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--sink", required=True)
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    conn = psycopg2.connect(host=args.host, port=args.port, dbname="postgres")
    conn.autocommit = True
    cur = conn.cursor()
    cur.execute("CREATE EXTENSION IF NOT EXISTS eventgrid")
    print(f"figure 24: event domains, {EVENTS} events of about 300 bytes, publish() {BATCH} a call, one session")
    rows = []
    for n in SIZES:
        plain, domain = f"plain-{n}", f"saas-{n}"
        cur.execute("SELECT eventgrid.create_topic(%s)", (plain,))
        cur.execute("SELECT eventgrid.create_event_subscription(%s, 'hook', %s)", (plain, args.sink + "/plain"))
        cur.execute("SELECT eventgrid.create_domain(%s)", (domain,))
        t0 = time.monotonic()
        cur.execute("""
            DO $$
            BEGIN
                FOR i IN 1 .. %s LOOP
                    PERFORM eventgrid.create_event_subscription(%s || '/tenant-' || i, 'hook', %s || '/t' || i);
                END LOOP;
            END $$""", (n, domain, args.sink))
        setup = time.monotonic() - t0
        cur.execute("ANALYZE eventgrid.event_subscriptions, eventgrid.subscription_positions")
        cur.execute("SELECT eventgrid.pause_delivery(%s)", (plain,))
        cur.execute("SELECT eventgrid.pause_delivery(%s)", (domain,))
        plain_events = [event(i) for i in range(EVENTS)]
        domain_events = [event(i, f"tenant-{i % n + 1}") for i in range(EVENTS)]
        # alternately, twice each: the ratio from the same minute
        tp = td = 0.0
        for _ in range(2):
            tp += publish(cur, plain, plain_events)
            td += publish(cur, domain, domain_events)
        rp, rd = 2 * EVENTS / tp, 2 * EVENTS / td
        cur.execute("SET enable_seqscan = off")
        cur.execute("EXPLAIN (COSTS OFF) SELECT * FROM eventgrid._unpassed_events(%s, pg_current_snapshot(), NULL, '0', 0)",
                    (domain + "/tenant-1",))
        plan = " ".join(r[0].strip() for r in cur.fetchall() if "Index" in r[0])
        cur.execute("RESET enable_seqscan")
        cur.execute("SELECT eventgrid.resume_delivery(%s)", (plain,))
        dp = drain(cur, plain, 2 * EVENTS)
        cur.execute("SELECT eventgrid.resume_delivery(%s)", (domain,))
        dd = drain(cur, domain, 2 * EVENTS)
        rows.append((n, setup, rp, rd, dp, dd))
        print(f"  {n} domain topics (created with their subscriptions in {setup:.0f} s):")
        print(f"    publish: plain topic {rp:,.0f} events/s, domain {rd:,.0f} events/s: domain costs {rp / rd:.2f}x")
        print(f"    delivery of {2 * EVENTS} events: plain topic {2 * EVENTS / dp:,.0f} events/s" if dp else "    plain: not drained")
        print(f"    delivery of {2 * EVENTS} events to {min(n, EVENTS)} subscriptions: "
              + (f"{2 * EVENTS / dd:,.0f} events/s" if dd else "not drained in 30 min"))
        print(f"    a domain topic's read: {plan[:200]}")
        cur.execute("SELECT eventgrid.drop_topic(%s)", (plain,))
        cur.execute("SELECT eventgrid.drop_domain(%s)", (domain,))
    print("BENCH_RESULT " + json.dumps([{"domain_topics": n, "setup_s": round(s, 1), "publish_plain": round(p),
                                          "publish_domain": round(d), "publish_cost": round(p / d, 2),
                                          "deliver_plain_s": dp and round(dp, 1), "deliver_domain_s": dd and round(dd, 1)}
                                         for n, s, p, d, dp, dd in rows]))


if __name__ == "__main__":
    main()
