"""End-to-end test of both Lambda functions under cargo-lambda's emulator.

Needs the stack (DynamoDB Local, Apache Kafka, moto's EventBridge/SQS) and `cargo lambda`
on PATH (the venv's):

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
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import time
import uuid

from outbox_e2e import events
from outbox_e2e.dynamodb import free_port, message_items, scan
from outbox_e2e.paths import ROOT
from outbox_e2e.report import Failed, check, step


def run(args: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, **kw)


class Watch:
    """`cargo lambda watch` on a loopback port, stopped (with its functions) on exit."""

    def __init__(self, env: dict[str, str], log_path: str):
        self.name = "cargo lambda watch"
        self.port = free_port()
        self.log = open(log_path, "w")
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
                raise Failed(f"cargo lambda watch exited with {self.proc.returncode}:\n"
                             f"{self.tail()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.2)
        raise Failed(f"cargo lambda watch did not listen within 120 s:\n{self.tail()}")

    def invoke(self, function: str, payload: dict) -> tuple[int, str, str]:
        out = run(["cargo", "lambda", "invoke", function, "--invoke-address", "127.0.0.1",
                   "--invoke-port", str(self.port), "--output-format", "json",
                   "--data-ascii", json.dumps(payload)], cwd=ROOT, timeout=180)
        return out.returncode, out.stdout, out.stderr

    def tail(self, n: int = 40) -> str:
        self.log.flush()
        with open(self.log.name) as f:
            return "".join(f.readlines()[-n:])

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
        if not self.log.closed:
            self.log.close()


def test_both_functions_under_cargo_lambda_watch(stack, kafka, debug_binaries, started,
                                                 tmp_path) -> None:
    """The enqueue function's answer, its one commit notification, a bad request refused
    with the table unchanged, the relay started by the notification publishing every
    message once in per-key order (the module docstring)."""
    suffix = uuid.uuid4().hex[:10]
    table, topic, bus, prefix = (f"e2e-{suffix}", f"e2e-orders-{suffix}", f"e2e-bus-{suffix}",
                                 "OUTBOX")
    out = run([debug_binaries["outboxctl"], "create-table", "--table", table])
    check(out.returncode == 0, f"outboxctl create-table: {out.stderr}")
    kafka.create_topic(topic, 3)
    queue = events.watch(bus)

    env = dict(os.environ)
    env.update({
        "OUTBOX_TABLE_NAME": table,
        "OUTBOX_NOTIFY_EVENT_BUS": bus,
        "OUTBOX_MAX_RUN_TIME": "6s",
        "OUTBOX_POLL_INTERVAL": "200ms",
        "RUST_LOG": "info",
    })
    step("starting cargo lambda watch")
    watch = Watch(env, str(tmp_path / "cargo-lambda-watch.log"))
    started.append(watch)
    watch.wait_ready()

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
    check(len(message_items(items_after_enqueue, prefix)) == 21, "21 message items in the table")

    step("the commit notification the function sent")
    got = events.receive(queue, wait=5)
    check(len(got) == 1, f"one notification, got {got}")
    event = got[0]
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
    late = events.receive(queue, wait=1)
    check(late == [], f"no notification for a rejected request: {late}")

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
    records = kafka.read(topic)
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
    check(message_items(scan(table), prefix) == [], "no message left in the table")
    step(f"ok: 21 enqueued through the function, 1 notification, bad request rejected with the "
         f"table unchanged, 21 relayed in per-key order over {len(per_key) + 1} keys")
