"""A mixed fleet on one outbox table: `outboxctl relay` (Rust) next to the independent
relay of e2e/independent_relay/ (Python, written from docs/protocol.md and
docs/item-schema.md alone), as docs/protocol.md promises ("relays of both
implementations can run against one table at the same time").

Run inside the local stack:

  bash scripts/stack.sh run -- ~/.cache/dynamo-outbox/venv/bin/python -m pytest \\
      e2e/test_mixed_fleet.py -x -q

`outboxctl` must be built ($CARGO_TARGET_DIR, default ~/.cache/dynamo-outbox/target,
debug/outboxctl).  MIXED_FLEET_REPORT=FILE writes the figures of the fleet test as JSON.

test_independent_relay_reads_the_docs_examples: the Python relay's plan, murmur2, bucket,
Kafka partition and header blob code against every worked example of the two documents.

test_mixed_fleet_shares_one_table: one fresh table (8 buckets) and topic (3 partitions);
all relays with a 15 s lease and a 5 s renew interval.  Events, each waiting until the
live relays hold a fair split of all buckets (a stop waits for the process to exit):
rust-1 alone; py-1 joins; the writer starts; rust-2 joins (`--for 25s`, so it announces
StopsAtUtc, which the Python relay ignores) and leaves at its deadline; rust-1 stops
(SIGTERM): py-1 takes everything; py-2 joins; rust-1 restarts under its id; py-1 stops;
py-1 restarts under its id; the writer stops; once the table is drained every relay
stops together.  The writer alternates `outboxctl enqueue` requests and boto3 writes
per docs/item-schema.md (counter ADD, TransactWriteItems under attribute_not_exists),
40 messages per write over 40 keys, one write at a time, at least 3000 messages.

Checks, as a user observes them: every message id in Kafka and none other; each first
delivery's key, value and headers as written, the id header last; each key in one Kafka
partition (murmur2 % 3) with its first deliveries in write order; no message item left;
no lease owned; every relay run's summary with 0 refused writes and its leases released;
both implementations published (each > 0).
"""
from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

import independent_relay as ir

E2E = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(E2E)

BUCKETS = 8
PARTITIONS = 3
KEYS = 40
PER_WRITE = 40
MIN_MESSAGES = 3000
LEASE, RENEW = "15s", "5s"
SETTLE_TIMEOUT = 45.0
ID_HEADER = "x-outbox-message-id"
STOP_LINE = re.compile(r"^relay (\S+) stopped \((\w+)\): published (\d+), refused writes "
                       r"(\d+), leases released: (true|false)$")


# ------------------------------------------------------------------ fixtures

@pytest.fixture(scope="session")
def stack_env(stack) -> dict:
    """The variables `scripts/stack.sh run` exports (DynamoDB Local, Kafka PLAINTEXT)."""
    return dict(os.environ)


@pytest.fixture(scope="session")
def outboxctl(debug_binaries) -> str:
    return debug_binaries["outboxctl"]


@pytest.fixture
def ddb(stack_env):
    import boto3
    return boto3.client("dynamodb")


@pytest.fixture
def outbox_env(stack_env) -> dict:
    """The environment of every writer and relay of one fresh table (no stray OUTBOX_*)."""
    env = {k: v for k, v in stack_env.items()
           if not k.startswith("OUTBOX_") or k.startswith("OUTBOX_STACK_")}
    env.update(OUTBOX_TABLE_NAME=f"mixed-{uuid.uuid4().hex[:10]}",
               OUTBOX_BUCKET_COUNT=str(BUCKETS), OUTBOX_LEASE_DURATION=LEASE,
               OUTBOX_LEASE_RENEW_INTERVAL=RENEW, KAFKA_AUTH="none")
    return env


@pytest.fixture
def outbox_table(outboxctl, outbox_env, ddb) -> str:
    table = outbox_env["OUTBOX_TABLE_NAME"]
    subprocess.run([outboxctl, "create-table"], env=outbox_env, check=True,
                   capture_output=True, timeout=60)
    yield table
    ddb.delete_table(TableName=table)


@pytest.fixture
def kafka_topic(stack_env) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": stack_env["KAFKA_BOOTSTRAP_SERVERS"]})
    topic = f"mixed-fleet-{uuid.uuid4().hex[:8]}"
    for f in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
        f.result(30)
    yield topic
    for f in admin.delete_topics([topic]).values():
        f.result(30)


@pytest.fixture
def relays(outboxctl, outbox_env, tmp_path):
    """Starts relays of either implementation; kills any left at teardown."""
    started: list[RelayProcess] = []

    def start(kind: str, relay_id: str, *args: str) -> RelayProcess:
        if kind == "rust":
            cmd = [outboxctl, "relay", *args]
        else:
            cmd = [sys.executable, "-m", "independent_relay", *args]
        env = dict(outbox_env, OUTBOX_RELAY_ID=relay_id, PYTHONPATH=E2E)
        r = RelayProcess(kind, relay_id, cmd, env, tmp_path, len(started))
        started.append(r)
        return r

    start.started = started
    yield start
    for r in started:
        if r.proc.poll() is None:
            r.proc.kill()
            r.proc.wait()


# ------------------------------------------------------------------ helpers

class RelayProcess:
    def __init__(self, kind, relay_id, cmd, env, workdir, n):
        self.kind, self.relay_id = kind, relay_id
        self.out = os.path.join(workdir, f"{n:02d}-{relay_id}.out")
        self.err = os.path.join(workdir, f"{n:02d}-{relay_id}.err")
        self.signalled = False
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, cwd=ROOT)

    def terminate(self) -> None:
        """One SIGTERM (a second one may land after Python reset its handlers at exit)."""
        if not self.signalled and self.proc.poll() is None:
            self.signalled = True
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 30.0) -> None:
        self.terminate()
        self.proc.wait(timeout)

    def tail(self, n: int = 25) -> str:
        with open(self.err, errors="replace") as f:
            return "".join(f.readlines()[-n:])

    def summary(self) -> dict:
        """The final line, for both implementations; the Python relay's report line too."""
        with open(self.out) as f:
            lines = f.read().splitlines()
        found = [STOP_LINE.match(x) for x in lines if STOP_LINE.match(x)]
        assert found, f"{self.kind} {self.relay_id} printed no stop line:\n{self.tail()}"
        rid, reason, pub, refused, released = found[-1].groups()
        out = {"kind": self.kind, "relay_id": rid, "stop_reason": reason,
               "published": int(pub), "refused_writes": int(refused),
               "released": released == "true", "line": found[-1].group(0)}
        reports = [x for x in lines if x.startswith("report: ")]
        if reports:
            out["report"] = json.loads(reports[-1][len("report: "):])
        return out


def coordination(ddb, table: str) -> tuple[dict, dict]:
    items, start = [], None
    while True:
        kw = {"ExclusiveStartKey": start} if start else {}
        page = ddb.query(TableName=table, ConsistentRead=True,
                         KeyConditionExpression="PK = :pk",
                         ExpressionAttributeValues={":pk": {"S": "OUTBOX#COORDINATION"}}, **kw)
        items += page["Items"]
        start = page.get("LastEvaluatedKey")
        if not start:
            break
    leases = {int(i["SK"]["S"][6:]): i for i in items if i["SK"]["S"].startswith("LEASE#")}
    beats = {i["SK"]["S"][6:]: i for i in items if i["SK"]["S"].startswith("RELAY#")}
    return leases, beats


def live_owners(ddb, table: str) -> dict[int, str]:
    leases, _ = coordination(ddb, table)
    now = ir.now_ticks()
    return {b: i["Owner"]["S"] for b, i in leases.items()
            if "Owner" in i and int(i["ExpiresAtUtc"]["N"]) > now and b < BUCKETS}


def wait_split(ddb, table: str, expected: list, relays_alive: list, what: str) -> float:
    """Waits until the live leases are a fair split among exactly `expected`."""
    t0 = time.monotonic()
    want = {r.relay_id for r in expected}
    floor, extra = divmod(BUCKETS, len(want))
    while True:
        owners = live_owners(ddb, table)
        counts = collections.Counter(owners.values())
        if (len(owners) == BUCKETS and set(counts) == want
                and all(floor <= c <= floor + (1 if extra else 0) for c in counts.values())):
            return time.monotonic() - t0
        for r in relays_alive:
            assert r.proc.poll() is None, f"{r.relay_id} exited during {what}:\n{r.tail()}"
        assert time.monotonic() - t0 < SETTLE_TIMEOUT, (
            f"{what}: no fair split among {sorted(want)} after {SETTLE_TIMEOUT}s: {owners}")
        time.sleep(0.2)


class Writer(threading.Thread):
    """One write at a time, alternating `outboxctl enqueue` and a boto3 writer per
    docs/item-schema.md; 40 messages per write over KEYS keys, in a global order."""

    def __init__(self, outboxctl: str, env: dict, topic: str):
        super().__init__(daemon=True)
        import boto3
        self.outboxctl, self.env, self.topic = outboxctl, env, topic
        self.table = env["OUTBOX_TABLE_NAME"]
        self.ddb = boto3.client("dynamodb")
        self.sent: list[dict] = []  # in write order
        self.per_key = collections.Counter()
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.writes = 0

    def next_messages(self) -> list[dict]:
        out = []
        for _ in range(PER_WRITE):
            k = len(self.sent) % KEYS
            key = f"customer-{k}"
            n = self.per_key[key]
            self.per_key[key] += 1
            m = {"key": key, "n": n, "value": json.dumps({"key": key, "n": n}),
                 "headers": [("type", b"OrderPlaced"), ("n", str(n).encode())]}
            self.sent.append(m)
            out.append(m)
        return out

    def enqueue_with_outboxctl(self, ms: list[dict]) -> None:
        req = {"messages": [{"topic": self.topic, "key": m["key"], "value": m["value"],
                             "headers": [{"key": k, "value": v.decode()}
                                         for k, v in m["headers"]]} for m in ms]}
        p = subprocess.run([self.outboxctl, "enqueue", "-"], input=json.dumps(req), env=self.env,
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, f"outboxctl enqueue: {p.stderr}"
        for m, r in zip(ms, json.loads(p.stdout)["messages"]):
            m["message_id"], m["writer"] = r["message_id"], "outboxctl"

    def enqueue_with_boto3(self, ms: list[dict]) -> None:
        by_bucket = collections.defaultdict(list)
        for m in ms:
            m["message_id"], m["writer"] = str(uuid.uuid4()), "boto3"
            m["headers"] = m["headers"] + [("trace", None)]  # a null header value
            by_bucket[ir.bucket_of(m["message_id"], m["key"].encode(), None, BUCKETS)].append(m)
        puts = []
        for b, group in sorted(by_bucket.items()):
            new = int(self.ddb.update_item(
                TableName=self.table, Key={"PK": {"S": f"OUTBOX#SEQUENCE#{b}"},
                                           "SK": {"S": "SEQUENCE"}},
                UpdateExpression="ADD #s :n", ExpressionAttributeNames={"#s": "Sequence"},
                ExpressionAttributeValues={":n": {"N": str(len(group))}},
                ReturnValues="UPDATED_NEW")["Attributes"]["Sequence"]["N"])
            for i, m in enumerate(group):
                item = {"PK": {"S": f"OUTBOX#MESSAGES#{b}"},
                        "SK": {"S": f"{new - len(group) + 1 + i:019d}"},
                        "MessageId": {"S": m["message_id"]}, "Topic": {"S": self.topic},
                        "Key": {"B": m["key"].encode()}, "Value": {"B": m["value"].encode()},
                        "Headers": {"B": ir.encode_headers(m["headers"])},
                        "CreatedAtUtc": {"N": str(ir.now_ticks())},
                        "BucketCount": {"N": str(BUCKETS)}}
                puts.append({"Put": {"TableName": self.table, "Item": item,
                                     "ConditionExpression": "attribute_not_exists(#sk)",
                                     "ExpressionAttributeNames": {"#sk": "SK"}}})
        self.ddb.transact_write_items(TransactItems=puts)

    def run(self) -> None:
        try:
            while not (self.done.is_set() and len(self.sent) >= MIN_MESSAGES):
                ms = self.next_messages()
                if self.writes % 2:
                    self.enqueue_with_boto3(ms)
                else:
                    self.enqueue_with_outboxctl(ms)
                self.writes += 1
                time.sleep(0.5)
        except BaseException as e:  # reported by the test
            self.error = e


def read_topic(bootstrap: str, topic: str) -> list:
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(PARTITIONS)}
        c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        records, deadline = [], time.monotonic() + 60
        pos = {p: 0 for p in range(PARTITIONS)}
        while any(pos[p] < ends[p] for p in pos):
            assert time.monotonic() < deadline, f"reading {topic}: at {pos} of {ends}"
            for msg in c.consume(500, timeout=1.0):
                assert msg.error() is None, msg.error()
                records.append(msg)
                pos[msg.partition()] = msg.offset() + 1
        return records
    finally:
        c.close()


# ------------------------------------------------------------------ the docs' examples

def doc_blocks(doc: str, kind: str) -> list[list[str]]:
    text = open(os.path.join(ROOT, "docs", doc)).read()
    return [[x for x in b.splitlines() if x.strip() and not x.startswith("#")]
            for b in re.findall(r"```\w* example:" + kind + r"\n(.*?)```", text, re.S)]


def buckets_of(spec: str) -> list[int]:
    out = []
    for part in spec.split():
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def runs(bs: list[int]) -> str:
    if not bs:
        return "none"
    out, start = [], bs[0]
    for prev, cur in zip(bs, bs[1:] + [None]):
        if cur != prev + 1:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = cur
    return " ".join(out)


def test_independent_relay_reads_the_docs_examples():
    plans = doc_blocks("protocol.md", "plan")
    assert len(plans) >= 15
    for block in plans:
        f = dict(x.split(": ", 1) for x in block[:3] if x.split(":")[0] in (
            "bucket count", "active relays", "leases"))
        n, active = int(f["bucket count"]), f["active relays"].split(", ")
        view = {}
        for group in filter(None, f.get("leases", "").split("; ")):
            words = group.split()
            lapsed = words[-1] == "lapsed"
            owner = None if words[0] == "nobody" else words[0]
            for b in buckets_of(" ".join(words[1:-1] if lapsed else words[1:])):
                view[b] = (owner, lapsed)
        for line in block:
            me, _, rest = line.partition(": ")
            if me in ("bucket count", "active relays", "leases"):
                continue
            p = ir.compute_plan(n, active, view, me)
            got = (f"share {p.share}; range {runs(list(range(*p.range))).replace('none', 'empty')}"
                   f"; keep {runs(p.keep)}; release {runs(p.release)}; claim {runs(p.claim)}"
                   + ("" if p.standby is None else f"; standby {p.standby}"))
            assert got == rest, f"{block}: {me}"
    for doc in ("protocol.md", "item-schema.md"):
        for block in doc_blocks(doc, "bucket") + doc_blocks(doc, "keyless"):
            f = dict(x.split(":", 1) for x in block)
            f = {k: v.strip() for k, v in f.items()}
            data = (uuid.UUID(f["message id"]).bytes_le if "message id" in f
                    else f["key (UTF-8)"].encode())
            assert data.hex(" ") == f.get("key bytes", f.get("id bytes"))
            assert ir.murmur2(data) == int(f["murmur2"])
            assert ir.to_positive(ir.murmur2(data)) % int(f["bucket count"]) == int(f["bucket"])
    for block in doc_blocks("protocol.md", "kafka-partition"):
        f = {k: v.strip() for k, v in (x.split(":", 1) for x in block)}
        p = ir.kafka_partition(f["key (UTF-8)"].encode(), int(f["explicit partition"])
                               if "explicit partition" in f else None,
                               int(f["partition count"]), 0)
        assert ("refused" if p is None else str(p)) == f["partition"]
    for line in doc_blocks("protocol.md", "header-blobs")[0]:
        hexs, want = line.rsplit(": ", 1)
        blob = bytes.fromhex("" if hexs.startswith("(") else hexs)
        try:
            count = len(ir.decode_headers(blob))
            got = f"{count} header{'' if count == 1 else 's'}"
        except ir.BadItem as e:
            got = f"refused, {e}"
        assert got == want, line
    for block in doc_blocks("item-schema.md", "headers"):
        hs = [re.match(r'header: (\S+) = (null|"(.*)")$', x).groups() for x in block
              if x.startswith("header:")]
        hexs = " ".join(x.replace("bytes:", "") for x in block
                        if not x.startswith(("header:", "base64:")))
        headers = [(k, None if v == "null" else s.encode()) for k, v, s in hs]
        assert ir.encode_headers(headers) == bytes.fromhex(hexs)
        assert ir.decode_headers(bytes.fromhex(hexs)) == headers


# ------------------------------------------------------------------ the mixed fleet

def test_mixed_fleet_shares_one_table(stack_env, outboxctl, outbox_env, outbox_table,
                                      kafka_topic, ddb, relays):
    t_start = time.monotonic()
    timeline = []

    def event(what: str, expected: list, alive: list) -> None:
        took = wait_split(ddb, outbox_table, expected, alive, what)
        owners = collections.Counter(live_owners(ddb, outbox_table).values())
        timeline.append({"at_s": round(time.monotonic() - t_start, 1), "event": what,
                         "settled_in_s": round(took, 1), "split": dict(sorted(owners.items()))})

    rust1 = relays("rust", "rust-1")
    event("rust-1 alone", [rust1], [rust1])
    py1 = relays("python", "py-1")
    event("py-1 joins", [rust1, py1], [rust1, py1])
    writer = Writer(outboxctl, outbox_env, kafka_topic)
    writer.start()
    rust2 = relays("rust", "rust-2", "--for", "25s")
    event("rust-2 joins (--for 25s)", [rust1, py1, rust2], [rust1, py1, rust2])
    rust2.proc.wait(40)
    event("rust-2 leaves at its deadline", [rust1, py1], [rust1, py1])
    rust1.stop()
    event("rust-1 stops (SIGTERM)", [py1], [py1])
    py2 = relays("python", "py-2")
    event("py-2 joins", [py1, py2], [py1, py2])
    rust1b = relays("rust", "rust-1")
    event("rust-1 restarts", [rust1b, py1, py2], [rust1b, py1, py2])
    py1.stop()
    event("py-1 stops (SIGTERM)", [rust1b, py2], [rust1b, py2])
    py1b = relays("python", "py-1")
    event("py-1 restarts", [rust1b, py1b, py2], [rust1b, py1b, py2])
    writer.done.set()
    writer.join(120)
    assert writer.error is None, f"writer: {writer.error!r}"
    assert not writer.is_alive()

    # Drained: no message item left while the last three still run.
    deadline = time.monotonic() + 60
    while True:
        left = sum(ddb.query(TableName=outbox_table, Select="COUNT", ConsistentRead=True,
                             KeyConditionExpression="PK = :pk", ExpressionAttributeValues={
                                 ":pk": {"S": f"OUTBOX#MESSAGES#{b}"}})["Count"]
                   for b in range(BUCKETS))
        if left == 0:
            break
        assert time.monotonic() < deadline, f"{left} messages still in the table after 60s"
        time.sleep(0.5)
    for r in (rust1b, py1b, py2):
        r.terminate()
    for r in (rust1b, py1b, py2):
        r.stop()

    summaries = [r.summary() for r in relays.started]
    for s, r in zip(summaries, relays.started):
        assert r.proc.returncode == 0, f"{r.relay_id} exited {r.proc.returncode}:\n{r.tail()}"
        assert s["refused_writes"] == 0, f"refused writes: {s}\n{r.tail(60)}"
        assert s["released"], f"leases not released at stop: {s}"
    published = collections.Counter()
    for s in summaries:
        published[s["kind"]] += s["published"]

    # What a consumer sees.
    records = read_topic(stack_env["KAFKA_BOOTSTRAP_SERVERS"], kafka_topic)
    sent = {m["message_id"]: m for m in writer.sent}
    first: dict[str, object] = {}
    for rec in records:
        hs = rec.headers() or []
        assert hs and hs[-1][0] == ID_HEADER, f"no id header last: {hs}"
        mid = hs[-1][1].decode()
        assert mid in sent, f"a record nobody wrote: {mid}"
        first.setdefault(mid, rec)
    missing = set(sent) - set(first)
    assert not missing, f"{len(missing)} of {len(sent)} messages not in Kafka"
    order = collections.defaultdict(list)
    for mid, rec in first.items():
        m = sent[mid]
        assert rec.key() == m["key"].encode() and rec.value() == m["value"].encode(), mid
        assert [(k, v) for k, v in rec.headers()[:-1]] == m["headers"], (mid, rec.headers())
        want_p = ir.to_positive(ir.murmur2(m["key"].encode())) % PARTITIONS
        assert rec.partition() == want_p, f"{m['key']} in partition {rec.partition()}"
        order[m["key"]].append((rec.offset(), m["n"]))
    for key, recs in order.items():
        ns = [n for _, n in sorted(recs)]
        assert ns == sorted(ns), f"per-key order broken for {key}: {ns}"

    items = ddb.scan(TableName=outbox_table)["Items"]
    assert not [i for i in items if i["PK"]["S"].startswith("OUTBOX#MESSAGES#")]
    assert not [i for i in items if i["SK"]["S"].startswith("LEASE#") and "Owner" in i]
    assert published["rust"] > 0 and published["python"] > 0, published

    figures = {
        "messages": len(sent), "writes": writer.writes, "records_in_kafka": len(records),
        "duplicates": len(records) - len(first),
        "by_writer": dict(collections.Counter(m["writer"] for m in writer.sent)),
        "published_by_implementation": dict(published),
        "runs": [{k: s.get(k) for k in ("kind", "relay_id", "stop_reason", "published",
                                        "refused_writes", "released")}
                 | ({k: s["report"][k] for k in ("refused", "claim_holds", "lost_leases",
                                                  "heartbeats_deleted", "gap_probes",
                                                  "gaps_filled")} if "report" in s else {})
                 for s in summaries],
        "timeline": timeline, "duration_s": round(time.monotonic() - t_start, 1)}
    print(json.dumps(figures, indent=1))
    if os.environ.get("MIXED_FLEET_REPORT"):
        with open(os.environ["MIXED_FLEET_REPORT"], "w") as f:
            json.dump(figures, f, indent=1)
