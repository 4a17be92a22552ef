"""The independent Kafka client of the local stack and the tests (confluent-kafka, that
is librdkafka: not the relay's rskafka): wait for the broker, create a topic, read a
topic back from its first offset, produce one record.  scripts/kafka.py is its command
line; the end-to-end suite calls it in-process.

A record read back is a dict, as scripts/kafka.py prints it (one per line):
  {"topic": str, "partition": int, "offset": int,
   "key": base64|null, "value": base64|null,
   "headers": [[name, base64|null], ...],
   "timestamp": int|null,            # milliseconds since the epoch
   "timestamp_type": "create"|"log_append"|null}
with value_len and value_sha256 as well when only the value's head was kept.
"""

from __future__ import annotations

import base64
import hashlib
import os
import time
import uuid

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


class KafkaToolError(Exception):
    """The broker did not answer, or a topic is missing, or a read or a produce failed.
    `records` holds what a read got before it failed."""

    def __init__(self, message: str, records: list[dict] | None = None):
        super().__init__(message)
        self.records = records or []


def config(bootstrap: str | None = None) -> dict:
    """The client configuration: `bootstrap`, else $KAFKA_BOOTSTRAP_SERVERS."""
    bootstrap = bootstrap or os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not bootstrap:
        raise KafkaToolError("set KAFKA_BOOTSTRAP_SERVERS or pass a bootstrap address")
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


def ping(bootstrap: str | None = None, timeout: float = 30.0) -> dict:
    """Waits until the broker answers a metadata request; how many brokers and topics."""
    admin = AdminClient(config(bootstrap))
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            md = admin.list_topics(timeout=min(2.0, timeout))
            return {"brokers": len(md.brokers), "topics": len(md.topics)}
        except KafkaException as e:
            last = e
            time.sleep(0.2)
    raise KafkaToolError(f"broker did not answer within {timeout}s: {last}")


def topics(bootstrap: str | None = None, timeout: float = 10.0) -> dict[str, int]:
    """Every topic and its partition count."""
    md = AdminClient(config(bootstrap)).list_topics(timeout=timeout)
    return {n: len(t.partitions) for n, t in sorted(md.topics.items())}


def create_topic(name: str, partitions: int = 1, bootstrap: str | None = None,
                 replication_factor: int = 1, timeout: float = 30.0,
                 configs: dict | None = None) -> dict:
    """Creates a topic (idempotent) with the topic configs `configs` (none: the broker's
    defaults) and waits until the broker's metadata shows it with its partitions, so that a
    producer started right after does not race its creation. Returns {"topic",
    "partitions", "created"}; "warning" when it existed with another partition count."""
    admin = AdminClient(config(bootstrap))
    topic = NewTopic(name, num_partitions=partitions, replication_factor=replication_factor,
                     config=dict(configs or {}))
    futures = admin.create_topics([topic], operation_timeout=timeout)
    try:
        futures[name].result(timeout=timeout)
        created = True
    except KafkaException as e:
        err = e.args[0]
        if err.code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise KafkaToolError(f"create-topic {name}: {err}") from e
        created = False

    parts = wait_partitions(admin, name, time.monotonic() + timeout,
                            lambda p: not created or len(p) >= partitions)
    if parts is None:
        raise KafkaToolError(f"topic {name} not visible in metadata after {timeout}s")
    out = {"topic": name, "partitions": len(parts), "created": created}
    if len(parts) != partitions:
        out["warning"] = (f"topic {name} already exists with {len(parts)} partitions "
                          f"(asked for {partitions})")
    return out


def wait_partitions(admin, name: str, deadline: float, ready):
    """The topic's partitions once metadata shows them and `ready(partitions)` holds,
    asking every 0.1 s until `deadline` (monotonic); None if it never did."""
    while time.monotonic() < deadline:
        try:
            parts = topic_partitions(admin, name, timeout=2.0)
        except KafkaException:
            parts = None
        if parts is not None and ready(parts):
            return parts
        time.sleep(0.1)
    return None


def read_topic(name: str, bootstrap: str | None = None, partition: int | None = None,
               value_head: int | None = None, timeout: float = 30.0,
               expect: int | None = None, isolation: str | None = None) -> list[dict]:
    """Every record of every partition (or of `partition`), from offset 0 up to the fetch
    high watermark, sorted by partition and offset.  With `value_head` only the first
    bytes of each value, its length and its SHA-256.  With `expect`, fails unless exactly
    that many records were read.

    With `isolation` ("read_committed" or "read_uncommitted", Kafka's isolation.level) the
    read is of a topic with transactions: a partition is done at its end of partition, which
    librdkafka reports at the last stable offset (read_committed: no record of an open
    transaction or any after it, none of an aborted one) or at the high watermark
    (read_uncommitted: every record). Its transaction markers take offsets, so the last
    record's offset is no measure of the end."""
    conf = config(bootstrap)
    admin = AdminClient(conf)
    deadline = time.monotonic() + timeout
    parts = wait_partitions(admin, name, deadline, lambda p: True)
    if parts is None:
        raise KafkaToolError(f"topic {name} not found")
    if partition is not None:
        if partition not in parts:
            raise KafkaToolError(f"topic {name} has no partition {partition}")
        parts = [partition]

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
            **({"isolation.level": isolation} if isolation else {}),
        }
    )
    records: list[dict] = []
    try:
        # From offset 0 itself: the tests' topics are fresh and nothing is deleted
        # from them, so offset 0 is their first record, without the
        # ListOffsets(earliest) that OFFSET_BEGINNING costs.  Where 0 is gone (a
        # cluster with retention), auto.offset.reset=earliest applies.
        consumer.assign([TopicPartition(name, p, 0) for p in parts])
        # A partition is done when the consumer has reached the high watermark
        # reported by the fetch responses (partition EOF, then position >=
        # cached high watermark): the target is what the fetches themselves see,
        # not a separate ListOffsets(Latest) answer.
        done: set[int] = set()
        next_offset = {p: 0 for p in parts}
        while len(done) < len(parts):
            if time.monotonic() >= deadline:
                missing = sorted(set(parts) - done)
                raise KafkaToolError(
                    f"read {name}: partitions {missing} did not reach their high watermark "
                    f"within {timeout}s", sort_records(records))
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    p = msg.partition()
                    if isolation:
                        done.add(p)
                        continue
                    _low, high = consumer.get_watermark_offsets(
                        TopicPartition(name, p), cached=True
                    )
                    if high is None or high < 0 or next_offset[p] >= high:
                        done.add(p)
                    continue
                if err.retriable() or not err.fatal():
                    continue
                raise KafkaToolError(f"read {name}: {err}", sort_records(records))
            p = msg.partition()
            next_offset[p] = msg.offset() + 1
            done.discard(p)
            records.append(record_json(msg, value_head))
    finally:
        consumer.close()

    sort_records(records)
    if expect is not None and len(records) != expect:
        raise KafkaToolError(f"read {name}: expected {expect} records, got {len(records)}",
                             records)
    return records


def sort_records(records: list[dict]) -> list[dict]:
    records.sort(key=lambda r: (r["partition"], r["offset"]))
    return records


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


def produce(name: str, key: str | None = None, value: str | None = None,
            headers: list[tuple[str, bytes]] | None = None, partition: int | None = None,
            bootstrap: str | None = None, timeout: float = 30.0) -> dict:
    """Produces one record (acks=all); where it landed: {"topic", "partition", "offset"}."""
    producer = Producer({**config(bootstrap), "acks": "all"})
    result: dict = {}

    def on_delivery(err, msg):
        if err is not None:
            result["error"] = str(err)
        else:
            result.update(topic=msg.topic(), partition=msg.partition(), offset=msg.offset())

    kwargs = {"headers": headers or [], "on_delivery": on_delivery}
    if key is not None:
        kwargs["key"] = key.encode()
    if value is not None:
        kwargs["value"] = value.encode()
    if partition is not None:
        kwargs["partition"] = partition
    producer.produce(name, **kwargs)
    remaining = producer.flush(timeout)
    if remaining or "error" in result or not result:
        raise KafkaToolError(f"produce {name}: {result.get('error', 'not delivered in time')}")
    return result
