#!/usr/bin/env python3
"""The serverless cost model, measured: the real relay function binary
under scripts/lambda_runtime.py, a timer standing in for the schedule, and in doorbell
mode scripts/streams.py poll standing in for the event source mapping, in three modes x
three loads, with the billed function time, invocations, cold starts, DynamoDB requests by
operation, commit -> visible-in-Kafka latency, refused writes, lost messages and per-key
order of each cell, and the USD per month they come to.

  scripts/stack.sh run -- $HOME/.cache/dynamo-outbox/venv/bin/python scripts/cost_model.py \\
      [--modes a,b,c] [--loads idle,trickle,steady] [--idle-seconds 300] ...

Modes (the template's, with WakeOn and RelayIdleStop):
  a  always-on (no idle stop): OUTBOX_IDLE_STOP=never, schedule every 60 s, no stream
  b  idle stop + schedule: OUTBOX_IDLE_STOP=5s, schedule every 60 s, no stream
     (WakeOn=schedule without an event bus)
  c  idle stop + doorbell: OUTBOX_IDLE_STOP=5s, schedule every 300 s, the table's
     KEYS_ONLY stream polled by streams.py with the template's RelayDoorbell mapping read
     from template.yaml (BatchSize 100 unless --stream-batch-size, window 0 s unless --stream-window, record age
     60 s, no retries, its filter) invoking the function synchronously (WakeOn=stream,
     the template's default)
--delivery exactly-once runs the relay with OUTBOX_DELIVERY=exactly-once (and a watermark
topic made for the run).

Every mode: relay timeout 70 s, 256 MB, max concurrency 5 (ReservedConcurrentExecutions),
OUTBOX_MAX_RUN_TIME=900s and OUTBOX_SHUTDOWN_MARGIN=3s (the template's), the schedule's
payload {"source":"dynamo-outbox.schedule"} as an asynchronous invocation with the
relay's EventInvokeConfig read from template.yaml (no retries, 60 s event age).

Loads: idle (nothing written), trickle (one message every --trickle-interval seconds),
steady (--steady-rate messages a second). Messages are written as the library's writer
does (docs/item-schema.md): UpdateItem ADD on the bucket's counter, then a
TransactWriteItems with the message's conditional Put, by boto3, one message per
transaction, --writers threads, each key written by one thread only (so commit order per
key is defined); each value carries its id, key, per-key number and send time. A
confluent-kafka consumer thread reads the topic from the start and stamps each record's
arrival; latency = arrival - the writer's return from TransactWriteItems (the commit).

Each cell (mode x load) gets a fresh table, topic and emulator:
  1. the emulator starts (schedule first tick at --warmup + P/2, then every P); one
     warm-up invocation with the schedule's payload (source "event", not counted) puts the
     deployment in its steady state (in mode a: a relay running when the window opens);
  2. the measurement window W = [t0, t0 + D) opens --warmup seconds after the emulator's
     start; the load runs for D seconds;
  3. drain: wait until every committed message is in Kafka (at most P + timeout + 20 s),
     and until every invocation started in W has answered;
  4. the emulator's /stats give every invocation's record and response (the relay's
     summary JSON: trigger, stop_reason, published, refused_writes, dynamodb_requests).
Counted: schedule invocations received in W, and every doorbell invocation of the cell
(all are caused by W's writes; nothing is written outside W). Per hour: (3600 / P) x the
mean of the counted schedule invocations + the doorbell invocations x 3600 / D; in modes
a and b with D a multiple of P this equals the window's sum x 3600 / D.

A load named in --stationary-loads (default: steady) runs instead from the warm-up
invocation on until every invocation counted in W has ended (W's end + timeout + 5 s), so
that each counted invocation works under the load for its whole run, as in a deployment
with that load all the time (with the load only inside W, the relay started before W does
part of W's work uncounted, and the last ones idle after W). Then only the doorbells
received in W count, and the latency, throughput and writer figures are those of the
messages committed in W (lost and order: every message of the cell).

--compress F divides the schedule periods and the relay timeout by F (not the idle stop,
the margin or the loads): only for quick checks, the figures are not the deployment's.

Prints one JSON line per cell as it ends, and the whole result as JSON to --out (a
file; default: $CARGO_TARGET_DIR/bench/cost/<UTC start>-<commit>-<run id>.json, with
CARGO_TARGET_DIR defaulting to ~/.cache/dynamo-outbox/target: raw run output stays out
of the repository) and a Markdown table on stdout.

The bill (bill(), per cell; --reprice FILE... prints it for recorded --out files; a
self-check of the pricing functions: --self-test): us-east-1 list prices, one table
(PRICE_TABLE, with the page each is read from and the date, PRICES_READ), 730 hours a
month, free tiers not deducted. Counted for the default stack (WakeOn=stream, arm64,
256 MB, msk-iam, no AlarmTopicArn): Lambda GB-s and requests (schedule, doorbell and
successor invocations alike); EventBridge Scheduler invocations; DynamoDB reads in RRU by
the bytes each Query reads (query_mix splits the measured Query count by kind from the
relay's structure: an estimate), writes in WRU by item size, the stream (reads by the
event source mapping are free), storage (not material: the outbox holds only unpublished
messages); CloudWatch EMF custom metrics (emf_metric_count), alarms (the template's, which
always exist: template_alarm_count) and Logs (log_bytes_h: line sizes rebuilt from the log formats, an
estimate). your_vpc_adds() names what the user's VPC adds (interface endpoints, a NAT
gateway) and a SCRAM secret; they are not in the stack's figures. The old relay-side
figure (usd_month: every Query 1 RRU; Lambda, scheduler, DynamoDB only) is kept in each
cell for comparison.
"""

from __future__ import annotations

import argparse
import bisect
import datetime
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter, defaultdict

import boto3
from botocore.config import Config
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(SCRIPTS)
PY = sys.executable
# The stream mapping (RelayDoorbell) and the relay's EventInvokeConfig are read from the
# template itself (streams.py poll --template, lambda_runtime.py --template).
TEMPLATE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "template.yaml")
SCHEDULE_PAYLOAD = '{"source":"dynamo-outbox.schedule"}'
PREFIX = "OUTBOX"
BUCKETS = 8
HOURS_PER_MONTH = 730

# Every price of the bill, USD, us-east-1 list prices, in one table: key -> (price, unit,
# the AWS pricing page it is read from). Read on PRICES_READ from the stored copies of those
# pages; free tiers are not deducted anywhere (they are per account, not per stack).
PRICES_READ = "2026-12-02"
PRICE_TABLE = {
    # Lambda, arm64 (the template's architecture), first 7.5 billion GB-s a month.
    "lambda_arm64_gb_s": (0.0000133334, "GB-second", "https://aws.amazon.com/lambda/pricing/"),
    "lambda_request": (0.20 / 1e6, "request", "https://aws.amazon.com/lambda/pricing/"),
    # DynamoDB on-demand (the template's BillingMode: PAY_PER_REQUEST), standard table class.
    "ddb_rru": (0.125 / 1e6, "read request unit",
                "https://aws.amazon.com/dynamodb/pricing/on-demand/"),
    "ddb_wru": (0.625 / 1e6, "write request unit",
                "https://aws.amazon.com/dynamodb/pricing/on-demand/"),
    "ddb_storage_gb_month": (0.25, "GB-month (the first 25 GB a month free)",
                             "https://aws.amazon.com/dynamodb/pricing/on-demand/"),
    # "You are not charged for GetRecords API calls invoked by AWS Lambda as part of
    # DynamoDB triggers" (the same page, DynamoDB Streams); enabling a stream costs nothing.
    "ddb_stream_read_by_lambda": (0.0, "GetRecords by an event source mapping",
                                  "https://aws.amazon.com/dynamodb/pricing/on-demand/"),
    "scheduler_invocation": (1.00 / 1e6, "schedule invocation (after 14 million free a month)",
                             "https://aws.amazon.com/eventbridge/pricing/"),
    # CloudWatch: a custom metric (EMF) per metric name and dimension set, pro-rated by the
    # hour; a standard-resolution alarm per alarm metric; Logs (Standard class; Lambda's
    # logs start at the same rate) ingestion and archive storage.
    "cw_metric_month": (0.30, "metric-month (first 10,000 metrics)",
                        "https://aws.amazon.com/cloudwatch/pricing/"),
    "cw_alarm_month": (0.10, "standard-resolution alarm metric-month",
                       "https://aws.amazon.com/cloudwatch/pricing/"),
    "cw_logs_ingest_gb": (0.50, "GB ingested", "https://aws.amazon.com/cloudwatch/pricing/"),
    "cw_logs_store_gb_month": (0.03, "GB-month stored",
                               "https://aws.amazon.com/cloudwatch/pricing/"),
    # Only with KafkaAuth scram-* / plain (the default, msk-iam, has no secret).
    "secret_month": (0.40, "secret-month", "https://aws.amazon.com/secrets-manager/pricing/"),
    "secret_api_call": (0.05 / 1e4, "API call", "https://aws.amazon.com/secrets-manager/pricing/"),
    # What the user's VPC may add (not priced into the stack's figures).
    "vpce_interface_hour": (0.01, "interface endpoint-hour per AZ",
                            "https://aws.amazon.com/privatelink/pricing/"),
    "vpce_interface_gb": (0.01, "GB processed (first PB)",
                          "https://aws.amazon.com/privatelink/pricing/"),
    "nat_gateway_hour": (0.045, "NAT gateway-hour", "https://aws.amazon.com/vpc/pricing/"),
    "nat_gateway_gb": (0.045, "GB processed", "https://aws.amazon.com/vpc/pricing/"),
}
PRICES = {k: v[0] for k, v in PRICE_TABLE.items()}

MODES = {
    "a": {"name": "always-on", "idle_stop": "never", "schedule": 60.0, "stream": False},
    "b": {"name": "idle stop + schedule", "idle_stop": "5s", "schedule": 60.0, "stream": False},
    "c": {"name": "idle stop + doorbell", "idle_stop": "5s", "schedule": 300.0, "stream": True},
}


def say(msg: str) -> None:
    print(f"[cost-model {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ the item schema

M32 = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (docs/item-schema.md), as an unsigned 32-bit value."""
    m, r = 0x5BD1E995, 24
    h = (0x9747B28C ^ len(data)) & M32
    n4 = len(data) // 4
    for i in range(n4):
        k = int.from_bytes(data[4 * i:4 * i + 4], "little")
        k = (k * m) & M32
        k ^= k >> r
        k = (k * m) & M32
        h = (h * m) & M32
        h ^= k
    tail = data[4 * n4:]
    if len(tail) == 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if len(tail) >= 1:
        h ^= tail[0]
        h = (h * m) & M32
    h ^= h >> 13
    h = (h * m) & M32
    h ^= h >> 15
    return h


def bucket_of(key: bytes, count: int = BUCKETS) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % count


def ticks(t: float) -> int:
    return 621355968000000000 + int(round(t * 1e7))


assert bucket_of(b"customer-42") == 1 and bucket_of(b"customer-42", 32) == 25
assert bucket_of(b"order-1001") == 6 and bucket_of(b"") == 1
assert ticks(1796047200) == 639316440000000000


def ddb_client():
    return boto3.client(
        "dynamodb", endpoint_url=os.environ.get("AWS_ENDPOINT_URL_DYNAMODB"),
        region_name=os.environ.get("AWS_REGION", "us-east-1"),
        config=Config(retries={"max_attempts": 5, "mode": "standard"},
                      max_pool_connections=32))


def create_table(name: str, stream: bool) -> None:
    ddb = ddb_client()
    kw = {}
    if stream:
        kw["StreamSpecification"] = {"StreamEnabled": True, "StreamViewType": "KEYS_ONLY"}
    ddb.create_table(
        TableName=name, BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[{"AttributeName": "PK", "AttributeType": "S"},
                              {"AttributeName": "SK", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"},
                   {"AttributeName": "SK", "KeyType": "RANGE"}], **kw)
    ddb.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 0.2})


def delete_table(name: str) -> None:
    try:
        ddb_client().delete_table(TableName=name)
    except Exception as e:  # best effort: DynamoDB Local is in memory and goes with the stack
        say(f"delete_table {name}: {e}")


# ------------------------------------------------------------------------- Kafka

def kafka_conf() -> dict:
    return {"bootstrap.servers": os.environ["KAFKA_BOOTSTRAP_SERVERS"], "log_level": 3}


def create_topic(name: str, partitions: int) -> None:
    admin = AdminClient(kafka_conf())
    fut = admin.create_topics([NewTopic(name, num_partitions=partitions,
                                        replication_factor=1)], operation_timeout=30)
    try:
        fut[name].result(timeout=30)
    except KafkaException as e:
        if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        md = admin.list_topics(topic=name, timeout=5)
        t = md.topics.get(name)
        if t is not None and t.error is None and len(t.partitions) >= partitions:
            return
        time.sleep(0.1)
    raise RuntimeError(f"topic {name} not in the metadata after 30 s")


class Reader(threading.Thread):
    """Reads the topic from the start; records each record's arrival time."""

    def __init__(self, topic: str, partitions: int):
        super().__init__(daemon=True, name="kafka-reader")
        self.topic, self.partitions = topic, partitions
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.first: dict[str, float] = {}  # message id -> first arrival
        self.deliveries: list[tuple] = []  # (partition, offset, id, key, n, arrival)
        self.unparsed = 0
        self.errors: list[str] = []
        self.assigned = threading.Event()

    def run(self) -> None:
        c = Consumer({**kafka_conf(), "group.id": f"cost-model-{uuid.uuid4()}",
                      "enable.auto.commit": False, "auto.offset.reset": "earliest",
                      "fetch.wait.max.ms": 50, "fetch.error.backoff.ms": 50})
        try:
            # From offset 0, not OFFSET_BEGINNING (scripts/kafka.py says why).
            c.assign([TopicPartition(self.topic, p, 0) for p in range(self.partitions)])
            self.assigned.set()
            while not self.stop.is_set():
                msgs = c.consume(num_messages=500, timeout=0.05)
                now = time.time()
                for msg in msgs:
                    err = msg.error()
                    if err is not None:
                        if err.code() != KafkaError._PARTITION_EOF:
                            self.errors.append(str(err))
                        continue
                    try:
                        v = json.loads(msg.value())
                        mid, key, n = v["id"], v["key"], v["n"]
                    except (ValueError, KeyError, TypeError):
                        self.unparsed += 1
                        continue
                    with self.lock:
                        self.deliveries.append((msg.partition(), msg.offset(), mid, key, n, now))
                        self.first.setdefault(mid, now)
        finally:
            c.close()

    def have(self, ids) -> int:
        with self.lock:
            return sum(1 for i in ids if i in self.first)


# ----------------------------------------------------------------------- writers

class Writers:
    """Messages g = 0, 1, ... at t0 + offset + g / rate, key = keys[g % K], written by
    thread g % T (K is a multiple of T, so each key has one writer thread)."""

    def __init__(self, table: str, topic: str, rate: float, offset: float, duration: float,
                 threads: int, keys: int):
        if keys % threads:
            raise ValueError("--keys must be a multiple of --writers")
        self.table, self.topic = table, topic
        self.rate, self.offset, self.duration = rate, offset, duration
        self.threads, self.keys = threads, keys
        self.count = max(0, math.floor((duration - offset) * rate - 1e-9) + 1) \
            if duration > offset else 0
        self.until = float("inf")  # absolute time; set_until() ends a stationary load
        self.lock = threading.Lock()
        self.committed: dict[str, dict] = {}  # id -> {key, n, sent, committed}
        self.requests = Counter()
        self.failed = 0
        self.retried = 0
        self.late = []  # seconds behind schedule at send
        self.workers: list[threading.Thread] = []

    def start(self, t0: float) -> None:
        for j in range(self.threads if self.count is None else
                       min(self.threads, max(self.count, 1))):
            t = threading.Thread(target=self.run, args=(j, t0), daemon=True, name=f"writer-{j}")
            self.workers.append(t)
            t.start()

    def join(self, timeout: float) -> None:
        end = time.time() + timeout
        for t in self.workers:
            t.join(max(0.0, end - time.time()))

    def set_until(self, t: float) -> None:
        self.until = t

    def run(self, j: int, t0: float) -> None:
        ddb = ddb_client()
        g = j
        while self.count is None or g < self.count:
            due = t0 + self.offset + g / self.rate
            if due >= self.until:
                break
            g += self.threads
            pause = due - time.time()
            if pause > 0:
                time.sleep(pause)
            else:
                self.late.append(-pause)
            self.write(ddb, g - self.threads)

    def write(self, ddb, g: int) -> None:
        key = f"key-{g % self.keys:03d}"
        n = g // self.keys
        kb = key.encode()
        b = bucket_of(kb)
        sent = time.time()
        mid = str(uuid.uuid4())
        for attempt in range(4):
            try:
                self.requests["UpdateItem"] += 1
                out = ddb.update_item(
                    TableName=self.table,
                    Key={"PK": {"S": f"{PREFIX}#SEQUENCE#{b}"}, "SK": {"S": "SEQUENCE"}},
                    UpdateExpression="ADD #s :n", ExpressionAttributeNames={"#s": "Sequence"},
                    ExpressionAttributeValues={":n": {"N": "1"}}, ReturnValues="UPDATED_NEW")
                seq = int(out["Attributes"]["Sequence"]["N"])
                value = json.dumps({"id": mid, "key": key, "n": n, "sent": round(sent, 6)})
                item = {
                    "PK": {"S": f"{PREFIX}#MESSAGES#{b}"}, "SK": {"S": f"{seq:019d}"},
                    "MessageId": {"S": mid}, "Topic": {"S": self.topic},
                    "Key": {"B": kb}, "Value": {"B": value.encode()},
                    "CreatedAtUtc": {"N": str(ticks(sent))}, "BucketCount": {"N": str(BUCKETS)},
                }
                self.requests["TransactWriteItems"] += 1
                ddb.transact_write_items(TransactItems=[{"Put": {
                    "TableName": self.table, "Item": item,
                    "ConditionExpression": "attribute_not_exists(#sk)",
                    "ExpressionAttributeNames": {"#sk": "SK"}}}])
                committed = time.time()
                with self.lock:
                    self.committed[mid] = {"key": key, "n": n, "sent": sent,
                                           "committed": committed}
                return
            except Exception as e:  # reserve again and retry, as the writer does
                self.retried += 1
                say(f"write of message {g} failed (attempt {attempt + 1}): {e}")
                time.sleep(0.2)
        self.failed += 1


# --------------------------------------------------------------------- emulator

def http(url: str, data: bytes | None = None, headers: dict | None = None,
         timeout: float = 30.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=data, headers=headers or {},
                                 method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class Emulator:
    def __init__(self, args, mode: dict, table: str, workdir: str, name: str):
        self.port_file = os.path.join(workdir, f"{name}.port")
        self.log = os.path.join(workdir, f"{name}.function.log")
        self.stderr = open(os.path.join(workdir, f"{name}.emulator.log"), "w")
        self.period = mode["schedule"] / args.compress
        self.timeout = args.timeout / args.compress
        offset = args.warmup + self.period / 2
        cmd = [PY, os.path.join(SCRIPTS, "lambda_runtime.py"), args.binary,
               "--function-name", "outbox-relay", "--timeout", f"{self.timeout:g}",
               "--memory", str(args.memory), "--max-concurrency", str(args.max_concurrency),
               *(["--cpu-share"] if args.cpu_share else []),
               "--schedule", f"{self.period:g}", "--schedule-offset", f"{offset:g}",
               "--schedule-payload", SCHEDULE_PAYLOAD, "--port-file", self.port_file,
               "--template", TEMPLATE, "--template-function", "RelayFunction",
               "--log-file", self.log, "--log-format", "JSON", "--log-level", "INFO",
               "--env", f"OUTBOX_TABLE_NAME={table}",
               "--env", f"OUTBOX_KEY_PREFIX={PREFIX}",
               "--env", f"OUTBOX_BUCKET_COUNT={BUCKETS}",
               "--env", f"OUTBOX_IDLE_STOP={mode['idle_stop']}",
               "--env", "OUTBOX_MAX_RUN_TIME=900s",
               "--env", "OUTBOX_SHUTDOWN_MARGIN=3s",
               *(["--env", "OUTBOX_DELIVERY=exactly-once",
                  "--env", f"OUTBOX_WATERMARK_TOPIC={args.watermark_topic}"]
                 if args.delivery == "exactly-once" else [])]
        self.started = time.time()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.stderr,
                                     start_new_session=True)
        deadline = time.time() + 20
        while not os.path.exists(self.port_file):
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"the emulator did not start (see {self.stderr.name})")
            time.sleep(0.05)
        with open(self.port_file) as f:
            self.port = int(f.read().strip())
        self.base = f"http://127.0.0.1:{self.port}"
        self.invoke_url = f"{self.base}/2015-03-31/functions/outbox-relay/invocations"

    def invoke_event(self, payload: str) -> None:
        code, body = http(self.invoke_url, payload.encode(), {"X-Amz-Invocation-Type": "Event"})
        if code != 202:
            raise RuntimeError(f"async invoke: HTTP {code} {body[:200]!r}")

    def stats(self, invocations: bool = True) -> dict:
        code, body = http(f"{self.base}/stats?invocations={1 if invocations else 0}",
                          timeout=60)
        if code != 200:
            raise RuntimeError(f"/stats: HTTP {code}")
        return json.loads(body)

    def shutdown(self) -> None:
        try:
            http(f"{self.base}/shutdown", b"", timeout=30)
        except OSError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.stderr.close()


class StreamPoller:
    def __init__(self, table: str, invoke_url: str, workdir: str, name: str, args):
        self.ready = os.path.join(workdir, f"{name}.poller.ready")
        self.stats_file = os.path.join(workdir, f"{name}.poller.json")
        self.batch_log = os.path.join(workdir, f"{name}.poller.batches.jsonl")
        self.stderr = open(os.path.join(workdir, f"{name}.poller.log"), "w")
        cmd = [PY, os.path.join(SCRIPTS, "streams.py"), "poll", table, "--invoke", invoke_url,
               "--template", TEMPLATE, "--function", "RelayFunction",
               "--param", f"KeyPrefix={PREFIX}",
               "--ready-file", self.ready, "--stats-file", self.stats_file,
               "--batch-log", self.batch_log]
        if args.stream_window is not None:
            cmd += ["--window", f"{args.stream_window:g}"]
        if args.stream_max_retries is not None:
            cmd += ["--max-retries", str(args.stream_max_retries)]
        if args.stream_batch_size is not None:
            cmd += ["--batch-size", str(args.stream_batch_size)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.stderr,
                                     start_new_session=True)
        deadline = time.time() + 30
        while not os.path.exists(self.ready):
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"the stream poller did not start (see {self.stderr.name})")
            time.sleep(0.05)
        with open(self.ready) as f:
            self.settings = json.load(f)["settings"]

    def batches(self) -> list[dict]:
        out = []
        try:
            with open(self.batch_log) as f:
                for line in f:
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass
        except OSError:
            pass
        return out

    def stop(self) -> dict:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.stderr.close()
        try:
            with open(self.stats_file) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}


# ---------------------------------------------------------------------- figures

def percentile(values: list[float], q: float) -> float | None:
    """Nearest rank."""
    if not values:
        return None
    s = sorted(values)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


def summary_of(rec: dict) -> dict | None:
    if rec.get("status") != "ok":
        return None
    try:
        return json.loads(rec.get("response") or "null")
    except ValueError:
        return None


def aggregate(recs: list[dict]) -> dict:
    out = {"invocations": len(recs), "billed_ms": 0, "cold_starts": 0, "published": 0,
           "refused_writes": 0, "dynamodb_requests": Counter(),
           "dynamodb_consistent_reads": Counter(), "stop_reasons": Counter(),
           "triggers": Counter(), "statuses": Counter(), "no_summary": 0,
           "init_ms": [], "duration_ms": []}
    for r in recs:
        out["billed_ms"] += r.get("billed_ms") or 0
        out["cold_starts"] += 1 if r.get("cold") else 0
        out["statuses"][r.get("status")] += 1
        out["duration_ms"].append(r.get("duration_ms") or 0)
        if r.get("cold") and r.get("init_ms") is not None:
            out["init_ms"].append(r["init_ms"])
        s = summary_of(r)
        if s is None:
            out["no_summary"] += 1
            continue
        out["published"] += s.get("published", 0)
        out["refused_writes"] += s.get("refused_writes", 0)
        out["stop_reasons"][s.get("stop_reason")] += 1
        out["triggers"][s.get("trigger")] += 1
        for op, n in (s.get("dynamodb_requests") or {}).items():
            out["dynamodb_requests"][op] += n
        for op, n in (s.get("dynamodb_consistent_reads") or {}).items():
            out["dynamodb_consistent_reads"][op] += n
    return out


def per_hour(ticks_agg: dict, bell_agg: dict, period: float, window: float, key: str):
    """(3600 / P) x mean per schedule invocation + doorbells x 3600 / D."""
    n = ticks_agg["invocations"]
    tick_part = (3600 / period) * (ticks_agg[key] / n) if n else 0.0
    return tick_part + bell_agg[key] * 3600 / window


def delete_batches(requests: dict) -> float:
    """The requests that delete published messages, at most 25 each: BatchWriteItem, or
    with exactly-once delivery PartiQL's BatchExecuteStatement (conditional deletes)."""
    return requests.get("BatchWriteItem", 0) + requests.get("BatchExecuteStatement", 0)


def units(requests: dict, published: float) -> dict:
    """Request units from the operation counts (assumptions in the module doc and in
    BENCHMARKS.md): Query 1 RRU (strongly consistent, under 4 KB: the upper bound, the
    idle probes are eventually consistent, 0.5), UpdateItem / PutItem / DeleteItem 1 WRU,
    BatchWriteItem and (exactly-once's conditional deletes) BatchExecuteStatement 1 WRU
    per deleted message (= published), TransactWriteItems 2 per item (one item each),
    GetItem 1 RRU."""
    rru = requests.get("Query", 0) + requests.get("GetItem", 0)
    wru = (requests.get("UpdateItem", 0) + requests.get("PutItem", 0)
           + requests.get("DeleteItem", 0) + 2 * requests.get("TransactWriteItems", 0))
    batches = delete_batches(requests)
    if batches:
        wru += max(published, batches)
    return {"rru": rru, "wru": wru}


def usd_month(billed_ms_h: float, invocations_h: float, ticks_h: float, rru_h: float,
              wru_h: float, memory_mb: int) -> dict:
    gb_s = billed_ms_h / 1000 * memory_mb / 1024 * HOURS_PER_MONTH
    out = {
        "lambda_gb_s": gb_s,
        "lambda_compute": gb_s * PRICES["lambda_arm64_gb_s"],
        "lambda_requests": invocations_h * HOURS_PER_MONTH * PRICES["lambda_request"],
        "scheduler": ticks_h * HOURS_PER_MONTH * PRICES["scheduler_invocation"],
        "dynamodb_relay": (rru_h * PRICES["ddb_rru"] + wru_h * PRICES["ddb_wru"])
        * HOURS_PER_MONTH,
    }
    out["total_relay_side"] = (out["lambda_compute"] + out["lambda_requests"]
                               + out["scheduler"] + out["dynamodb_relay"])
    return out


# ------------------------------------------------------------------- the whole bill
#
# What the default stack (template.yaml with its defaults: WakeOn=stream, arm64, 256 MB,
# KafkaAuth msk-iam, no AlarmTopicArn) is billed for, per mode and load, from the counts a
# cell recorded. DynamoDB's rules (the developer guide's "DynamoDB read and write
# operations", docs.aws.amazon.com/amazondynamodb/latest/developerguide/
# read-write-operations.html): a Query is one read of the total size of the items it
# reads, rounded up to the next 4 KB (1 RRU per 4 KB strongly consistent, half that
# eventually consistent), and still consumes that minimum when it finds nothing; a
# projection ("keys only") and a COUNT do not change the item sizes counted; a write or
# delete is 1 WRU per 1 KB of the item (the larger of before and after), per item of a
# BatchWriteItem, 2 per KB in a transaction.

MAX_RELAY_ID = 128  # MAX_RELAY_ID_LEN (lib/src/options.rs)
# The relay id in the deployment: "{function name}-{request id}"; SAM names the function
# "{stack}-RelayFunction-{12 characters}" (41 characters for a stack "dynamo-outbox").
DEPLOYED_RELAY_ID_LEN = len("dynamo-outbox-RelayFunction-AbCdEfGh1234") + 1 + 36
COORDINATION_HEARTBEATS = 4  # heartbeat records read with the leases (live + not cleaned)
RENEW_INTERVAL_S = 10.0  # RelayOptions::lease_renew_interval
BACKLOG_SAMPLE_S = 60.0  # BACKLOG_SAMPLE_INTERVAL (lib/src/relay/mod.rs)
DELETE_CHUNK = 25  # BatchWriteItem's most delete requests


def attr_bytes(name: str, kind: str, value) -> int:
    """An attribute's size as DynamoDB counts it: the name's UTF-8 bytes plus the value's
    (S: UTF-8 bytes, B: bytes); numbers counted at their 21-byte maximum, as the library's
    schema::item_size does (an upper bound)."""
    n = len(name.encode())
    if kind == "S":
        return n + len(str(value).encode())
    if kind == "B":
        return n + len(value)
    if kind == "N":
        return n + 21
    raise ValueError(kind)


def item_bytes(attrs: list[tuple]) -> int:
    return sum(attr_bytes(*a) for a in attrs)


def message_item_bytes(topic: str = "orders", key_len: int = 7, value_len: int = 100,
                       headers_len: int = 0, prefix: str = PREFIX) -> int:
    """A message item as docs/item-schema.md lays it out (PK, SK, MessageId, Topic, Key,
    Value, Headers when present, CreatedAtUtc, BucketCount)."""
    attrs = [("PK", "S", f"{prefix}#MESSAGES#7"), ("SK", "S", "0" * 19),
             ("MessageId", "S", "0" * 36), ("Topic", "S", topic),
             ("Key", "B", b"k" * key_len), ("Value", "B", b"v" * value_len),
             ("CreatedAtUtc", "N", 0), ("BucketCount", "N", 0)]
    if headers_len:
        attrs.append(("Headers", "B", b"h" * headers_len))
    return item_bytes(attrs)


def cost_model_message_bytes(topic: str = "cost-c-steady-91c88b") -> int:
    """The items this model's writers write (Writers.write): a 7-byte key, a JSON value."""
    value = json.dumps({"id": str(uuid.UUID(int=0)), "key": "key-000", "n": 1000,
                        "sent": 1796047200.123456})
    return message_item_bytes(topic, 7, len(value))


def lease_item_bytes(relay_id_len: int = DEPLOYED_RELAY_ID_LEN, prefix: str = PREFIX) -> int:
    return item_bytes([("PK", "S", f"{prefix}#COORDINATION"), ("SK", "S", "LEASE#0000000003"),
                       ("Owner", "S", "r" * relay_id_len), ("ExpiresAtUtc", "N", 0)])


def heartbeat_item_bytes(relay_id_len: int = DEPLOYED_RELAY_ID_LEN,
                         prefix: str = PREFIX) -> int:
    return item_bytes([("PK", "S", f"{prefix}#COORDINATION"),
                       ("SK", "S", "RELAY#" + "r" * relay_id_len), ("LastSeenUtc", "N", 0),
                       ("StopsAtUtc", "N", 0), ("StoppedAtUtc", "N", 0)])


def counter_item_bytes(prefix: str = PREFIX) -> int:
    return item_bytes([("PK", "S", f"{prefix}#SEQUENCE#7"), ("SK", "S", "SEQUENCE"),
                       ("Sequence", "N", 0)])


def coordination_read_bytes(buckets: int = BUCKETS, heartbeats: int = COORDINATION_HEARTBEATS,
                            relay_id_len: int = DEPLOYED_RELAY_ID_LEN) -> int:
    """One read of the coordination partition: every lease and heartbeat item."""
    return buckets * lease_item_bytes(relay_id_len) + heartbeats * heartbeat_item_bytes(
        relay_id_len)


def query_rru(total_bytes: float, consistent: bool = True) -> float:
    """A Query's read request units: the items' total size rounded up to 4 KB, at least
    one unit (an empty result is charged too); half for an eventually consistent read."""
    units = max(1, math.ceil(total_bytes / 4096))
    return units if consistent else units / 2


def write_units(item_size: float) -> int:
    """A write or delete of one item: 1 WRU per 1 KB, rounded up, at least 1."""
    return max(1, math.ceil(item_size / 1024))


def runs_of(cell: dict) -> list[tuple[float, dict]]:
    """The counted invocations as (weight per hour, record): a schedule tick weighs
    (3600 / P) / ticks counted, a doorbell 3600 / D. Doorbells left out of the recorded
    list (over 400 in a cell) come back from the window's totals: the skipped ones
    (covered, empty) as 10 ms answers, the rest as runs sharing the doorbells' billed
    time."""
    period, window = cell["schedule_period_s"], cell["window_s"]
    inv = cell["invocation_list"]
    ticks = [r for r in inv if r["source"] == "schedule" and 0 <= r["at_s"] < window
             and r.get("status") != "throttled"]
    bells = [r for r in inv if r["source"] == "invoke" and r.get("status") != "throttled"
             and (not cell["stationary_load"] or 0 <= r["at_s"] < window)]
    out = [((3600 / period) / len(ticks), r) for r in ticks] if ticks else []
    n_bells = cell["doorbell_invocations"]
    if bells or not n_bells:
        out += [(3600 / window, r) for r in bells]
        return out
    w = cell["window"]
    skipped = sum(n for k, n in w["stop_reasons"].items()
                  if k in ("covered", "empty", "not_this_outbox"))
    ran = n_bells - skipped
    bell_ms = (w["doorbell_billed_ms_mean"] or 0) * n_bells
    skip_ms = 10
    out.append((3600 / window * skipped, {"source": "invoke", "trigger": "doorbell",
                                          "stop_reason": "covered", "billed_ms": skip_ms,
                                          "published": 0}))
    if ran:
        per_run = max(0.0, bell_ms - skipped * skip_ms) / ran
        out.append((3600 / window * ran, {"source": "invoke", "trigger": "doorbell",
                                          "stop_reason": "deadline", "billed_ms": per_run}))
    return out


SKIPPED = ("covered", "empty", "not_this_outbox")


def query_mix(cell: dict, message_bytes: int, coordination_bytes: int,
              buckets: int = BUCKETS) -> dict:
    """The relay's Query count per hour (measured) split by kind, from the structure of a
    run (lib/src/relay, lib/src/protocol/store; an estimate, bounded by the measured count
    of strongly consistent queries when the binary reports it), each kind with the RRU one
    query of it costs:
      coordination  read_coordination: one per round (every 10 s from the start), one
                    before an idle stop, one per doorbell decision (coverage); strong,
                    every lease and heartbeat item (coordination_bytes)
      probe_strong  probe_consistent of each owned bucket before an idle stop (8 for a
                    lone relay); strong, at most one message item read
      backlog_head  the owner of bucket 0, every 60 s from its second round: a strong
                    one-item Query per bucket
      backlog_count with it, an eventually consistent COUNT per bucket (it reads the
                    pending items; at these loads under 4 KB)
      fetch         fetches that found messages: one per batch, counted as the
                    BatchWriteItem requests (one per batch of at most 25); strong, the
                    batch's items (published / batches x message_bytes)
      strong_empty  with the measured split: the strong queries beyond the kinds above,
                    fetches that found nothing (after a batch that removed messages the
                    next look fetches at once) and gap probes, 1 RRU each
      probe         the rest: the idle probes (eventually consistent, keys-only projection
                    but billed by the item read: one message item, or nothing); without
                    the measured split also the gap probes and empty fetches (not
                    separated, so priced as probes)."""
    ph = cell["per_hour"]
    q = ph["dynamodb_requests"].get("Query", 0.0)
    bw = delete_batches(ph["dynamodb_requests"])
    published = ph["published"]
    coord = probe_strong = backlog = 0.0
    for w, r in runs_of(cell):
        if r.get("stop_reason") in SKIPPED:
            coord += w  # the coverage read of the decision
            continue
        t = (r.get("billed_ms") or 0) / 1000
        coord += w * math.ceil(max(t, 0.001) / RENEW_INTERVAL_S)
        if r.get("trigger") == "doorbell":
            coord += w
        if r.get("stop_reason") == "idle":
            coord += w
            probe_strong += w * buckets
        if t > RENEW_INTERVAL_S:
            backlog += w * (1 + math.floor((t - RENEW_INTERVAL_S) / BACKLOG_SAMPLE_S)) * buckets
    fetches = bw
    per_fetch = published / fetches * message_bytes if fetches else 0.0
    mix = {
        "coordination": (coord, query_rru(coordination_bytes)),
        "probe_strong": (probe_strong, query_rru(message_bytes)),
        "backlog_head": (backlog, query_rru(message_bytes)),
        "backlog_count": (backlog, query_rru(message_bytes * 0, consistent=False)),
        "fetch": (fetches, query_rru(per_fetch)),
    }
    strong = ph.get("consistent_queries")
    if strong is None:
        known = coord + probe_strong + 2 * backlog + fetches
        probes = q - known
        mix["probe"] = (max(0.0, probes), query_rru(message_bytes, consistent=False))
        unexplained = min(0.0, probes)
    else:
        # Measured split: the strong queries beyond the kinds above are fetches that found
        # nothing and gap probes (1 RRU each, the minimum of a strong read); the eventually
        # consistent ones beyond the backlog counts are the idle probes.
        strong_rest = strong - coord - probe_strong - backlog - fetches
        probes = q - strong - backlog
        mix["strong_empty"] = (max(0.0, strong_rest), query_rru(0))
        mix["probe"] = (max(0.0, probes), query_rru(message_bytes, consistent=False))
        unexplained = min(0.0, strong_rest) + min(0.0, probes)
    return {"queries_h": q, "kinds": mix, "unexplained_h": unexplained,
            "rru_h": sum(n * u for n, u in mix.values())}


def emf_metric_count(cell: dict) -> int:
    """Metrics the relay's EMF documents carry in an hour (lib/src/metrics/emf.rs: one
    dimension set, service and table; only flushes that carry information render a
    document: something published, failed, refused, lost or found pending). A cell whose
    runs published nothing (and, in these runs, failed, refused and lost nothing) reports
    no metric at all: an idle outbox's leases, rounds, buckets and cold starts are not
    reported. With messages published: Published, BatchDuration and CommitToAckLatency,
    with them LeasesAcquired, OwnedBuckets, RoundDuration and ColdStart (counted in every
    hour, an upper bound), and PendingMessages and OldestPendingAge when a run lasts past
    its first round (the backlog sample). Not counted: failures, refusals, lost leases,
    poison items (0 in these runs)."""
    runs = [r for _, r in runs_of(cell) if r.get("stop_reason") not in SKIPPED]
    if not runs or cell["per_hour"]["published"] <= 0:
        return 0
    n = 3 + 4  # Published, BatchDuration, CommitToAckLatency; leases, buckets, rounds, cold start
    if any((r.get("billed_ms") or 0) / 1000 > RENEW_INTERVAL_S for r in runs):
        n += 2
    return n


def log_line_bytes(relay_id_len: int = DEPLOYED_RELAY_ID_LEN) -> dict:
    """Sizes of the relay's log lines, rebuilt from their formats (no function log of the
    published runs is kept): the function's JSON lines (tracing-subscriber's JSON, no time,
    no target, with the run's span carrying the relay id), Lambda's JSON platform records
    (LogFormat: JSON, SystemLogLevel: INFO: platform.start and platform.report), an EMF
    document per flush (8 metrics, 12 duration values)."""
    rid = "r" * relay_id_len
    span = {"relay_id": rid, "name": "run_until"}
    app = json.dumps({"level": "INFO", "fields": {"message": "bucket ownership", "bucket": 3,
                                                   "ownership": "owns"},
                      "span": span, "spans": [span]}, separators=(",", ":"))
    done = json.dumps({"level": "INFO", "fields": {
        "message": "relay invocation done", "relay_id": rid, "published": 12,
        "publish_failures": 0, "buckets_owned": 8, "refused_writes": 0,
        "trigger": "Doorbell", "stop_reason": "idle", "released": True,
        "successor_started": False, "time_left_ms": 61234}}, separators=(",", ":"))
    req = str(uuid.UUID(int=0))
    start = json.dumps({"time": "2026-12-01T12:44:51.123Z", "type": "platform.start",
                        "record": {"requestId": req, "version": "$LATEST"}},
                       separators=(",", ":"))
    report = json.dumps({"time": "2026-12-01T12:44:56.123Z", "type": "platform.report",
                         "record": {"requestId": req, "metrics": {
                             "durationMs": 5087.123, "billedDurationMs": 5088,
                             "memorySizeMB": 256, "maxMemoryUsedMB": 31,
                             "initDurationMs": 41.2}, "status": "success"}},
                        separators=(",", ":"))
    names = ["LeasesAcquired", "OwnedBuckets", "PendingMessages", "OldestPendingAge",
             "RoundDuration", "ColdStart", "Published", "BatchDuration"]
    emf = json.dumps({"_aws": {"Timestamp": 1796047200123, "CloudWatchMetrics": [{
        "Namespace": "Outbox", "Dimensions": [["service", "table"]],
        "Metrics": [{"Name": m, "Unit": "Count"} for m in names]}]},
        "service": "outbox-relay", "table": "dynamo-outbox-OutboxTable-ABCDEFGHIJKL",
        **{m: 1 for m in names}, "RoundDuration": [12.5] * 7, "BatchDuration": [4.5] * 5},
        separators=(",", ":"))
    return {"app": len(app) + 1, "done": len(done) + 1, "platform": len(start) + len(report) + 2,
            "emf": len(emf) + 1, "duration_value": len("12.5,"),
            "latency_value": len("1065.104,")}


def log_bytes_h(cell: dict, buckets: int = BUCKETS) -> float:
    """Log bytes per hour (an estimate from the lines' formats, log_line_bytes): every
    invocation Lambda's two platform records; a skipped doorbell one decision line; a run
    its INFO lines (relay starting, claimed buckets, an ownership line per bucket claimed
    and per bucket released, the idle decision, relay stopped, the successor decision,
    the Kafka connection when it published, invocation done) and, when it published, one
    EMF document (an idle run reports nothing), plus a value per batch for BatchDuration (the batches: BatchWriteItem requests) and one per
    published message for CommitToAckLatency."""
    size = log_line_bytes()
    total = 0.0
    for w, r in runs_of(cell):
        total += w * size["platform"]
        if r.get("stop_reason") in SKIPPED:
            total += w * size["app"]
            continue
        lines = 2 + 2 * buckets + (1 if r.get("stop_reason") == "idle" else 0) + 2
        lines += 1 if (r.get("published") or 0) > 0 else 0
        # An EMF document only from a run with something to report (lib/src/metrics/emf.rs).
        emf = size["emf"] if (r.get("published") or 0) > 0 else 0
        total += w * (lines * size["app"] + size["done"] + emf)
    total += delete_batches(cell["per_hour"]["dynamodb_requests"]) * size["duration_value"]
    total += cell["per_hour"]["published"] * size["latency_value"]
    return total


def template_alarm_count(params: dict | None = None) -> int:
    """The CloudWatch alarms template.yaml creates for a deployment with these parameters
    (default: the default deployment; AlarmTopicArn only adds their actions), with the
    Conditions evaluated (scripts/outbox_e2e/alarms: the enqueue function's with it).
    CloudWatch bills each standard-resolution alarm on one metric as one alarm metric."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from outbox_e2e import alarms as model
    return len(model.resolve_alarms(model.load_template(os.path.join(ROOT, "template.yaml")),
                                    params or {}))


def bill(cell: dict, message_bytes: int | None = None, memory_mb: int = 256,
         alarms: int | None = None) -> dict:
    """The monthly bill of one cell (USD), line by line, from its recorded counts. Default
    stack: the template's alarms, no secret (msk-iam)."""
    if alarms is None:
        alarms = template_alarm_count()
    ph = cell["per_hour"]
    req = ph["dynamodb_requests"]
    m = HOURS_PER_MONTH
    msg = message_bytes or cost_model_message_bytes()
    mix = query_mix(cell, msg, coordination_read_bytes())
    relay_writes = max(lease_item_bytes(), heartbeat_item_bytes())
    wru_h = (req.get("UpdateItem", 0.0) * write_units(relay_writes)
             + req.get("DeleteItem", 0.0) * write_units(heartbeat_item_bytes())
             + max(ph["published"], 0.0) * write_units(msg)
             + req.get("PutItem", 0.0) * write_units(relay_writes))
    gb_s = ph["billed_s"] * memory_mb / 1024 * m
    metrics = emf_metric_count(cell)
    logs_gb = log_bytes_h(cell) * m / 1e9
    lines = {
        "lambda_compute": gb_s * PRICES["lambda_arm64_gb_s"],
        "lambda_requests": ph["invocations"] * m * PRICES["lambda_request"],
        "scheduler": ph["schedule_invocations"] * m * PRICES["scheduler_invocation"],
        "dynamodb_reads": mix["rru_h"] * m * PRICES["ddb_rru"],
        "dynamodb_writes": wru_h * m * PRICES["ddb_wru"],
        "dynamodb_stream": 0.0,
        "dynamodb_storage": 0.0,
        "cloudwatch_metrics": metrics * PRICES["cw_metric_month"],
        "cloudwatch_alarms": alarms * PRICES["cw_alarm_month"],
        "cloudwatch_logs": logs_gb * (PRICES["cw_logs_ingest_gb"]
                                      + PRICES["cw_logs_store_gb_month"]),
    }
    return {
        "usd": lines, "total": sum(lines.values()),
        "counts": {"gb_s_month": gb_s, "invocations_h": ph["invocations"],
                   "schedule_h": ph["schedule_invocations"], "rru_h": mix["rru_h"],
                   "wru_h": wru_h, "queries": {k: v for k, v in mix["kinds"].items()},
                   "queries_unexplained_h": mix["unexplained_h"], "emf_metrics": metrics,
                   "log_gb_month": logs_gb, "message_item_bytes": msg,
                   "coordination_read_bytes": coordination_read_bytes()},
    }


def your_vpc_adds(azs: int = 2, secret: bool = False, cold_starts_month: float = 730,
                  lambda_api: bool = True) -> dict:
    """What the user's network adds around a relay in a VPC (SubnetIds given; without
    them it runs outside any VPC and needs none of this), not the stack's: the relay
    reaches DynamoDB (a gateway endpoint, free), the brokers (in the VPC), with
    successors started by invoking the function (lambda_api) the Lambda API, with a
    Kafka secret Secrets Manager (once per execution environment): an interface endpoint
    for each, per AZ, or one NAT gateway. A successor started through the table's stream
    (a continuation item) needs no Lambda endpoint: lambda_api=False."""
    month = HOURS_PER_MONTH
    out = {"dynamodb_gateway_endpoint": 0.0}
    if lambda_api:
        out["lambda_endpoint"] = azs * month * PRICES["vpce_interface_hour"]
    if lambda_api or secret:
        out["nat_gateway"] = month * PRICES["nat_gateway_hour"]
    if secret:
        out["secrets_manager_endpoint"] = azs * month * PRICES["vpce_interface_hour"]
        out["secret"] = PRICES["secret_month"] + cold_starts_month * PRICES["secret_api_call"]
    return out


def self_test() -> int:
    checks = []

    def check(name, got, want, tol=1e-9):
        ok = (abs(got - want) <= tol) if isinstance(want, float) else got == want
        checks.append((name, ok, got, want))

    check("query: empty strong", query_rru(0), 1)
    check("query: empty eventual", query_rru(0, consistent=False), 0.5)
    check("query: 4096 B", query_rru(4096), 1)
    check("query: 4097 B", query_rru(4097), 2)
    check("query: 10 items of 40.8 KB total -> 44 KB (the guide's example)",
          query_rru(40.8 * 1024), 11)
    check("query: 1500 x 64 B = 96 KB", query_rru(1500 * 64), 24)
    check("query: 8 KB eventual", query_rru(8192, consistent=False), 1.0)
    check("write: 500 B", write_units(500), 1)
    check("write: 1.6 KB", write_units(1.6 * 1024), 2)
    check("write: 1024 B", write_units(1024), 1)
    check("attr: N at 21", attr_bytes("Seq", "N", 5), 24)
    check("attr: S utf-8", attr_bytes("K", "S", "é"), 3)
    check("message item under 1 KB", message_item_bytes() < 1024, True)
    check("coordination read under 4 KB", coordination_read_bytes() < 4096, True)
    check("lease item", lease_item_bytes(10), 2 + 19 + 2 + 16 + 5 + 10 + 12 + 21)
    check("price: 1 M RRU", 1e6 * PRICES["ddb_rru"], 0.125)
    check("price: 1 M WRU", 1e6 * PRICES["ddb_wru"], 0.625)
    check("price: GB-s of a 256 MB second", 0.25 * PRICES["lambda_arm64_gb_s"],
          0.00000333335)
    fake = {"schedule_period_s": 300.0, "window_s": 300.0, "stationary_load": False,
            "doorbell_invocations": 0, "window": {},
            "invocation_list": [{"source": "schedule", "at_s": 150.0, "billed_ms": 5000,
                                 "stop_reason": "idle", "published": 0, "status": "ok"}],
            "per_hour": {"dynamodb_requests": {"Query": 51 * 12.0}, "published": 0.0,
                         "billed_s": 60.0, "invocations": 12.0,
                         "schedule_invocations": 12.0}}
    mix = query_mix(fake, 300, 2000)
    k = mix["kinds"]
    check("mix: an idle 5 s run reads the coordination twice", k["coordination"][0], 24.0)
    check("mix: and probes 8 buckets strongly", k["probe_strong"][0], 96.0)
    check("mix: the rest are 0.5 RRU probes", k["probe"], (612.0 - 120.0, 0.5))
    check("mix: RRU", mix["rru_h"], 24 + 96 + 0.5 * 492)
    # The same with the measured split: 130 strong queries, 10 of them beyond the known
    # kinds (empty fetches or gap probes, 1 RRU each); the other 482 eventual probes.
    fake["per_hour"]["consistent_queries"] = 130.0
    mix = query_mix(fake, 300, 2000)
    check("mix, measured: strong beyond the known kinds", mix["kinds"]["strong_empty"],
          (10.0, 1))
    check("mix, measured: eventual probes", mix["kinds"]["probe"], (482.0, 0.5))
    check("mix, measured: RRU", mix["rru_h"], 24 + 96 + 10 + 0.5 * 482)
    del fake["per_hour"]["consistent_queries"]
    check("emf: idle short runs report nothing", emf_metric_count(fake), 0)
    b = bill(fake)
    check("bill: requests", b["usd"]["lambda_requests"], 12 * 730 * 0.2e-6, 1e-12)
    check("bill: scheduler", b["usd"]["scheduler"], 12 * 730 * 1e-6, 1e-12)
    check("bill: metrics", b["usd"]["cloudwatch_metrics"], 0.0, 1e-12)
    check("alarms: the default deployment's", template_alarm_count(), 7)
    check("alarms: no enqueue API removes one, quarantine-after adds none",
          template_alarm_count({"PoisonPolicy": "quarantine-after=1",
                                "EnableEnqueueApi": "false"}), 6)
    check("bill: alarms", b["usd"]["cloudwatch_alarms"], 0.7, 1e-12)
    check("vpc: a gateway endpoint only, with the successor through the stream",
          sum(your_vpc_adds(lambda_api=False).values()), 0.0)
    passed = sum(1 for c in checks if c[1])
    for name, ok, got, want in checks:
        if not ok:
            print(f"FAIL {name}: got {got!r}, want {want!r}")
    print(f"{passed} passed, {len(checks) - passed} failed")
    return 0 if passed == len(checks) else 1


# The counts of the default stack's idle cell as a run measured them (mode c, idle, the
# relay at 128 MB with Lambda's CPU share, commit dacba38, 2026-12-02; BENCHMARKS.md, "The
# relay at 128 MB"): per hour 12 schedule invocations (no doorbell: nothing written), 61
# billed seconds, 612 Query, 228 UpdateItem, 12 DeleteItem, nothing published.
IDLE_RUN = {
    "commit": "dacba38", "memory_mb": 128,
    "schedule_period_s": 300.0, "window_s": 300.0, "stationary_load": False,
    "doorbell_invocations": 0, "window": {},
    "invocation_list": [{"source": "schedule", "at_s": 150.0, "billed_ms": 61_000 / 12,
                         "stop_reason": "idle", "published": 0, "status": "ok"}],
    "per_hour": {"dynamodb_requests": {"Query": 612.0, "UpdateItem": 228.0,
                                       "DeleteItem": 12.0},
                 "published": 0.0, "billed_s": 61.0, "invocations": 12.0,
                 "schedule_invocations": 12.0},
}


def idle_bill() -> int:
    """Prints the idle bill of the default stack from IDLE_RUN's counts, line by line,
    with today's template (its alarms) and EMF rule, and what a VPC adds."""
    b = bill(IDLE_RUN, memory_mb=IDLE_RUN["memory_mb"])
    print(f"Idle, default stack (counts of run {IDLE_RUN['commit']}, "
          f"{IDLE_RUN['memory_mb']} MB, {template_alarm_count()} alarms, "
          f"{b['counts']['emf_metrics']} EMF metrics), USD a month:")
    for k, v in b["usd"].items():
        print(f"  {k:20s} {v:8.4f}")
    print(f"  {'total':20s} {b['total']:8.4f}")
    for label, kw in [("in a VPC (WakeOn=stream: successors through the stream)",
                       {"lambda_api": False}),
                      ("in a VPC, a Kafka secret", {"lambda_api": False, "secret": True}),
                      ("in a VPC with WakeOn=schedule (successors invoked)", {})]:
        adds = your_vpc_adds(**kw)
        # The cheaper of the endpoints and the NAT gateway: one of them is needed.
        endpoints = sum(v for k, v in adds.items() if k.endswith("_endpoint"))
        nat = adds.get("nat_gateway", 0.0)
        route = min(endpoints, nat) if nat else endpoints
        other = sum(v for k, v in adds.items()
                    if not k.endswith("_endpoint") and k != "nat_gateway")
        print(f"{label}: + {route + other:.2f} (endpoints {endpoints:.2f} or NAT {nat:.2f}; "
              f"{', '.join(k for k in adds)}) = {b['total'] + route + other:.2f}")
    return 0


def bill_markdown(cells: list[dict], label=lambda c: "") -> str:
    lines = [
        "| Mode | Load | Lambda GB-s | Lambda requests | Scheduler | DynamoDB reads "
        "(RRU / h) | DynamoDB writes (WRU / h) | EMF metrics | Logs (GB / month) | "
        "Total USD / month |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        b = c.get("bill") or bill(c, memory_mb=c.get("memory_mb", 256))
        u, n = b["usd"], b["counts"]
        lines.append(
            f"| {c['mode']} | {c['load']}{label(c)} | {u['lambda_compute']:,.2f} | "
            f"{u['lambda_requests']:,.2f} | {u['scheduler']:,.2f} | "
            f"{u['dynamodb_reads']:,.2f} ({n['rru_h']:,.0f}) | "
            f"{u['dynamodb_writes']:,.2f} ({n['wru_h']:,.0f}) | "
            f"{u['cloudwatch_metrics']:,.2f} ({n['emf_metrics']}) | "
            f"{u['cloudwatch_logs']:,.2f} ({n['log_gb_month']:,.2f}) | "
            f"**{b['total']:,.2f}** |")
    return "\n".join(lines)


def slow_seconds(committed: dict, first: dict, t0: float, over: float = 2.0) -> list:
    per: dict[int, list[float]] = defaultdict(list)
    for m, c in committed.items():
        if m in first and first[m] - c["committed"] > over:
            per[int(c["committed"] - t0)].append(first[m] - c["committed"])
    return [[sec, len(v), round(max(v), 3)] for sec, v in sorted(per.items())]


def order_check(deliveries: list[tuple]) -> dict:
    """Per key, the per-key numbers of first deliveries, in delivery (offset) order."""
    seen = set()
    per_key: dict[str, list[int]] = defaultdict(list)
    for part, off, mid, key, n, _ in sorted(deliveries, key=lambda d: (d[0], d[1])):
        if mid in seen:
            continue
        seen.add(mid)
        per_key[key].append(n)
    violations = sum(1 for ns in per_key.values() for a, b in zip(ns, ns[1:]) if b <= a)
    return {"keys": len(per_key), "violations": violations}


# ------------------------------------------------------------------------ a cell

def run_cell(args, mode_id: str, load: str, run_id: str, workdir: str) -> dict:
    mode = MODES[mode_id]
    name = f"cost-{mode_id}-{load}-{run_id}"
    duration = {"idle": args.idle_seconds, "trickle": args.trickle_seconds,
                "steady": args.steady_seconds}[load]
    say(f"cell {mode_id} ({mode['name']}) x {load}: {duration:g} s window, table/topic {name}")
    create_table(name, mode["stream"])
    create_topic(name, args.partitions)
    reader = Reader(name, args.partitions)
    reader.start()
    reader.assigned.wait(30)
    writers = None
    # A stationary load runs from the warm-up on and until every invocation counted in the
    # window has ended (timeout + 5 s after it), so that each counted invocation works
    # under the load for its whole run, as in a deployment that has the load all the time.
    stationary = load in args.stationary_loads.split(",")
    if load == "trickle":
        writers = Writers(name, name, 1 / args.trickle_interval, args.trickle_interval / 2,
                          duration, 1, args.keys)
    elif load == "steady":
        writers = Writers(name, name, args.steady_rate, 0.0, duration, args.writers, args.keys)

    if writers and stationary:
        writers.count = None
    emu = Emulator(args, mode, name, workdir, name)
    poller = None
    poller_stats = {}
    mapping_settings = None
    poller_batch_log: list[dict] = []
    try:
        t0 = emu.started + args.warmup
        emu.invoke_event(SCHEDULE_PAYLOAD)  # the warm-up invocation (source "event")
        if writers and stationary:
            writers.start(emu.started + 3.0)  # the load is on from the warm-up
        if mode["stream"]:
            poller = StreamPoller(name, emu.invoke_url, workdir, name, args)
            mapping_settings = poller.settings
        if time.time() > t0 - 1:
            raise RuntimeError("the set-up took longer than --warmup; raise it")
        time.sleep(t0 - time.time())
        at_t0 = emu.stats(invocations=False)["totals"]
        t_end = t0 + duration
        if writers and not stationary:
            writers.start(t0)
        time.sleep(max(0.0, t_end - time.time()))
        at_end = emu.stats(invocations=False)["totals"]
        if writers and stationary:
            # Every invocation received in the window has ended by then (the timeout kills).
            time.sleep(max(0.0, t_end + emu.timeout + 5 - time.time()))
            writers.set_until(time.time())
        if writers:
            writers.join(60)
        ids = list(writers.committed) if writers else []  # every message of the cell
        # Drain: every committed message in Kafka.
        drain_limit = time.time() + emu.period + emu.timeout + 20
        while reader.have(ids) < len(ids) and time.time() < drain_limit:
            time.sleep(0.2)
        drained_at = time.time()
        # Every schedule invocation received in W has answered.
        ticks_expected = at_end["schedule_ticks"] - at_t0["schedule_ticks"]
        answer_limit = time.time() + emu.timeout + 15
        while time.time() < answer_limit:
            recs = emu.stats()["invocations"]
            done = [r for r in recs if r["source"] == "schedule" and r["status"] != "throttled"
                    and t0 <= r["received"] < t_end + 1]
            if len(done) >= ticks_expected:
                break
            time.sleep(1.0)
        if poller:
            poller_stats = poller.stop()
            poller_batch_log = poller.batches()
            poller = None
        final = emu.stats()
    finally:
        if poller:
            poller.stop()
        emu.shutdown()
        reader.stop.set()
        reader.join(10)
        delete_table(name)

    recs = final["invocations"]
    tick_recs = [r for r in recs if r["source"] == "schedule" and t0 <= r["received"] < t_end
                 and r["status"] != "throttled"]
    # Doorbells: every one of the cell when the load is inside the window; with a
    # stationary load, those received in the window.
    bell_recs = [r for r in recs if r["source"] == "invoke" and r["status"] != "throttled"
                 and (not stationary or t0 <= r["received"] < t_end)]
    throttled = Counter(r["source"] for r in recs if r["status"] == "throttled")
    warmup = [r for r in recs if r["source"] == "event"]
    ta, ba = aggregate(tick_recs), aggregate(bell_recs)
    period, memory = emu.period, args.memory
    both = aggregate(tick_recs + bell_recs)

    def ph(key):
        return per_hour(ta, ba, period, duration, key)

    ops = sorted(set(ta["dynamodb_requests"]) | set(ba["dynamodb_requests"]))
    req_h = {}
    for op in ops:
        n = ta["invocations"]
        tick_part = (3600 / period) * ta["dynamodb_requests"][op] / n if n else 0.0
        req_h[op] = tick_part + ba["dynamodb_requests"][op] * 3600 / duration
    published_h = ph("published")
    # The strongly consistent Query attempts an hour, when the binary reports them (its
    # summaries carry dynamodb_consistent_reads; older ones do not: None).
    if ta["dynamodb_consistent_reads"] or ba["dynamodb_consistent_reads"]:
        n = ta["invocations"]
        tick_part = ((3600 / period) * ta["dynamodb_consistent_reads"]["Query"] / n
                     if n else 0.0)
        consistent_queries_h = tick_part + ba["dynamodb_consistent_reads"]["Query"] * 3600 / duration
    else:
        consistent_queries_h = None
    u = units(req_h, published_h)
    ticks_h = 3600 / period
    invocations_h = (ticks_h if ta["invocations"] else 0.0) + ba["invocations"] * 3600 / duration
    billed_h = ph("billed_ms")
    cost = usd_month(billed_h, invocations_h, ticks_h, u["rru"], u["wru"], memory)

    all_committed = writers.committed if writers else {}
    committed = {m: c for m, c in all_committed.items() if t0 <= c["committed"] < t_end}
    lat = [reader.first[m] - c["committed"] for m, c in committed.items() if m in reader.first]
    lat_sent = [reader.first[m] - c["sent"] for m, c in committed.items() if m in reader.first]
    read_ids = set(reader.first)
    lost = set(all_committed) - read_ids
    unexpected = read_ids - set(all_committed)
    throughput = None
    if load == "steady":
        if stationary:
            # Messages that became visible inside the window, per second.
            throughput = sum(1 for t in reader.first.values() if t0 <= t < t_end) / duration
        else:
            firsts = sorted(reader.first[m] for m in committed if m in reader.first)
            commits = sorted(c["committed"] for c in committed.values())
            if len(firsts) > 1:
                # From the first commit to the last arrival.
                throughput = len(firsts) / (firsts[-1] - commits[0])
    share = len(committed) / len(all_committed) if all_committed else 0.0
    writer_req_h = ({op: n * share * 3600 / duration for op, n in writers.requests.items()}
                    if writers else {})
    warnings = []
    if not ta["invocations"]:
        warnings.append("no schedule invocation in the window: the schedule's share of the "
                        "figures per hour is missing (make the window longer than P / 2)")
    # Where a doorbell's latency goes (single-record batches: the trickle): from the
    # commit to the poller's invoke, and from the invoke to the record in Kafka.
    doorbell_delay, invoke_to_visible = [], []
    if poller_batch_log and committed:
        by_commit = sorted((c["committed"], m) for m, c in committed.items())
        times = [t for t, _ in by_commit]
        for b in poller_batch_log:
            if b.get("records") != 1 or b.get("attempt") != 1:
                continue
            i = bisect.bisect_right(times, b["sent"]) - 1
            if i < 0:
                continue
            t_c, mid = by_commit[i]
            doorbell_delay.append(b["sent"] - t_c)
            if mid in reader.first:
                invoke_to_visible.append(reader.first[mid] - b["sent"])
    compact = [{
        "source": r["source"], "at_s": round(r["received"] - t0, 3),
        "billed_ms": r.get("billed_ms"), "cold": r.get("cold"), "status": r.get("status"),
        **({k: s.get(k) for k in ("trigger", "stop_reason", "published", "refused_writes")}
           if (s := summary_of(r)) else {}),
    } for r in recs if r["source"] != "invoke" or len(bell_recs) <= 400]
    cell = {
        "mode": mode_id, "mode_name": mode["name"], "load": load, "table": name,
        "warnings": warnings, "stationary_load": stationary,
        "stream_window_s": mapping_settings["window_s"] if mapping_settings else None,
        "stream_mapping": mapping_settings,
        "window_s": duration, "schedule_period_s": period, "relay_timeout_s": emu.timeout,
        "idle_stop": mode["idle_stop"], "t0": round(t0, 3),
        "drain_s": round(drained_at - t_end, 3),
        "ticks_in_window": ticks_expected, "schedule_invocations_counted": ta["invocations"],
        "doorbell_invocations": ba["invocations"], "warmup_invocations": len(warmup),
        "throttled": dict(throttled),
        "window": {
            "billed_ms": both["billed_ms"], "invocations": both["invocations"],
            "cold_starts": both["cold_starts"], "published": both["published"],
            "refused_writes": both["refused_writes"],
            "dynamodb_requests": dict(both["dynamodb_requests"]),
            "stop_reasons": dict(both["stop_reasons"]), "triggers": dict(both["triggers"]),
            "statuses": dict(both["statuses"]), "no_summary": both["no_summary"],
            "init_ms_max": max(both["init_ms"]) if both["init_ms"] else None,
            "schedule_billed_ms_mean": (ta["billed_ms"] / ta["invocations"]
                                        if ta["invocations"] else None),
            "doorbell_billed_ms_mean": (ba["billed_ms"] / ba["invocations"]
                                        if ba["invocations"] else None),
        },
        "per_hour": {
            "billed_s": billed_h / 1000, "invocations": invocations_h,
            "schedule_invocations": ticks_h, "dynamodb_requests": req_h,
            "rru": u["rru"], "wru": u["wru"], "published": published_h,
            "writer_requests": writer_req_h,
            "consistent_queries": consistent_queries_h,
        },
        "usd_month": cost,
        "messages": {
            "stationary_load": stationary,
            "committed": len(committed), "committed_in_cell": len(all_committed),
            "planned": (writers.count or 0) if writers else 0,
            "write_failures": writers.failed if writers else 0,
            "write_retries": writers.retried if writers else 0,
            "writer_behind_max_s": max(writers.late) if writers and writers.late else 0.0,
            "read_distinct": len(read_ids), "deliveries": len(reader.deliveries),
            "duplicates": len(reader.deliveries) - len(read_ids),
            "lost": len(lost), "unexpected": len(unexpected), "unparsed": reader.unparsed,
            "kafka_errors": reader.errors[:5],
            "order": order_check(reader.deliveries),
            "offered_per_s": len(committed) / duration if duration else 0.0,
            "throughput_per_s": throughput,
        },
        "latency_s": {
            "n": len(lat), "p50": percentile(lat, 50), "p99": percentile(lat, 99),
            "max": max(lat) if lat else None,
            # Where the slow ones were: [second of the window (commit), messages over
            # 2 s, their max], for every second that had one.
            "slow_seconds": slow_seconds(committed, reader.first, t0),
            "from_send_p50": percentile(lat_sent, 50), "from_send_p99": percentile(lat_sent, 99),
        },
        "doorbell_path_s": {
            "commit_to_invoke_p50": percentile(doorbell_delay, 50),
            "commit_to_invoke_max": max(doorbell_delay) if doorbell_delay else None,
            "invoke_to_visible_p50": percentile(invoke_to_visible, 50),
            "invoke_to_visible_max": max(invoke_to_visible) if invoke_to_visible else None,
            "n": len(doorbell_delay),
        },
        "poller": poller_stats,
        "emulator_totals": final["totals"],
        "invocation_list": compact,
    }
    cell["memory_mb"] = memory
    cell["bill"] = bill(cell, memory_mb=memory)
    return cell


# ------------------------------------------------------------------------ output

def fmt(x, nd=1, unit=""):
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.{nd}f}{unit}"
    return f"{x:,}{unit}"


def op_short(req: dict) -> str:
    names = {"Query": "Q", "UpdateItem": "U", "PutItem": "P", "DeleteItem": "D",
             "BatchWriteItem": "BW", "BatchExecuteStatement": "BX", "TransactWriteItems": "TW",
             "GetItem": "G"}
    return " ".join(f"{names.get(op, op)} {n:,.0f}" for op, n in sorted(req.items()))


def markdown(cells: list[dict]) -> str:
    lines = [
        "| Mode | Load | Billed s / h | Invocations / h (cold in window) | DynamoDB requests / h "
        "(relay) | Latency p50 / p99 / max (s) | Messages (lost, order, refused) | "
        "USD / month (the whole bill) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        ph, m, lat = c["per_hour"], c["messages"], c["latency_s"]
        lat_s = ("-" if not lat["n"] else
                 f"{lat['p50']:.2f} / {lat['p99']:.2f} / {lat['max']:.2f}")
        order = "ok" if m["order"]["violations"] == 0 else f"{m['order']['violations']} violations"
        lines.append(
            f"| {c['mode']} {c['mode_name']} | {c['load']} | {ph['billed_s']:,.0f} | "
            f"{ph['invocations']:,.0f} ({c['window']['cold_starts']}) | "
            f"{op_short(ph['dynamodb_requests'])} | {lat_s} | "
            f"{m['committed']:,} ({m['lost']}, {order}, {c['window']['refused_writes']}) | "
            f"{c['bill']['total']:,.2f} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="See the module docstring for the details.")
    target_dir = os.environ.get("CARGO_TARGET_DIR",
                                os.path.expanduser("~/.cache/dynamo-outbox/target"))
    p.add_argument("--binary", default=os.path.join(
        target_dir, "release", "outbox-relay-function"), help="the relay function binary")
    p.add_argument("--binary-commit", help="the commit the binary was built from, for the "
                   "record (default: this checkout's HEAD)")
    p.add_argument("--modes", default="a,b,c")
    p.add_argument("--loads", default="idle,trickle,steady")
    p.add_argument("--idle-seconds", type=float, default=300.0)
    p.add_argument("--trickle-seconds", type=float, default=240.0)
    p.add_argument("--steady-seconds", type=float, default=180.0)
    p.add_argument("--trickle-interval", type=float, default=10.0)
    p.add_argument("--steady-rate", type=float, default=50.0)
    p.add_argument("--warmup", type=float, default=30.0,
                   help="seconds from the emulator's start (and the warm-up invocation) "
                        "to the window (default 30)")
    p.add_argument("--compress", type=float, default=1.0,
                   help="divide the schedule periods and the relay timeout by this")
    p.add_argument("--timeout", type=float, default=70.0, help="relay timeout (70 s)")
    p.add_argument("--memory", type=int, default=256)
    p.add_argument("--cpu-share", action="store_true",
                   help="the relay gets --memory/1769 of one CPU, as on Lambda "
                   "(lambda_runtime.py --cpu-share)")
    p.add_argument("--max-concurrency", type=int, default=5)
    p.add_argument("--stream-max-retries", type=int, default=None,
                   help="streams.py poll --max-retries (default: the template's "
                        "MaximumRetryAttempts, 0; throttles are retried until the records "
                        "pass MaximumRecordAgeInSeconds either way)")
    p.add_argument("--stream-window", type=float, default=None,
                   help="the poller's batching window in mode c (default: the template's "
                        "MaximumBatchingWindowInSeconds, 0)")
    p.add_argument("--stream-batch-size", type=int, default=None,
                   help="the poller's BatchSize in mode c (default: the template's)")
    p.add_argument("--stationary-loads", default="steady",
                   help="loads that run from the warm-up until the window's invocations have "
                        "ended (default: steady; empty: none)")
    p.add_argument("--delivery", choices=("at-least-once", "exactly-once"),
                   default="at-least-once",
                   help="the relay's OUTBOX_DELIVERY (exactly-once: a watermark topic is "
                   "created for the run)")
    p.add_argument("--writers", type=int, default=8)
    p.add_argument("--keys", type=int, default=32)
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--out", help="write the full result JSON here (default: "
                   "$CARGO_TARGET_DIR/bench/cost/<UTC start>-<commit>-<run id>.json)")
    p.add_argument("--workdir", help="logs of the emulator, function and poller "
                   "(default: a new temp dir, kept)")
    p.add_argument("--self-test", action="store_true",
                   help="check the pricing functions and exit")
    p.add_argument("--idle-bill", action="store_true",
                   help="price the recorded idle counts of the default stack (IDLE_RUN) "
                        "with today's template and metric rule, outside and in a VPC, "
                        "and exit")
    p.add_argument("--reprice", nargs="+", metavar="RESULT_JSON",
                   help="print the whole bill of recorded results (--out files) and exit")
    args = p.parse_args()
    if args.self_test:
        return self_test()
    if args.idle_bill:
        return idle_bill()
    if args.reprice:
        for path in args.reprice:
            with open(path) as f:
                result = json.load(f)
            print(f"{os.path.basename(path)} (commit {result.get('commit')}):")
            # Priced again from the counts, with today's template (its alarm count) and
            # prices, not the bill stored with the result.
            argv = result.get("argv") or []
            memory = int(argv[argv.index("--memory") + 1]) if "--memory" in argv else 256
            for cell in result["cells"]:
                cell.pop("bill", None)
                cell.setdefault("memory_mb", memory)
            print(bill_markdown(result["cells"]))
            print()
        print("Your VPC adds (2 AZs): " + ", ".join(
            f"{k} ${v:,.2f}" for k, v in your_vpc_adds(secret=True).items()))
        return 0
    for var in ("AWS_ENDPOINT_URL_DYNAMODB", "KAFKA_BOOTSTRAP_SERVERS"):
        if not os.environ.get(var):
            p.error(f"{var} is not set: run inside scripts/stack.sh run -- ...")
    if not os.path.exists(args.binary):
        p.error(f"no relay binary at {args.binary}")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    loads = [x.strip() for x in args.loads.split(",") if x.strip()]
    for m in modes:
        if m not in MODES:
            p.error(f"unknown mode {m}")
    for x in loads:
        if x not in ("idle", "trickle", "steady"):
            p.error(f"unknown load {x}")
    args.watermark_topic = None
    if args.delivery == "exactly-once":
        args.watermark_topic = f"cost-watermarks-{uuid.uuid4().hex[:8]}"
        create_topic(args.watermark_topic, 1)
    workdir = args.workdir or tempfile.mkdtemp(prefix="cost-model-")
    os.makedirs(workdir, exist_ok=True)
    run_id = uuid.uuid4().hex[:6]
    commit = args.binary_commit or subprocess.run(
        ["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
        capture_output=True, text=True).stdout.strip()
    started = datetime.datetime.now(datetime.timezone.utc)
    if not args.out:
        args.out = os.path.join(target_dir, "bench", "cost",
                                f"{started:%Y-%m-%dT%H%M%SZ}-{commit or 'nogit'}-{run_id}.json")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    say(f"run {run_id}, commit {commit}, logs in {workdir}, binary {args.binary}, "
        f"result in {args.out}")
    result = {
        "run_id": run_id, "commit": commit,
        "started_utc": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "argv": sys.argv[1:], "delivery": args.delivery,
        "prices_usd": PRICES, "prices_read": PRICES_READ,
        "hours_per_month": HOURS_PER_MONTH,
        "load_average_start": os.getloadavg(), "cells": [],
    }
    for m in modes:
        for x in loads:
            cell = run_cell(args, m, x, run_id, workdir)
            cell["load_average_end"] = os.getloadavg()
            result["cells"].append(cell)
            print(json.dumps({k: cell[k] for k in (
                "mode", "load", "warnings", "per_hour", "latency_s", "doorbell_path_s",
                "messages", "window", "usd_month", "bill")},
                default=str), flush=True)
            if args.out:
                with open(args.out, "w") as f:
                    json.dump(result, f, indent=1, default=str)
    result["ended_utc"] = datetime.datetime.now(datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1, default=str)
    print(markdown(result["cells"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
