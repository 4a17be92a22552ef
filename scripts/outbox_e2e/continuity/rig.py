"""The pieces of a continuity scenario: the template's relay environment, the relay
under the emulator, the stream mapping, a fresh outbox, the burst writer, the checks of
Kafka, the table and the invocations, and the template's alarms over what the relay
wrote."""

from __future__ import annotations

import collections
import functools
import http.server
import json
import os
import threading
import time
import uuid

import boto3

from .. import alarms, cfn_template, dynamodb, kafka as kafka_client
from ..emulator import Emulator
from ..items import BUCKET_COUNT as BUCKETS
from ..items import MESSAGE_ID_HEADER, direct_write
from ..mapping import StreamPoller
from ..paths import TEMPLATE
from ..report import Failed, check
from ..serverless import b64d
from ..stack import aws_env
from ..streams.records import enable as enable_stream
from .monitor import Monitor, r3

PARTITIONS = 3
PER_COMMIT = 99  # messages per TransactWriteItems: its 100 items, one the business write


# ------------------------------------------------------------------ the template

def template(params: dict | None = None) -> cfn_template.Template:
    base = {"KafkaBootstrapServers": "local:9092"}
    base.update(params or {})
    return cfn_template.Template(TEMPLATE, base)


def relay_template_env() -> dict:
    """The relay function's own variables as the template resolves them by default
    (the relay-side timings; Kafka and the table are set here)."""
    tpl = template()
    props = tpl.resources["RelayFunction"]["Properties"]
    env = tpl.resolve(props["Environment"]["Variables"])
    keep = ("OUTBOX_MAX_RUN_TIME", "OUTBOX_SHUTDOWN_MARGIN", "OUTBOX_IDLE_STOP",
            "OUTBOX_SUCCESSOR")
    out = {k: str(env[k]) for k in keep if k in env}
    check(set(out) == set(keep), f"the template's relay environment lacks {set(keep) - set(out)}")
    return out



def start_relay(args, workdir: str, started: list, table: str, prefix: str,
                bootstrap: str, extra_env: dict | None = None,
                extra_args: list[str] | None = None) -> tuple[Emulator, dict]:
    """The relay binary under the emulator with the template's relay environment and its
    EventInvokeConfig (--template), its log also timed line by line
    (RelayFunction.timed.log in `workdir`)."""
    tenv = relay_template_env()
    env = dict(aws_env(), OUTBOX_TABLE_NAME=table, OUTBOX_KEY_PREFIX=prefix,
               OUTBOX_BUCKET_COUNT=str(BUCKETS), KAFKA_BOOTSTRAP_SERVERS=bootstrap,
               KAFKA_AUTH="none", **tenv, **(extra_env or {}))
    relay = Emulator.function(
        "RelayFunction", args.relay_binary, workdir, args.relay_timeout, env,
        max_concurrency=args.relay_concurrency, init_timeout=10.0,
        extra_args=["--template", TEMPLATE, "--template-function", "RelayFunction",
                    "--param", "KafkaBootstrapServers=local:9092",
                    "--memory", str(args.memory),
                    "--timed-log-file", os.path.join(workdir, "RelayFunction.timed.log"),
                    *(["--cpu-share"] if args.cpu_share else []),
                    *(extra_args or [])])
    started.append(relay)
    relay.wait_ready()
    return relay, tenv


def start_poller(relay: "Emulator | NullFunction", table: str, prefix: str, workdir: str,
                 started: list, relay_timeout: float, shards: int) -> StreamPoller:
    """The stream mapping with the template's RelayDoorbell settings, over `shards`
    virtual shards (DynamoDB Local has one)."""
    poller = StreamPoller.templated(workdir, table, relay.invoke_url, prefix, relay_timeout,
                                    shards=shards)
    started.append(poller)
    poller.settings = poller.wait_ready()
    return poller


class NullFunction:
    """An HTTP endpoint that answers every invocation at once with `null` (a function that
    does nothing): what the always-on comparison's stream mapping invokes, so that its
    writers share DynamoDB Local with the same stream reader as the Lambda run's."""

    def __init__(self) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (the http.server name)
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.send_response(200)
                self.send_header("Content-Length", "4")
                self.end_headers()
                self.wfile.write(b"null")

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.invoke_url = (f"http://127.0.0.1:{self.server.server_address[1]}"
                           "/2015-03-31/functions/RelayFunction/invocations")
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()


def stop_poller(poller: StreamPoller, started: list) -> dict:
    """Its counters (from --stats-file)."""
    counters = poller.stop_counters()
    started.remove(poller)
    return counters


def fresh_outbox(stream: bool, bootstrap: str | None = None,
                 prefix: str = "SHOP") -> tuple[str, str, str, str]:
    """A fresh outbox table (its stream on when `stream`), a business table and a topic
    (created through `bootstrap` when given); key prefix `prefix`."""
    suffix = uuid.uuid4().hex[:10]
    table, business, topic = f"cont-{suffix}", f"cont-orders-{suffix}", f"cont-{suffix}"
    dynamodb.create_outbox_table(table)
    dynamodb.create_business_table(business)
    if stream:
        enable_stream(table)
    try:
        kafka_client.create_topic(topic, PARTITIONS, bootstrap)
    except kafka_client.KafkaToolError as e:
        raise Failed(f"create-topic {topic}: {e}") from e
    return table, business, topic, prefix


# ------------------------------------------------------------------ the writer

def burst(table: str, business: str, prefix: str, topic: str, n: int, value_bytes: int,
          nkeys: int, writers: int) -> tuple[list[dict], float, float, float, float, set]:
    """n messages over nkeys keys, written by `writers` threads (a key belongs to one
    thread, so its messages are committed in order), each TransactWriteItems 99 messages
    and a business item (serverless_e2e.direct_write: ADD Sequence per bucket, then the
    transaction).  The first thread's first commit goes alone and the others start when
    it returns: DynamoDB Local runs one transaction at a time, so a first commit sent
    beside seven others returned 0.44-1.13 s after its call, and when in that time its
    messages became visible was not known (on DynamoDB a commit does not queue behind
    other writers' items).  Alone it returned in 0.30-0.49 s (twelve runs of 2026-12-03:
    the 99 items' own work); the writers behind it start then, and the relay's requests
    meet all of them.  Returns the messages, the first commit's start, the last commit's
    end, the first commit's end (the earliest return of one), the first commit's request
    sent (the earliest time one left the client, serialized and signed) and the buckets
    of the first commit's messages."""
    keys = [f"customer-{i}" for i in range(nkeys)]
    per_thread: list[list[dict]] = [[] for _ in range(writers)]
    for i in range(n):
        k = i % nkeys
        pad = "x" * max(0, value_bytes - 20)
        per_thread[k % writers].append({"key": keys[k], "value": f"order-{i}-{pad}", "n": i,
                                        "headers": [("type", b"order-placed")]})
    first, last, sent, errors = [], [], [], []
    lock = threading.Lock()
    lead = threading.Event()  # the first commit has returned (or failed)

    def write(ms: list[dict], w: int) -> None:
        try:
            if w != 0 and not lead.wait(timeout=120):
                raise RuntimeError("the first commit did not return within 120 s")
            for c in range(0, len(ms), PER_COMMIT):
                chunk = ms[c:c + PER_COMMIT]
                direct_write(table, business, prefix, topic, chunk, order_id=f"{w}-{c}")
                with lock:
                    first.append(chunk[0]["commit_started"])
                    sent.append(chunk[0]["commit_sent"])
                    last.append(time.time())
                lead.set()
        except Exception as e:  # reported below
            errors.append(f"writer {w}: {e!r}")
        finally:
            lead.set()

    threads = [threading.Thread(target=write, args=(ms, w)) for w, ms in enumerate(per_thread)
               if ms]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(not errors, f"the burst writers failed: {errors}")
    out = [m for ms in per_thread for m in ms]
    first_buckets = {m["bucket"] for m in per_thread[0][:PER_COMMIT]}
    return out, min(first), max(last), min(last), min(sent), first_buckets


# ------------------------------------------------------------------ Kafka and checks

def check_delivery(topic: str, sent: list[dict], bootstrap: str | None) -> dict:
    """Each id at least once, none unknown, per-key order of first copies.  Returns the
    figures, with the publish timestamps of the first and last records."""
    try:
        records = kafka_client.read_topic(topic, bootstrap, value_head=16, timeout=120)
    except kafka_client.KafkaToolError as e:
        raise Failed(f"read {topic}: {e}") from e
    expected = {m["message_id"]: m for m in sent}
    first_copy: dict[str, dict] = {}
    counts = collections.Counter()
    for r in records:
        mid = (b64d(dict(r["headers"]).get(MESSAGE_ID_HEADER)) or b"").decode()
        check(mid in expected, f"a record in {topic} with an id nobody wrote: {mid!r}")
        counts[mid] += 1
        if mid not in first_copy:
            first_copy[mid] = r
    missing = set(expected) - set(counts)
    check(not missing, f"{len(missing)} of {len(expected)} message ids not in {topic}: "
                       f"{sorted(missing)[:5]}")
    per_key: dict[str, list[tuple[int, int, int]]] = collections.defaultdict(list)
    for mid, r in first_copy.items():
        m = expected[mid]
        check(b64d(r["key"]) == m["key"].encode(), f"{mid}: key {r['key']}")
        per_key[m["key"]].append((r["partition"], r["offset"], m["n"]))
    for key, recs in per_key.items():
        check(len({p for p, _, _ in recs}) == 1, f"{key} in several partitions")
        ns = [n for _, _, n in sorted(recs)]
        check(ns == sorted(ns), f"per-key order broken for {key}: {ns[:20]}")
    stamps = [r["timestamp"] / 1000 for r in records if r.get("timestamp")]
    return {"records": len(records), "ids": len(counts),
            "duplicates": sum(c - 1 for c in counts.values()),
            "keys": len(per_key), "first_publish": min(stamps), "last_publish": max(stamps),
            "stamps": stamps}


def check_table_clean(table: str, prefix: str) -> dict:
    items = dynamodb.scan(table)
    pending = [i for i in items if i["PK"]["S"].startswith(f"{prefix}#MESSAGES#")]
    check(not pending, f"{len(pending)} message items left in the table")
    owned = [(i["SK"]["S"], i["Owner"]["S"]) for i in items
             if i["PK"]["S"] == f"{prefix}#COORDINATION" and i["SK"]["S"].startswith("LEASE#")
             and "Owner" in i]
    check(not owned, f"leases still owned: {owned}")
    return {"message_items": 0, "owned_leases": 0}


def wait_drained(monitor: Monitor, after: float, wait: float, what: str,
                 settle: float = 1.0) -> float:
    """Until every bucket has been seen empty for `settle` s by samples begun after
    `after`; returns when it first was."""
    deadline = time.time() + wait
    while time.time() < deadline:
        since = monitor.empty_since(after)
        if since is not None and time.time() - since >= settle:
            return since
        time.sleep(0.2)
    s = monitor.latest()
    raise Failed(f"{what}: not drained after {wait:g}s (heads {s and s['heads']})")


def wait_relay_quiet(relay: Emulator, poller: StreamPoller | None, wait: float) -> None:
    """Until no relay invocation runs, no asynchronous event waits (a successor), and
    the poller's batch log has not grown for 3 s."""
    deadline = time.time() + wait
    last_size, stable_since = -1, time.time()
    while time.time() < deadline:
        st = relay.stats(10**9)
        batch_log = poller.batch_log if poller else None
        size = os.path.getsize(batch_log) if batch_log and os.path.exists(batch_log) else 0
        if size != last_size:
            last_size, stable_since = size, time.time()
        t = st["totals"]
        queued = t["async_invocations"] - t["async_succeeded"] - t["async_dropped"]
        if t["concurrency_now"] == 0 and queued == 0 and time.time() - stable_since >= 3.0:
            return
        time.sleep(0.5)
    raise Failed(f"the relay did not go quiet within {wait:g}s")


def invocations(relay: Emulator) -> list[tuple[dict, dict | None]]:
    """Every invocation the relay emulator saw, with its summary (None when it failed)."""
    out = []
    for inv in relay.stats()["invocations"]:
        s = json.loads(inv["response"]) if inv["status"] == "ok" else None
        out.append((inv, s))
    return out


def summarize_invocations(invs: list[tuple[dict, dict | None]], t0: float) -> dict:
    by_trigger = collections.Counter()
    by_outcome = collections.Counter()
    timeline = []
    for inv, s in invs:
        trig = s["trigger"] if s else f"failed:{inv['status']}"
        by_trigger[trig] += 1
        if s:
            ran = s["stop_reason"] not in ("covered", "empty", "not_this_outbox")
            by_outcome[f"{trig}:{s['stop_reason']}"] += 1
            if ran:
                timeline.append({
                    "trigger": trig, "source": inv["source"],
                    "start_s": r3((inv["start"] or inv["received"]) - t0),
                    "end_s": r3((inv["end"] or 0) - t0), "cold": inv["cold"],
                    "published": s["published"], "publish_failures": s["publish_failures"],
                    "buckets_owned": s["buckets_owned"], "owned_at_end": s["owned_at_end"],
                    "stop_reason": s["stop_reason"], "successor_started": s["successor_started"],
                    "released": s["released"], "refused_writes": s["refused_writes"],
                    "errors": s["errors"], "time_left_ms": s["time_left_ms"],
                    **({"doubt": s["doubt"]} if s.get("doubt") else {}),
                    "relay_id": s["relay_id"][-12:]})
    return {"invocations": len(invs), "by_trigger": dict(by_trigger),
            "by_trigger_and_stop_reason": dict(sorted(by_outcome.items())),
            "successors_started": sum(1 for _, s in invs if s and s["successor_started"]),
            "successors_failed": sum(1 for _, s in invs if s and s.get("successor_failed")),
            "runs": sorted(timeline, key=lambda x: x["start_s"])}


def check_invocations(invs: list[tuple[dict, dict | None]], allowed: set[str],
                      schedule: bool = False) -> int:
    """No failed invocation, only `allowed` triggers, 0 refused writes, leases released.
    Returns the refused writes (0)."""
    for inv, s in invs:
        check(s is not None, f"relay invocation {inv['request_id']} ended {inv['status']} "
                             f"({inv.get('error_type')}): {inv.get('error', '')[:500]}")
        check(s["trigger"] in allowed, f"{s['relay_id']}: trigger {s['trigger']}, only "
                                       f"{sorted(allowed)} expected: {s}")
        check(s["released"] is True, f"{s['relay_id']}: leases not released: {s}")
        check(schedule or inv["source"] != "schedule", f"a scheduled invocation: {inv}")
    refused = sum(s["refused_writes"] for _, s in invs)
    check(refused == 0, f"{refused} refused writes: "
                        f"{[s for _, s in invs if s['refused_writes']]}")
    return refused


# ------------------------------------------------------------------ the alarms

# The alarms a healthy drain must leave out of ALARM (the relay's own metrics).
TROUBLE_ALARMS = ("OutboxStuckAlarm", "RefusedWritesAlarm", "SuccessorFailuresAlarm")


@functools.lru_cache(maxsize=1)
def template_alarms_source() -> dict:
    """template.yaml parsed once (the stuck scenario evaluates its alarms every 5 s)."""
    return alarms.load_template(TEMPLATE)


def alarm_report(relay: Emulator, invs: list[tuple[dict, dict | None]], table: str,
                 t0: float, t_end: float, params: dict | None = None,
                 require_emf: bool = True) -> dict:
    """The template's alarms (with `params`) evaluated by outbox_e2e.alarms, CloudWatch's
    M-of-N rule with each alarm's TreatMissingData, from the minute of t0 to two minutes
    after t_end: the relay's own metrics from the EMF documents in the function's log
    (every document must be valid EMF), and the AWS/Lambda metrics the emulator saw (an
    Errors, an Invocations and a ConcurrentExecutions datapoint per invocation, at its
    start).  Returns, per
    alarm, its state at the end and its transitions in seconds after t0."""
    resolved = alarms.resolve_alarms(
        template_alarms_source(), dict({"KafkaBootstrapServers": "local:9092"}, **(params or {})),
        resource_names={"OutboxTable": table, "RelayFunction": relay.name})
    with open(relay.function_log, encoding="utf-8", errors="replace") as f:
        read = alarms.read_emf(f)
    check(not read.rejected, f"EMF documents rejected: {read.rejected[:5]}")
    check(read.documents > 0 or not require_emf, "the relay wrote no EMF document")
    lambda_points = []
    for inv, s in invs:
        at = int((inv["start"] or inv["received"]) * 1000)
        dims = {"FunctionName": relay.name}
        lambda_points += [
            {"namespace": "AWS/Lambda", "metric": "Errors", "dimensions": dims,
             "timestamp": at, "value": 0 if s is not None else 1},
            {"namespace": "AWS/Lambda", "metric": "Invocations", "dimensions": dims,
             "timestamp": at, "value": 1},
            {"namespace": "AWS/Lambda", "metric": "ConcurrentExecutions", "dimensions": dims,
             "timestamp": at, "value": 1}]
    samples = read.samples + alarms.samples_from_records(lambda_points)
    start = int(t0 * 1000) - int(t0 * 1000) % 60_000
    end = int(t_end * 1000) - int(t_end * 1000) % 60_000 + 120_000
    out = {}
    for logical, alarm in sorted(resolved.items()):
        ev = alarms.evaluate(alarm, samples, start, end)
        out[logical] = {
            "final": ev.final_state,
            "transitions": [{"at_s": r3(t["time_ms"] / 1000 - t0), "to": t["to"]}
                            for t in ev.transitions]}
    return {"emf_documents": read.documents, "evaluated_until_s": r3(end / 1000 - t0),
            "alarms": out}


def first_alarm_s(report: dict, logical: str) -> float | None:
    """When `logical` first went into ALARM, seconds after the report's t0."""
    return next((t["at_s"] for t in report["alarms"][logical]["transitions"]
                 if t["to"] == "ALARM"), None)


def check_no_trouble_alarm(report: dict, what: str) -> None:
    for logical in TROUBLE_ALARMS:
        at = first_alarm_s(report, logical)
        check(at is None, f"{what}: {logical} went into ALARM {at}s after the first commit: "
                          f"{report['alarms'][logical]}")


# ------------------------------------------------------------------ main

WARM_THREADS, WARM_PER_THREAD = 8, 25


def warm_dynamodb() -> float:
    """Serves DynamoDB Local some work before a scenario (--warm): each of WARM_THREADS
    threads writes WARM_PER_THREAD transactions of 99 items of 1 KB to a table of its own,
    with a strongly consistent Query after each; then the table goes. A fresh stack's JVM
    has compiled nothing yet, and DynamoDB itself has no such warm-up. Returns the seconds
    it took."""
    table = f"warm-{uuid.uuid4().hex[:10]}"
    dynamodb.create_outbox_table(table)
    errors: list[str] = []

    def write(i: int) -> None:
        c = boto3.client("dynamodb")
        try:
            for j in range(WARM_PER_THREAD):
                c.transact_write_items(TransactItems=[
                    {"Put": {"TableName": table, "Item": {
                        "PK": {"S": f"p{i}"}, "SK": {"S": f"{j}-{k}"}, "v": {"S": "x" * 1000}}}}
                    for k in range(PER_COMMIT)])
                c.query(TableName=table, KeyConditionExpression="PK = :p", Limit=10,
                        ExpressionAttributeValues={":p": {"S": f"p{i}"}}, ConsistentRead=True)
        except Exception as e:  # reported below
            errors.append(f"writer {i}: {e!r}")

    t0 = time.time()
    threads = [threading.Thread(target=write, args=(i,)) for i in range(WARM_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.time() - t0
    boto3.client("dynamodb").delete_table(TableName=table)
    check(not errors, f"warming DynamoDB Local failed: {errors[:3]}")
    return took
