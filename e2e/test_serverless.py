"""The serverless mode with the deployable artifacts: the two bootstraps `sam build` made,
each under the Lambda emulator (real deadline headers, cold starts, freezes).

test_serverless_doorbell: sam build's x86-64 bootstraps, WakeOn=stream, the table's
KEYS_ONLY stream read by the event source mapping with the template's RelayDoorbell
settings (KeyPrefix given: filter INSERT of {prefix}#MESSAGES#*, batch size 10, no
batching window, no retries, record age 60 s, from LATEST), and NO schedule: only the
doorbell can start the relay.
  1. a fresh outbox table (as lib/src/table.rs creates it) with its KEYS_ONLY stream, a
     business table, a topic with 3 partitions; both functions with the template's
     environment (OUTBOX_TABLE_NAME, OUTBOX_KEY_PREFIX (a non-default prefix, so the
     variable matters), OUTBOX_BUCKET_COUNT, OUTBOX_MAX_RUN_TIME=900s,
     OUTBOX_SHUTDOWN_MARGIN=3s, OUTBOX_IDLE_STOP (2s here, the template's default is 5s),
     KAFKA_BOOTSTRAP_SERVERS and KAFKA_AUTH=none from the stack), its memory, timeouts,
     reserved concurrency and JSON logging, and nothing else of this process's environment
     (the stack's DynamoDB endpoint and credentials aside);
  2. phase 1: the enqueue function with 20 messages over 5 keys; its answer (ids, each
     bucket equal to murmur2(key) % 8 by the Python port, per-key ascending sequences);
     the poller delivers the 20 inserts to the relay; every relay invocation: trigger
     doorbell, no function error, released, 0 refused writes, the deadline taken from the
     invocation, answered with at least half its timeout left; those that published
     stopped with stop_reason idle, the others (a later batch whose messages were already
     published) idle or covered; published 20 in all;
  3. the topic read back by the independent client: the set of message ids equals the
     set enqueued and no id twice, per-key order, each record in Kafka's default
     partition for its key, the headers;
  4. phase 2, a writer that is not the enqueue function: one TransactWriteItems by boto3
     with a business item and 3 message puts, as the library's writer builds them (ADD
     Sequence on {prefix}#SEQUENCE#{bucket}, then Puts with attribute_not_exists on the
     sort key, the attributes of docs/item-schema.md); a new doorbell invocation
     publishes the 3, checked in Kafka as above (23 ids, each once, per-key order across
     both phases; headers byte for byte: the writer's in order, the null value as null,
     then the message-id header once, last);
  5. the table has no message item left, no lease has an owner, every relay heartbeat is
     stamped stopped, the sequence counters add up to 23; the poller delivered 23
     records, dropped none, filtered out the relay's own writes; the relay emulator saw
     no error, timeout or throttle.

test_arm64_smoke_tick: the default artifact, sam build's arm64 bootstraps (under
qemu-aarch64-static -L / on an x86-64 machine: scripts/install.sh installs it and
libc6:arm64); no stream, no poller; 20 messages over 5 keys through the enqueue function,
checked as in step 2; one relay invocation with the template's schedule payload
({"source":"dynamo-outbox.schedule"}): no function error, trigger direct, published 20,
stop_reason idle, released, 0 refused writes, the deadline taken from the invocation and
the answer before it (no other timing bound: an emulator's durations say nothing about
Lambda's); Kafka as in step 3; the table as in step 5 (20 written); the relay's stdout
carries its CloudWatch EMF documents (the table's dimension, Published summing to 20);
neither emulator saw an error, timeout or throttle.
"""

from __future__ import annotations

import base64
import json
import os
import time
import uuid
from dataclasses import dataclass

from outbox_e2e.items import BUCKET_COUNT, bucket_of, direct_write, header_blob, murmur2, ticks
from outbox_e2e.report import check, step
from outbox_e2e.serverless import (ENQUEUE_TIMEOUT_S, MAX_RUN_TIME, RELAY_RESERVED_CONCURRENCY,
                                   SCHEDULE_PAYLOAD, SHUTDOWN_MARGIN, TOPIC_PARTITIONS,
                                   check_doorbell_invocations, check_table, check_topic,
                                   elf_machine, emf_documents, emf_sum, enqueue_batch,
                                   relay_summary, wait_doorbells)
from outbox_e2e.stack import aws_env


@dataclass
class Options:
    relay_timeout: float = 30.0   # the relay function's timeout, seconds
    idle_stop: str = "2s"         # OUTBOX_IDLE_STOP (the template's is 5s)
    init_timeout: float = 10.0    # seconds a new environment may take to its first /next
    wait: float = 60.0            # seconds each phase may take to reach Kafka
    prefix: str = ""              # the command both bootstraps run under
    arch: str | None = None       # both bootstraps must be ELF executables of this machine


def test_python_writer_matches_the_library() -> None:
    """The Python writer (outbox_e2e.items) against the vectors of lib/src/message.rs
    (Kafka's murmur2 test vectors) and docs/item-schema.md (buckets, header blob, ticks)."""
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


def bootstraps(build_dir: str, opts: Options) -> tuple[dict[str, str], dict[str, str], str]:
    """The two bootstraps of a sam build directory, their machines (checked against this
    host and --arch), and a note of the command they run under."""
    binaries = {fn: os.path.join(build_dir, fn, "bootstrap")
                for fn in ("RelayFunction", "EnqueueFunction")}
    for path in binaries.values():
        check(os.path.isfile(path) and os.access(path, os.X_OK), f"no executable {path}")
    arch = {fn: elf_machine(path) for fn, path in binaries.items()}
    prefix_note = f" under {opts.prefix!r}" if opts.prefix else ""
    step(f"bootstraps: RelayFunction {arch['RelayFunction']}, EnqueueFunction "
         f"{arch['EnqueueFunction']}{prefix_note}")
    if os.uname().machine == "x86_64" and not opts.prefix:
        check(all(a == "x86-64" for a in arch.values()),
              f"bootstraps are {arch}: on this x86_64 host they need a prefix (qemu)")
    if opts.arch:
        check(all(a == opts.arch for a in arch.values()),
              f"bootstraps are {arch}, expected {opts.arch}")
    return binaries, arch, prefix_note


def start_functions(opts: Options, binaries: dict[str, str], fresh, lambda_emulator,
                    stack, stream: bool) -> tuple:
    """A fresh outbox table (with its stream when `stream`), a business table and a topic;
    both functions under the emulator with the template's environment.  Returns
    (suffix, table, business table, topic, key prefix, relay, enqueue)."""
    suffix = uuid.uuid4().hex[:10]
    table, business, topic = f"sls-{suffix}", f"sls-orders-{suffix}", f"sls-orders-{suffix}"
    prefix = "SHOP"  # not the default OUTBOX: OUTBOX_KEY_PREFIX has to reach both functions
    fresh.outbox_table(table, stream=stream)
    fresh.business_table(business)
    fresh.topic(topic, TOPIC_PARTITIONS)
    step(f"table {table} ({'KEYS_ONLY stream' if stream else 'no stream'}), business table "
         f"{business}, topic {topic} ({TOPIC_PARTITIONS} partitions), key prefix {prefix}")

    # The template's environment, and what Lambda's execution role and VPC provide here:
    # the stack's DynamoDB endpoint and credentials.
    common = dict(aws_env(), OUTBOX_TABLE_NAME=table, OUTBOX_KEY_PREFIX=prefix,
                  OUTBOX_BUCKET_COUNT=str(BUCKET_COUNT))
    relay_env = dict(common, OUTBOX_MAX_RUN_TIME=MAX_RUN_TIME,
                     OUTBOX_SHUTDOWN_MARGIN=SHUTDOWN_MARGIN,
                     KAFKA_BOOTSTRAP_SERVERS=stack.kafka, KAFKA_AUTH="none",
                     OUTBOX_IDLE_STOP=opts.idle_stop)
    relay = lambda_emulator.function("RelayFunction", binaries["RelayFunction"],
                                     opts.relay_timeout, relay_env, prefix=opts.prefix,
                                     max_concurrency=RELAY_RESERVED_CONCURRENCY,
                                     init_timeout=opts.init_timeout)
    enqueue = lambda_emulator.function("EnqueueFunction", binaries["EnqueueFunction"],
                                       ENQUEUE_TIMEOUT_S, common, prefix=opts.prefix,
                                       max_concurrency=10, init_timeout=opts.init_timeout)
    return suffix, table, business, topic, prefix, relay, enqueue


def test_serverless_doorbell(sam_build, stack, fresh, lambda_emulator, stream_mapping) -> None:
    """sam build's x86-64 bootstraps woken by the stream's doorbell alone: the enqueue
    function's commit and a direct TransactWriteItems, each published once in per-key
    order, the table empty after (the module docstring has every check)."""
    opts = Options()
    t0 = time.time()
    binaries, arch, prefix_note = bootstraps(os.path.join(sam_build, "build"), opts)
    suffix, table, business, topic, prefix, relay, enqueue = start_functions(
        opts, binaries, fresh, lambda_emulator, stack, stream=True)

    poller = stream_mapping.templated(table, relay, prefix, opts.relay_timeout)
    mapping = poller.settings
    step(f"RelayFunction (timeout {opts.relay_timeout:g}s, idle stop {opts.idle_stop}) and "
         f"EnqueueFunction under lambda_runtime.py; streams.py poll with the template's "
         f"{mapping['mapping']}: filter {json.dumps(mapping['filter_patterns'])}, batch "
         f"{mapping['batch_size']}, window {mapping['window_s']:g}s, "
         f"{mapping['max_retries']} retries, record age {mapping['max_record_age_s']:g}s; "
         f"no schedule")

    # ---- phase 1: the enqueue function, woken relay by the stream.
    sent, enqueue_started = enqueue_batch(enqueue, topic, "phase 1")

    invs1 = wait_doorbells(relay, poller, 0, 0, 20, opts.wait)
    summaries1, notes1 = check_doorbell_invocations(invs1, 20, opts.relay_timeout, "phase 1")
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
    invs2 = wait_doorbells(relay, poller, since, 20, 3, opts.wait)
    summaries2, notes2 = check_doorbell_invocations(invs2, 3, opts.relay_timeout, "phase 2")
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
    pc = poller.stop_counters()
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
         f"before the {opts.relay_timeout:g}s deadline; 23 ids in Kafka exactly once over "
         f"{nkeys} keys in per-key order; 0 refused writes; table empty, no lease owned; "
         f"poller: {pc['records']} inserts in {pc['batches']} batches, "
         f"{pc['records_filtered_out']} records filtered out")


def test_arm64_smoke_tick(sam_build, stack, fresh, lambda_emulator) -> None:
    """The default artifact, sam build's arm64 bootstraps (under qemu-aarch64-static on an
    x86-64 machine): a batch through the enqueue function, then one scheduled relay
    invocation publishing it before its deadline (the module docstring)."""
    emulated = os.uname().machine != "aarch64"
    opts = Options(relay_timeout=60.0, init_timeout=30.0, arch="aarch64",
                   prefix="qemu-aarch64-static -L /" if emulated else "")
    t0 = time.time()
    binaries, arch, prefix_note = bootstraps(os.path.join(sam_build, "build-arm64"), opts)
    _suffix, table, _business, topic, prefix, relay, enqueue = start_functions(
        opts, binaries, fresh, lambda_emulator, stack, stream=False)
    step(f"RelayFunction (timeout {opts.relay_timeout:g}s, idle stop {opts.idle_stop}) and "
         f"EnqueueFunction under lambda_runtime.py (each bootstrap{prefix_note}); no stream, "
         f"no schedule timer: one tick by hand")

    sent, _ = enqueue_batch(enqueue, topic, "enqueue")

    # The template's ScheduleV2 Input (template.yaml), as one invocation.
    status, function_error, body = relay.invoke(SCHEDULE_PAYLOAD,
                                                timeout=opts.relay_timeout + 60)
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
         f"{opts.relay_timeout:g}s left), leases released")

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
