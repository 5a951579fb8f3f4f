#!/usr/bin/python3
"""A scriptable webhook receiver for eventgrid's tests and demo.

Listens on 127.0.0.1 (HTTP/1.1, keep-alive) and answers each POST according
to its URL path, then appends one JSON line per request to the log file:
{"time", "path", "headers", "body", "status", "peer_port"} (peer_port tells
connections apart: a kept-alive connection keeps its client port).

Paths:
  /status/NNN[/anything]     answer with status NNN
  /seq/A,B,C[/anything]      n-th request to this exact path gets the n-th
                             status; the last one repeats
  /reset[/anything]          close the connection without answering
  /hang[/anything]           never answer; hold the connection until the
                             client closes it (logged on arrival, with
                             "concurrent": how many requests to this path
                             are held open at that moment, this one included)
  /validate/MODE[/anything]  answer 200; a SubscriptionValidation request
                             (aeg-event-type) gets, by MODE: auto, the body
                             {"validationResponse": <its validationCode>};
                             manual, {}; wrong, a code that is not its own;
                             nul, its code beside "\u0000"; huge, its code
                             beside the number 1e1000000 (JSON that
                             PostgreSQL's jsonb cannot hold)
  any other path             answer 200
OPTIONS requests (the CloudEvents webhook validation handshake) to
  /webhook/allow[/anything]  200 with WebHook-Allowed-Origin: the query's
                             ?origin= or *, and WebHook-Allowed-Rate: ?rate=
                             when given
  any other path             200 without those headers
and are logged with "method": "OPTIONS".
Query ?delay_ms=N waits N milliseconds before answering; ?retry_after=V
adds the header "Retry-After: V" (V as given, delta-seconds or an HTTP-date;
"+N" is the HTTP-date N seconds from the moment of the answer; "long" is
10,000 nines); ?body=T answers with the body T (UTF-8; "long" is 2,000
bytes).
"""
import argparse
import os
import email.utils
import json
import socket
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit, parse_qs

LOCK = threading.Lock()
COUNTS = {}
HANGING = {}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length).decode("utf-8", "replace")
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        parts = url.path.strip("/").split("/")
        status = 200
        with LOCK:
            n = COUNTS.get(self.path, 0)
            COUNTS[self.path] = n + 1
        if parts[0] == "status" and len(parts) > 1:
            status = int(parts[1])
        elif parts[0] == "seq" and len(parts) > 1:
            seq = [int(x) for x in parts[1].split(",")]
            status = seq[min(n, len(seq) - 1)]
        elif parts[0] == "reset":
            status = 0
        validation_answer = None
        if parts[0] == "validate" and self.headers.get("aeg-event-type") == "SubscriptionValidation":
            mode = parts[1] if len(parts) > 1 else "auto"
            try:
                code = json.loads(body)[0]["data"]["validationCode"]
            except (ValueError, LookupError, TypeError):
                code = None
            validation_answer = {"auto": {"validationResponse": code}, "manual": {},
                                 "wrong": {"validationResponse": "NOT-THE-CODE"},
                                 # hostile: JSON text PostgreSQL's jsonb cannot hold
                                 "nul": '{"x": "\\u0000", "validationResponse": %s}' % json.dumps(code),
                                 "huge": '{"n": 1e1000000, "validationResponse": %s}' % json.dumps(code),
                                 }.get(mode, {})
        record = {
            "time": time.time(),
            "path": url.path,
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "body": body,
            "status": status,
            "peer_port": self.client_address[1],
        }
        if parts[0] == "hang":
            self.hang(url.path, record)
            return
        with LOCK:
            with open(self.server.log_path, "a") as f:
                f.write(json.dumps(record) + "\n")
        delay = int(query.get("delay_ms", ["0"])[0])
        if delay:
            time.sleep(delay / 1000.0)
        if status == 0:
            # RST instead of FIN: the client sees a reset connection.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            return
        answer = b""
        if validation_answer is not None:
            if not isinstance(validation_answer, str):
                validation_answer = json.dumps(validation_answer)
            answer = validation_answer.encode("utf-8")
        if "body" in query:
            text = query["body"][0]
            answer = ("x" * 2000 if text == "long" else text).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Length", str(len(answer)))
        if "retry_after" in query:
            value = query["retry_after"][0]
            if value == "long":
                value = "9" * 10000
            elif value.startswith("+"):
                value = email.utils.formatdate(time.time() + int(value[1:]), usegmt=True)
            self.send_header("Retry-After", value)
        self.end_headers()
        if answer:
            self.wfile.write(answer)


    def do_OPTIONS(self):
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        parts = url.path.strip("/").split("/")
        record = {
            "time": time.time(),
            "method": "OPTIONS",
            "path": url.path,
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "body": "",
            "status": 200,
            "peer_port": self.client_address[1],
        }
        with LOCK:
            with open(self.server.log_path, "a") as f:
                f.write(json.dumps(record) + "\n")
        self.send_response(200)
        self.send_header("Content-Length", "0")
        if parts[0] == "webhook" and len(parts) > 1 and parts[1] == "allow":
            self.send_header("WebHook-Allowed-Origin", query.get("origin", ["*"])[0])
            if "rate" in query:
                self.send_header("WebHook-Allowed-Rate", query["rate"][0])
        self.end_headers()

    def hang(self, path, record):
        with LOCK:
            HANGING[path] = HANGING.get(path, 0) + 1
            record["status"] = 0
            record["concurrent"] = HANGING[path]
            with open(self.server.log_path, "a") as f:
                f.write(json.dumps(record) + "\n")
        try:
            while self.connection.recv(4096):
                pass
        except OSError:
            pass
        finally:
            with LOCK:
                HANGING[path] -= 1
        self.close_connection = True


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # the default listen backlog of 5 drops bursts of connects

    def handle_error(self, request, client_address):
        # Clients that drop connections (a worker killed mid-request) are
        # part of the tests, not receiver errors.
        pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--log", required=True, help="JSON-lines file of received requests")
    ap.add_argument("--pid-file", help="file to write this process's pid to, once it listens")
    args = ap.parse_args()
    server = Server(("127.0.0.1", args.port), Handler)
    server.log_path = args.log
    open(args.log, "a").close()
    if args.pid_file:
        with open(args.pid_file, "w") as f:
            f.write(f"{os.getpid()}\n")
    print(f"receiver listening on 127.0.0.1:{args.port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
