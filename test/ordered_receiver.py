#!/usr/bin/python3
"""A webhook receiver that checks ordered delivery per key (test 054).

Listens on 127.0.0.1 (HTTP/1.1, keep-alive).  Each POST carries one event
(an object) or a batch (an array) of Event Grid or CloudEvents events.  The
query of the URL says how to read them:
  key=PATH    the dotted field path of an event's ordering key
  seq=PATH    the dotted field path of its sequence number within its key
  fail=N      N % of first attempts (aeg-delivery-count 0) answer 500,
              chosen by the hash of the first event's id (so the same ones)
  delay_ms=N  wait N milliseconds before answering
  late_first_ms=N  the first request that carries a key (per path) waits
              N milliseconds before it answers 200 (past the sender's
              response timeout: its answer comes too late to count)
An event whose data has "fail": true is always answered 500.

For each path (without the query) the receiver counts how often a request
arrived while another request carrying an event of one of its keys was
still being answered ("overlaps": two requests of one key in flight), and
keeps, per key, the sequence numbers of the events it answered 200, in the
order they arrived.  GET /report returns all of it as JSON:
{path: {"overlaps": n, "requests": n, "failed": n, "max_events": n,
        "keys": {key: [seq, ...]}}}
"""
import argparse
import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit, parse_qs

LOCK = threading.Lock()
STATE = {}


def field(event, path):
    v = event
    for part in path.split("."):
        if not isinstance(v, dict) or part not in v:
            return None
        v = v[part]
    if isinstance(v, (dict, list)) or v is None:
        return None
    return json.dumps(v) if not isinstance(v, str) else v


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def do_GET(self):
        with LOCK:
            body = json.dumps({p: {k: v for k, v in s.items() if k not in ("inflight", "seen")}
                               for p, s in STATE.items()}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        payload = json.loads(self.rfile.read(length).decode("utf-8"))
        url = urlsplit(self.path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        events = payload if isinstance(payload, list) else [payload]
        keys = [field(e, q["key"]) if "key" in q else None for e in events]
        held = sorted({k for k in keys if k is not None})
        with LOCK:
            s = STATE.setdefault(url.path, {"overlaps": 0, "requests": 0, "failed": 0, "max_events": 0,
                                            "keys": {}, "inflight": {}})
            s["requests"] += 1
            s["max_events"] = max(s["max_events"], len(events))
            seen = s.setdefault("seen", set())
            late = "late_first_ms" in q and any(k not in seen for k in held)
            seen.update(held)
            for k in held:
                if s["inflight"].get(k, 0) > 0:
                    s["overlaps"] += 1
                s["inflight"][k] = s["inflight"].get(k, 0) + 1
        try:
            if "delay_ms" in q:
                time.sleep(int(q["delay_ms"]) / 1000.0)
            if late:
                time.sleep(int(q["late_first_ms"]) / 1000.0)
            status = 200
            if any(isinstance(e.get("data"), dict) and e["data"].get("fail") is True for e in events):
                status = 500
            elif "fail" in q and self.headers.get("aeg-delivery-count") == "0":
                h = int(hashlib.sha256(str(events[0].get("id")).encode()).hexdigest(), 16)
                if h % 100 < int(q["fail"]):
                    status = 500
            with LOCK:
                if status == 200:
                    for e, k in zip(events, keys):
                        seq = field(e, q["seq"]) if "seq" in q else None
                        s["keys"].setdefault(k if k is not None else "(none)", []).append(
                            int(seq) if seq is not None else None)
                else:
                    s["failed"] += 1
        finally:
            with LOCK:
                for k in held:
                    s["inflight"][k] -= 1
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
