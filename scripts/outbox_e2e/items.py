"""The bytes a writer puts in the outbox table, written in Python from the library's
documents, so that a scenario can commit messages as a service using the library does
(TransactWriteItems by boto3) and check what the functions computed: Kafka's murmur2 and
the bucket of a key, the header blob (format version 1), .NET ticks, the W3C trace context
of an X-Ray header, the headers as the relay publishes them.  e2e/test_serverless.py
checks them against the vectors of lib/src/message.rs and docs/item-schema.md."""

from __future__ import annotations

import collections
import time
import uuid

from . import dynamodb
from .report import check

# The template's OUTBOX_BUCKET_COUNT (template.yaml's Globals).
BUCKET_COUNT = 8
MESSAGE_ID_HEADER = "x-outbox-message-id"

M32 = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's Utils.murmur2 (seed 0x9747b28c), as a signed 32-bit integer."""
    m = 0x5BD1E995
    h = (0x9747B28C ^ len(data)) & M32
    whole = len(data) // 4 * 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * m) & M32
        k ^= k >> 24
        k = (k * m) & M32
        h = (h * m) & M32
        h ^= k
    rest = data[whole:]
    if len(rest) >= 3:
        h ^= rest[2] << 16
    if len(rest) >= 2:
        h ^= rest[1] << 8
    if rest:
        h ^= rest[0]
        h = (h * m) & M32
    h ^= h >> 13
    h = (h * m) & M32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def to_positive(h: int) -> int:
    return h & 0x7FFFFFFF


def bucket_of(key: bytes, bucket_count: int = BUCKET_COUNT) -> int:
    return to_positive(murmur2(key)) % bucket_count


def header_blob(headers: list[tuple[str, bytes | None]]) -> bytes | None:
    """The Headers attribute, format version 1; None when there are no headers."""
    if not headers:
        return None
    out = bytearray([1]) + len(headers).to_bytes(4, "little", signed=True)
    for k, v in headers:
        kb = k.encode()
        out += len(kb).to_bytes(4, "little", signed=True) + kb
        if v is None:
            out += (-1).to_bytes(4, "little", signed=True)
        else:
            out += len(v).to_bytes(4, "little", signed=True) + v
    return bytes(out)


def ticks(unix_seconds: float) -> int:
    """.NET ticks in UTC (100 ns units since 0001-01-01)."""
    return 621355968000000000 + int(round(unix_seconds * 10_000_000))


def w3c_traceparent(xray: str) -> bytes:
    """The W3C traceparent of an X-Ray trace header (Root=1-{8 hex}-{24 hex};Parent={16
    hex};Sampled={0|1}): the trace id is the Root's two hex parts joined, the span id the
    Parent, the flags 01 when sampled (lib/src/trace_context.rs converts the same way)."""
    fields = dict(part.split("=", 1) for part in xray.split(";") if "=" in part)
    _, epoch, unique = fields["Root"].split("-")
    flags = "01" if fields.get("Sampled") == "1" else "00"
    return f"00-{epoch}{unique}-{fields['Parent']}-{flags}".encode()


def as_published(headers: list[tuple[str, bytes | None]]) -> list[tuple[str, bytes | None]]:
    """The headers as the relay publishes them before its message-id header
    (lib/src/publish/record.rs): the writer's, in order, null values null, repeated keys
    repeated; a stored header named like the message-id header is replaced by it."""
    return [(k, v) for k, v in headers if k != MESSAGE_ID_HEADER]


def direct_write(table: str, business_table: str, prefix: str, topic: str,
                 messages: list[dict], order_id: str) -> list[dict]:
    """What a service writing through the library does, in boto3: reserve numbers per
    bucket (ADD Sequence, UPDATED_NEW; in message order), then one TransactWriteItems
    with the business item and each message's Put (attribute_not_exists on the sort
    key).  Returns each message with its id, bucket and sequence, and when the commit
    started (the call) and was sent (its first attempt's request leaving the client)."""
    client = dynamodb.client()
    by_bucket: dict[int, list[dict]] = collections.OrderedDict()
    for m in messages:
        m["message_id"] = str(uuid.uuid4())
        m["bucket"] = bucket_of(m["key"].encode())
        by_bucket.setdefault(m["bucket"], []).append(m)
    for bucket, ms in by_bucket.items():
        out = client.update_item(
            TableName=table,
            Key={"PK": {"S": f"{prefix}#SEQUENCE#{bucket}"}, "SK": {"S": "SEQUENCE"}},
            UpdateExpression="ADD #seq :n", ExpressionAttributeNames={"#seq": "Sequence"},
            ExpressionAttributeValues={":n": {"N": str(len(ms))}}, ReturnValues="UPDATED_NEW")
        last = int(out["Attributes"]["Sequence"]["N"])
        check(last >= len(ms), f"counter of bucket {bucket} is {last} after ADD {len(ms)}")
        for i, m in enumerate(ms):
            m["sequence"] = last - len(ms) + 1 + i
    created = ticks(time.time())
    puts = [{"Put": {
        "TableName": business_table,
        "Item": {"PK": {"S": f"ORDER#{order_id}"}, "Total": {"N": "42"}},
        "ConditionExpression": "attribute_not_exists(PK)"}}]
    for m in messages:
        item = {
            "PK": {"S": f"{prefix}#MESSAGES#{m['bucket']}"},
            "SK": {"S": f"{m['sequence']:019d}"},
            "MessageId": {"S": m["message_id"]},
            "Topic": {"S": topic},
            "Key": {"B": m["key"].encode()},
            "Value": {"B": m["value"].encode()},
            "CreatedAtUtc": {"N": str(created)},
            "BucketCount": {"N": str(BUCKET_COUNT)},
        }
        blob = header_blob(m["headers"])
        if blob is not None:
            item["Headers"] = {"B": blob}
        puts.append({"Put": {"TableName": table, "Item": item,
                             "ConditionExpression": "attribute_not_exists(#sk)",
                             "ExpressionAttributeNames": {"#sk": "SK"}}})
    sent = []
    # botocore's before-send: the request serialized and signed, about to leave the client
    # (nothing of it can be in the table before this).
    client.meta.events.register("before-send.dynamodb.TransactWriteItems",
                                lambda **_: sent.append(time.time()))
    for m in messages:
        m["commit_started"] = time.time()
    client.transact_write_items(TransactItems=puts)
    for m in messages:
        m["commit_sent"] = sent[0] if sent else m["commit_started"]
    return messages
