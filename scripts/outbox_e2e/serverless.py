"""The serverless deployment as the scenarios run it (the template's settings for the two
functions) and the checks they share: a batch through the enqueue function, the topic
read back, the relay's doorbell invocations and summaries, the table after a drain, the
relay's EMF documents."""

from __future__ import annotations

import base64
import collections
import json
import time
import uuid

from . import dynamodb, kafka
from .emulator import Emulator
from .items import (MESSAGE_ID_HEADER, as_published, bucket_of, murmur2, to_positive,
                    w3c_traceparent)
from .mapping import StreamPoller
from .report import Failed, check, step

# The template's settings (template.yaml): Globals and the functions' properties.
ENQUEUE_TIMEOUT_S = 10
# The template reserves none by default (RelayReservedConcurrency empty); the emulator
# needs a ceiling on concurrent environments: 5.
RELAY_RESERVED_CONCURRENCY = 5
SHUTDOWN_MARGIN = "3s"
MAX_RUN_TIME = "900s"
TOPIC_PARTITIONS = 3
# The relay's schedule: the template's ScheduleV2 Input.
SCHEDULE_PAYLOAD = {"source": "dynamo-outbox.schedule"}


def b64d(s: str | None) -> bytes | None:
    return None if s is None else base64.b64decode(s)


def elf_machine(path: str) -> str:
    with open(path, "rb") as f:
        head = f.read(20)
    if head[:4] != b"\x7fELF":
        return "not ELF"
    machine = int.from_bytes(head[18:20], "little")
    return {62: "x86-64", 183: "aarch64"}.get(machine, f"ELF machine {machine}")


def enqueue_batch(enqueue: Emulator, topic: str, phase: str) -> tuple[list[dict], float]:
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


def check_topic(topic: str, sent: list[dict], wait: float) -> tuple[list[dict], int]:
    """Reads `topic` until it holds every id of `sent` (at most `wait` s); checks each id
    once and no other, per-key order (the `n` of each message), Kafka's default
    partition of each key, the headers (as the relay publishes them, with the trace context
    the enqueue function stamped, `traceparent` of a sent message).  Returns the records
    and how many keys."""
    expected = {m["message_id"]: m for m in sent}
    deadline = time.time() + wait
    while True:
        records = kafka.read_topic(topic)
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


def relay_summary(inv: dict) -> dict:
    check(inv["status"] == "ok",
          f"relay invocation {inv['request_id']} ended {inv['status']} "
          f"({inv.get('error_type')}): {inv.get('error', '')[:500]}")
    return json.loads(inv["response"])


def wait_doorbells(relay: Emulator, poller: StreamPoller, since: int, delivered_before: int,
                   inserted: int, wait: float) -> list[dict]:
    """Waits until the poller has delivered `inserted` more message inserts to the relay
    and every invocation they started has answered; returns those invocations (each
    with its summary).  Fails at once on a failed invocation or delivery."""
    deadline = time.time() + wait
    while True:
        lines = poller.batches()
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


def check_table(table: str, prefix: str, summaries: list[dict], written: int) -> None:
    """No message item left, no lease owned, one heartbeat per invocation that ran a
    relay, each stamped stopped, the sequence counters adding up to `written`."""
    items = dynamodb.scan(table)
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
