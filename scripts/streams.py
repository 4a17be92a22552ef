#!/usr/bin/env python3
"""DynamoDB Streams helpers for the local stack: enable a table's stream, print its
records as the Lambda event the event source mapping would deliver, and a poller
standing in for that event source mapping.  Built on boto3 against DynamoDB Local
(endpoint $AWS_ENDPOINT_URL_DYNAMODB_STREAMS, else $AWS_ENDPOINT_URL_DYNAMODB, as
exported by scripts/stack.sh; DynamoDB Local serves the streams API on the same
port).  Run it with the stack's venv python ($OUTBOX_STACK_PYTHON).

Subcommands:
  enable TABLE [--view-type KEYS_ONLY]
        UpdateTable with StreamSpecification (StreamEnabled, KEYS_ONLY); waits until
        the stream is ENABLED; prints its ARN.  A table whose stream is already on
        with that view type is left as it is.
  records TABLE [--after SEQ] [--filter-prefix PREFIX] [--pretty]
        prints every record of the stream (every shard from TRIM_HORIZON; with
        --after only those whose sequence number is greater than SEQ; with
        --filter-prefix only those the poller's filter keeps) as ONE Lambda
        DynamoDB stream event: {"Records":[{"eventID", "eventName", "eventVersion",
        "eventSource", "awsRegion", "dynamodb": {"ApproximateCreationDateTime"
        (Unix seconds, a number), "Keys", "SequenceNumber", "SizeBytes",
        "StreamViewType"}, "eventSourceARN"}]}, ordered by sequence number: the
        shape aws_lambda_events::event::dynamodb::Event deserializes.
  poll TABLE --invoke URL [--template template.yaml [--function RelayFunction]
             [--param K=V ...]] [--filter-prefix PREFIX] [--key-attribute PK]
             [--batch-size N] [--window SECONDS] [--starting-position LATEST]
             [--max-retries N] [--max-record-age SECONDS] [--[no-]bisect]
             [--shards N] [--backoff S] [--max-backoff S]
             [--ready-file F] [--stats-file F] [--batch-log F]
        the event source mapping, POSTing each batch as one event to URL (the Invoke
        URL of scripts/lambda_runtime.py,
        http://127.0.0.1:PORT/2015-03-31/functions/NAME/invocations) and waiting for
        the answer (RequestResponse).  Described below.

The event source mapping (poll)
-------------------------------
Settings.  --template reads the function's DynamoDB stream mapping from the SAM
template (scripts/cfn_template.py: the AWS::Lambda::EventSourceMapping whose
FunctionName is the function, parameters at their defaults or --param K=V,
conditions evaluated): BatchSize, MaximumBatchingWindowInSeconds,
MaximumRecordAgeInSeconds, MaximumRetryAttempts, BisectBatchOnFunctionError,
StartingPosition and FilterCriteria's patterns.  A flag given explicitly overrides
the template (--filter-prefix replaces the patterns); what neither sets takes
Lambda's default (BatchSize 100, window 0, record age -1, retries -1, no bisect; the
table in "Lambda parameters for Amazon DynamoDB event source mappings",
https://docs.aws.amazon.com/lambda/latest/dg/services-ddb-params.html) and
StartingPosition LATEST (required in AWS, no default).  A mapping whose Condition
is false under the parameters (e.g. --param WakeOn=schedule) is an error.  The
effective settings and where each came from ("flag", "template:RelayDoorbell",
"default") are in the --ready-file JSON and under "settings" in the stats.
Values below AWS's minimums (record age 60 s) are accepted, for tests.

Reading.  Every shard of the stream is read (the shards open at start from
StartingPosition; shards created later from TRIM_HORIZON once their parent is read
to its end; discovered every --discover-interval seconds; each polled every
--poll-interval seconds, 0.25, while it has nothing new), independently of the
invocations, so reading never waits for the function.  The filter patterns are
Lambda's event filtering ("Control which events Lambda sends to your function",
https://docs.aws.amazon.com/lambda/latest/dg/invocation-eventfiltering.html):
a record is kept when one pattern matches it; a pattern's lists match when one
value matches (exact values, prefix, suffix, equals-ignore-case, anything-but,
numeric, exists); filtered records are never sent and never counted against
anything.  Without a pattern every record is kept.

Shards.  Lambda reads the stream's records in batches and invokes the function
synchronously with each ("Using AWS Lambda with Amazon DynamoDB",
https://docs.aws.amazon.com/lambda/latest/dg/with-ddb.html); a stream mapping
retries the entire batch and repeated errors block processing of the affected
shard ("Understanding retry behavior in Lambda",
https://docs.aws.amazon.com/lambda/latest/dg/invocation-retries.html); with
ParallelizationFactor at its default of 1 (the parameters page below; a larger one
"processes multiple batches from each shard concurrently") a shard has one batch in
flight at a time, in order, while different shards are processed independently.
(The one-batch-at-a-time-per-shard wording is the Kinesis page's, "Using Lambda to
process records from Amazon Kinesis Data Streams",
https://docs.aws.amazon.com/lambda/latest/dg/with-kinesis.html; the DynamoDB page
was only found here in a translation, so this module relies on the retry and
parameter pages for DynamoDB.)  DynamoDB Local gives one open shard, so
--shards N splits the kept records into N virtual shards by a hash (MD5) of the
partition key's value (--key-attribute, default the table's hash key), as DynamoDB
keeps the items of one partition key in one shard.  Each virtual shard is one
pipeline: its records in the order they were read, one invocation at a time, the
next batch only after the previous one is done with (succeeded, dropped or
expired).  The real shards feed the virtual ones in their order (a child after its
parent), so a key's records stay in order across shard rollovers.
ParallelizationFactor is not modelled (1, the default).

Batching ("How Lambda processes records from stream and queue-based event sources",
section "Batching behavior",
https://docs.aws.amazon.com/lambda/latest/dg/invocation-eventsourcemapping.html):
a pipeline invokes when BatchSize records wait, when the next record would take the
event past 6 MB, or when the batching window has passed and a record waits.  The
page says that the next batching window begins as soon as the previous invocation
completes; so the first window begins when the poller starts, and after an idle
spell longer than the window the first records are sent as soon as they are read
(with window 0, everything read so far, up to BatchSize).

Record age.  MaximumRecordAgeInSeconds discards records older than the age, before
they are sent or between retries; -1 means until the record expires, the stream's
24 h retention ("Retain discarded records for a DynamoDB event source in Lambda",
https://docs.aws.amazon.com/lambda/latest/dg/services-dynamodb-errors.html; the
parameters page above).  DynamoDB Local's ApproximateCreationDateTime is whole
minutes, so a record's age is measured from the moment the poller first read it
(within --poll-interval of its write while the reader keeps up, which it does since
it never waits for the function).  Expired records waiting in a pipeline are
discarded unsent; those of a failing batch are removed before its next attempt,
the rest of the batch retried.  AWS sends discarded records to an on-failure
destination; here they are counted (expired_records) and logged.

Errors (the error-handling page above).  Before invocation: a throttle (HTTP 429
from the emulator), another HTTP error or no answer is retried until the records
expire, never counted against MaximumRetryAttempts.  During invocation: a function
error (X-Amz-Function-Error, timeouts included) is retried up to
MaximumRetryAttempts times (-1: until the records expire), then the batch is
dropped and the shard moves on.  With BisectBatchOnFunctionError a failing batch of
more than one record is split in two halves (the first half gets the odd record
out), each processed in turn, in order, as a batch of its own; "splitting batches
doesn't consume the retry quota".  Where AWS is silent, chosen here: a half starts
with a fresh retry count; a batch is bisected at each function error until it is a
single record, whose function errors then count against MaximumRetryAttempts; the
wait before a retry is --backoff seconds (0.5) doubling up to --max-backoff (10),
or until the oldest record expires if sooner; a bisect retries at once.

Stopping.  SIGTERM or SIGINT stops the poller (an invocation in flight is waited for
up to --stop-grace seconds); its counters go to stdout as JSON (and to
--stats-file): batches and records (delivered in successful invocations),
records_read, records_filtered_out, invoke_errors (every failed attempt),
function_errors, throttles (HTTP 429), retries (after function errors, counted
against MaximumRetryAttempts), throttle_retries (after throttles or failed
requests), bisects, expired_records (discarded for their age, sent or not),
dropped_batches and dropped_records (out of retries), buffered_unsent (read, not
yet done with at the stop), in_flight_batches, peak_in_flight_batches (the most
invocations at once, across virtual shards), get_records_calls, shards_seen,
shards_finished, virtual_shards, stream_arn, settings.  --batch-log appends one
JSON line per invocation attempt: shard (the virtual shard, "shard-0"...),
records, first_seq, last_seq, oldest_age_s, sent, done, attempt (1 for a batch's
or a half's first attempt), status, function_error, the response's first 1,000
characters.  --ready-file is written (and "ready" said on stderr) once every
starting shard has its iterator, so writes after that are seen.

Differences from the real service worth knowing: DynamoDB Local puts its own
region ("ddblocal") and account (000000000000) in the stream ARN and awsRegion,
and its ApproximateCreationDateTime is whole minutes; records are passed through
as DynamoDB Local returns them.  ReportBatchItemFailures, on-failure destinations,
ParallelizationFactor and tumbling windows are not modelled.

Exit codes: 0 ok, 1 failure (a message goes to stderr), 2 usage.
"""

from __future__ import annotations

import argparse
import base64
import collections
import datetime
import hashlib
import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request

import boto3
from botocore.config import Config

EVENT_LIMIT = 6 * 1024 * 1024  # Lambda's synchronous payload limit


def say(msg: str) -> None:
    print(f"[streams] {msg}", file=sys.stderr, flush=True)


def die(msg: str) -> None:
    say(f"error: {msg}")
    sys.exit(1)


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
        die(f"table {table} has no enabled stream (run: streams.py enable {table})")
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


def make_filter(prefix: str | None, key_attribute: str):
    """The template's filter criteria: {"eventName": ["INSERT"], "dynamodb": {"Keys":
    {PK: {"S": [{"prefix": PREFIX}]}}}}; None keeps everything."""
    if prefix is None:
        return lambda rec: True
    return make_keep([prefix_pattern(prefix, key_attribute)])


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


def cmd_enable(args) -> int:
    ddb, streams = clients()
    desc = ddb.describe_table(TableName=args.table)["Table"]
    spec = desc.get("StreamSpecification") or {}
    if spec.get("StreamEnabled"):
        if spec.get("StreamViewType") != args.view_type:
            die(f"table {args.table} already has a {spec.get('StreamViewType')} stream")
    else:
        ddb.update_table(TableName=args.table, StreamSpecification={
            "StreamEnabled": True, "StreamViewType": args.view_type})
    deadline = time.time() + args.wait
    while True:
        desc = ddb.describe_table(TableName=args.table)["Table"]
        arn = desc.get("LatestStreamArn")
        if arn and desc.get("TableStatus") == "ACTIVE":
            status = streams.describe_stream(StreamArn=arn)["StreamDescription"]["StreamStatus"]
            if status == "ENABLED":
                print(arn)
                return 0
        if time.time() > deadline:
            die(f"stream of {args.table} not enabled after {args.wait}s")
        time.sleep(0.2)


def cmd_records(args) -> int:
    ddb, streams = clients()
    arn = stream_arn(ddb, args.table)
    keep = make_filter(args.filter_prefix, args.key_attribute)
    after = int(args.after) if args.after is not None else None
    records = []
    for shard in list_shards(streams, arn):
        for rec in read_shard(streams, arn, shard["ShardId"]):
            if after is not None and int(rec["dynamodb"]["SequenceNumber"]) <= after:
                continue
            lr = lambda_record(rec, arn)
            if keep(lr):
                records.append(lr)
    records.sort(key=lambda r: int(r["dynamodb"]["SequenceNumber"]))
    print(json.dumps({"Records": records}, indent=1 if args.pretty else None))
    return 0


# --------------------------------------------------------------------- poll

RETENTION_S = 24 * 3600  # DynamoDB Streams keeps a record for 24 hours


def match_pattern(pattern: dict, event) -> bool:
    """Lambda's event filtering for one filter pattern (JSON): every key of the
    pattern must match; a list of values matches when one of them does."""
    for key, rule in pattern.items():
        present = isinstance(event, dict) and key in event
        value = event.get(key) if present else None
        if isinstance(rule, dict):
            if not present or not isinstance(value, dict) or not match_pattern(rule, value):
                return False
        elif isinstance(rule, list):
            if not any(match_value(r, present, value) for r in rule):
                return False
        else:
            raise ValueError(f"filter pattern: {key} must be an object or a list")
    return True


def match_value(rule, present: bool, value) -> bool:
    if isinstance(rule, dict):
        if "exists" in rule:
            return present == bool(rule["exists"])
        if not present:
            return False
        if "prefix" in rule:
            return isinstance(value, str) and value.startswith(rule["prefix"])
        if "suffix" in rule:
            return isinstance(value, str) and value.endswith(rule["suffix"])
        if "equals-ignore-case" in rule:
            return isinstance(value, str) and value.lower() == str(
                rule["equals-ignore-case"]).lower()
        if "anything-but" in rule:
            but = rule["anything-but"]
            if isinstance(but, dict) and "prefix" in but:
                return not (isinstance(value, str) and value.startswith(but["prefix"]))
            but = but if isinstance(but, list) else [but]
            return value not in but
        if "numeric" in rule:
            try:
                x = float(value)
            except (TypeError, ValueError):
                return False
            ops = rule["numeric"]
            checks = {"=": x.__eq__, "<": x.__lt__, "<=": x.__le__, ">": x.__gt__,
                      ">=": x.__ge__}
            return all(checks[ops[i]](float(ops[i + 1])) for i in range(0, len(ops), 2))
        raise ValueError(f"filter pattern: unsupported rule {rule}")
    if not present:
        return False
    if isinstance(value, list):
        return rule in value
    return value == rule


def prefix_pattern(prefix: str, key_attribute: str) -> dict:
    """The template's filter: INSERTs whose partition key begins with PREFIX."""
    return {"eventName": ["INSERT"],
            "dynamodb": {"Keys": {key_attribute: {"S": [{"prefix": prefix}]}}}}


def make_keep(patterns: list[dict] | None):
    """A record is kept when one of the patterns matches (no patterns: every record)."""
    if not patterns:
        return lambda rec: True
    return lambda rec: any(match_pattern(p, rec) for p in patterns)


def template_settings(args) -> tuple[dict, list[dict] | None, str]:
    """The mapping's settings read from --template (function --function), the filter
    patterns, and the mapping's logical id."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import cfn_template  # noqa: E402 (next to this script; needs PyYAML)

    try:
        tpl = cfn_template.Template(args.template, cfn_template.parse_params(args.param))
        mapping = tpl.stream_mapping(args.function)
    except cfn_template.TemplateError as e:
        die(f"--template: {e}")
    if mapping is None:
        die(f"--template: {args.function} has no DynamoDB stream event source mapping with "
            f"these parameters (its Condition is false, or it has none)")
    settings = {}
    for key, attr, conv in (("BatchSize", "batch_size", int),
                            ("MaximumBatchingWindowInSeconds", "window", float),
                            ("MaximumRecordAgeInSeconds", "max_record_age", float),
                            ("MaximumRetryAttempts", "max_retries", int),
                            ("BisectBatchOnFunctionError", "bisect",
                             lambda v: str(v).lower() == "true"),
                            ("StartingPosition", "starting_position", str)):
        if key in mapping:
            settings[attr] = conv(mapping[key])
    patterns = None
    filters = (mapping.get("FilterCriteria") or {}).get("Filters")
    if filters:
        patterns = []
        for f in filters:
            pat = f.get("Pattern")
            patterns.append(json.loads(pat) if isinstance(pat, str) else pat)
    return settings, patterns, mapping["LogicalId"]


DEFAULTS = {"batch_size": 100, "window": 0.0, "max_record_age": -1.0, "max_retries": -1,
            "bisect": False, "starting_position": "LATEST"}


def effective_settings(args) -> dict:
    """Explicit flags over the template's mapping over Lambda's defaults; sets the
    attributes of args and returns where each came from."""
    from_template, patterns, mapping_id = ({}, None, None)
    if args.template:
        from_template, patterns, mapping_id = template_settings(args)
    source = {}
    for attr, default in DEFAULTS.items():
        if getattr(args, attr) is not None:
            source[attr] = "flag"
        elif attr in from_template:
            setattr(args, attr, from_template[attr])
            source[attr] = f"template:{mapping_id}"
        else:
            setattr(args, attr, default)
            source[attr] = "default"
    if args.filter_prefix is not None:
        args.patterns = [prefix_pattern(args.filter_prefix, args.key_attribute or "PK")]
        source["filter"] = "flag"
    elif patterns:
        args.patterns = patterns
        source["filter"] = f"template:{mapping_id}"
    else:
        args.patterns = None
        source["filter"] = "none"
    return {"batch_size": args.batch_size, "window_s": args.window,
            "max_record_age_s": args.max_record_age, "max_retries": args.max_retries,
            "bisect": args.bisect, "starting_position": args.starting_position,
            "filter_patterns": args.patterns, "shards": args.shards,
            "mapping": mapping_id, "source": source}


class VirtualShard:
    """One in-order, one-batch-at-a-time pipeline: the records routed to it, in the
    order they were read, each with the monotonic time it was first read."""

    def __init__(self, index: int):
        self.index = index
        self.name = f"shard-{index}"
        self.queue: collections.deque = collections.deque()  # (read_at, record, size)
        self.cond = threading.Condition()


class Poller:
    def __init__(self, args):
        self.args = args
        self.ddb, self.streams = clients()
        self.arn, desc = stream_arn(self.ddb, args.table, with_description=True)
        hash_keys = [k["AttributeName"] for k in desc.get("KeySchema", [])
                     if k["KeyType"] == "HASH"]
        self.partition_key = args.key_attribute or (hash_keys[0] if hash_keys else "PK")
        self.keep = make_keep(args.patterns)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.c = {
            "batches": 0, "records": 0, "records_read": 0, "records_filtered_out": 0,
            "invoke_errors": 0, "function_errors": 0, "throttles": 0, "retries": 0,
            "throttle_retries": 0, "bisects": 0, "expired_records": 0,
            "dropped_batches": 0, "dropped_records": 0, "buffered_unsent": 0,
            "in_flight_batches": 0, "peak_in_flight_batches": 0, "get_records_calls": 0,
            "shards_seen": 0, "shards_finished": 0, "virtual_shards": args.shards,
        }
        self.known: dict[str, dict] = {}  # shard id -> {"parent", "state"}
        self.readers: list[threading.Thread] = []
        self.vshards = [VirtualShard(i) for i in range(args.shards)]
        self.pipelines: list[threading.Thread] = []
        self.batch_log = open(args.batch_log, "a", buffering=1) if args.batch_log else None
        self.max_age = args.max_record_age if args.max_record_age >= 0 else RETENTION_S

    def count(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.c[key] += n

    # ---------------------------------------------------------------- reading

    def start(self) -> None:
        initial = self.args.starting_position
        pending = []
        for shard in list_shards(self.streams, self.arn):
            sid = shard["ShardId"]
            closed = "EndingSequenceNumber" in shard.get("SequenceNumberRange", {})
            self.known[sid] = {"parent": shard.get("ParentShardId"), "state": "new"}
            self.count("shards_seen")
            if closed and initial == "LATEST":
                self.known[sid]["state"] = "done"  # nothing after LATEST in a closed shard
                self.count("shards_finished")
            else:
                pending.append(sid)
        for vs in self.vshards:
            t = threading.Thread(target=self.pipeline_loop, args=(vs,), daemon=True)
            self.pipelines.append(t)
            t.start()
        for sid in pending:
            it = self.streams.get_shard_iterator(StreamArn=self.arn, ShardId=sid,
                                                 ShardIteratorType=initial)["ShardIterator"]
            self.launch(sid, it)
        threading.Thread(target=self.discover_loop, daemon=True).start()
        if self.args.ready_file:
            tmp = f"{self.args.ready_file}.tmp{os.getpid()}"
            with open(tmp, "w") as f:
                json.dump({"stream_arn": self.arn, "shards": len(pending),
                           "settings": self.args.settings}, f)
            os.replace(tmp, self.args.ready_file)
        a = self.args
        say(f"ready: {self.arn}, {len(pending)} shard(s) from {initial} into {a.shards} "
            f"virtual shard(s); batch {a.batch_size}, window {a.window:g}s, record age "
            f"{a.max_record_age:g}s, retries {a.max_retries}, bisect {a.bisect}; invoking "
            f"{a.invoke}")

    def launch(self, sid: str, iterator: str) -> None:
        self.known[sid]["state"] = "reading"
        t = threading.Thread(target=self.shard_reader, args=(sid, iterator), daemon=True)
        self.readers.append(t)
        t.start()

    def discover_loop(self) -> None:
        while not self.stop.wait(self.args.discover_interval):
            try:
                shards = list_shards(self.streams, self.arn)
            except Exception as e:  # a transient failure: try again next round
                say(f"describe_stream failed: {e}")
                continue
            for shard in shards:
                sid = shard["ShardId"]
                if sid not in self.known:
                    self.known[sid] = {"parent": shard.get("ParentShardId"), "state": "new"}
                    self.count("shards_seen")
            for sid, info in list(self.known.items()):
                if info["state"] != "new":
                    continue
                parent = self.known.get(info["parent"]) if info["parent"] else None
                if parent is not None and parent["state"] != "done":
                    continue  # a child is read after its parent, as Lambda does
                try:
                    it = self.streams.get_shard_iterator(
                        StreamArn=self.arn, ShardId=sid,
                        ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
                except Exception as e:
                    say(f"get_shard_iterator {sid} failed: {e}")
                    continue
                self.launch(sid, it)

    def route(self, rec: dict) -> VirtualShard:
        """The virtual shard of a record: a hash of its partition key's value."""
        if len(self.vshards) == 1:
            return self.vshards[0]
        key = (rec.get("dynamodb", {}).get("Keys") or {}).get(self.partition_key)
        digest = hashlib.md5(json.dumps(key, sort_keys=True).encode()).digest()
        return self.vshards[int.from_bytes(digest[:8], "big") % len(self.vshards)]

    def shard_reader(self, sid: str, it: str | None) -> None:
        """Reads one real shard to its end, stamps and routes the kept records."""
        last_seq = None
        while it and not self.stop.is_set():
            try:
                r = self.streams.get_records(ShardIterator=it, Limit=1000)
            except self.streams.exceptions.ExpiredIteratorException:
                kind = ("AFTER_SEQUENCE_NUMBER", last_seq) if last_seq else ("TRIM_HORIZON", None)
                kw = {"SequenceNumber": kind[1]} if kind[1] else {}
                it = self.streams.get_shard_iterator(StreamArn=self.arn, ShardId=sid,
                                                     ShardIteratorType=kind[0],
                                                     **kw)["ShardIterator"]
                continue
            except Exception as e:
                say(f"get_records {sid} failed: {e}")
                self.stop.wait(1.0)
                continue
            self.count("get_records_calls")
            records = r.get("Records", [])
            it = r.get("NextShardIterator")
            now = time.monotonic()
            pages: dict[int, list] = {}
            kept = 0
            for rec in records:
                last_seq = rec["dynamodb"]["SequenceNumber"]
                lr = lambda_record(rec, self.arn)
                if not self.keep(lr):
                    continue
                kept += 1
                pages.setdefault(self.route(lr).index, []).append(
                    (now, lr, len(json.dumps(lr)) + 2))
            self.count("records_read", len(records))
            self.count("records_filtered_out", len(records) - kept)
            for index, page in pages.items():
                vs = self.vshards[index]
                with vs.cond:
                    vs.queue.extend(page)
                    vs.cond.notify_all()
            if not it:
                break
            if not records:
                self.stop.wait(self.args.poll_interval)
        if not it:
            self.known[sid]["state"] = "done"
            self.count("shards_finished")

    # ------------------------------------------------------------- processing

    def expired(self, read_at: float, now: float) -> bool:
        return now - read_at > self.max_age

    def prune_queue(self, vs: VirtualShard) -> None:
        """Discards the expired records at the head of the queue (lock held)."""
        now = time.monotonic()
        n = 0
        while vs.queue and self.expired(vs.queue[0][0], now):
            vs.queue.popleft()
            n += 1
        if n:
            self.count("expired_records", n)
            say(f"{vs.name}: {n} record(s) older than {self.max_age:g}s discarded unsent")

    def take_batch(self, vs: VirtualShard) -> list:
        """Up to BatchSize records and 6 MB of event from the head of the queue
        (lock held)."""
        batch, size = [], 0
        while vs.queue and len(batch) < self.args.batch_size:
            item = vs.queue[0]
            if batch and size + item[2] > EVENT_LIMIT - 64:
                break
            batch.append(vs.queue.popleft())
            size += item[2]
        return batch

    def batch_ready(self, vs: VirtualShard) -> bool:
        if len(vs.queue) >= self.args.batch_size:
            return True
        size = 0
        for item in vs.queue:
            size += item[2]
            if size > EVENT_LIMIT - 64:
                return True
        return False

    def pipeline_loop(self, vs: VirtualShard) -> None:
        """One virtual shard: a batch is invoked when BatchSize records are waiting,
        or the next one would pass 6 MB, or the batching window (which begins when
        the previous invocation completes) has passed and a record is waiting."""
        window_start = time.monotonic()
        while not self.stop.is_set():
            with vs.cond:
                while not self.stop.is_set():
                    self.prune_queue(vs)
                    now = time.monotonic()
                    due = window_start + self.args.window
                    if vs.queue and (now >= due or self.batch_ready(vs)):
                        break
                    wait = 0.5 if not vs.queue else min(0.5, max(0.0, due - now))
                    vs.cond.wait(wait)
                if self.stop.is_set():
                    break
                batch = self.take_batch(vs)
            self.deliver(vs, batch)
            window_start = time.monotonic()
        with vs.cond:
            self.count("buffered_unsent", len(vs.queue))

    def deliver(self, vs: VirtualShard, batch: list) -> None:
        """Invokes with one batch (and, bisecting, its halves in order) until each
        part succeeds, expires or runs out of retries."""
        with self.lock:
            self.c["in_flight_batches"] += 1
            self.c["peak_in_flight_batches"] = max(self.c["peak_in_flight_batches"],
                                                   self.c["in_flight_batches"])
        try:
            parts = [batch]
            while parts:
                part = parts.pop(0)
                if not self.deliver_part(vs, part, parts):
                    self.count("buffered_unsent", len(part) + sum(len(p) for p in parts))
                    return
        finally:
            self.count("in_flight_batches", -1)

    def deliver_part(self, vs: VirtualShard, part: list, parts: list) -> bool:
        """One batch until it is done with (True) or the poller stops (False); a
        bisect puts the two halves at the front of `parts`."""
        errors, attempts, backoff = 0, 0, self.args.backoff
        while True:
            now = time.monotonic()
            fresh = [x for x in part if not self.expired(x[0], now)]
            if len(fresh) < len(part):
                self.count("expired_records", len(part) - len(fresh))
                say(f"{vs.name}: {len(part) - len(fresh)} record(s) of a failing batch older "
                    f"than {self.max_age:g}s discarded")
                part = fresh
            if not part:
                return True
            attempts += 1
            records = [x[1] for x in part]
            sent = time.time()
            status, function_error, text = self.invoke(
                json.dumps({"Records": records}).encode())
            done = time.time()
            if self.batch_log:
                self.batch_log.write(json.dumps({
                    "shard": vs.name, "records": len(records),
                    "first_seq": records[0]["dynamodb"]["SequenceNumber"],
                    "last_seq": records[-1]["dynamodb"]["SequenceNumber"],
                    "oldest_age_s": round(time.monotonic() - part[0][0], 3),
                    "sent": round(sent, 6), "done": round(done, 6), "attempt": attempts,
                    "status": status, "function_error": function_error,
                    "response": text[:1000]}) + "\n")
            if status == 200 and not function_error:
                with self.lock:
                    self.c["batches"] += 1
                    self.c["records"] += len(records)
                return True
            with self.lock:
                self.c["invoke_errors"] += 1
                if status == 429:
                    self.c["throttles"] += 1
                elif function_error:
                    self.c["function_errors"] += 1
            say(f"invoke of {len(records)} record(s) from {vs.name} failed (attempt "
                f"{attempts}): HTTP {status} {function_error or ''} {text[:300]}")
            if function_error and status == 200:
                if self.args.bisect and len(part) > 1:
                    mid = len(part) // 2
                    parts[:0] = [part[:mid], part[mid:]]
                    self.count("bisects")
                    return True
                errors += 1
                if 0 <= self.args.max_retries < errors:
                    with self.lock:
                        self.c["dropped_batches"] += 1
                        self.c["dropped_records"] += len(part)
                    return True
                self.count("retries")
            else:
                self.count("throttle_retries")
            # Wait the back-off, or until the oldest record expires if sooner.
            until_expiry = self.max_age - (time.monotonic() - part[0][0])
            if self.stop.wait(max(0.0, min(backoff, until_expiry + 0.001))):
                return False
            backoff = min(backoff * 2, self.args.max_backoff)

    def invoke(self, body: bytes) -> tuple[int, str | None, str]:
        req = urllib.request.Request(self.args.invoke, data=body, method="POST", headers={
            "Content-Type": "application/json", "X-Amz-Invocation-Type": "RequestResponse"})
        try:
            with urllib.request.urlopen(req, timeout=self.args.invoke_timeout) as r:
                return r.status, r.headers.get("X-Amz-Function-Error"), \
                    r.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("X-Amz-Function-Error"), \
                e.read().decode("utf-8", "replace")
        except OSError as e:
            return 0, None, f"{type(e).__name__}: {e}"

    def counters(self) -> dict:
        with self.lock:
            out = dict(self.c)
        out["stream_arn"] = self.arn
        out["settings"] = self.args.settings
        return out


def cmd_poll(args) -> int:
    args.settings = effective_settings(args)
    poller = Poller(args)

    def on_signal(signum, _frame):
        poller.stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    poller.start()
    while not poller.stop.wait(0.5):
        pass
    for vs in poller.vshards:
        with vs.cond:
            vs.cond.notify_all()
    deadline = time.time() + args.stop_grace
    for t in poller.pipelines + poller.readers:
        t.join(max(0.0, deadline - time.time()))
    counters = poller.counters()
    text = json.dumps(counters, sort_keys=True)
    if args.stats_file:
        with open(args.stats_file, "w") as f:
            f.write(text + "\n")
    print(text, flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="See the module docstring for the details.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("enable", help="turn the table's stream on, print its ARN")
    p.add_argument("table")
    p.add_argument("--view-type", default="KEYS_ONLY",
                   choices=["KEYS_ONLY", "NEW_IMAGE", "OLD_IMAGE", "NEW_AND_OLD_IMAGES"])
    p.add_argument("--wait", type=float, default=30.0)
    p.set_defaults(func=cmd_enable)

    p = sub.add_parser("records", help="print the stream's records as one Lambda event")
    p.add_argument("table")
    p.add_argument("--after", metavar="SEQ", help="only records after this sequence number")
    p.add_argument("--filter-prefix", metavar="PREFIX",
                   help="only INSERTs whose partition key begins with PREFIX")
    p.add_argument("--key-attribute", default="PK", help="partition key attribute (PK)")
    p.add_argument("--pretty", action="store_true")
    p.set_defaults(func=cmd_records)

    p = sub.add_parser("poll", help="the event source mapping: stream -> Invoke URL")
    p.add_argument("table")
    p.add_argument("--invoke", required=True, metavar="URL")
    p.add_argument("--template", metavar="FILE",
                   help="read the mapping's settings from this SAM template (template.yaml)")
    p.add_argument("--function", default="RelayFunction",
                   help="the function whose stream mapping --template reads (RelayFunction)")
    p.add_argument("--param", action="append", default=[], metavar="K=V",
                   help="a template parameter for --template (repeatable)")
    p.add_argument("--filter-prefix", metavar="PREFIX",
                   help="keep only INSERTs whose partition key begins with PREFIX "
                        "(instead of the template's FilterCriteria)")
    p.add_argument("--key-attribute", default=None,
                   help="partition key attribute (default: the table's)")
    p.add_argument("--batch-size", type=int, help="BatchSize (default 100)")
    p.add_argument("--window", type=float,
                   help="MaximumBatchingWindowInSeconds (default 0)")
    p.add_argument("--starting-position", choices=["LATEST", "TRIM_HORIZON"],
                   help="StartingPosition (default LATEST)")
    p.add_argument("--max-retries", type=int,
                   help="MaximumRetryAttempts after function errors (default -1: until the "
                        "records expire)")
    p.add_argument("--max-record-age", type=float, metavar="SECONDS",
                   help="MaximumRecordAgeInSeconds (default -1: the stream's 24 h retention)")
    p.add_argument("--bisect", action=argparse.BooleanOptionalAction, default=None,
                   help="BisectBatchOnFunctionError (default off)")
    p.add_argument("--shards", type=int, default=1,
                   help="virtual shards: the records split by a hash of the partition key, "
                        "each with its own in-order pipeline (default 1)")
    p.add_argument("--backoff", type=float, default=0.5,
                   help="first wait before retrying a failed batch, doubling (default 0.5)")
    p.add_argument("--max-backoff", type=float, default=10.0,
                   help="longest wait between retries (default 10)")
    p.add_argument("--poll-interval", type=float, default=0.25)
    p.add_argument("--discover-interval", type=float, default=1.0)
    p.add_argument("--invoke-timeout", type=float, default=960.0)
    p.add_argument("--stop-grace", type=float, default=5.0)
    p.add_argument("--ready-file")
    p.add_argument("--stats-file")
    p.add_argument("--batch-log")
    p.set_defaults(func=cmd_poll)

    args = parser.parse_args()
    if (getattr(args, "batch_size", None) or 1) < 1:
        parser.error("--batch-size must be at least 1")
    if getattr(args, "shards", 1) < 1:
        parser.error("--shards must be at least 1")
    if getattr(args, "max_record_age", None) is not None and \
            args.max_record_age < 0 and args.max_record_age != -1:
        parser.error("--max-record-age must be -1 or at least 0")
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 1
    except Exception as e:  # boto3/botocore errors: one line, exit 1
        die(f"{type(e).__name__}: {e}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
