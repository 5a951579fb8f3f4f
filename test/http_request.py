#!/usr/bin/python3
"""One raw HTTPS request to the HTTP listener, for what the Azure SDKs never
send (wrong content types, bad paths, oversized or slow bodies).

    http_request.py METHOD URL [HEADER:VALUE ...] [--body TEXT | --body-file F]
                    [--declare-length N]

--declare-length sends a Content-Length of N and no body, then waits for the
answer (a server that reads the body first would wait for it).  Prints
"STATUS BODY".  The CA file is in REQUESTS_CA_BUNDLE."""
import http.client
import os
import ssl
import sys
import urllib.parse

method, url = sys.argv[1], sys.argv[2]
headers, body, declared = {}, None, None
args = sys.argv[3:]
while args:
    a = args.pop(0)
    if a == '--body':
        body = args.pop(0).encode()
    elif a == '--body-file':
        body = open(args.pop(0), 'rb').read()
    elif a == '--declare-length':
        declared = args.pop(0)
    else:
        k, v = a.split(':', 1)
        headers[k] = v.strip()
u = urllib.parse.urlsplit(url)
ctx = ssl.create_default_context(cafile=os.environ['REQUESTS_CA_BUNDLE'])
conn = http.client.HTTPSConnection(u.hostname, u.port, context=ctx, timeout=20)
path = u.path + ('?' + u.query if u.query else '')
if declared is not None:
    conn.putrequest(method, path)
    for k, v in headers.items():
        conn.putheader(k, v)
    conn.putheader('Content-Length', declared)
    conn.endheaders()
else:
    conn.request(method, path, body=body, headers=headers)
r = conn.getresponse()
print(r.status, r.read().decode())
