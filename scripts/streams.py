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
  poll TABLE --invoke URL [--filter-prefix PREFIX] [--key-attribute PK]
             [--batch-size N] [--window SECONDS] [--starting-position LATEST]
             [--max-retries N] [--ready-file F] [--stats-file F] [--batch-log F]
        the event source mapping: reads every shard of the stream (the shards open
        at start from LATEST, or TRIM_HORIZON with --starting-position; shards
        created later from TRIM_HORIZON once their parent is read to its end;
        discovered every --discover-interval seconds), keeps the records the
        template's filter keeps (eventName INSERT and Keys.PK.S beginning with
        PREFIX, e.g. OUTBOX#MESSAGES#; without --filter-prefix every record),
        gathers them for up to --window seconds (MaximumBatchingWindowInSeconds,
        counted from the first record gathered) or --batch-size records
        (BatchSize; also at most 6 MB of event), and POSTs each batch as one event
        to URL (the Invoke URL of scripts/lambda_runtime.py,
        http://127.0.0.1:PORT/2015-03-31/functions/NAME/invocations), one shard
        at a time as Lambda does: the next batch of a shard waits for the previous
        invocation.  A function error, a throttle or an HTTP failure retries the
        same batch (backoff 0.5 s doubling to 10 s) up to --max-retries times
        (default -1: until it succeeds, the mapping's default, which blocks the
        shard), then drops it.  Each shard is polled every --poll-interval seconds
        (default 0.25: four GetRecords a second, as Lambda polls) while it has
        nothing new.  Writes --ready-file (and says "ready" on stderr) once every
        starting shard has its iterator, so writes after that are seen.  Stops on
        SIGTERM or SIGINT (an invocation in flight is waited for up to
        --stop-grace seconds), then prints its counters as JSON on stdout (and to
        --stats-file): batches, records (delivered in successful invocations),
        records_read, records_filtered_out, invoke_errors, function_errors,
        throttles, retries, dropped_batches, dropped_records, buffered_unsent,
        in_flight_batches, get_records_calls, shards_seen, shards_finished.
        --batch-log appends one JSON line per invocation attempt (shard, records,
        first/last sequence, sent/done times, HTTP status, function error, the
        response's first 1,000 characters).

Differences from the real service worth knowing: DynamoDB Local puts its own
region ("ddblocal") and account (000000000000) in the stream ARN and awsRegion,
and its ApproximateCreationDateTime is whole minutes; records are passed through
as DynamoDB Local returns them.  ReportBatchItemFailures, bisecting, on-failure
destinations and tumbling windows are not modelled.

Exit codes: 0 ok, 1 failure (a message goes to stderr), 2 usage.
"""

from __future__ import annotations

import argparse
import base64
import datetime
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


def stream_arn(ddb, table: str) -> str:
    desc = ddb.describe_table(TableName=table)["Table"]
    spec = desc.get("StreamSpecification") or {}
    arn = desc.get("LatestStreamArn")
    if not spec.get("StreamEnabled") or not arn:
        die(f"table {table} has no enabled stream (run: streams.py enable {table})")
    return arn


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

    def keep(rec: dict) -> bool:
        if rec.get("eventName") != "INSERT":
            return False
        key = (rec.get("dynamodb", {}).get("Keys") or {}).get(key_attribute) or {}
        return isinstance(key.get("S"), str) and key["S"].startswith(prefix)

    return keep


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

class Poller:
    def __init__(self, args):
        self.args = args
        self.ddb, self.streams = clients()
        self.arn = stream_arn(self.ddb, args.table)
        self.keep = make_filter(args.filter_prefix, args.key_attribute)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.c = {
            "batches": 0, "records": 0, "records_read": 0, "records_filtered_out": 0,
            "invoke_errors": 0, "function_errors": 0, "throttles": 0, "retries": 0,
            "dropped_batches": 0, "dropped_records": 0, "buffered_unsent": 0,
            "in_flight_batches": 0, "get_records_calls": 0, "shards_seen": 0,
            "shards_finished": 0,
        }
        self.known: dict[str, dict] = {}  # shard id -> {"parent", "state"}
        self.workers: list[threading.Thread] = []
        self.batch_log = open(args.batch_log, "a", buffering=1) if args.batch_log else None

    def count(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.c[key] += n

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
        for sid in pending:
            it = self.streams.get_shard_iterator(StreamArn=self.arn, ShardId=sid,
                                                 ShardIteratorType=initial)["ShardIterator"]
            self.launch(sid, it)
        threading.Thread(target=self.discover_loop, daemon=True).start()
        if self.args.ready_file:
            tmp = f"{self.args.ready_file}.tmp{os.getpid()}"
            with open(tmp, "w") as f:
                json.dump({"stream_arn": self.arn, "shards": len(pending)}, f)
            os.replace(tmp, self.args.ready_file)
        say(f"ready: {self.arn}, {len(pending)} shard(s) from {initial}, invoking "
            f"{self.args.invoke}")

    def launch(self, sid: str, iterator: str) -> None:
        self.known[sid]["state"] = "reading"
        t = threading.Thread(target=self.shard_loop, args=(sid, iterator), daemon=True)
        self.workers.append(t)
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

    def shard_loop(self, sid: str, it: str | None) -> None:
        bs, window = self.args.batch_size, self.args.window
        buffer: list[dict] = []
        buffer_bytes = 0
        gathered_since = None
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
            kept = 0
            for rec in records:
                last_seq = rec["dynamodb"]["SequenceNumber"]
                lr = lambda_record(rec, self.arn)
                if not self.keep(lr):
                    continue
                kept += 1
                size = len(json.dumps(lr)) + 2
                if buffer and buffer_bytes + size > EVENT_LIMIT - 64:
                    self.deliver(sid, buffer)
                    buffer, buffer_bytes = [], 0
                buffer.append(lr)
                buffer_bytes += size
                if gathered_since is None:
                    gathered_since = time.monotonic()
            self.count("records_read", len(records))
            self.count("records_filtered_out", len(records) - kept)
            while len(buffer) >= bs and not self.stop.is_set():
                self.deliver(sid, buffer[:bs])
                buffer = buffer[bs:]
                buffer_bytes = sum(len(json.dumps(x)) + 2 for x in buffer)
                gathered_since = time.monotonic() if buffer else None
            waited = time.monotonic() - gathered_since if gathered_since is not None else 0.0
            if buffer and (waited >= window or not it) and not self.stop.is_set():
                self.deliver(sid, buffer)
                buffer, buffer_bytes, gathered_since = [], 0, None
            if not it:
                break
            if not records:
                pause = self.args.poll_interval
                if buffer:
                    pause = max(0.0, min(pause, window - waited))
                self.stop.wait(pause)
        self.count("buffered_unsent", len(buffer))
        if not it:
            self.known[sid]["state"] = "done"
            self.count("shards_finished")

    def deliver(self, sid: str, batch: list[dict]) -> None:
        """Invokes with one batch until it succeeds or runs out of retries."""
        body = json.dumps({"Records": batch}).encode()
        attempts, backoff = 0, 0.5
        self.count("in_flight_batches")
        try:
            while True:
                attempts += 1
                sent = time.time()
                status, function_error, text = self.invoke(body)
                done = time.time()
                if self.batch_log:
                    self.batch_log.write(json.dumps({
                        "shard": sid, "records": len(batch),
                        "first_seq": batch[0]["dynamodb"]["SequenceNumber"],
                        "last_seq": batch[-1]["dynamodb"]["SequenceNumber"],
                        "sent": round(sent, 6), "done": round(done, 6), "attempt": attempts,
                        "status": status, "function_error": function_error,
                        "response": text[:1000]}) + "\n")
                if status == 200 and not function_error:
                    with self.lock:
                        self.c["batches"] += 1
                        self.c["records"] += len(batch)
                    return
                with self.lock:
                    self.c["invoke_errors"] += 1
                    if status == 429:
                        self.c["throttles"] += 1
                    elif function_error:
                        self.c["function_errors"] += 1
                say(f"invoke of {len(batch)} record(s) from {sid} failed (attempt {attempts}): "
                    f"HTTP {status} {function_error or ''} {text[:300]}")
                if 0 <= self.args.max_retries < attempts or self.stop.is_set():
                    with self.lock:
                        self.c["dropped_batches"] += 1
                        self.c["dropped_records"] += len(batch)
                    return
                self.count("retries")
                if self.stop.wait(backoff):
                    with self.lock:
                        self.c["dropped_batches"] += 1
                        self.c["dropped_records"] += len(batch)
                    return
                backoff = min(backoff * 2, 10.0)
        finally:
            self.count("in_flight_batches", -1)

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
        return out


def cmd_poll(args) -> int:
    poller = Poller(args)

    def on_signal(signum, _frame):
        poller.stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    poller.start()
    while not poller.stop.wait(0.5):
        pass
    deadline = time.time() + args.stop_grace
    for t in poller.workers:
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
    p.add_argument("--filter-prefix", metavar="PREFIX",
                   help="keep only INSERTs whose partition key begins with PREFIX")
    p.add_argument("--key-attribute", default="PK", help="partition key attribute (PK)")
    p.add_argument("--batch-size", type=int, default=100, help="BatchSize (default 100)")
    p.add_argument("--window", type=float, default=0.0,
                   help="MaximumBatchingWindowInSeconds (default 0)")
    p.add_argument("--starting-position", default="LATEST", choices=["LATEST", "TRIM_HORIZON"])
    p.add_argument("--max-retries", type=int, default=-1,
                   help="MaximumRetryAttempts (default -1: retry until it succeeds)")
    p.add_argument("--poll-interval", type=float, default=0.25)
    p.add_argument("--discover-interval", type=float, default=1.0)
    p.add_argument("--invoke-timeout", type=float, default=960.0)
    p.add_argument("--stop-grace", type=float, default=5.0)
    p.add_argument("--ready-file")
    p.add_argument("--stats-file")
    p.add_argument("--batch-log")
    p.set_defaults(func=cmd_poll)

    args = parser.parse_args()
    if getattr(args, "batch_size", 1) < 1:
        parser.error("--batch-size must be at least 1")
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 1
    except Exception as e:  # boto3/botocore errors: one line, exit 1
        die(f"{type(e).__name__}: {e}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
