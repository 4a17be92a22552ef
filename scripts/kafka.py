#!/usr/bin/env python3
"""Small Kafka CLI for the local stack and the tests, built on confluent-kafka (the client
itself is scripts/outbox_e2e/kafka.py, which the end-to-end suite calls in-process).

The broker is taken from $KAFKA_BOOTSTRAP_SERVERS (as exported by
scripts/stack.sh) unless --bootstrap is given.  Run it with the stack's venv
python ($OUTBOX_STACK_PYTHON), which has confluent-kafka installed.

Subcommands:
  ping                          wait until the broker answers a metadata request
  create-topic NAME [--partitions N] [--config KEY=VALUE ...]
                                create a topic (idempotent) and wait until the
                                broker's metadata shows it with its partitions
  topics                        print {"topic": partition_count, ...} as JSON
  read NAME [--isolation LEVEL]  print every record of every partition, from the
                                start up to the fetch high watermark, one JSON
                                object per line; with --isolation read_committed
                                or read_uncommitted, of a topic with transactions
  produce NAME [--key K] [--value V] [--header K=V ...] [--partition P]
                                produce one record, print where it landed

Record JSON (read):
  {"topic": str, "partition": int, "offset": int,
   "key": base64|null, "value": base64|null,
   "headers": [[name, base64|null], ...],
   "timestamp": int|null,            # milliseconds since the epoch
   "timestamp_type": "create"|"log_append"|null}

Exit codes: 0 ok, 1 failure or timeout (a message goes to stderr), 2 usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import NoReturn

try:
    from outbox_e2e import kafka
except ImportError:  # pragma: no cover - depends on the interpreter used
    sys.exit(
        "kafka.py: confluent-kafka is not importable by "
        f"{sys.executable}; run scripts/install.sh and use $OUTBOX_STACK_PYTHON"
    )


def die(msg: str) -> NoReturn:
    print(f"kafka.py: {msg}", file=sys.stderr)
    sys.exit(1)


def emit(records: list[dict]) -> None:
    for r in records:
        print(json.dumps(r, separators=(",", ":")))
    sys.stdout.flush()


def cmd_ping(args: argparse.Namespace) -> int:
    print(json.dumps(kafka.ping(args.bootstrap, args.timeout)))
    return 0


def cmd_topics(args: argparse.Namespace) -> int:
    print(json.dumps(kafka.topics(args.bootstrap, args.timeout)))
    return 0


def cmd_create_topic(args: argparse.Namespace) -> int:
    configs = {}
    for kv in args.config:
        key, sep, value = kv.partition("=")
        if not sep or not key:
            print(f"kafka.py: --config {kv!r}: must be KEY=VALUE", file=sys.stderr)
            return 2
        configs[key] = value
    out = kafka.create_topic(args.name, args.partitions, args.bootstrap,
                             args.replication_factor, args.timeout, configs)
    warning = out.pop("warning", None)
    if warning:
        print(f"kafka.py: {warning}", file=sys.stderr)
    print(json.dumps(out))
    return 0


def cmd_read(args: argparse.Namespace) -> int:
    try:
        records = kafka.read_topic(args.name, args.bootstrap, args.partition, args.value_head,
                                   args.timeout, args.expect, args.isolation)
    except kafka.KafkaToolError as e:
        emit(e.records)
        raise
    emit(records)
    return 0


def cmd_produce(args: argparse.Namespace) -> int:
    headers = []
    for h in args.header:
        name, sep, value = h.partition("=")
        if not sep:
            print(f"kafka.py: --header wants NAME=VALUE, got {h!r}", file=sys.stderr)
            return 2
        headers.append((name, value.encode()))
    print(json.dumps(kafka.produce(args.name, args.key, args.value, headers, args.partition,
                                   args.bootstrap, args.timeout)))
    return 0


# ----------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="kafka.py", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--bootstrap", help="default: $KAFKA_BOOTSTRAP_SERVERS")
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("ping", help="wait until the broker answers")
    p.add_argument("--timeout", type=float, default=30.0)
    p.set_defaults(func=cmd_ping)

    p = sub.add_parser("topics", help="list topics and partition counts")
    p.add_argument("--timeout", type=float, default=10.0)
    p.set_defaults(func=cmd_topics)

    p = sub.add_parser("create-topic", help="create a topic (idempotent)")
    p.add_argument("name")
    p.add_argument("--partitions", type=int, default=1)
    p.add_argument("--replication-factor", type=int, default=1)
    p.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                   help="a topic config (max.message.bytes=1000, say); repeatable")
    p.add_argument("--timeout", type=float, default=30.0)
    p.set_defaults(func=cmd_create_topic)

    p = sub.add_parser("read", help="dump a topic from the start as JSON lines")
    p.add_argument("name")
    p.add_argument("--partition", type=int, help="only this partition")
    p.add_argument(
        "--expect", type=int, help="fail unless exactly this many records are read"
    )
    p.add_argument(
        "--value-head",
        type=int,
        metavar="N",
        help="print only the first N bytes of each value, with value_len and value_sha256",
    )
    p.add_argument(
        "--isolation",
        choices=["read_committed", "read_uncommitted"],
        help="a topic with transactions: read up to the last stable offset (read_committed) "
        "or the high watermark (read_uncommitted)",
    )
    p.add_argument("--timeout", type=float, default=30.0)
    p.set_defaults(func=cmd_read)

    p = sub.add_parser("produce", help="produce one record")
    p.add_argument("name")
    p.add_argument("--key")
    p.add_argument("--value")
    p.add_argument("--header", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--partition", type=int)
    p.add_argument("--timeout", type=float, default=30.0)
    p.set_defaults(func=cmd_produce)

    args = ap.parse_args(argv)
    if not (args.bootstrap or os.environ.get("KAFKA_BOOTSTRAP_SERVERS")):
        print("kafka.py: set KAFKA_BOOTSTRAP_SERVERS or pass --bootstrap", file=sys.stderr)
        return 2
    try:
        return args.func(args)
    except kafka.KafkaToolError as e:
        die(str(e))


if __name__ == "__main__":
    sys.exit(main())
