#!/usr/bin/python3
"""The RabbitMQ side of test/t/078_rabbitmq.pl and bench/destinations.py,
through pika (RabbitMQ's Python client, Debian's python3-pika) against a
real broker:

  rabbitmq.py <amqp URL> queue <queue> [max_length]    declares a durable queue
      (with x-max-length and x-overflow reject-publish when max_length is given)
  rabbitmq.py <amqp URL> exchange <exchange> <queue> <key>
      declares a durable direct exchange and binds queue to it with key
  rabbitmq.py <amqp URL> purge <queue>
  rabbitmq.py <amqp URL> count <queue>                  prints how many messages it holds
  rabbitmq.py <amqp URL> get <queue>                    takes every message, printing each as a JSON line:
      {"body": <the body parsed as JSON>, "content_type": ..., "message_id": ...,
       "delivery_mode": ..., "headers": {...}}
"""
import json
import sys

import pika


def main():
    url, command, queue = sys.argv[1:4]
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    if command == "queue":
        args = {}
        if len(sys.argv) > 4:
            args = {"x-max-length": int(sys.argv[4]), "x-overflow": "reject-publish"}
        ch.queue_declare(queue, durable=True, arguments=args)
    elif command == "exchange":
        exchange, bound, key = sys.argv[3:6]
        ch.exchange_declare(exchange, exchange_type="direct", durable=True)
        ch.queue_bind(bound, exchange, routing_key=key)
    elif command == "purge":
        ch.queue_purge(queue)
    elif command == "count":
        print(ch.queue_declare(queue, passive=True).method.message_count)
    elif command == "get":
        while True:
            method, props, body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                break
            print(json.dumps({"body": json.loads(body), "content_type": props.content_type,
                              "message_id": props.message_id, "delivery_mode": props.delivery_mode,
                              "headers": props.headers or {}}))
    else:
        sys.exit("unknown command " + command)
    conn.close()


if __name__ == "__main__":
    main()
