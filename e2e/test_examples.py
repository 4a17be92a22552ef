"""The library's examples (lib/examples/) against the local stack.

Needs the stack:

  1. builds outboxctl and the examples (dev profile, the shared target directory,
     the features `cargo test --workspace --all-features` builds them with);
  2. checks that bad input is refused before anything is sent: `place_orders
     --count abc` and `embedded_relay` without OUTBOX_TABLE_NAME exit 2 with an
     error naming the flag or variable;
  3. creates a fresh outbox table (`outboxctl create-table`) and topic
     (3 partitions);
  4. runs `place_orders --count 12`: each order item is in the orders table and
     each message in the outbox table, as printed;
  5. starts `embedded_relay` in the background and waits until every printed
     message is in the topic (read back with confluent-kafka): each message id
     once, per-key order as placed, the outbox table empty of messages;
  6. sends SIGTERM: the relay exits 0 within 20 s, reports the shutdown with
     its leases released, and `outboxctl status --json` shows no bucket owned,
     nothing pending and the relay stopped;
  7. runs `relay_in_your_own_lambda` (a user's own Lambda function on the library's
     relay handler) under the local model of Lambda: one scheduled invocation publishes
     what place_orders wrote, in per-key order, and the function's own log line is there.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import time
import uuid

from outbox_e2e import kafka
from outbox_e2e.dynamodb import message_items, scan
from outbox_e2e.paths import ROOT, target_dir
from outbox_e2e.report import Failed, check, step

OUTBOXCTL = os.path.join(target_dir(), "debug", "outboxctl")
EXAMPLES = os.path.join(target_dir(), "debug", "examples")
ORDERS = 12
PLACED = re.compile(
    r"^placed order (?P<order>\S+) for (?P<customer>\S+): message (?P<id>[0-9a-f-]{36}) to "
)


def run(args: list[str], timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)


def outbox_messages(table: str) -> list[dict]:
    return message_items(scan(table))


def bad_input(env: dict) -> None:
    out = run([os.path.join(EXAMPLES, "place_orders"), "--count", "abc"], env=env)
    check(out.returncode == 2 and "--count" in out.stderr,
          f"place_orders --count abc: exit 2 naming --count, got {out.returncode}: {out.stderr}")
    no_table = {k: v for k, v in env.items() if k != "OUTBOX_TABLE_NAME"}
    out = run([os.path.join(EXAMPLES, "embedded_relay")], env=no_table)
    check(out.returncode == 2 and "OUTBOX_TABLE_NAME" in out.stderr,
          f"embedded_relay without a table: exit 2 naming OUTBOX_TABLE_NAME, got "
          f"{out.returncode}: {out.stderr}")
    step("bad input refused with exit 2: --count abc, OUTBOX_TABLE_NAME unset")


def place_orders(env: dict, orders_table: str, topic: str, table: str) -> list[dict]:
    out = run([os.path.join(EXAMPLES, "place_orders"), "--count", str(ORDERS),
               "--topic", topic, "--orders-table", orders_table], env=env)
    check(out.returncode == 0, f"place_orders exited {out.returncode}: {out.stderr}")
    placed = [m.groupdict() for m in map(PLACED.match, out.stdout.splitlines()) if m]
    check(len(placed) == ORDERS, f"{ORDERS} orders printed, got:\n{out.stdout}")
    orders = {i["OrderId"]["S"] for i in scan(orders_table)}
    check(orders == {p["order"] for p in placed}, "every printed order is in the orders table")
    check(len(outbox_messages(table)) == ORDERS, f"{ORDERS} messages in the outbox table")
    step(f"place_orders: {ORDERS} orders in {orders_table}, their messages in {table}")
    return placed


def relay_publishes(env: dict, table: str, topic: str, placed: list[dict], log) -> None:
    relay = subprocess.Popen([os.path.join(EXAMPLES, "embedded_relay")], env=env,
                             stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        first = relay.stdout.readline()
        check(first.startswith("relay ") and " running on table " in first,
              f"embedded_relay's first line: {first!r} (log: {log.name})")
        deadline = time.monotonic() + 30
        while True:
            records = kafka.read_topic(topic)
            if len(records) >= ORDERS:
                break
            check(relay.poll() is None,
                  f"embedded_relay exited {relay.returncode} (log: {log.name})")
            check(time.monotonic() < deadline, f"{len(records)} of {ORDERS} records after 30 s")
            time.sleep(0.3)
        check(len(records) == ORDERS, f"{ORDERS} records, got {len(records)}")
        got: dict[str, list[str]] = {}
        for rec in sorted(records, key=lambda r: (r["partition"], r["offset"])):
            headers = dict(rec["headers"])
            key = base64.b64decode(rec["key"]).decode()
            message_id = base64.b64decode(headers["x-outbox-message-id"]).decode()
            got.setdefault(key, []).append(message_id)
        check(sorted(i for ids in got.values() for i in ids) == sorted(p["id"] for p in placed),
              "every printed message id exactly once in the topic")
        for customer, ids in got.items():
            check(ids == [p["id"] for p in placed if p["customer"] == customer],
                  f"{customer}'s messages in the order placed")
        deadline = time.monotonic() + 10
        while outbox_messages(table):
            check(time.monotonic() < deadline, "messages left in the outbox table after 10 s")
            time.sleep(0.2)
        step(f"embedded_relay: {ORDERS} records in {topic}, each id once, per-key order, "
             "the outbox table empty")

        started = time.monotonic()
        relay.send_signal(signal.SIGTERM)
        try:
            rest, _ = relay.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            raise Failed(f"embedded_relay still running 20 s after SIGTERM (log: {log.name})")
        check(relay.returncode == 0, f"embedded_relay exited {relay.returncode} (log: {log.name})")
        stopped = [line for line in rest.splitlines() if " stopped (" in line]
        check(len(stopped) == 1 and stopped[0].endswith("leases released: true")
              and "stopped (shutdown)" in stopped[0] and f"published {ORDERS}," in stopped[0],
              f"a shutdown report with published {ORDERS} and the leases released: {rest!r}")
        step(f"SIGTERM: exit 0 in {time.monotonic() - started:.1f} s: {stopped[0]}")
    finally:
        if relay.poll() is None:
            relay.kill()
            relay.wait()


def status_after(table: str, env: dict) -> None:
    out = run([OUTBOXCTL, "status", "--json", "--table", table], env=env)
    check(out.returncode == 0, f"outboxctl status: {out.stderr}")
    report = json.loads(out.stdout)
    owned = [b["bucket"] for b in report["buckets"] if b["owned"]]
    check(owned == [], f"no bucket owned after the stop, got {owned}")
    check(all(b["pending"] == 0 for b in report["buckets"]), "nothing pending")
    check(report["relays"] and all(r["stopped"] for r in report["relays"]),
          f"the relay's heartbeat says stopped: {report['relays']}")
    step("outboxctl status: no bucket owned, nothing pending, the relay stopped")


def test_examples_place_orders_then_embedded_relay(stack, fresh, tmp_path) -> None:
    """place_orders writes orders with their messages; embedded_relay publishes them in
    per-key order and stops on SIGTERM with its leases released (the module docstring)."""
    started = time.monotonic()
    step("building outboxctl and the examples (dev profile)")
    # The features `cargo test --workspace --all-features` resolves: that step then finds
    # the library, the examples and outboxctl built (cargo test builds examples too).
    # On a fresh machine this is the workspace's first debug build (about ten minutes on
    # two cores): bounded, but far above that.
    out = run(["cargo", "build", "-q", "--workspace", "--all-features", "--examples",
               "--bin", "outboxctl"], timeout=2400, cwd=ROOT)
    check(out.returncode == 0, f"cargo build: {out.stderr}")
    built = time.monotonic()

    suffix = uuid.uuid4().hex[:10]
    table, orders_table, topic = f"ex-outbox-{suffix}", f"ex-orders-{suffix}", f"ex-orders-{suffix}"
    env = {**os.environ, "OUTBOX_TABLE_NAME": table}
    bad_input(env)
    out = run([OUTBOXCTL, "create-table"], env=env)
    check(out.returncode == 0, f"outboxctl create-table: {out.stderr}")
    fresh.topic(topic, 3)

    placed = place_orders(env, orders_table, topic, table)
    with open(tmp_path / "embedded-relay.log", "w") as log:
        relay_publishes(env, table, topic, placed, log)
    status_after(table, env)
    step(f"ok: both examples on the local stack (build {built - started:.1f} s, "
         f"run {time.monotonic() - built:.1f} s)")


def test_example_relay_in_your_own_lambda_under_the_lambda_emulator(
        stack, fresh, debug_binaries, lambda_emulator, tmp_path) -> None:
    """relay_in_your_own_lambda (a user's own function on the library's relay handler)
    under the local model of Lambda, with the relay function's environment: a scheduled
    invocation publishes what place_orders wrote, in per-key order, and answers with the
    handler's summary (stopped idle, its leases released); the example's own step (the
    `my-service:` line) is in the function's log."""
    suffix = uuid.uuid4().hex[:10]
    table, orders_table, topic = f"own-outbox-{suffix}", f"own-orders-{suffix}", f"own-{suffix}"
    env = {**os.environ, "OUTBOX_TABLE_NAME": table}
    out = run([debug_binaries["outboxctl"], "create-table"], env=env)
    check(out.returncode == 0, f"outboxctl create-table: {out.stderr}")
    fresh.topic(topic, 3)
    placed = place_orders(env, orders_table, topic, table)

    function_env = {k: v for k, v in os.environ.items()
                    if k.startswith("AWS_") or k == "KAFKA_BOOTSTRAP_SERVERS"}
    function_env.update(OUTBOX_TABLE_NAME=table, OUTBOX_POLL_INTERVAL="100ms")
    emu = lambda_emulator.function("my-relay", os.path.join(EXAMPLES, "relay_in_your_own_lambda"),
                                   30, function_env)
    status, error, body = emu.invoke({"source": "aws.scheduler"}, timeout=60)
    check(status == 200 and error is None, f"invocation: HTTP {status}, {error}: {body!r}")
    summary = json.loads(body)
    check(summary["published"] == ORDERS and summary["stop_reason"] == "idle"
          and summary["released"] and summary["refused_writes"] == 0,
          f"{ORDERS} published, stopped idle, leases released: {summary}")
    step(f"relay_in_your_own_lambda: {summary['published']} published, stop "
         f"{summary['stop_reason']}, {summary['time_left_ms']} ms left of 30 s")

    records = kafka.read_topic(topic)
    ids: dict[str, list[str]] = {}
    for rec in sorted(records, key=lambda r: (r["partition"], r["offset"])):
        headers = dict(rec["headers"])
        ids.setdefault(base64.b64decode(rec["key"]).decode(), []).append(
            base64.b64decode(headers["x-outbox-message-id"]).decode())
    for customer, got in ids.items():
        check(got == [p["id"] for p in placed if p["customer"] == customer],
              f"{customer}'s messages once each, in the order placed")
    check(sum(map(len, ids.values())) == ORDERS, f"{ORDERS} records in {topic}")
    check(not outbox_messages(table), "the outbox table is empty")
    with open(emu.function_log) as f:
        own = [line for line in f if "my-service: the outbox published" in line]
    check(len(own) == 1 and f"published {ORDERS} messages" in own[0],
          f"the example's own log line, once: {own}")
    step("relay_in_your_own_lambda: every record in per-key order, the table empty, "
         "its own log line written")
