#!/usr/bin/env python3
"""End-to-end test of both Lambda functions under cargo-lambda's emulator.

Runs inside `scripts/stack.sh run` (DynamoDB Local, Apache Kafka, moto's EventBridge/SQS)
with the stack's venv python, from the workspace root, with `cargo lambda` on PATH:

  1. creates a fresh outbox table (outboxctl), a topic (confluent-kafka) and an
     event bus whose commit notifications land in an SQS queue (moto);
  2. starts `cargo lambda watch` on a free loopback port, with the functions'
     environment (OUTBOX_TABLE_NAME, OUTBOX_NOTIFY_EVENT_BUS, short run times);
  3. `cargo lambda invoke outbox-enqueue-function` with a batch: checks the
     response (ids, buckets, per-key consecutive sequences) and the one commit
     notification the function sent;
  4. invokes it with a bad request: checks the ValidationError naming the field
     and that the table is item for item what it was;
  5. `cargo lambda invoke outbox-relay-function` with the notification as
     EventBridge delivered it: the relay joins (no live relay), publishes the
     batch, stops gracefully;
  6. reads the topic back with confluent-kafka: every message once, per-key
     order, the message-id header equal to the enqueue response's id; the
     table holds no message any more.

Prints what it checks; exits non-zero at the first failed check.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import time
import uuid

import boto3

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(SCRIPTS)
PY = sys.executable
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))


def step(msg: str) -> None:
    print(f"[lambda-e2e] {msg}", flush=True)


def fail(msg: str) -> None:
    print(f"[lambda-e2e] FAILED: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def check(cond: bool, msg: str) -> None:
    if not cond:
        fail(msg)


def run(args: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, **kw)


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def scan(table: str) -> list[dict]:
    ddb = boto3.client("dynamodb")
    items, start = [], None
    while True:
        kw = {"TableName": table, "ConsistentRead": True}
        if start:
            kw["ExclusiveStartKey"] = start
        out = ddb.scan(**kw)
        items += out["Items"]
        start = out.get("LastEvaluatedKey")
        if not start:
            return sorted(items, key=lambda i: (i["PK"]["S"], i["SK"]["S"]))


def messages_in(items: list[dict], prefix: str) -> list[dict]:
    return [i for i in items if i["PK"]["S"].startswith(f"{prefix}#MESSAGES#")]


class Watch:
    """`cargo lambda watch` on a loopback port, stopped (with its functions) on exit."""

    def __init__(self, env: dict[str, str]):
        self.port = free_port()
        self.log = open(os.path.join(TARGET, "lambda-e2e-watch.log"), "w")
        self.proc = subprocess.Popen(
            ["cargo", "lambda", "watch", "--invoke-address", "127.0.0.1",
             "--invoke-port", str(self.port), "--ignore-changes"],
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self) -> None:
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.dump()
                fail(f"cargo lambda watch exited with {self.proc.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.2)
        self.dump()
        fail("cargo lambda watch did not listen within 120 s")

    def invoke(self, function: str, payload: dict) -> tuple[int, str, str]:
        out = run(["cargo", "lambda", "invoke", function, "--invoke-address", "127.0.0.1",
                   "--invoke-port", str(self.port), "--output-format", "json",
                   "--data-ascii", json.dumps(payload)], cwd=ROOT, timeout=180)
        return out.returncode, out.stdout, out.stderr

    def dump(self) -> None:
        self.log.flush()
        with open(self.log.name) as f:
            print("".join(f.readlines()[-40:]), file=sys.stderr)

    def stop(self) -> None:
        """Stops the emulator and the function processes it started (one session)."""
        for sig, wait in ((15, 15), (9, 5)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        self.log.close()


def main() -> int:
    suffix = uuid.uuid4().hex[:10]
    table, topic, bus, prefix = f"e2e-{suffix}", f"e2e-orders-{suffix}", f"e2e-bus-{suffix}", "OUTBOX"

    step("building outboxctl and both functions (dev profile)")
    out = run(["cargo", "build", "-q", "-p", "outboxctl", "-p", "outbox-enqueue-function",
               "-p", "outbox-relay-function"], cwd=ROOT)
    check(out.returncode == 0, f"cargo build: {out.stderr}")
    out = run([os.path.join(TARGET, "debug", "outboxctl"), "create-table", "--table", table])
    check(out.returncode == 0, f"outboxctl create-table: {out.stderr}")
    out = run([PY, os.path.join(SCRIPTS, "kafka.py"), "create-topic", topic, "--partitions", "3"])
    check(out.returncode == 0, f"create-topic: {out.stderr}")
    out = run([PY, os.path.join(SCRIPTS, "events.py"), "watch", bus])
    check(out.returncode == 0, f"events.py watch: {out.stderr}")
    queue = out.stdout.strip()

    env = dict(os.environ)
    env.update({
        "OUTBOX_TABLE_NAME": table,
        "OUTBOX_NOTIFY_EVENT_BUS": bus,
        "OUTBOX_MAX_RUN_TIME": "6s",
        "OUTBOX_POLL_INTERVAL": "200ms",
        "RUST_LOG": "info",
    })
    step("starting cargo lambda watch")
    watch = Watch(env)
    try:
        watch.wait_ready()
        return scenario(watch, table, topic, prefix, queue)
    finally:
        watch.stop()


def scenario(watch: Watch, table: str, topic: str, prefix: str, queue: str) -> int:
    keys = [f"customer-{i}" for i in range(4)]
    request = {"messages": [
        {"topic": topic, "key": keys[n % 4], "value": f"order-{n}",
         "headers": [{"key": "type", "value": "order-placed"}, {"key": "n", "value": str(n)}]}
        for n in range(20)
    ]}
    request["messages"].append({"topic": topic, "key_base64": base64.b64encode(b"\x00bin").decode(),
                                "value_base64": base64.b64encode(b"\xff\x00").decode()})

    step("invoke outbox-enqueue-function with 21 messages")
    rc, stdout, stderr = watch.invoke("outbox-enqueue-function", request)
    check(rc == 0, f"enqueue failed: {stderr}")
    response = json.loads(stdout)
    sent = response["messages"]
    check(len(sent) == 21, f"21 results, got {len(sent)}")
    by_key: dict[str, list[dict]] = {}
    for m, r in zip(request["messages"], sent):
        uuid.UUID(r["message_id"])
        check(0 <= r["bucket"] < 8, f"bucket {r['bucket']}")
        by_key.setdefault(m.get("key") or m.get("key_base64"), []).append(r)
    for key, rs in by_key.items():
        check(len({r["bucket"] for r in rs}) == 1, f"{key}: one bucket")
        seqs = [r["sequence"] for r in rs]
        check(all(b > a for a, b in zip(seqs, seqs[1:])), f"{key}: ascending sequences {seqs}")
    items_after_enqueue = scan(table)
    check(len(messages_in(items_after_enqueue, prefix)) == 21, "21 message items in the table")

    step("the commit notification the function sent")
    out = run([PY, os.path.join(SCRIPTS, "events.py"), "receive", queue, "--wait", "5"])
    check(out.returncode == 0, f"events.py receive: {out.stderr}")
    events = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    check(len(events) == 1, f"one notification, got {events}")
    event = events[0]
    buckets = sorted({r["bucket"] for r in sent})
    check(event["source"] == "dynamo-outbox" and event["detail-type"] == "OutboxCommitted",
          f"event source/detail-type: {event}")
    check(event["detail"] == {"table": table, "key_prefix": prefix, "bucket_count": 8,
                              "buckets": buckets}, f"event detail: {event['detail']}")

    step("invoke outbox-enqueue-function with a bad request")
    bad = {"messages": [{"topic": topic, "value": "fine"}, {"topic": "no spaces allowed"}]}
    rc, stdout, stderr = watch.invoke("outbox-enqueue-function", bad)
    check(rc != 0, f"a bad request must fail: {stdout}")
    check("ValidationError" in stderr, f"errorType ValidationError: {stderr}")
    check("messages[1].topic" in stderr, f"the error names the field: {stderr}")
    check(scan(table) == items_after_enqueue, "the table is unchanged after the bad request")
    out = run([PY, os.path.join(SCRIPTS, "events.py"), "receive", queue, "--wait", "1"])
    check(out.returncode == 0, f"events.py receive: {out.stderr}")
    check(out.stdout.strip() == "", f"no notification for a rejected request: {out.stdout}")

    step("invoke outbox-relay-function with the notification")
    started = time.time()
    rc, stdout, stderr = watch.invoke("outbox-relay-function", event)
    check(rc == 0, f"relay failed: {stderr}")
    summary = json.loads(stdout)
    step(f"relay summary after {time.time() - started:.1f}s: {json.dumps(summary)}")
    check(summary["trigger"] == "notification", "started by the notification")
    check(summary["published"] == 21, f"published 21: {summary}")
    check(summary["refused_writes"] == 0, f"no refused write: {summary}")
    check(summary["released"] and summary["stop_reason"] == "deadline", f"graceful stop: {summary}")
    check(summary["deadline_source"] == "fallback",
          "cargo lambda watch sends no usable deadline: the configured run time applies")

    step("read the topic back with confluent-kafka")
    out = run([PY, os.path.join(SCRIPTS, "kafka.py"), "read", topic])
    check(out.returncode == 0, f"kafka.py read: {out.stderr}")
    records = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    check(len(records) == 21, f"21 records, got {len(records)}")
    ids = {r["message_id"] for r in sent}
    got_ids = set()
    per_key: dict[str, list[int]] = {}
    for rec in sorted(records, key=lambda r: (r["partition"], r["offset"])):
        headers = dict(rec["headers"])
        mid = base64.b64decode(headers["x-outbox-message-id"]).decode()
        got_ids.add(mid)
        value = base64.b64decode(rec["value"])
        if value.startswith(b"order-"):
            check(base64.b64decode(headers["type"]) == b"order-placed", "header type")
            per_key.setdefault(rec["key"], []).append(int(value[6:]))
        else:
            check(value == b"\xff\x00" and base64.b64decode(rec["key"]) == b"\x00bin",
                  "binary key and value round-trip")
    check(got_ids == ids, "every message id exactly once")
    for key, ns in per_key.items():
        check(ns == sorted(ns), f"per-key order for {key}: {ns}")
    check(messages_in(scan(table), prefix) == [], "no message left in the table")
    step(f"ok: 21 enqueued through the function, 1 notification, bad request rejected with the "
         f"table unchanged, 21 relayed in per-key order over {len(per_key) + 1} keys")
    return 0


if __name__ == "__main__":
    sys.exit(main())
