#!/usr/bin/python3
"""Publishes through the HTTP listener with Python's Azure SDK (azure-eventgrid's
EventGridPublisherClient), unchanged: only the endpoint, the credential and
the CA that signed the listener's certificate are ours.

    http_publisher.py ENDPOINT CREDENTIAL SECRET KIND COUNT [EXPIRY]

CREDENTIAL: key (AzureKeyCredential: aeg-sas-key), sas (a SAS token that
generate_sas() signs with SECRET, expiring at EXPIRY, an ISO date-time in
UTC, or in an hour; with a '/' it is sent as written, e.g. the
JavaScript SDK's "11/27/2026 2:15:33 PM") or token (SECRET is a SAS token as it is).  KIND:
eventgrid (EventGridEvent), domain:NAME (EventGridEvent whose topic is
NAME: an event domain's domain topic), cloudevent (CloudEvent) or custom
(dicts).
Prints "sent N" or "error STATUS CODE MESSAGE" (the SDK's HttpResponseError).
The CA file is in REQUESTS_CA_BUNDLE."""
import datetime
import json
import os
import sys

from azure.core.credentials import AzureKeyCredential, AzureSasCredential
from azure.core.exceptions import HttpResponseError
from azure.core.messaging import CloudEvent
from azure.eventgrid import EventGridEvent, EventGridPublisherClient, generate_sas

endpoint, credential, secret, kind, count = sys.argv[1:6]
count = int(count)
if credential == 'key':
    cred = AzureKeyCredential(secret)
elif credential == 'sas':
    class Written(str):
        pass                    # generate_sas() signs str(expiry): a string is signed as written
    if len(sys.argv) <= 6:
        expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
    elif '/' in sys.argv[6]:
        expiry = Written(sys.argv[6])
    else:
        expiry = datetime.datetime.fromisoformat(sys.argv[6])
    cred = AzureSasCredential(generate_sas(endpoint, secret, expiry))
else:
    cred = AzureSasCredential(secret)

if kind == 'eventgrid':
    events = [EventGridEvent(subject=f'orders/{i}', event_type='Contoso.Orders.Created',
                             data={'n': i}, data_version='1.0') for i in range(count)]
elif kind.startswith('domain:'):
    events = [EventGridEvent(subject=f'orders/{i}', event_type='Contoso.Orders.Created',
                             data={'n': i}, data_version='1.0', topic=kind[len('domain:'):]) for i in range(count)]
elif kind == 'cloudevent':
    events = [CloudEvent(source='/contoso/orders', type='Contoso.Orders.Created', data={'n': i})
              for i in range(count)]
else:
    events = [{'kind': 'order', 'n': i} for i in range(count)]

client = EventGridPublisherClient(endpoint, cred, connection_verify=os.environ['REQUESTS_CA_BUNDLE'])
try:
    client.send(events)
    print(f'sent {count}')
except HttpResponseError as e:
    err = json.loads(e.response.text()).get('error', {}) if e.response is not None and e.response.text() else {}
    print(f'error {e.status_code} {err.get("code")} {err.get("message")}')
