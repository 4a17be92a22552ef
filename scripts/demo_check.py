#!/usr/bin/env python3
"""Checks what the demo put into Kafka, as read by the independent client.

Reads `kafka.py read TOPIC` JSON lines on stdin and prints, per partition, how many
records arrived; verifies per-key order (each customer's `seq` increases among first
deliveries, deduplicated on the x-outbox-message-id header) and reports the
enqueue-to-publish latency (record timestamp minus the value's `enqueued_ms`).
Exits 1 when a record is missing its message id, order is broken, or the count is off.
"""
import base64
import json
import sys
from collections import Counter, defaultdict


def main() -> int:
    expected = int(sys.argv[1]) if len(sys.argv) > 1 else None
    per_partition = Counter()
    last_seq = {}
    seen = set()
    latencies = []
    problems = []
    for line in sys.stdin:
        if not line.strip():
            continue
        rec = json.loads(line)
        headers = {k: (base64.b64decode(v) if v is not None else None) for k, v in rec["headers"]}
        mid = headers.get("x-outbox-message-id")
        if not mid:
            problems.append(f"record at {rec['partition']}/{rec['offset']} has no message id")
            continue
        if mid in seen:
            continue  # a duplicate (at-least-once); order is judged on first deliveries
        seen.add(mid)
        per_partition[rec["partition"]] += 1
        value = json.loads(base64.b64decode(rec["value"]))
        key = base64.b64decode(rec["key"]).decode()
        if value["seq"] <= last_seq.get(key, 0):
            problems.append(f"order broken for {key}: seq {value['seq']} after {last_seq[key]}")
        last_seq[key] = value["seq"]
        if rec.get("timestamp") is not None:
            latencies.append(rec["timestamp"] - value["enqueued_ms"])
    for p in sorted(per_partition):
        print(f"partition {p}: {per_partition[p]} records")
    print(f"{len(seen)} distinct messages over {len(last_seq)} keys; per-key order "
          + ("verified" if not problems else "BROKEN"))
    if latencies:
        latencies.sort()
        pct = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))]
        print(f"enqueue-to-publish latency: p50 {pct(0.50)} ms, p99 {pct(0.99)} ms")
    if expected is not None and len(seen) != expected:
        problems.append(f"expected {expected} messages, found {len(seen)}")
    for p in problems[:10]:
        print("problem:", p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
