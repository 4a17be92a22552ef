#!/usr/bin/env python3
"""End-to-end test of the serverless mode (WakeOn=stream) with the deployable artifacts:
the two `bootstrap` executables that `sam build` made, each under the local Lambda
emulator (scripts/lambda_runtime.py: real deadline headers, cold starts, freezes), the
table's KEYS_ONLY stream read by the stand-in for the event source mapping
(scripts/streams.py poll), and NO schedule: only the doorbell can start the relay.

  scripts/serverless_e2e.py BOOTSTRAP_DIR [--mode doorbell|tick] [--prefix CMD]
                            [--arch x86-64|aarch64] [options]

BOOTSTRAP_DIR is sam build's build directory (RelayFunction/bootstrap and
EnqueueFunction/bootstrap in it).  --prefix runs both through a command, e.g.
'qemu-aarch64-static -L /' for arm64 bootstraps on x86_64 (the loader and libraries of
Debian's libc6:arm64); --arch fails unless both are ELF executables of that machine.  Runs
inside `scripts/stack.sh run` (DynamoDB Local, Apache Kafka) with the stack's venv python.

--mode tick, the smoke run (scripts/test.sh runs sam build's arm64 bootstraps so under
qemu-aarch64-static): steps 0 and 1 below without the stream and the poller; 20 messages
over 5 keys through the enqueue function, checked as in step 2; one relay invocation
with the template's schedule payload ({"source":"dynamo-outbox.schedule"}): no function
error, trigger direct, published 20, stop_reason idle, released, 0 refused writes, the
deadline taken from the invocation and the answer before it (no other timing bound: an
emulator's durations say nothing about Lambda's); Kafka as in step 3; the table as in
step 5 (20 written); the relay's stdout carries its CloudWatch EMF documents (the table's
dimension, Published summing to 20); neither emulator saw an error, timeout or throttle.

What the default --mode doorbell does and checks:
  0. self-checks of the Python writer below against the vectors of lib/src/message.rs
     (Kafka's murmur2 test vectors) and docs/item-schema.md (buckets, header blob, ticks);
  1. a fresh outbox table (boto3 CreateTable as lib/src/table.rs: string PK/SK,
     on-demand) with a KEYS_ONLY stream (streams.py enable), a business table, a topic
     with 3 partitions; both functions under lambda_runtime.py with the template's
     environment (OUTBOX_TABLE_NAME, OUTBOX_KEY_PREFIX (a non-default prefix, so the
     variable matters), OUTBOX_BUCKET_COUNT, OUTBOX_MAX_RUN_TIME=900s,
     OUTBOX_SHUTDOWN_MARGIN=3s, OUTBOX_IDLE_STOP (2s here, the template's default is 5s),
     KAFKA_BOOTSTRAP_SERVERS and KAFKA_AUTH=none from the stack), its memory, timeouts,
     reserved concurrency and JSON logging, and nothing else of this process's
     environment (--clean-env, plus the stack's DynamoDB endpoint and credentials);
     the poller with the template's mapping, read from template.yaml (streams.py poll
     --template, KeyPrefix={prefix}: filter INSERT of {prefix}#MESSAGES#*, batch size
     10, no batching window, no retries, record age 60 s, from LATEST);
  2. phase 1: invokes the enqueue function with 20 messages over 5 keys; checks the
     response (ids, each bucket equal to murmur2(key) % 8 by the Python port, per-key
     ascending sequences); waits until the poller has delivered the 20 inserts to the
     relay; every relay invocation: trigger doorbell, no function error, released,
     0 refused writes, the deadline taken from the invocation, answered with at least
     half its timeout left; those that published stopped with stop_reason idle, the
     others (a later batch whose messages were already published) idle or covered;
     published 20 in all;
  3. reads the topic with the independent client (scripts/kafka.py): the set of
     message ids equals the set enqueued and no id twice, per-key order, each record in
     Kafka's default partition for its key, the headers;
  4. phase 2, a writer that is not the enqueue function: one TransactWriteItems by
     boto3 with a business item and 3 message puts, as the library's writer builds them
     (ADD Sequence on {prefix}#SEQUENCE#{bucket}, then Puts with attribute_not_exists on
     the sort key, the attributes of docs/item-schema.md); a new doorbell invocation
     publishes the 3, checked in Kafka as above (23 ids, each once, per-key order
     across both phases; headers byte for byte: the writer's in order, the null value
     as null, then the message-id header once, last);
  5. the table has no message item left, no lease has an owner, every relay heartbeat
     is stamped stopped, the sequence counters add up to 23; the poller delivered 23
     records, dropped none, filtered out the relay's own writes; the relay emulator saw
     no error, timeout or throttle.

Prints one line per step and a one-line summary; exits 1 with a message naming the
failed check (the function and poller logs' last lines are printed, the work directory
kept), 2 on usage.  Every process it started is stopped, also on failure or SIGTERM.
"""

from __future__ import annotations

import argparse
import base64
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid

import boto3

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
PY = sys.executable
NAME = "serverless-e2e"

# The template's settings (template.yaml): Globals and the functions' properties.
BUCKET_COUNT = 8
# Globals' MemorySize, the enqueue function's; the emulator gives the relay the same
# (the template's RelayMemorySize is 128: continuity_e2e.py --memory 128 --cpu-share).
MEMORY_MB = 256
ENQUEUE_TIMEOUT_S = 10
# The template reserves none by default (RelayReservedConcurrency empty); the emulator needs a
# ceiling on concurrent environments: 5.
RELAY_RESERVED_CONCURRENCY = 5
# The doorbell's event source mapping (RelayDoorbell): streams.py poll reads its settings
# from the template itself (--template, KeyPrefix given as a parameter).
TEMPLATE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "template.yaml")
SHUTDOWN_MARGIN = "3s"
MAX_RUN_TIME = "900s"

TOPIC_PARTITIONS = 3
MESSAGE_ID_HEADER = "x-outbox-message-id"
# The relay's schedule: the template's ScheduleV2 Input.
SCHEDULE_PAYLOAD = {"source": "dynamo-outbox.schedule"}


class Failed(Exception):
    pass


class Interrupted(Exception):
    pass


def require_stack(parser) -> None:
    """Ends with a usage error unless the stack's variables are set (scripts/stack.sh run)."""
    for var in ("AWS_ENDPOINT_URL_DYNAMODB", "KAFKA_BOOTSTRAP_SERVERS"):
        if not os.environ.get(var):
            parser.error(f"{var} is not set: run inside scripts/stack.sh run")


def interrupt_on_signals() -> None:
    """SIGTERM and SIGINT raise Interrupted, so the caller's cleanup stops what it started."""
    def on_signal(signum, _frame):
        raise Interrupted(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def step(msg: str) -> None:
    print(f"[{NAME}] {msg}", flush=True)


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise Failed(msg)


# ------------------------------------------------------------ the writer's bytes

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


def self_check() -> None:
    # Kafka's UtilsTest.testMurmur2, as in lib/src/message.rs.
    for data, expected in [(b"21", -973932308), (b"foobar", -790332482),
                           (b"a-little-bit-long-string", -985981536),
                           (b"a-little-bit-longer-string", -1486304829),
                           (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
                           (b"abc", 479470107)]:
        check(murmur2(data) == expected, f"murmur2 port: {data!r} gives {murmur2(data)}, "
                                         f"lib/src/message.rs says {expected}")
    # docs/item-schema.md's examples.
    check(murmur2(b"customer-42") == -542987495 and bucket_of(b"customer-42") == 1
          and bucket_of(b"customer-42", 32) == 25, "murmur2 port: customer-42")
    check(bucket_of(b"order-1001") == 6 and bucket_of(b"") == 1, "murmur2 port: doc buckets")
    keyless = uuid.UUID("0f8fad5b-d9cb-469f-a165-70867728950e").bytes_le
    check(murmur2(keyless) == -1580500322, "murmur2 port: keyless id bytes")
    blob = header_blob([("type", b"OrderPlaced"), ("trace", None), ("empty", b"")])
    check(base64.b64encode(blob).decode() ==
          "AQMAAAAEAAAAdHlwZQsAAABPcmRlclBsYWNlZAUAAAB0cmFjZf////8FAAAAZW1wdHkAAAAA",
          "header blob of docs/item-schema.md")
    check(ticks(1796047200) == 639316440000000000, "ticks of docs/item-schema.md")


def elf_machine(path: str) -> str:
    with open(path, "rb") as f:
        head = f.read(20)
    if head[:4] != b"\x7fELF":
        return "not ELF"
    machine = int.from_bytes(head[18:20], "little")
    return {62: "x86-64", 183: "aarch64"}.get(machine, f"ELF machine {machine}")


# --------------------------------------------------------------------- processes

class Proc:
    """A background process in its own session, its output in a log file."""

    def __init__(self, name: str, args: list[str], workdir: str, env: dict | None = None,
                 stdout_file: str | None = None):
        self.name = name
        self.log_path = os.path.join(workdir, f"{name}.log")
        self.log = open(self.log_path, "w")
        self.stdout_path = stdout_file
        out = open(stdout_file, "w") if stdout_file else self.log
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out,
                                     stderr=self.log, env=env, start_new_session=True)
        if stdout_file:
            out.close()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace: float = 15.0) -> int | None:
        """SIGTERM, wait up to `grace` s, then SIGKILL of its process group."""
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                step(f"{self.name} ignored SIGTERM for {grace:g}s; killing it")
        kill_group(self.proc.pid)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            step(f"warning: {self.name} (pid {self.proc.pid}) still alive")
        self.log.close()
        return self.proc.returncode

    def tail(self, n: int = 30) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""


def kill_group(pgid: int) -> None:
    for sig in (signal.SIGKILL, signal.SIGCONT):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def wait_file(path: str, proc: Proc, what: str, timeout: float = 60.0) -> str:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(path):
            with open(path) as f:
                text = f.read()
            if text.strip():
                return text
        if not proc.alive():
            raise Failed(f"{what} exited with {proc.proc.returncode} before it was ready:\n"
                         f"{proc.tail()}")
        time.sleep(0.1)
    raise Failed(f"{what} not ready after {timeout:g}s:\n{proc.tail()}")


class Function:
    """One function binary under scripts/lambda_runtime.py."""

    def __init__(self, name: str, binary: str, workdir: str, timeout: float, env: dict,
                 prefix: str, max_concurrency: int, init_timeout: float,
                 extra_args: list[str] | None = None):
        self.name = name
        self.timeout = timeout
        self.port_file = os.path.join(workdir, f"{name}.port")
        self.stats_file = os.path.join(workdir, f"{name}.stats.json")
        self.function_log = os.path.join(workdir, f"{name}.function.log")
        args = [PY, os.path.join(SCRIPTS, "lambda_runtime.py"), binary,
                "--function-name", name, "--memory", str(MEMORY_MB),
                "--timeout", f"{timeout:g}", "--max-concurrency", str(max_concurrency),
                "--init-timeout", f"{init_timeout:g}",
                "--port-file", self.port_file, "--stats-file", self.stats_file,
                "--log-file", self.function_log, "--log-format", "JSON",
                "--log-level", "INFO", "--clean-env"]
        if prefix:
            args.append(f"--prefix={prefix}")
        for k, v in env.items():
            args += ["--env", f"{k}={v}"]
        args += extra_args or []
        self.env_pids: set[int] = set()
        self.last_trace_id: str | None = None
        self.proc = Proc(f"{name}.emulator", args, workdir)
        self.port = 0

    def wait_ready(self) -> None:
        self.port = int(wait_file(self.port_file, self.proc, f"the {self.name} emulator"))

    @property
    def invoke_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/2015-03-31/functions/{self.name}/invocations"

    def invoke(self, payload: dict, timeout: float) -> tuple[int, str | None, bytes]:
        req = urllib.request.Request(self.invoke_url, data=json.dumps(payload).encode(),
                                     method="POST", headers={
                                         "Content-Type": "application/json",
                                         "X-Amz-Invocation-Type": "RequestResponse"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                # The invocation's X-Ray trace header (Lambda answers with it).
                self.last_trace_id = r.headers.get("X-Amzn-Trace-Id")
                return r.status, r.headers.get("X-Amz-Function-Error"), r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("X-Amz-Function-Error"), e.read()

    def stats(self, since: int = 0) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/stats?since={since}",
                                    timeout=10) as r:
            out = json.load(r)
        # Remembered for the cleanup: environments are process groups of their own.
        self.env_pids.update(e["pid"] for e in out["environments"] if e.get("pid"))
        return out

    def stop(self) -> dict | None:
        if self.port:
            try:
                self.stats()
            except OSError:
                pass
        self.proc.stop()
        final = None
        try:
            with open(self.stats_file) as f:
                final = json.load(f)
            self.env_pids.update(e["pid"] for e in final["environments"] if e.get("pid"))
        except (OSError, ValueError):
            pass
        for pid in self.env_pids:
            kill_group(pid)
        return final

    def function_tail(self, n: int = 40) -> str:
        try:
            with open(self.function_log, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""


# ------------------------------------------------------------------- DynamoDB

def ddb():
    return boto3.client("dynamodb")


def create_outbox_table(name: str) -> None:
    """As lib/src/table.rs's create_table_request: string PK/SK, on-demand."""
    client = ddb()
    client.create_table(
        TableName=name, BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[{"AttributeName": "PK", "AttributeType": "S"},
                              {"AttributeName": "SK", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"},
                   {"AttributeName": "SK", "KeyType": "RANGE"}])
    client.get_waiter("table_exists").wait(TableName=name,
                                           WaiterConfig={"Delay": 1, "MaxAttempts": 60})


def create_business_table(name: str) -> None:
    client = ddb()
    client.create_table(
        TableName=name, BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[{"AttributeName": "PK", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"}])
    client.get_waiter("table_exists").wait(TableName=name,
                                           WaiterConfig={"Delay": 1, "MaxAttempts": 60})


def scan(table: str) -> list[dict]:
    client = ddb()
    items, start = [], None
    while True:
        kw = {"TableName": table, "ConsistentRead": True}
        if start:
            kw["ExclusiveStartKey"] = start
        out = client.scan(**kw)
        items += out["Items"]
        start = out.get("LastEvaluatedKey")
        if not start:
            return items


def direct_write(table: str, business_table: str, prefix: str, topic: str,
                 messages: list[dict], order_id: str) -> list[dict]:
    """What a service writing through the library does, in boto3: reserve numbers per
    bucket (ADD Sequence, UPDATED_NEW; in message order), then one TransactWriteItems
    with the business item and each message's Put (attribute_not_exists on the sort
    key).  Returns each message with its id, bucket and sequence, and when the commit
    started (the call) and was sent (its first attempt's request leaving the client)."""
    client = ddb()
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


# ---------------------------------------------------------------------- Kafka

def kafka_py(*args: str) -> str:
    out = subprocess.run([PY, os.path.join(SCRIPTS, "kafka.py"), *args],
                         capture_output=True, text=True, timeout=120)
    check(out.returncode == 0, f"kafka.py {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def read_topic(topic: str) -> list[dict]:
    return [json.loads(line) for line in kafka_py("read", topic).splitlines() if line.strip()]


def b64d(s: str | None) -> bytes | None:
    return None if s is None else base64.b64decode(s)


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


def check_topic(topic: str, sent: list[dict], wait: float) -> tuple[list[dict], int]:
    """Reads `topic` until it holds every id of `sent` (at most `wait` s); checks each id
    once and no other, per-key order (the `n` of each message), Kafka's default
    partition of each key, the headers (as the relay publishes them, with the trace context
    the enqueue function stamped, `traceparent` of a sent message).  Returns the records
    and how many keys."""
    expected = {m["message_id"]: m for m in sent}
    deadline = time.time() + wait
    while True:
        records = read_topic(topic)
        ids = [(b64d(dict(r["headers"]).get(MESSAGE_ID_HEADER)) or b"").decode()
               for r in records]
        if set(expected) <= set(ids) or time.time() > deadline:
            break
        time.sleep(0.5)
    missing = set(expected) - set(ids)
    check(not missing, f"{len(missing)} of {len(expected)} message ids not in {topic}: "
                       f"{sorted(missing)[:5]}")
    extra = set(ids) - set(expected)
    check(not extra, f"{len(extra)} records in {topic} with ids nobody wrote: {sorted(extra)[:5]}")
    twice = [i for i, c in collections.Counter(ids).items() if c > 1]
    check(not twice, f"{len(twice)} message ids in {topic} more than once: {twice[:5]}")
    per_key: dict[str, list[tuple[int, int, int]]] = {}
    for rec, mid in zip(records, ids):
        m = expected[mid]
        key = b64d(rec["key"])
        check(key == m["key"].encode(), f"{mid}: key {key!r}, sent {m['key']!r}")
        check(b64d(rec["value"]) == m["value"].encode(), f"{mid}: value {rec['value']}")
        want_partition = to_positive(murmur2(key)) % TOPIC_PARTITIONS
        check(rec["partition"] == want_partition,
              f"{mid}: key {m['key']} in partition {rec['partition']}, Kafka's default "
              f"partitioner says {want_partition}")
        headers = [(k, b64d(v)) for k, v in rec["headers"]]
        # The enqueue function stamps the trace context of its invocation (its X-Ray
        # header in W3C form) after the message's own headers.
        stamped = [("traceparent", m["traceparent"])] if m.get("traceparent") else []
        want = as_published(m["headers"]) + stamped + [(MESSAGE_ID_HEADER, mid.encode())]
        check(headers == want, f"{mid}: headers {headers}; sent {m['headers']}, which "
                               f"the relay publishes as {want}")
        per_key.setdefault(m["key"], []).append((rec["partition"], rec["offset"], m["n"]))
    for key, recs in per_key.items():
        ns = [n for _, _, n in sorted(recs)]
        check(ns == sorted(ns), f"per-key order broken for {key}: {ns}")
    return records, len(per_key)


# ---------------------------------------------------------------------- relay

def relay_summary(inv: dict) -> dict:
    check(inv["status"] == "ok",
          f"relay invocation {inv['request_id']} ended {inv['status']} "
          f"({inv.get('error_type')}): {inv.get('error', '')[:500]}")
    return json.loads(inv["response"])


def wait_doorbells(relay: Function, batch_log: str, since: int, delivered_before: int,
                   inserted: int, wait: float) -> list[dict]:
    """Waits until the poller has delivered `inserted` more message inserts to the relay
    and every invocation they started has answered; returns those invocations (each
    with its summary).  Fails at once on a failed invocation or delivery."""
    deadline = time.time() + wait
    while True:
        lines = []
        if os.path.exists(batch_log):
            with open(batch_log) as f:
                lines = [json.loads(x) for x in f if x.strip()]
        for line in lines:
            check(line["status"] == 200 and not line["function_error"],
                  f"the poller's invocation with {line['records']} records failed: HTTP "
                  f"{line['status']} {line['function_error'] or ''} {line['response'][:500]}")
        delivered = sum(x["records"] for x in lines)
        stats = relay.stats(since)
        for inv in stats["invocations"]:
            relay_summary(inv)
        quiet = stats["totals"]["concurrency_now"] == 0
        if delivered >= delivered_before + inserted and quiet and \
                stats["invocation_count"] == len(lines):
            check(delivered == delivered_before + inserted,
                  f"the poller delivered {delivered - delivered_before} message inserts, "
                  f"{inserted} were written")
            return stats["invocations"]
        if time.time() > deadline:
            raise Failed(f"after {wait:g}s the poller delivered "
                         f"{delivered - delivered_before} of {inserted} message inserts and "
                         f"the relay answered {stats['invocation_count'] - since} doorbell "
                         f"invocations ({stats['totals']['concurrency_now']} running)")
        time.sleep(0.2)


def check_doorbell_invocations(invs: list[dict], published: int, timeout: float,
                               what: str) -> tuple[list[dict], str]:
    """The checks every doorbell invocation passes; returns the summaries and a note."""
    summaries = []
    for inv in invs:
        s = relay_summary(inv)
        rid = s.get("relay_id", inv["request_id"])
        check(s["trigger"] == "doorbell", f"{rid}: trigger {s['trigger']}, not doorbell: {s}")
        check(s["refused_writes"] == 0, f"{rid}: {s['refused_writes']} refused writes: {s}")
        check(s["released"] is True, f"{rid}: leases not released: {s}")
        check(s["errors"] == 0, f"{rid}: {s['errors']} errors: {s}")
        check(s["deadline_source"] == "invocation",
              f"{rid}: deadline_source {s['deadline_source']}: the emulator's "
              f"Lambda-Runtime-Deadline-Ms header was not used: {s}")
        check(inv["end"] * 1000 < inv["deadline_ms"], f"{rid}: answered after its deadline")
        check(s["time_left_ms"] >= timeout * 1000 / 2 and
              inv["duration_ms"] <= timeout * 1000 / 2,
              f"{rid}: answered after {inv['duration_ms']:.0f} ms with "
              f"{s['time_left_ms']} ms left of a {timeout:g}s timeout (the idle stop should "
              f"end it well before): {s}")
        if s["published"] > 0:
            check(s["stop_reason"] == "idle", f"{rid}: stop_reason {s['stop_reason']}, not "
                                              f"idle (no schedule, no load): {s}")
        else:
            check(s["stop_reason"] in ("idle", "covered", "empty"),
                  f"{rid}: stop_reason {s['stop_reason']}: {s}")
        summaries.append(s)
    total = sum(s["published"] for s in summaries)
    check(total == published, f"{what}: the doorbell invocations published {total}, "
                              f"{published} were written: {summaries}")
    check(any(s["stop_reason"] == "idle" and s["published"] > 0 for s in summaries),
          f"{what}: no doorbell invocation ran a relay that published and idled out")
    notes = ", ".join(
        f"{'cold' if inv['cold'] else 'warm'} {s['stop_reason']} published {s['published']} "
        f"in {inv['duration_ms'] / 1000:.1f}s ({s['time_left_ms'] / 1000:.1f}s left)"
        for inv, s in zip(invs, summaries))
    return summaries, notes


# ------------------------------------------------------------------------ main

def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="See the module docstring for what it checks.")
    p.add_argument("bootstrap_dir", help="sam build's build directory")
    p.add_argument("--prefix", default="",
                   help="command both bootstraps run under (passed to lambda_runtime.py), "
                        "e.g. 'qemu-aarch64-static -L /'")
    p.add_argument("--mode", choices=["doorbell", "tick"], default="doorbell",
                   help="doorbell (default): the stream wakes the relay, two writers; tick: "
                        "the smoke run, one batch and one scheduled relay invocation")
    p.add_argument("--arch", choices=["x86-64", "aarch64"],
                   help="fail unless both bootstraps are ELF executables of this machine")
    p.add_argument("--relay-timeout", type=float, default=30.0,
                   help="the relay function's timeout in seconds (default 30)")
    p.add_argument("--idle-stop", default="2s",
                   help="OUTBOX_IDLE_STOP of the relay (default 2s; the template's is 5s)")
    p.add_argument("--init-timeout", type=float, default=10.0,
                   help="seconds a new environment may take to ask for its first event "
                        "(default 10, Lambda's; more under emulation)")
    p.add_argument("--wait", type=float, default=60.0,
                   help="seconds each phase may take to reach Kafka (default 60)")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = p.parse_args()

    binaries = {fn: os.path.join(args.bootstrap_dir, fn, "bootstrap")
                for fn in ("RelayFunction", "EnqueueFunction")}
    for fn, path in binaries.items():
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            p.error(f"no executable {path}")
    require_stack(p)
    interrupt_on_signals()

    workdir = tempfile.mkdtemp(prefix="outbox-serverless-e2e.")
    started: list = []
    ok = False
    try:
        run(args, binaries, workdir, started)
        ok = True
        return 0
    except (Failed, Interrupted) as e:
        kind = "interrupted" if isinstance(e, Interrupted) else "FAILED"
        print(f"[{NAME}] {kind}: {e}", file=sys.stderr, flush=True)
        for thing in started:
            if isinstance(thing, Function):
                tail = thing.function_tail()
                name = f"{thing.name} function log"
            else:
                tail = thing.tail()
                name = thing.name
            if tail:
                print(f"[{NAME}] ---- last lines of the {name} ----\n{tail}",
                      file=sys.stderr, flush=True)
        return 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for thing in reversed(started):
            try:
                thing.stop()
            except Exception as e:  # keep stopping the others
                print(f"[{NAME}] stopping {getattr(thing, 'name', thing)}: {e}",
                      file=sys.stderr, flush=True)
        if ok and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"[{NAME}] logs kept in {workdir}", file=sys.stderr, flush=True)


def run(args, binaries: dict[str, str], workdir: str, started: list) -> None:
    t0 = time.time()
    self_check()
    arch = {fn: elf_machine(path) for fn, path in binaries.items()}
    prefix_note = f" under {args.prefix!r}" if args.prefix else ""
    step(f"bootstraps: RelayFunction {arch['RelayFunction']}, EnqueueFunction "
         f"{arch['EnqueueFunction']}{prefix_note}; murmur2, header blob and ticks match "
         f"lib/src/message.rs and docs/item-schema.md")
    if os.uname().machine == "x86_64" and not args.prefix:
        check(all(a == "x86-64" for a in arch.values()),
              f"bootstraps are {arch}: on this x86_64 host they need --prefix (qemu)")
    if args.arch:
        check(all(a == args.arch for a in arch.values()),
              f"bootstraps are {arch}, --arch says {args.arch}")
    if args.mode == "tick":
        run_tick(args, binaries, workdir, started, t0, arch, prefix_note)
    else:
        run_doorbell(args, binaries, workdir, started, t0, arch, prefix_note)


def start_functions(args, binaries: dict[str, str], workdir: str, started: list,
                    stream: bool) -> tuple:
    """A fresh outbox table (with its stream when `stream`), a business table and a topic;
    both functions under lambda_runtime.py with the template's environment.  Returns
    (suffix, table, business table, topic, key prefix, relay, enqueue)."""
    suffix = uuid.uuid4().hex[:10]
    table, business, topic = f"sls-{suffix}", f"sls-orders-{suffix}", f"sls-orders-{suffix}"
    prefix = "SHOP"  # not the default OUTBOX: OUTBOX_KEY_PREFIX has to reach both functions
    create_outbox_table(table)
    create_business_table(business)
    stream_note = "no stream"
    if stream:
        out = subprocess.run([PY, os.path.join(SCRIPTS, "streams.py"), "enable", table],
                             capture_output=True, text=True, timeout=60)
        check(out.returncode == 0, f"streams.py enable: {out.stderr.strip()}")
        stream_note = f"KEYS_ONLY stream {out.stdout.strip().rsplit('/', 1)[-1]}"
    kafka_py("create-topic", topic, "--partitions", str(TOPIC_PARTITIONS))
    step(f"table {table} ({stream_note}), business table "
         f"{business}, topic {topic} ({TOPIC_PARTITIONS} partitions), key prefix {prefix}")

    # The template's environment, and what Lambda's execution role and VPC provide here:
    # the stack's DynamoDB endpoint and credentials.
    common = {
        "OUTBOX_TABLE_NAME": table,
        "OUTBOX_KEY_PREFIX": prefix,
        "OUTBOX_BUCKET_COUNT": str(BUCKET_COUNT),
    }
    for var in ("AWS_ENDPOINT_URL_DYNAMODB", "AWS_REGION", "AWS_DEFAULT_REGION",
                "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        if os.environ.get(var):
            common[var] = os.environ[var]
    relay_env = dict(common, **{
        "OUTBOX_MAX_RUN_TIME": MAX_RUN_TIME,
        "OUTBOX_SHUTDOWN_MARGIN": SHUTDOWN_MARGIN,
        "KAFKA_BOOTSTRAP_SERVERS": os.environ["KAFKA_BOOTSTRAP_SERVERS"],
        "KAFKA_AUTH": "none",
        "OUTBOX_IDLE_STOP": args.idle_stop,
    })
    relay = Function("RelayFunction", binaries["RelayFunction"], workdir, args.relay_timeout,
                     relay_env, args.prefix, RELAY_RESERVED_CONCURRENCY, args.init_timeout)
    started.append(relay)
    enqueue = Function("EnqueueFunction", binaries["EnqueueFunction"], workdir,
                       ENQUEUE_TIMEOUT_S, common, args.prefix, 10, args.init_timeout)
    started.append(enqueue)
    relay.wait_ready()
    enqueue.wait_ready()
    return suffix, table, business, topic, prefix, relay, enqueue


def enqueue_batch(enqueue: "Function", topic: str, phase: str) -> tuple[list[dict], float]:
    """Invokes the enqueue function with 20 messages over 5 keys and checks its answer
    (ids, buckets by the murmur2 port, per-key ascending sequences).  Returns the
    messages (with id, bucket, sequence) and when the call started."""
    keys = [f"customer-{i}" for i in range(5)]
    sent: list[dict] = []
    request = {"messages": []}
    for n in range(20):
        headers = [("type", b"order-placed"), ("n", str(n).encode())]
        sent.append({"key": keys[n % 5], "value": f"order-{n}", "headers": headers, "n": n})
        request["messages"].append({
            "topic": topic, "key": keys[n % 5], "value": f"order-{n}",
            "headers": [{"key": k, "value": v.decode()} for k, v in headers]})
    enqueue_started = time.time()
    status, function_error, body = enqueue.invoke(request, timeout=ENQUEUE_TIMEOUT_S + 60)
    check(status == 200 and not function_error,
          f"enqueue invocation: HTTP {status} {function_error or ''} {body[:500]!r}")
    response = json.loads(body)
    results = response.get("messages", [])
    check(len(results) == 20, f"20 results from the enqueue function, got {response}")
    check(bool(enqueue.last_trace_id), "the enqueue invocation's answer has no X-Amzn-Trace-Id")
    for m in sent:
        m["traceparent"] = w3c_traceparent(enqueue.last_trace_id)
    for m, r in zip(sent, results):
        uuid.UUID(r["message_id"])
        check(r["bucket"] == bucket_of(m["key"].encode()),
              f"{m['key']}: the function's bucket {r['bucket']}, murmur2 says "
              f"{bucket_of(m['key'].encode())}")
        m.update(message_id=r["message_id"], bucket=r["bucket"], sequence=r["sequence"])
    for key in keys:
        seqs = [m["sequence"] for m in sent if m["key"] == key]
        check(seqs == sorted(set(seqs)), f"{key}: sequences not ascending: {seqs}")
    step(f"{phase}: EnqueueFunction wrote 20 messages over 5 keys in "
         f"{len({m['bucket'] for m in sent})} buckets (buckets agree with the murmur2 port)")
    return sent, enqueue_started


def check_table(table: str, prefix: str, summaries: list[dict], written: int) -> None:
    """No message item left, no lease owned, one heartbeat per invocation that ran a
    relay, each stamped stopped, the sequence counters adding up to `written`."""
    items = scan(table)
    pending = [i for i in items if i["PK"]["S"].startswith(f"{prefix}#MESSAGES#")]
    check(not pending, f"{len(pending)} message items left in the table")
    coordination = [i for i in items if i["PK"]["S"] == f"{prefix}#COORDINATION"]
    leases = [i for i in coordination if i["SK"]["S"].startswith("LEASE#")]
    owned = [i for i in leases if "Owner" in i]
    check(not owned, f"leases still owned: {[(i['SK']['S'], i['Owner']['S']) for i in owned]}")
    beats = [i for i in coordination if i["SK"]["S"].startswith("RELAY#")]
    running = [i["SK"]["S"] for i in beats if "StoppedAtUtc" not in i]
    check(not running, f"relay heartbeats not stamped stopped: {running}")
    joined = [s for s in summaries if s["stop_reason"] not in ("covered", "empty")]
    check(len(beats) == len(joined),
          f"{len(beats)} relay heartbeats, {len(joined)} invocations ran a relay")
    counters = {i["PK"]["S"]: int(i["Sequence"]["N"]) for i in items
                if i["PK"]["S"].startswith(f"{prefix}#SEQUENCE#")}
    check(sum(counters.values()) == written,
          f"sequence counters add up to {sum(counters.values())}, {written} written: {counters}")
    others = [i["PK"]["S"] for i in items if not i["PK"]["S"].startswith(f"{prefix}#")]
    check(not others, f"items outside the prefix in the outbox table: {others}")


def run_doorbell(args, binaries: dict[str, str], workdir: str, started: list, t0: float,
                 arch: dict[str, str], prefix_note: str) -> None:
    suffix, table, business, topic, prefix, relay, enqueue = start_functions(
        args, binaries, workdir, started, stream=True)

    batch_log = os.path.join(workdir, "doorbell-batches.jsonl")
    ready_file = os.path.join(workdir, "poller.ready")
    poller_stats = os.path.join(workdir, "poller.stats.json")
    poller = Proc("poller", [
        PY, os.path.join(SCRIPTS, "streams.py"), "poll", table, "--invoke", relay.invoke_url,
        "--template", TEMPLATE, "--function", "RelayFunction", "--param", f"KeyPrefix={prefix}",
        "--ready-file", ready_file,
        "--stats-file", poller_stats, "--batch-log", batch_log,
        "--invoke-timeout", f"{args.relay_timeout + 30:g}"],
        workdir, stdout_file=os.path.join(workdir, "poller.out"))
    started.append(poller)
    wait_file(ready_file, poller, "streams.py poll")
    with open(ready_file) as f:
        mapping = json.load(f)["settings"]
    step(f"RelayFunction (timeout {args.relay_timeout:g}s, idle stop {args.idle_stop}) and "
         f"EnqueueFunction under lambda_runtime.py; streams.py poll with the template's "
         f"{mapping['mapping']}: filter {json.dumps(mapping['filter_patterns'])}, batch "
         f"{mapping['batch_size']}, window {mapping['window_s']:g}s, "
         f"{mapping['max_retries']} retries, record age {mapping['max_record_age_s']:g}s; "
         f"no schedule")

    # ---- phase 1: the enqueue function, woken relay by the stream.
    sent, enqueue_started = enqueue_batch(enqueue, topic, "phase 1")

    invs1 = wait_doorbells(relay, batch_log, 0, 0, 20, args.wait)
    summaries1, notes1 = check_doorbell_invocations(invs1, 20, args.relay_timeout, "phase 1")
    # An upper bound of commit -> doorbell: from the start of the call that committed.
    first1 = min(inv["received"] for inv in invs1) - enqueue_started
    step(f"phase 1: {len(invs1)} doorbell invocation(s), the first within {first1:.2f}s of "
         f"the enqueue call: "
         f"{notes1}")
    check_topic(topic, sent, 15)
    step("phase 1: Kafka holds the 20 ids, each once, per-key order, default partitions, "
         "headers")

    # ---- phase 2: a writer that is not the enqueue function.
    since = len(invs1)
    direct = direct_write(table, business, prefix, topic, [
        {"key": "customer-0", "value": "order-20", "n": 20,
         "headers": [("type", b"order-placed"), ("trace", None)]},
        {"key": "customer-7", "value": "order-21", "n": 21,
         "headers": [("type", b"order-placed")]},
        {"key": "customer-0", "value": "order-22", "n": 22, "headers": []},
    ], order_id=suffix)
    step(f"phase 2: one TransactWriteItems by boto3: business item + 3 messages (buckets "
         f"{sorted({m['bucket'] for m in direct})}, sequences reserved with ADD Sequence)")
    invs2 = wait_doorbells(relay, batch_log, since, 20, 3, args.wait)
    summaries2, notes2 = check_doorbell_invocations(invs2, 3, args.relay_timeout, "phase 2")
    first2 = min(inv["received"] for inv in invs2) - direct[0]["commit_started"]
    step(f"phase 2: {len(invs2)} doorbell invocation(s), the first within {first2:.2f}s of "
         f"the TransactWriteItems call: "
         f"{notes2}")
    records, nkeys = check_topic(topic, sent + direct, 15)
    step(f"phase 2: Kafka holds all {len(records)} ids, each once, per-key order across both "
         f"writers, headers byte for byte (the null value as null, the message-id header last)")

    # ---- the table and the counters.
    check_table(table, prefix, summaries1 + summaries2, 23)

    # ---- the processes' own accounts.
    poller.stop()
    started.remove(poller)
    try:
        with open(poller_stats) as f:
            pc = json.load(f)
    except (OSError, ValueError) as e:
        raise Failed(f"the poller wrote no counters ({e}):\n{poller.tail()}")
    check(pc["records"] == 23 and pc["batches"] == len(invs1) + len(invs2),
          f"poller delivered {pc['records']} records in {pc['batches']} batches, expected 23 "
          f"in {len(invs1) + len(invs2)}: {pc}")
    for k in ("invoke_errors", "function_errors", "throttles", "dropped_records",
              "buffered_unsent", "in_flight_batches"):
        check(pc[k] == 0, f"poller {k} = {pc[k]}: {pc}")
    check(pc["records_filtered_out"] > 0,
          f"the filter kept every record (the relay's and counters' writes must not ring): {pc}")
    rt = relay.stats()["totals"]
    for k in ("errors", "timeouts", "throttles"):
        check(rt[k] == 0, f"relay emulator {k} = {rt[k]}: {rt}")
    et = enqueue.stats()["totals"]
    check(et["invocations"] == 1 and et["errors"] == 0, f"enqueue emulator: {et}")

    step(f"ok in {time.time() - t0:.0f}s: {arch['RelayFunction']} bootstraps{prefix_note}; "
         f"20 enqueued by EnqueueFunction + 3 by a direct TransactWriteItems, "
         f"{rt['invocations']} doorbell invocations ({rt['cold_starts']} cold), the first "
         f"within {first1:.2f}s / {first2:.2f}s of each commit, all stop_reason idle/covered well "
         f"before the {args.relay_timeout:g}s deadline; 23 ids in Kafka exactly once over "
         f"{nkeys} keys in per-key order; 0 refused writes; table empty, no lease owned; "
         f"poller: {pc['records']} inserts in {pc['batches']} batches, "
         f"{pc['records_filtered_out']} records filtered out")


def emf_documents(function_log: str) -> list[dict]:
    """The CloudWatch Embedded Metric Format documents a function printed on its stdout
    (lambda_runtime.py writes each line of it to --log-file as "[NAME:ENV] line")."""
    docs = []
    with open(function_log, encoding="utf-8", errors="replace") as f:
        for line in f:
            _, sep, rest = line.partition("] ")
            if not sep or not rest.startswith("{"):
                continue
            try:
                doc = json.loads(rest)
            except ValueError:
                continue
            if isinstance(doc, dict) and "CloudWatchMetrics" in doc.get("_aws", {}):
                docs.append(doc)
    return docs


def emf_sum(doc: dict, metric: str) -> float:
    """A metric's values in one EMF document, summed (a value or a list of values)."""
    v = doc.get(metric, 0)
    return sum(v) if isinstance(v, list) else v


def run_tick(args, binaries: dict[str, str], workdir: str, started: list, t0: float,
             arch: dict[str, str], prefix_note: str) -> None:
    """The smoke run of the deployable artifact (--mode tick; scripts/test.sh runs sam
    build's arm64 bootstraps this way under qemu-aarch64-static): no stream, no poller;
    a batch through the enqueue function, then one relay invocation with the template's
    schedule payload, which must publish the batch and answer before its deadline."""
    _suffix, table, _business, topic, prefix, relay, enqueue = start_functions(
        args, binaries, workdir, started, stream=False)
    step(f"RelayFunction (timeout {args.relay_timeout:g}s, idle stop {args.idle_stop}) and "
         f"EnqueueFunction under lambda_runtime.py (each bootstrap{prefix_note}); no stream, "
         f"no schedule timer: one tick by hand")

    sent, _ = enqueue_batch(enqueue, topic, "enqueue")

    # The template's ScheduleV2 Input (template.yaml), as one invocation.
    status, function_error, body = relay.invoke(SCHEDULE_PAYLOAD,
                                                timeout=args.relay_timeout + 60)
    check(status == 200 and not function_error,
          f"relay tick: HTTP {status} {function_error or ''} {body[:500]!r}")
    invs = relay.stats()["invocations"]
    check(len(invs) == 1, f"the relay emulator saw {len(invs)} invocations, 1 sent")
    inv = invs[0]
    s = relay_summary(inv)
    rid = s.get("relay_id", inv["request_id"])
    check(s["trigger"] == "direct", f"{rid}: trigger {s['trigger']}, not direct: {s}")
    check(s["published"] == 20, f"{rid}: published {s['published']}, 20 enqueued: {s}")
    check(s["stop_reason"] == "idle", f"{rid}: stop_reason {s['stop_reason']}, not idle: {s}")
    check(s["released"] is True, f"{rid}: leases not released: {s}")
    check(s["refused_writes"] == 0, f"{rid}: {s['refused_writes']} refused writes: {s}")
    check(s["errors"] == 0, f"{rid}: {s['errors']} errors: {s}")
    check(s["deadline_source"] == "invocation",
          f"{rid}: deadline_source {s['deadline_source']}: the emulator's "
          f"Lambda-Runtime-Deadline-Ms header was not used: {s}")
    # Before the deadline, and by the relay's own account too; no timing bound beyond it
    # (under an emulator the durations say nothing about Lambda's).
    check(inv["end"] * 1000 < inv["deadline_ms"] and s["time_left_ms"] > 0,
          f"{rid}: answered after its deadline ({s['time_left_ms']} ms left): {s}")
    step(f"tick: {'cold' if inv['cold'] else 'warm'} start (init {inv['init_ms'] or 0:.0f} ms), "
         f"published {s['published']}, stop_reason {s['stop_reason']} after "
         f"{inv['duration_ms'] / 1000:.1f}s ({s['time_left_ms'] / 1000:.1f}s of "
         f"{args.relay_timeout:g}s left), leases released")

    records, nkeys = check_topic(topic, sent, 15)
    step(f"Kafka holds the {len(records)} ids, each once, per-key order over {nkeys} keys, "
         f"default partitions, headers")
    check_table(table, prefix, [s], 20)
    docs = emf_documents(relay.function_log)
    published = sum(emf_sum(d, "Published") for d in docs)
    check(docs and all(d.get("table") == table for d in docs),
          f"the relay's stdout had no EMF document for table {table}: {docs}")
    check(published == 20, f"EMF on the relay's stdout says Published {published}, 20 were: {docs}")
    step(f"the relay's stdout: {len(docs)} EMF document(s) (namespace "
         f"{docs[0]['_aws']['CloudWatchMetrics'][0]['Namespace']}), Published {published}")
    for fn in (relay, enqueue):
        t = fn.stats()["totals"]
        for k in ("errors", "timeouts", "throttles"):
            check(t[k] == 0, f"{fn.name} emulator {k} = {t[k]}: {t}")
        check(t["invocations"] == 1, f"{fn.name} emulator: {t['invocations']} invocations")
    step(f"ok in {time.time() - t0:.0f}s: {arch['RelayFunction']} bootstraps{prefix_note}; "
         f"20 enqueued by EnqueueFunction, published by one scheduled RelayFunction invocation "
         f"before its deadline; Kafka: each id once, per-key order; table empty, no lease "
         f"owned, heartbeat stopped")


if __name__ == "__main__":
    sys.exit(main())
