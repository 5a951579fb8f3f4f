#!/usr/bin/python3
"""Figures 27 and 28: destinations (bench/destinations.sh starts the servers).

The same backlog of ~1 KB events (BENCH_DEST_EVENTS, 200,000), published
while delivery is paused, drained through one event subscription to:
  - a webhook (nginx, return 204): single events, and max_events_per_batch 100;
  - a Redis stream (redis-server, no persistence): single events (each its
    own XADD, pipelined per connection), and with max_events_per_batch 100
    asked for (which a stream does not batch: the same entries);
  - a Storage queue (Azurite's Queue service, an emulator in Node.js:
    what it takes is the emulator's figure, not Azure's), signed with the
    account key;
  - a RabbitMQ queue (rabbitmq-server, a durable queue through the
    default exchange, persistent messages, publisher confirms; figure 28):
    single events, and batches of 100 (one message holding a JSON array);
printed as events a second, the CPU of every PostgreSQL process and of the
delivery workers per event, and Redis's and the broker's own CPU per event.  Each case runs
twice, alternately, and the better run is reported (the machine's other
load moves single runs by a tenth).  BENCH_DEST_PERF=<directory>: perf
record -g of the delivery workers during each case's first drain;
BENCH_DEST_CASES: a comma-separated subset of webhook, webhook_batch100,
redis, redis_batch100, storage_queue, rabbitmq, rabbitmq_batch100; BENCH_DEST_MAX_REQUESTS: eventgrid.max_concurrent_requests
and eventgrid.max_requests_per_endpoint (64 and 32 otherwise).
"""
import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import Bench, env_int  # noqa: E402


# Azurite's development account's well-known key
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def redis_cpu(port):
    out = subprocess.run(["redis-cli", "-p", str(port), "INFO", "cpu"], capture_output=True, text=True).stdout
    f = dict(line.strip().split(":", 1) for line in out.splitlines() if ":" in line)
    return float(f["used_cpu_sys"]) + float(f["used_cpu_user"])


def pid_cpu(pid_file):
    """CPU seconds (user + system) of the process pid_file names."""
    with open(pid_file) as f:
        pid = f.read().strip()
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--sink", required=True)
    ap.add_argument("--redis", required=True)
    ap.add_argument("--redis-port", type=int, required=True)
    ap.add_argument("--queue", required=True, help="a Storage queue's URL (Azurite's development account)")
    ap.add_argument("--amqp", required=True, help="a RabbitMQ endpoint (routing_key: a durable queue)")
    ap.add_argument("--broker-pid-file", required=True)
    ap.add_argument("--data-dir", required=True)
    args = ap.parse_args()
    b = Bench(args)
    b.setup()
    n = env_int("BENCH_DEST_EVENTS", 200000)
    perf_dir = os.environ.get("BENCH_DEST_PERF")

    def drain(case, endpoint, endpoint_type, batch, first):
        b.reset_queue()
        b.q("SELECT eventgrid.create_topic('dest')")
        b.q("SELECT eventgrid.create_event_subscription('dest', 'dest-sub', %s, max_events_per_batch => %s, endpoint_type => %s)",
            (endpoint, batch, endpoint_type))
        if endpoint_type == "StorageQueue":
            b.q("SELECT eventgrid.set_storage_account_key('dest', 'dest-sub', %s)", (AZURITE_KEY,))
        b.set_guc("eventgrid.delivery_paused", "on")
        b.publish_backlog("dest", n)
        b.q("CHECKPOINT")
        workers = b.worker_pids()
        cpu0, r0, m0 = b.cluster_cpu(), redis_cpu(args.redis_port), pid_cpu(args.broker_pid_file)
        rec = None
        if perf_dir and first:
            rec = subprocess.Popen(["perf", "record", "-g", "-F", "999", "-o", os.path.join(perf_dir, f"perf-{case}.data"),
                                    "-p", ",".join(map(str, workers))], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        b.set_guc("eventgrid.delivery_paused", "off")
        t0 = time.time() - 0.3  # set_guc waited 0.3 s after the reload
        t1 = b.wait_drained()
        if rec:
            rec.send_signal(2)
            rec.wait()
        cpu1, r1, m1 = b.cluster_cpu(), redis_cpu(args.redis_port), pid_cpu(args.broker_pid_file)
        delivered, failed = b.q("SELECT c.delivered, c.failed_attempts + c.dead_lettered + c.dropped "
                                "FROM eventgrid.subscription_counters c JOIN eventgrid.event_subscriptions s "
                                "ON s.id = c.subscription_id WHERE s.name = 'dest-sub'")[0]
        if delivered != n or failed != 0:
            raise RuntimeError(f"{case}: {delivered} of {n} delivered, {failed} failures")
        return {"rate": n / (t1 - t0),
                "cpu": sum(v - cpu0.get(p, 0) for p, v in cpu1.items()) * 1e6 / n,
                "worker": sum(cpu1.get(w, 0) - cpu0.get(w, 0) for w in workers) * 1e6 / n,
                "redis": (r1 - r0) * 1e6 / n,
                "broker": (m1 - m0) * 1e6 / n}

    cases = [("webhook", args.sink + "/dest", "WebHook", None),
             ("webhook_batch100", args.sink + "/dest", "WebHook", 100),
             ("redis", args.redis + "/0?stream=bench", "RedisStream", None),
             ("redis_batch100", args.redis + "/0?stream=bench&maxlen=100000", "RedisStream", 100),
             ("storage_queue", args.queue, "StorageQueue", None),
             ("rabbitmq", args.amqp, "RabbitMQ", None),
             ("rabbitmq_batch100", args.amqp, "RabbitMQ", 100)]
    only = os.environ.get("BENCH_DEST_CASES")
    if only:
        cases = [c for c in cases if c[0] in only.split(",")]
    # BENCH_DEST_MAX_REQUESTS: eventgrid.max_concurrent_requests and
    # eventgrid.max_requests_per_endpoint both (64 and 32 by default)
    if os.environ.get("BENCH_DEST_MAX_REQUESTS"):
        b.set_guc("eventgrid.max_concurrent_requests", os.environ["BENCH_DEST_MAX_REQUESTS"])
        b.set_guc("eventgrid.max_requests_per_endpoint", os.environ["BENCH_DEST_MAX_REQUESTS"])
    best = {}
    for rnd in range(2):
        for case, endpoint, etype, batch in cases:
            subprocess.run(["redis-cli", "-p", str(args.redis_port), "FLUSHALL"], capture_output=True)
            account, queue = args.queue.rsplit("/", 1)
            subprocess.run(["/usr/bin/python3", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test",
                                                             "storage_queue.py"), account, "clear", queue], check=True)
            subprocess.run(["/usr/bin/python3", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test",
                                                             "rabbitmq.py"), "amqp://guest:guest@" + args.amqp.split("://", 1)[1].split("/", 1)[0] + "/%2F",
                            "purge", "bench-q"], check=True)
            r = drain(case, endpoint, etype, batch, rnd == 0)
            print(f"# {case} run {rnd + 1}: {r['rate']:,.0f} events/s", flush=True)
            if case not in best or r["rate"] > best[case]["rate"]:
                best[case] = r
    print(f"# {n:,} events of {b.event_size} bytes a drain; the better of two runs", flush=True)
    for case, _, _, _ in cases:
        r = best[case]
        fig = "28" if case.startswith("rabbitmq") else "27"
        b.report(f"{case}_events_per_s", f"{fig} {case}: events a second", r["rate"], "events/s")
        b.report(f"{case}_cpu_us", "  CPU of all PostgreSQL processes per event", r["cpu"], "µs")
        b.report(f"{case}_worker_cpu_us", "  of which the delivery workers", r["worker"], "µs")
        if case.startswith("redis"):
            b.report(f"{case}_redis_cpu_us", "  redis-server's CPU per event", r["redis"], "µs")
        if case.startswith("rabbitmq"):
            b.report(f"{case}_broker_cpu_us", "  rabbitmq-server's CPU per event", r["broker"], "µs")
    if "redis" in best and "webhook" in best:
        b.report("redis_over_webhook", "27 Redis stream / webhook, single events",
                 best["redis"]["rate"] / best["webhook"]["rate"], "x")
    if "rabbitmq" in best and "webhook" in best:
        b.report("rabbitmq_over_webhook", "28 RabbitMQ (confirms) / webhook, single events",
                 best["rabbitmq"]["rate"] / best["webhook"]["rate"], "x")


if __name__ == "__main__":
    main()
