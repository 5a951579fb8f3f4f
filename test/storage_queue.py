#!/usr/bin/python3
"""The Azure Storage queue side of test/t/077_storage_queue.pl, through
Microsoft's Python client (azure.storage.queue, Debian's
python3-azure-storage) against Azurite's Queue service:

  storage_queue.py <queue endpoint> create <queue>
  storage_queue.py <queue endpoint> clear <queue>     (bench/destinations.py, between drains)
  storage_queue.py <queue endpoint> sas <queue> [permissions]
      prints a SAS token allowing add (or the permissions given: r, a, u, p), for an hour
  storage_queue.py <queue endpoint> receive <queue>   prints each message as a JSON line:
      {"event": <the message text base64-decoded, parsed as JSON>, "ttl": <expires_on - inserted_on in seconds>}

The account is Azurite's development account (devstoreaccount1 and its
well-known key)."""
import base64
import datetime
import json
import sys

from azure.storage.queue import QueueServiceClient, QueueSasPermissions, generate_queue_sas

ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def main():
    endpoint, command, queue = sys.argv[1:4]
    svc = QueueServiceClient(account_url=endpoint, credential={"account_name": ACCOUNT, "account_key": KEY})
    if command == "create":
        svc.create_queue(queue)
    elif command == "clear":
        svc.get_queue_client(queue).clear_messages()
    elif command == "sas":
        permission = QueueSasPermissions.from_string(sys.argv[4] if len(sys.argv) > 4 else "a")
        print(generate_queue_sas(ACCOUNT, queue, KEY, permission=permission,
                                 expiry=datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)))
    elif command == "receive":
        q = svc.get_queue_client(queue)
        for m in q.receive_messages(messages_per_page=32, visibility_timeout=300):
            ttl = (m.expires_on - m.inserted_on).total_seconds() if m.expires_on else -1
            print(json.dumps({"event": json.loads(base64.b64decode(m.content)), "ttl": ttl}))
    else:
        sys.exit("unknown command " + command)


if __name__ == "__main__":
    main()
