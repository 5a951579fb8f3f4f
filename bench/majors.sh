#!/usr/bin/env bash
# Figures 2-4 (single-event, batched and fan-out delivery) on PostgreSQL 15,
# 17 and 18, each inside the chroot of the Debian suite that ships it
# (bench/run.sh --pg N), the majors taken in turn for BENCH_ROUNDS rounds
# (default 2) so that a slow spell of the machine falls on all of them;
# then each figure's median per major and its ratio to 15.  Sizes come from
# bench/run.sh's environment (BENCH_EVENTS, default 200,000).  No figure is
# asserted; bench/RESULTS.md ("Every major") holds what it printed.
#   ./bench/majors.sh            (as root, or through sudo)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
majors=${BENCH_MAJORS:-15 17 18}
rounds=${BENCH_ROUNDS:-2}
results=$(mktemp /tmp/eventgrid-majors-XXXXXX)
trap 'rm -f "$results"' EXIT
for round in $(seq "$rounds"); do
    for major in $majors; do
        echo "== round $round, PostgreSQL $major"
        out=$("$here/run.sh" --pg "$major" --only 2 2>&1) || { echo "$out" | tail -n 40; exit 1; }
        echo "$out" | grep -E '^ *[234] |events/s|deliveries/s' | head -n 8
        echo "$out" | sed -n "s/^BENCH_RESULT /$major /p" >> "$results"
    done
done
python3 - "$results" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    major, blob = line.split(" ", 1)
    for k, v in json.loads(blob).items():
        rows.setdefault(k, {}).setdefault(major, []).append(v)
keys = [("http_limit_rps", "1 HTTP limit (wrk), requests/s"),
        ("single_events_per_s", "2 single-event delivery, events/s"),
        ("single_cpu_us_per_delivery", "  CPU of all PostgreSQL, us/delivery"),
        ("single_worker_cpu_us_per_delivery", "  of which the delivery workers"),
        ("single_wal_bytes_per_delivery", "  WAL bytes per delivery"),
        ("batched_events_per_s", "3 batched delivery, events/s"),
        ("batched_cpu_us_per_delivery", "  CPU of all PostgreSQL, us/delivery"),
        ("batched_worker_cpu_us_per_delivery", "  of which the delivery workers"),
        ("fanout_deliveries_per_s", "4 fan-out, deliveries/s"),
        ("fanout_cpu_us_per_delivery", "  CPU of all PostgreSQL, us/delivery"),
        ("fanout_worker_cpu_us_per_delivery", "  of which the delivery workers")]
majors = sorted({m for r in rows.values() for m in r}, key=int)
print("\n== figures 1-4 by major (median of %s runs; each run's figure in brackets)" % ", ".join(
    "%s: %d" % (m, len(rows[keys[1][0]].get(m, []))) for m in majors))
print("%-40s" % "figure" + "".join("%22s" % ("PostgreSQL " + m) for m in majors) + "".join(
    "%10s" % (m + "/15") for m in majors if m != "15"))
for k, label in keys:
    med = {m: statistics.median(rows[k][m]) for m in majors if m in rows.get(k, {})}
    if not med:
        continue
    line = "%-40s" % label + "".join("%22s" % ("%.1f [%s]" % (med[m], " ".join("%.1f" % v for v in rows[k][m])))
                                     for m in majors if m in med)
    line += "".join("%10.2f" % (med[m] / med["15"]) for m in majors if m != "15" and m in med and "15" in med)
    print(line)
PY
