"""A table's stream on DynamoDB Local through boto3: the clients, enabling the stream,
its shards and records, and a record as the event source mapping puts it in an event."""

from __future__ import annotations

import base64
import datetime
import os
import sys
import time

import boto3
from botocore.config import Config

from .filters import make_filter


class StreamError(Exception):
    """A table without the stream asked for, or a template without the mapping."""


def say(msg: str) -> None:
    print(f"[streams] {msg}", file=sys.stderr, flush=True)


def clients():
    endpoint = os.environ.get("AWS_ENDPOINT_URL_DYNAMODB")
    streams_endpoint = os.environ.get("AWS_ENDPOINT_URL_DYNAMODB_STREAMS") or endpoint
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    kw = {"region_name": region, "config": Config(retries={"max_attempts": 5, "mode": "standard"})}
    if not os.environ.get("AWS_ACCESS_KEY_ID"):
        kw.update(aws_access_key_id="local", aws_secret_access_key="local")
    ddb = boto3.client("dynamodb", endpoint_url=endpoint, **kw)
    streams = boto3.client("dynamodbstreams", endpoint_url=streams_endpoint, **kw)
    return ddb, streams


def stream_arn(ddb, table: str, with_description: bool = False):
    desc = ddb.describe_table(TableName=table)["Table"]
    spec = desc.get("StreamSpecification") or {}
    arn = desc.get("LatestStreamArn")
    if not spec.get("StreamEnabled") or not arn:
        raise StreamError(f"table {table} has no enabled stream (run: streams.py enable {table})")
    return (arn, desc) if with_description else arn


def list_shards(streams, arn: str) -> list[dict]:
    shards, start = [], None
    while True:
        kw = {"StreamArn": arn}
        if start:
            kw["ExclusiveStartShardId"] = start
        desc = streams.describe_stream(**kw)["StreamDescription"]
        shards += desc.get("Shards", [])
        start = desc.get("LastEvaluatedShardId")
        if not start:
            return shards


# ------------------------------------------------------------------ records

def plain(value):
    """boto3's parsed values back to the JSON the service sends (bytes as base64)."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, set):
        return [plain(v) for v in sorted(value)]
    return value


def epoch_seconds(value):
    if isinstance(value, datetime.datetime):
        t = value.timestamp()
    else:
        t = float(value)
    return int(t) if t == int(t) else t


def lambda_record(rec: dict, arn: str) -> dict:
    """One record of GetRecords as the event source mapping puts it in an event."""
    change = plain({k: v for k, v in rec["dynamodb"].items()
                    if k != "ApproximateCreationDateTime"})
    if "ApproximateCreationDateTime" in rec["dynamodb"]:
        change = {"ApproximateCreationDateTime":
                  epoch_seconds(rec["dynamodb"]["ApproximateCreationDateTime"]), **change}
    out = {
        "eventID": rec["eventID"],
        "eventName": rec["eventName"],
        "eventVersion": rec.get("eventVersion", "1.1"),
        "eventSource": rec.get("eventSource", "aws:dynamodb"),
        "awsRegion": rec.get("awsRegion", ""),
        "dynamodb": change,
        "eventSourceARN": arn,
    }
    if "userIdentity" in rec:
        out["userIdentity"] = plain(rec["userIdentity"])
    return out


def read_shard(streams, arn: str, shard_id: str, empty_pages: int = 2) -> list[dict]:
    """Every record of one shard from TRIM_HORIZON up to where it ends for now."""
    it = streams.get_shard_iterator(StreamArn=arn, ShardId=shard_id,
                                    ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
    out, empty = [], 0
    while it:
        r = streams.get_records(ShardIterator=it, Limit=1000)
        out += r["Records"]
        it = r.get("NextShardIterator")
        if r["Records"]:
            empty = 0
        else:
            empty += 1
            if empty >= empty_pages:
                break
    return out



def enable(table: str, view_type: str = "KEYS_ONLY", wait: float = 30.0) -> str:
    """Turns the table's stream on (UpdateTable) unless it is on with that view type, waits
    until it is ENABLED; its ARN."""
    ddb, streams = clients()
    desc = ddb.describe_table(TableName=table)["Table"]
    spec = desc.get("StreamSpecification") or {}
    if spec.get("StreamEnabled"):
        if spec.get("StreamViewType") != view_type:
            raise StreamError(f"table {table} already has a {spec.get('StreamViewType')} stream")
    else:
        ddb.update_table(TableName=table, StreamSpecification={
            "StreamEnabled": True, "StreamViewType": view_type})
    deadline = time.time() + wait
    while True:
        desc = ddb.describe_table(TableName=table)["Table"]
        arn = desc.get("LatestStreamArn")
        if arn and desc.get("TableStatus") == "ACTIVE":
            status = streams.describe_stream(StreamArn=arn)["StreamDescription"]["StreamStatus"]
            if status == "ENABLED":
                return arn
        if time.time() > deadline:
            raise StreamError(f"stream of {table} not enabled after {wait}s")
        time.sleep(0.2)


def records(table: str, after: str | None = None, filter_prefix: str | None = None,
            key_attribute: str = "PK") -> list[dict]:
    """Every record of the table's stream (every shard from TRIM_HORIZON), as Lambda event
    records, in sequence order: with `after` only those after that sequence number, with
    `filter_prefix` only those the poller's prefix filter keeps."""
    ddb, streams = clients()
    arn = stream_arn(ddb, table)
    keep = make_filter(filter_prefix, key_attribute)
    after_n = int(after) if after is not None else None
    out = []
    for shard in list_shards(streams, arn):
        for rec in read_shard(streams, arn, shard["ShardId"]):
            if after_n is not None and int(rec["dynamodb"]["SequenceNumber"]) <= after_n:
                continue
            lr = lambda_record(rec, arn)
            if keep(lr):
                out.append(lr)
    out.sort(key=lambda r: int(r["dynamodb"]["SequenceNumber"]))
    return out
