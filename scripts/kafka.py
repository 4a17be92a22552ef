#!/usr/bin/env python3
"""Small Kafka CLI for the local stack and the tests, built on confluent-kafka.

The broker is taken from $KAFKA_BOOTSTRAP_SERVERS (as exported by
scripts/stack.sh) unless --bootstrap is given.  Run it with the stack's venv
python ($OUTBOX_STACK_PYTHON), which has confluent-kafka installed.

Subcommands:
  ping                          wait until the broker answers a metadata request
  create-topic NAME [--partitions N]
                                create a topic (idempotent) and wait until the
                                broker's metadata shows it with its partitions
  topics                        print {"topic": partition_count, ...} as JSON
  read NAME                     print every record of every partition, from the
                                start up to the fetch high watermark, one JSON
                                object per line
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
import base64
import hashlib
import json
import os
import sys
import time
import uuid
from typing import NoReturn

try:
    from confluent_kafka import (
        TIMESTAMP_CREATE_TIME,
        TIMESTAMP_LOG_APPEND_TIME,
        Consumer,
        KafkaError,
        KafkaException,
        Producer,
        TopicPartition,
    )
    from confluent_kafka.admin import AdminClient, NewTopic
except ImportError:  # pragma: no cover - depends on the interpreter used
    sys.exit(
        "kafka.py: confluent-kafka is not importable by "
        f"{sys.executable}; run scripts/install.sh and use $OUTBOX_STACK_PYTHON"
    )


def die(msg: str) -> NoReturn:
    print(f"kafka.py: {msg}", file=sys.stderr)
    sys.exit(1)


def base_config(args: argparse.Namespace) -> dict:
    bootstrap = args.bootstrap or os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not bootstrap:
        print(
            "kafka.py: set KAFKA_BOOTSTRAP_SERVERS or pass --bootstrap",
            file=sys.stderr,
        )
        sys.exit(2)
    return {
        "bootstrap.servers": bootstrap,
        # librdkafka logs connection noise at level 3+ while the broker starts;
        # keep errors only.
        "log_level": 3,
    }


def b64(data: bytes | str | None) -> str | None:
    if data is None:
        return None
    if isinstance(data, str):
        data = data.encode()
    return base64.b64encode(data).decode("ascii")


def topic_partitions(admin: AdminClient, topic: str, timeout: float):
    """Return the partition ids of `topic`, or None when the broker does not
    (yet) know the topic."""
    md = admin.list_topics(topic=topic, timeout=timeout)
    t = md.topics.get(topic)
    if t is None or t.error is not None or not t.partitions:
        return None
    return sorted(t.partitions)


# ---------------------------------------------------------------- subcommands


def cmd_ping(args: argparse.Namespace) -> int:
    admin = AdminClient(base_config(args))
    deadline = time.monotonic() + args.timeout
    last = None
    while time.monotonic() < deadline:
        try:
            md = admin.list_topics(timeout=min(2.0, args.timeout))
            print(json.dumps({"brokers": len(md.brokers), "topics": len(md.topics)}))
            return 0
        except KafkaException as e:
            last = e
            time.sleep(0.2)
    die(f"broker did not answer within {args.timeout}s: {last}")


def cmd_topics(args: argparse.Namespace) -> int:
    admin = AdminClient(base_config(args))
    md = admin.list_topics(timeout=args.timeout)
    print(json.dumps({n: len(t.partitions) for n, t in sorted(md.topics.items())}))
    return 0


def cmd_create_topic(args: argparse.Namespace) -> int:
    admin = AdminClient(base_config(args))
    topic = NewTopic(
        args.name,
        num_partitions=args.partitions,
        replication_factor=args.replication_factor,
    )
    futures = admin.create_topics([topic], operation_timeout=args.timeout)
    try:
        futures[args.name].result(timeout=args.timeout)
        created = True
    except KafkaException as e:
        err = e.args[0]
        if err.code() != KafkaError.TOPIC_ALREADY_EXISTS:
            die(f"create-topic {args.name}: {err}")
        created = False

    # Wait until the broker's metadata lists the topic with its partitions, so
    # that a producer started right after us does not race topic creation.
    deadline = time.monotonic() + args.timeout
    parts = None
    while time.monotonic() < deadline:
        try:
            parts = topic_partitions(admin, args.name, timeout=2.0)
        except KafkaException:
            parts = None
        if parts is not None and (not created or len(parts) >= args.partitions):
            break
        time.sleep(0.1)
    else:
        die(f"topic {args.name} not visible in metadata after {args.timeout}s")

    if len(parts) != args.partitions:
        print(
            f"kafka.py: topic {args.name} already exists with {len(parts)} "
            f"partitions (asked for {args.partitions})",
            file=sys.stderr,
        )
    print(
        json.dumps(
            {"topic": args.name, "partitions": len(parts), "created": created}
        )
    )
    return 0


def cmd_read(args: argparse.Namespace) -> int:
    conf = base_config(args)
    admin = AdminClient(conf)
    deadline = time.monotonic() + args.timeout

    parts = None
    while time.monotonic() < deadline:
        try:
            parts = topic_partitions(admin, args.name, timeout=2.0)
        except KafkaException:
            parts = None
        if parts is not None:
            break
        time.sleep(0.1)
    if parts is None:
        die(f"topic {args.name} not found")
    if args.partition is not None:
        if args.partition not in parts:
            die(f"topic {args.name} has no partition {args.partition}")
        parts = [args.partition]

    consumer = Consumer(
        {
            **conf,
            # assign() is used, so the group is never joined; librdkafka still
            # wants an id.  Nothing is committed.
            "group.id": f"outbox-kafka-py-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 100,
        }
    )
    records = []
    try:
        # From offset 0 itself: the tests' topics are fresh and nothing is deleted
        # from them, so offset 0 is their first record, without the
        # ListOffsets(earliest) that OFFSET_BEGINNING costs.  Where 0 is gone (a
        # cluster with retention), auto.offset.reset=earliest applies.
        consumer.assign([TopicPartition(args.name, p, 0) for p in parts])
        # A partition is done when the consumer has reached the high watermark
        # reported by the fetch responses (partition EOF, then position >=
        # cached high watermark): the target is what the fetches themselves see,
        # not a separate ListOffsets(Latest) answer.
        done: set[int] = set()
        next_offset = {p: 0 for p in parts}
        while len(done) < len(parts):
            if time.monotonic() >= deadline:
                missing = sorted(set(parts) - done)
                emit(records)
                die(
                    f"read {args.name}: partitions {missing} did not reach "
                    f"their high watermark within {args.timeout}s"
                )
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    p = msg.partition()
                    _low, high = consumer.get_watermark_offsets(
                        TopicPartition(args.name, p), cached=True
                    )
                    if high is None or high < 0 or next_offset[p] >= high:
                        done.add(p)
                    continue
                if err.retriable() or not err.fatal():
                    continue
                die(f"read {args.name}: {err}")
            p = msg.partition()
            next_offset[p] = msg.offset() + 1
            done.discard(p)
            records.append(record_json(msg, args.value_head))
    finally:
        consumer.close()

    if args.expect is not None and len(records) != args.expect:
        emit(records)
        die(f"read {args.name}: expected {args.expect} records, got {len(records)}")
    emit(records)
    return 0


def record_json(msg, value_head=None) -> dict:
    ts_type, ts = msg.timestamp()
    value = msg.value()
    extra = {}
    if value_head is not None and value is not None:
        # Large values: the first bytes, the length and a digest instead of the whole.
        extra = {"value_len": len(value), "value_sha256": hashlib.sha256(value).hexdigest()}
        value = value[:value_head]
    return {
        **extra,
        "topic": msg.topic(),
        "partition": msg.partition(),
        "offset": msg.offset(),
        "key": b64(msg.key()),
        "value": b64(value),
        "headers": [[k, b64(v)] for k, v in (msg.headers() or [])],
        "timestamp": ts if ts_type != 0 else None,
        "timestamp_type": {
            TIMESTAMP_CREATE_TIME: "create",
            TIMESTAMP_LOG_APPEND_TIME: "log_append",
        }.get(ts_type),
    }


def emit(records: list[dict]) -> None:
    records.sort(key=lambda r: (r["partition"], r["offset"]))
    for r in records:
        print(json.dumps(r, separators=(",", ":")))
    sys.stdout.flush()


def cmd_produce(args: argparse.Namespace) -> int:
    producer = Producer({**base_config(args), "acks": "all"})
    headers = []
    for h in args.header:
        name, sep, value = h.partition("=")
        if not sep:
            print(f"kafka.py: --header wants NAME=VALUE, got {h!r}", file=sys.stderr)
            return 2
        headers.append((name, value.encode()))
    result: dict = {}

    def on_delivery(err, msg):
        if err is not None:
            result["error"] = str(err)
        else:
            result.update(
                topic=msg.topic(), partition=msg.partition(), offset=msg.offset()
            )

    kwargs = {"headers": headers, "on_delivery": on_delivery}
    if args.key is not None:
        kwargs["key"] = args.key.encode()
    if args.value is not None:
        kwargs["value"] = args.value.encode()
    if args.partition is not None:
        kwargs["partition"] = args.partition
    producer.produce(args.name, **kwargs)
    remaining = producer.flush(args.timeout)
    if remaining or "error" in result or not result:
        die(f"produce {args.name}: {result.get('error', 'not delivered in time')}")
    print(json.dumps(result))
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
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
