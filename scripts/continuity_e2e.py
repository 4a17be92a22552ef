#!/usr/bin/env python3
"""Continuity of the serverless relay, end to end under the Lambda emulator with the real
relay binary: what happens to a backlog larger than one invocation, to a drain while
Kafka refuses connections, and to the wake-ups of a commit when an event bus is also
configured.

  scripts/continuity_e2e.py --scenario burst|outage|bus [options]

Runs inside `scripts/stack.sh run` (DynamoDB Local, Apache Kafka, moto) with the stack's
venv python.  The pieces are those of scripts/serverless_e2e.py (imported, not copied): the
relay binary under scripts/lambda_runtime.py with the template's EventInvokeConfig
(--template: no retries, events dropped after 60 s; the emulator points the function's
AWS_ENDPOINT_URL_LAMBDA at itself, so a successor's asynchronous Invoke reaches it),
the table's KEYS_ONLY stream read by scripts/streams.py poll with the template's
mapping, and NO schedule (no tick at all: only doorbells and successors start relays).
The relay's environment is the template's (OUTBOX_MAX_RUN_TIME, OUTBOX_SHUTDOWN_MARGIN,
OUTBOX_IDLE_STOP as template.yaml resolves them with its defaults), plus the table, the
key prefix, 8 buckets, the local Kafka (KAFKA_AUTH=none) and DynamoDB; the function's
timeout is --relay-timeout (30 s by default, shorter than the template's 70 s so that a
few minutes show several runs).

A monitor thread reads, every --monitor-interval (0.2 s), the coordination partition
(one strongly consistent Query of {prefix}#COORDINATION, all pages) and each message
partition (a strongly consistent Query with Limit 1 of {prefix}#MESSAGES#{b}), and
records, per bucket, the intervals in which the bucket had a message and no unlapsed
lease named an active relay (lib/src/protocol/coordination.rs: a heartbeat without StoppedAtUtc
whose LastSeenUtc is less than the lease duration old and not more than that in the
future; a lease is unlapsed while ExpiresAtUtc is after now, both in .NET ticks).  The
"owner gap" figures: every such interval, the longest, a histogram; those before the
bucket's first owner (the wake-up of an idle fleet) apart from the later ones (handovers
between relays).  An interval's length is measured between samples, so it is known to
about one sampling period.  The idle fleet's first owner is timed more closely by a
thread that reads only the coordination partition, one read after another, until
every bucket has had an owner ("first_owner"): a claim landed after the start of the
last read that did not show it and before the end of the first that did, and a bucket's
first message between the first commit's request leaving the client and the commit's
return.

Scenarios:

burst  A burst of --messages (3000) messages of --value-bytes (1000) over --keys (64)
       keys, written by --writers (8) threads of boto3 TransactWriteItems (99 messages
       and a business item each, sequences reserved per bucket with ADD just before, as
       the library's writer does), as fast as they go (the first commit alone, the other
       threads from its return: see burst()), into a fresh table; then nothing.
       Checks: every id in Kafka (at least once), no id nobody wrote, per-key order (of
       each id's first copy), the table without message items and without owned leases,
       0 refused writes in every relay summary, no invocation other than doorbells and
       successors (no tick), every invocation answered without a function error.
       Measures: drain time (the first commit's start to the last record's publish
       timestamp in Kafka), relay invocations by trigger and by what they did,
       successors started (summary.successor_started), the owner gaps.  Checked as
       well: no owner gap, before the first owner or after it, longer than
       OWNER_GAP_BOUND_S (10 s: a doorbell's delivery plus a cold start, and a handover's
       poll interval plus a cold start, with room for a loaded two-core machine and the
       monitor's sampling period, which such a machine stretched to 3.7 s; a relay that
       dropped its buckets mid-drain, or a backlog left to a tick, shows minutes).  Then (unless
       --no-compare) the same burst into another fresh table with ONE always-on relay
       (`outboxctl relay` with the same table settings and its defaults, started and
       holding every bucket before the burst; SIGTERM once drained): its drain time, its
       owner gaps, and the ratio of the two drain times.  The goals (the longest owner
       gap after the first owner and, at most, before it <= 2 s; with the comparison,
       ratio <= 1.1) are reported under "goals"; they fail the run only with
       --enforce-goals.

outage A burst of --messages (1000) into a relay whose Kafka is the stack's broker
       through a proxy slot (OUTBOX_KAFKA_PROXY_SLOTS): a TCP proxy in this script binds
       the slot's advertised port and forwards to the broker's listener of the slot,
       which advertises the proxy's address, so every connection of the relay (and of
       this script's topic creation and read-back) goes through it; the proxy's "refuse"
       closes every open connection and closes each new one as soon as it is accepted,
       as the harness's TcpFaultProxy refuse() does; "pass" forwards again.  Once the
       monitor has seen the first message leave the table, the proxy refuses for
       --outage-seconds (60), then passes.
       With --cut-before Kafka refuses from just before the burst instead (the relays
       start with Kafka down; nothing races a fast drain), for --outage-seconds.
       Checks as for burst (at-least-once: duplicates are counted, not failed).
       Measures: the time from Kafka's return to the first message leaving the table
       after it (a publish is acknowledged before its delete; checked against the first
       publish timestamp in Kafka after the return), messages deleted during the outage
       (must be 0), relay invocations that started during the outage by trigger and per
       minute, relay runs that overlapped the outage and the bound the design states (a
       run starts at most one successor: about outage / run length chained runs per
       relay; goal_met when the invocations that ran a relay during the outage are at
       most outage / (run length - 10 s) + 1 per relay, and resume <= 60 s).

bus    WakeOn=stream with an event bus configured (EventBusName=--bus): the enqueue
       function (outbox-enqueue-function under the emulator) gets the environment the
       template gives it under WakeOn=stream,EventBusName=BUS (its NotifyOnCommit
       condition), and moto's EventBridge gets the template's CommitNotificationRule
       when the template enables it under those parameters (a rule with the template's
       pattern targeting an SQS queue that this script forwards to the relay as an
       asynchronous invocation, as EventBridge invokes a Lambda target).  --commits (5)
       enqueue calls of one message each, --spacing (10) seconds apart (longer than the
       idle stop, so that each finds no relay running).  Checks: per commit exactly one
       invocation of the relay (trigger doorbell) and no notification, every message
       in Kafka, 0 refused writes.  --notify-anyway gives the enqueue function the bus
       and creates the rule whatever the template says (the wiring before the
       condition), which must fail the check (2 wake-ups per commit).

stuck  A poison head in a quiet period: the relay allows only the scenario's topic
       (OUTBOX_ALLOWED_TOPICS); one message on another topic is committed at the head of
       a bucket, one behind it, and one healthy message in another bucket; the doorbell
       and a schedule every --tick-seconds (30) wake the relay.  Every 5 s the template's
       alarms (with StuckMessageAgeSeconds=--stuck-age, 60) are evaluated by
       scripts/alarms.py over the EMF documents of the relay's log and the invocations'
       AWS/Lambda datapoints, until OutboxStuckAlarm and PoisonItemsAlarm are both in
       ALARM.  Checks: both in ALARM within stuck age + tick + 90 s (the relay reports
       the head's age each run; an alarm is evaluated at whole minutes), the healthy
       message in Kafka, the poison and the message behind it still in the table (never
       published), every relay run stopped idle (a parked bucket is no reason to run
       on), 0 refused writes.  The burst scenario evaluates the same alarms and
       fails when OutboxStuckAlarm, PoisonItemsAlarm, PublishFailuresAlarm or
       RefusedWritesAlarm goes into ALARM during its healthy drain.

Prints one line per step, then the figures as one JSON document on stdout (after the
line "RESULT"); exits 1 naming the failed check (logs kept), 2 on usage.  Every process
it started is stopped, also on failure or SIGTERM.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid

import boto3

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, SCRIPTS)

from outbox_e2e import alarms  # noqa: E402
from outbox_e2e import cfn_template  # noqa: E402
import serverless_e2e as sls  # noqa: E402
from serverless_e2e import (  # noqa: E402
    Failed, Function, Interrupted, Proc, check, create_business_table, create_outbox_table,
    direct_write, scan, wait_file)

NAME = "continuity-e2e"
PY = sys.executable
TEMPLATE = sls.TEMPLATE
BUCKETS = sls.BUCKET_COUNT
PARTITIONS = 3
CACHE = os.environ.get("DYNAMO_OUTBOX_CACHE", os.path.expanduser("~/.cache/dynamo-outbox"))
TARGET = os.path.join(CACHE, "target", "debug")
UNIX_EPOCH_TICKS = 621355968000000000
TICKS_PER_SECOND = 10_000_000
SUCCESSOR_LEAD_S = 10.0  # lib/src/notification/successor.rs
STOP_RESERVE_S = 2.0  # relay::DEFAULT_STOP_RESERVE (docs/protocol.md constants)
OWNER_GAP_BOUND_S = 10.0  # the burst's check (module docstring); its goal is 2 s
PER_COMMIT = 99  # messages per TransactWriteItems: its 100 items, one the business write


def step(msg: str) -> None:
    print(f"[{NAME}] {msg}", file=sys.stderr, flush=True)


def now_ticks(t: float) -> int:
    return UNIX_EPOCH_TICKS + int(t * TICKS_PER_SECOND)


def r3(x):
    return None if x is None else round(x, 3)


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
    keep = ("OUTBOX_MAX_RUN_TIME", "OUTBOX_SHUTDOWN_MARGIN", "OUTBOX_IDLE_STOP")
    out = {k: str(env[k]) for k in keep if k in env}
    check(set(out) == set(keep), f"the template's relay environment lacks {set(keep) - set(out)}")
    return out


# ------------------------------------------------------------------ processes

def aws_env() -> dict:
    out = {}
    for var in ("AWS_ENDPOINT_URL_DYNAMODB", "AWS_REGION", "AWS_DEFAULT_REGION",
                "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        if os.environ.get(var):
            out[var] = os.environ[var]
    return out


def start_relay(args, workdir: str, started: list, table: str, prefix: str,
                bootstrap: str, extra_env: dict | None = None,
                extra_args: list[str] | None = None) -> tuple[Function, dict]:
    tenv = relay_template_env()
    env = dict(aws_env(), OUTBOX_TABLE_NAME=table, OUTBOX_KEY_PREFIX=prefix,
               OUTBOX_BUCKET_COUNT=str(BUCKETS), KAFKA_BOOTSTRAP_SERVERS=bootstrap,
               KAFKA_AUTH="none", **tenv, **(extra_env or {}))
    relay = Function("RelayFunction", args.relay_binary, workdir, args.relay_timeout, env, "",
                     args.relay_concurrency, 10.0,
                     extra_args=["--template", TEMPLATE, "--template-function", "RelayFunction",
                                 "--param", "KafkaBootstrapServers=local:9092",
                                 "--memory", str(args.memory),
                                 "--timed-log-file",
                                 os.path.join(workdir, "RelayFunction.timed.log"),
                                 *(["--cpu-share"] if args.cpu_share else []),
                                 *(extra_args or [])])
    started.append(relay)
    relay.wait_ready()
    return relay, tenv


def start_poller(relay: Function, table: str, prefix: str, workdir: str, started: list,
                 relay_timeout: float) -> tuple[Proc, str, str]:
    batch_log = os.path.join(workdir, "doorbell-batches.jsonl")
    ready_file = os.path.join(workdir, "poller.ready")
    stats_file = os.path.join(workdir, "poller.stats.json")
    poller = Proc("poller", [
        PY, os.path.join(SCRIPTS, "streams.py"), "poll", table, "--invoke", relay.invoke_url,
        "--template", TEMPLATE, "--function", "RelayFunction", "--param", f"KeyPrefix={prefix}",
        "--ready-file", ready_file, "--stats-file", stats_file, "--batch-log", batch_log,
        "--invoke-timeout", f"{relay_timeout + 30:g}"],
        workdir, stdout_file=os.path.join(workdir, "poller.out"))
    started.append(poller)
    wait_file(ready_file, poller, "streams.py poll")
    return poller, batch_log, stats_file


def stop_poller(poller: Proc, stats_file: str, started: list) -> dict:
    poller.stop()
    started.remove(poller)
    try:
        with open(stats_file) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise Failed(f"the poller wrote no counters ({e}):\n{poller.tail()}")


def fresh_outbox(stream: bool, bootstrap: str | None = None) -> tuple[str, str, str, str]:
    suffix = uuid.uuid4().hex[:10]
    table, business, topic = f"cont-{suffix}", f"cont-orders-{suffix}", f"cont-{suffix}"
    prefix = "SHOP"
    create_outbox_table(table)
    create_business_table(business)
    if stream:
        out = subprocess.run([PY, os.path.join(SCRIPTS, "streams.py"), "enable", table],
                             capture_output=True, text=True, timeout=60)
        check(out.returncode == 0, f"streams.py enable: {out.stderr.strip()}")
    kafka(bootstrap, "create-topic", topic, "--partitions", str(PARTITIONS))
    return table, business, topic, prefix


def kafka(bootstrap: str | None, *args: str) -> str:
    pre = ["--bootstrap", bootstrap] if bootstrap else []
    out = subprocess.run([PY, os.path.join(SCRIPTS, "kafka.py"), *pre, *args],
                         capture_output=True, text=True, timeout=180)
    check(out.returncode == 0, f"kafka.py {' '.join(args)}: {out.stderr.strip()[-2000:]}")
    return out.stdout


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


# ------------------------------------------------------------------ the monitor

def live_owners(items: list[dict], now: int, lease_ticks: int) -> tuple[set, dict]:
    """The active relays of a coordination read and the live owner of each bucket (the
    rules in the module docstring)."""
    active = set()
    for i in items:
        sk = i["SK"]["S"]
        if not sk.startswith("RELAY#") or "StoppedAtUtc" in i:
            continue
        try:
            seen = int(i["LastSeenUtc"]["N"])
        except (KeyError, ValueError):
            continue
        if seen <= now + lease_ticks and now - seen < lease_ticks:
            active.add(sk[len("RELAY#"):])
    owner = {}
    for i in items:
        sk = i["SK"]["S"]
        if not sk.startswith("LEASE#") or "Owner" not in i:
            continue
        try:
            expires = int(i["ExpiresAtUtc"]["N"])
        except (KeyError, ValueError):
            expires = 0
        b = int(sk[len("LEASE#"):])
        if b < BUCKETS and expires > now and i["Owner"]["S"] in active:
            owner[b] = i["Owner"]["S"]
    return active, owner


def first_change(reads: list[tuple[float, float, bool]]) -> tuple[float, float] | None:
    """When a condition a series of reads watched first held: after the start of the last
    read before it that did not show it, before the end of the first that did (a
    strongly consistent read sees every write completed before it started)."""
    prev_start = None
    for start, end, seen in reads:
        if seen:
            return (prev_start if prev_start is not None else start, end)
        prev_start = start
    return None


class FirstOwnerWatch(threading.Thread):
    """The idle fleet's first owner, timed to within one read (the monitor's sample is
    nine reads): reads the coordination partition, one strongly consistent read after
    another, until every bucket has had a live owner (or it is stopped).  Watching the
    buckets' heads as closely too was tried: eight more readers slowed DynamoDB Local
    (the first doorbell reached the function 1.08-1.19 s after the first commit's start
    in three 3,000 bursts, against 0.51-0.81 s in six without them) and knew a message's
    arrival no better than the first commit's own start and return do."""

    def __init__(self, monitor: "Monitor"):
        super().__init__(daemon=True)
        self.monitor = monitor
        self.reads: list[tuple[float, float, set]] = []  # (start, end, owned buckets)
        self.stop_flag = threading.Event()

    def run(self) -> None:
        seen: set = set()
        while not self.stop_flag.is_set() and len(seen) < BUCKETS:
            t0 = time.time()
            try:
                items = self.monitor.coordination()
            except Exception:  # a lost read only widens the window
                items = None
            if items is not None:
                _, owner = live_owners(items, now_ticks(t0), self.monitor.lease_ticks)
                self.reads.append((t0, time.time(), set(owner)))
                seen |= set(owner)
            self.stop_flag.wait(0.02)

    def stop(self) -> None:
        self.stop_flag.set()
        self.join(timeout=10)

    def figures(self, first_start: float, first_sent: float, first_return: float,
                first_buckets: set) -> dict:
        """Bounds of the longest time a bucket had a message and no owner before its
        first owner.  A bucket's first message became visible after the first commit's
        request left the client (botocore's before-send: serialized and signed); the
        first commit's buckets had theirs before that commit returned.  So the longest
        such time is at most (the last bucket's first claim landed, at the latest) -
        (the first commit's request sent), and at least (a first commit's bucket's
        first claim landed, at the earliest, the latest of them) - (the first commit's
        return).  Times are also given from the first commit's start (the call), the
        zero of every other figure of the run."""
        landed = {}
        for b in range(BUCKETS):
            w = first_change([(s, e, b in o) for s, e, o in self.reads])
            if w is not None:
                landed[b] = w
        if not landed:
            return {"buckets": 0, "reads": len(self.reads)}
        return {
            "buckets": len(landed), "reads": len(self.reads),
            "longest_without_owner_s": {
                "at_least": r3(max([0.0] + [lo - first_return for b, (lo, _) in landed.items()
                                            if b in first_buckets])),
                "at_most": r3(max(hi for _, hi in landed.values()) - first_sent)},
            "first_commit_buckets": sorted(first_buckets),
            "first_commit_sent_after_s": r3(first_sent - first_start),
            "first_commit_returned_after_s": r3(first_return - first_start),
            "last_first_claim_after_s": r3(max(hi for _, hi in landed.values()) - first_start),
            "claim_window_s": r3(max(hi - lo for lo, hi in landed.values())),
        }


class Monitor(threading.Thread):
    """Samples the coordination partition and the head of each message partition."""

    def __init__(self, table: str, prefix: str, lease_s: float, interval: float):
        super().__init__(daemon=True)
        self.table, self.prefix = table, prefix
        self.lease_ticks = int(lease_s * TICKS_PER_SECOND)
        self.interval = interval
        self.client = boto3.client("dynamodb")
        self.samples: list[dict] = []
        self.errors = 0
        self.stop_flag = threading.Event()

    def coordination(self) -> list[dict]:
        items, start = [], None
        while True:
            kw = dict(TableName=self.table, ConsistentRead=True,
                      KeyConditionExpression="PK = :pk",
                      ExpressionAttributeValues={":pk": {"S": f"{self.prefix}#COORDINATION"}})
            if start:
                kw["ExclusiveStartKey"] = start
            out = self.client.query(**kw)
            items += out["Items"]
            start = out.get("LastEvaluatedKey")
            if not start:
                return items

    def head(self, bucket: int) -> str | None:
        out = self.client.query(
            TableName=self.table, ConsistentRead=True, Limit=1,
            KeyConditionExpression="PK = :pk", ProjectionExpression="SK",
            ExpressionAttributeValues={":pk": {"S": f"{self.prefix}#MESSAGES#{bucket}"}})
        return out["Items"][0]["SK"]["S"] if out["Items"] else None

    def sample(self) -> dict:
        t = time.time()
        active, owner = live_owners(self.coordination(), now_ticks(t), self.lease_ticks)
        heads = [self.head(b) for b in range(BUCKETS)]
        return {"t": t, "t_end": time.time(), "owner": owner, "heads": heads,
                "active": sorted(active)}

    def run(self) -> None:
        while not self.stop_flag.is_set():
            began = time.time()
            try:
                self.samples.append(self.sample())
            except Exception:  # counted; a lost sample only lowers the resolution
                self.errors += 1
            self.stop_flag.wait(max(0.0, self.interval - (time.time() - began)))

    def stop(self) -> None:
        self.stop_flag.set()
        self.join(timeout=10)

    def latest(self) -> dict | None:
        return self.samples[-1] if self.samples else None

    def empty_since(self, after: float) -> float | None:
        """The time of the first sample of the trailing run in which every bucket was
        empty, counting only samples begun after `after` (the last commit); None when
        there is none or the latest sample saw a message."""
        when = None
        for s in reversed(list(self.samples)):
            if s["t"] <= after or any(h is not None for h in s["heads"]):
                break
            when = s["t"]
        return when

    @staticmethod
    def moved_on(a: str | None, b: str | None) -> bool:
        """A bucket's head moved on from `a` to `b` (sort keys of the same width): a
        message of it was deleted, so published.  A head that moves back is a commit that
        landed after a later one of another writer (sequences are reserved before the
        commit), not progress."""
        return a is not None and (b is None or b > a)

    def first_progress_after(self, t0: float) -> float | None:
        """The first sample after t0 at which some bucket's head moved on (a message of
        it was deleted, so published) compared with the sample before it."""
        prev = None
        for s in self.samples:
            if prev is not None and s["t"] > t0:
                for a, b in zip(prev["heads"], s["heads"]):
                    if self.moved_on(a, b):
                        return s["t"]
            prev = s
        return None

    def progress_between(self, t0: float, t1: float) -> int:
        """Samples in [t0, t1] at which a bucket's head moved on from the sample before."""
        prev, moved = None, 0
        for s in self.samples:
            if prev is not None and t0 <= prev["t"] and s["t"] <= t1:
                moved += sum(1 for a, b in zip(prev["heads"], s["heads"])
                             if self.moved_on(a, b))
            prev = s
        return moved

    def gaps(self, since: float) -> dict:
        """Per bucket, the intervals (from the sample at `since` on) with a message and no
        live owner; split into those before the bucket's first owner and the others."""
        samples = [s for s in self.samples if s["t"] >= since]
        gaps = []
        for b in range(BUCKETS):
            open_at, owned_before = None, False
            for s in samples:
                uncovered = s["heads"][b] is not None and b not in s["owner"]
                if uncovered and open_at is None:
                    open_at = (s["t"], owned_before)
                elif not uncovered and open_at is not None:
                    gaps.append({"bucket": b, "start": open_at[0], "end": s["t"],
                                 "s": s["t"] - open_at[0], "after_first_owner": open_at[1]})
                    open_at = None
                if b in s["owner"]:
                    owned_before = True
            if open_at is not None and samples:
                gaps.append({"bucket": b, "start": open_at[0], "end": samples[-1]["t"],
                             "s": samples[-1]["t"] - open_at[0],
                             "after_first_owner": open_at[1], "open_at_end": True})
        periods = [s2["t"] - s1["t"] for s1, s2 in zip(samples, samples[1:])]
        edges = [0.5, 1, 2, 5, 10, 30]

        def hist(xs):
            out = collections.OrderedDict()
            lo = 0.0
            for e in edges + [float("inf")]:
                label = f"{lo:g}-{e:g}s" if e != float("inf") else f">={lo:g}s"
                out[label] = sum(1 for x in xs if lo <= x < e)
                lo = e
            return out

        handover = [g for g in gaps if g["after_first_owner"]]
        initial = [g for g in gaps if not g["after_first_owner"]]
        top = sorted(gaps, key=lambda g: -g["s"])[:10]
        return {
            "samples": len(samples), "sample_errors": self.errors,
            "sample_period_s": {"median": r3(sorted(periods)[len(periods) // 2]) if periods
                                else None, "max": r3(max(periods)) if periods else None},
            "max_gap_s": r3(max((g["s"] for g in gaps), default=0.0)),
            "max_gap_after_first_owner_s": r3(max((g["s"] for g in handover), default=0.0)),
            "max_gap_before_first_owner_s": r3(max((g["s"] for g in initial), default=0.0)),
            "gaps": len(gaps), "gaps_after_first_owner": len(handover),
            "histogram": hist([g["s"] for g in gaps]),
            "histogram_after_first_owner": hist([g["s"] for g in handover]),
            "longest": [{"bucket": g["bucket"], "start_s": r3(g["start"] - since),
                         "s": r3(g["s"]), "after_first_owner": g["after_first_owner"],
                         **({"open_at_end": True} if g.get("open_at_end") else {})}
                        for g in top],
        }


# ------------------------------------------------------------------ Kafka and checks

def check_delivery(topic: str, sent: list[dict], bootstrap: str | None) -> dict:
    """Each id at least once, none unknown, per-key order of first copies.  Returns the
    figures, with the publish timestamps of the first and last records."""
    out = kafka(bootstrap, "read", topic, "--value-head", "16", "--timeout", "120")
    records = [json.loads(x) for x in out.splitlines() if x.strip()]
    expected = {m["message_id"]: m for m in sent}
    first_copy: dict[str, dict] = {}
    counts = collections.Counter()
    for r in records:
        mid = (sls.b64d(dict(r["headers"]).get(sls.MESSAGE_ID_HEADER)) or b"").decode()
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
        check(sls.b64d(r["key"]) == m["key"].encode(), f"{mid}: key {r['key']}")
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
    items = scan(table)
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


def wait_relay_quiet(relay: Function, batch_log: str | None, wait: float) -> None:
    """Until no relay invocation runs, no asynchronous event waits (a successor), and
    the poller's batch log has not grown for 3 s."""
    deadline = time.time() + wait
    last_size, stable_since = -1, time.time()
    while time.time() < deadline:
        st = relay.stats(10**9)
        size = os.path.getsize(batch_log) if batch_log and os.path.exists(batch_log) else 0
        if size != last_size:
            last_size, stable_since = size, time.time()
        t = st["totals"]
        queued = t["async_invocations"] - t["async_succeeded"] - t["async_dropped"]
        if t["concurrency_now"] == 0 and queued == 0 and time.time() - stable_since >= 3.0:
            return
        time.sleep(0.5)
    raise Failed(f"the relay did not go quiet within {wait:g}s")


def invocations(relay: Function) -> list[tuple[dict, dict | None]]:
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
TROUBLE_ALARMS = ("OutboxStuckAlarm", "PoisonItemsAlarm", "PublishFailuresAlarm",
                  "RefusedWritesAlarm")


@functools.lru_cache(maxsize=1)
def template_alarms_source() -> dict:
    """template.yaml parsed once (the stuck scenario evaluates its alarms every 5 s)."""
    return alarms.load_template(TEMPLATE)


def alarm_report(relay: Function, invs: list[tuple[dict, dict | None]], table: str,
                 t0: float, t_end: float, params: dict | None = None,
                 require_emf: bool = True) -> dict:
    """The template's alarms (with `params`) evaluated by scripts/alarms.py, CloudWatch's
    M-of-N rule with each alarm's TreatMissingData, from the minute of t0 to two minutes
    after t_end: the relay's own metrics from the EMF documents in the function's log
    (every document must be valid EMF), and the AWS/Lambda metrics the emulator saw (an
    Errors and an Invocations datapoint per invocation, at its start).  Returns, per
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


# ------------------------------------------------------------------ scenario: burst

def run_lambda_burst(args, workdir: str, started: list, messages: int,
                     bootstrap: str | None = None, during=None, before=None) -> dict:
    """The relay under the emulator, the poller, the monitor and a burst.  `before` is
    called just before the burst is written; `during` with (monitor, t_first_commit)
    after it, before the drain is waited for.  Returns the figures and the objects the
    caller still needs."""
    table, business, topic, prefix = fresh_outbox(stream=True, bootstrap=bootstrap)
    relay, tenv = start_relay(args, workdir, started, table, prefix,
                              bootstrap or os.environ["KAFKA_BOOTSTRAP_SERVERS"])
    poller, batch_log, poller_stats = start_poller(relay, table, prefix, workdir, started,
                                                   args.relay_timeout)
    step(f"table {table} (8 buckets, KEYS_ONLY stream), topic {topic}; RelayFunction "
         f"{args.relay_binary} under lambda_runtime.py (timeout {args.relay_timeout:g}s, "
         f"{', '.join(f'{k}={v}' for k, v in tenv.items())}, EventInvokeConfig from the "
         f"template, no schedule); streams.py poll with the template's mapping")
    monitor = Monitor(table, prefix, args.lease_seconds, args.monitor_interval)
    monitor.start()
    watch = FirstOwnerWatch(monitor)
    watch.start()
    time.sleep(1.0)
    if before:
        before()
    sent, t_first, t_last, t_first_return, t_first_sent, first_buckets = burst(
        table, business, prefix, topic, messages, args.value_bytes, args.keys, args.writers)
    step(f"burst: {len(sent)} messages of ~{args.value_bytes} B over {args.keys} keys "
         f"committed in {t_last - t_first:.1f}s by {args.writers} writers")
    extra = during(monitor, t_first) if during else {}
    drained_at = wait_drained(monitor, t_last, args.wait, "the Lambda relay")
    step(f"the table's message partitions empty {drained_at - t_first:.1f}s after the "
         f"first commit")
    wait_relay_quiet(relay, batch_log, args.relay_timeout + 60)
    monitor.stop()
    watch.stop()
    pc = stop_poller(poller, poller_stats, started)
    invs = invocations(relay)
    refused = check_invocations(invs, {"doorbell", "successor"})
    delivery = check_delivery(topic, sent, bootstrap)
    clean = check_table_clean(table, prefix)
    totals = relay.stats(10**9)["totals"]
    check(totals["async_expired"] == 0 and totals["async_exhausted"] == 0,
          f"successor events lost: {totals}")
    check(totals["schedule_ticks"] == 0, f"the emulator ticked: {totals}")
    stamps = delivery.pop("stamps")
    alarm_rep = alarm_report(relay, invs, table, t_first, time.time())
    return {
        "table": table, "topic": topic, "messages": len(sent),
        "write_s": r3(t_last - t_first),
        "drain_s": r3(delivery["last_publish"] - t_first),
        "tail_after_last_commit_s": r3(delivery["last_publish"] - t_last),
        "table_empty_after_s": r3(drained_at - t_first),
        "first_publish_after_s": r3(delivery["first_publish"] - t_first),
        "kafka": delivery, "table_after": clean, "refused_writes": refused,
        "relay": summarize_invocations(invs, t_first),
        "emulator": {k: totals[k] for k in ("invocations", "cold_starts", "errors", "timeouts",
                                            "throttles", "async_invocations", "async_succeeded",
                                            "async_throttle_retries", "async_expired",
                                            "schedule_ticks", "peak_concurrency") if k in totals},
        "poller": {k: pc[k] for k in ("batches", "records", "expired_records", "throttles",
                                      "function_errors", "dropped_records")},
        "owner_gaps": monitor.gaps(t_first),
        "first_owner": watch.figures(t_first, t_first_sent, t_first_return, first_buckets),
        "alarms": alarm_rep,
        "_monitor": monitor, "_t_first": t_first, "_stamps": stamps, "_relay": relay,
        **extra,
    }


def run_always_on(args, workdir: str, started: list) -> dict:
    # The same stream (unread), so that the writer pays for it as in the Lambda run.
    table, business, topic, prefix = fresh_outbox(stream=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")
           or k.startswith("OUTBOX_STACK_")}
    env.update(OUTBOX_TABLE_NAME=table, OUTBOX_KEY_PREFIX=prefix,
               OUTBOX_BUCKET_COUNT=str(BUCKETS), KAFKA_AUTH="none",
               KAFKA_BOOTSTRAP_SERVERS=os.environ["KAFKA_BOOTSTRAP_SERVERS"])
    relay = Proc("always-on", [args.outboxctl, "relay"], workdir, env=env,
                 stdout_file=os.path.join(workdir, "always-on.out"))
    started.append(relay)
    monitor = Monitor(table, prefix, args.lease_seconds, args.monitor_interval)
    monitor.start()
    deadline = time.time() + 60
    while True:
        s = monitor.latest()
        if s and len(s["owner"]) == BUCKETS:
            break
        check(relay.alive(), f"outboxctl relay exited:\n{relay.tail()}")
        check(time.time() < deadline, f"outboxctl relay holds {s and s['owner']} after 60s")
        time.sleep(0.2)
    step(f"always-on: `{args.outboxctl} relay` on table {table} holds all {BUCKETS} buckets")
    sent, t_first, t_last, *_ = burst(table, business, prefix, topic, args.messages,
                                   args.value_bytes, args.keys, args.writers)
    step(f"always-on: burst of {len(sent)} committed in {t_last - t_first:.1f}s")
    drained_at = wait_drained(monitor, t_last, args.wait, "the always-on relay")
    monitor.stop()
    relay.stop()
    started.remove(relay)
    with open(os.path.join(workdir, "always-on.out")) as f:
        last = f.read().strip().splitlines()
    stopped = [x for x in last if "stopped" in x and "refused writes" in x]
    check(stopped, f"outboxctl relay printed no stop line: {last[-5:]}")
    refused = int(stopped[-1].split("refused writes ")[1].split(",")[0])
    check(refused == 0, f"always-on relay: {stopped[-1]}")
    delivery = check_delivery(topic, sent, None)
    delivery.pop("stamps")
    check_table_clean(table, prefix)
    return {"table": table, "messages": len(sent), "write_s": r3(t_last - t_first),
            "drain_s": r3(delivery["last_publish"] - t_first),
            "tail_after_last_commit_s": r3(delivery["last_publish"] - t_last),
            "table_empty_after_s": r3(drained_at - t_first),
            "first_publish_after_s": r3(delivery["first_publish"] - t_first),
            "kafka": delivery, "refused_writes": refused, "stop_line": stopped[-1],
            "owner_gaps": monitor.gaps(t_first)}


def public(d: dict) -> dict:
    return {k: v for k, v in d.items() if not k.startswith("_")}


def scenario_burst(args, workdir: str, started: list) -> dict:
    if args.always_on_only:
        on = run_always_on(args, workdir, started)
        step(f"always-on: drain {on['drain_s']}s, max owner gap "
             f"{on['owner_gaps']['max_gap_s']}s")
        return {"scenario": "burst", "always_on": on}
    lam = run_lambda_burst(args, workdir, started, args.messages)
    relay = lam["_relay"]
    relay.stop()
    started.remove(relay)
    check_no_trouble_alarm(lam["alarms"], "a healthy drain")
    g = lam["owner_gaps"]
    fo = lam["first_owner"].get("longest_without_owner_s", {})
    check(g["max_gap_s"] <= OWNER_GAP_BOUND_S,
          f"a bucket had a message and no live owner for {g['max_gap_s']}s "
          f"({g['max_gap_after_first_owner_s']}s after its first owner), more than the "
          f"{OWNER_GAP_BOUND_S}s bound: {g['longest'][:3]}")
    step(f"lambda: drain {lam['drain_s']}s, invocations {lam['relay']['by_trigger']}, "
         f"successors started {lam['relay']['successors_started']}, max owner gap "
         f"{g['max_gap_s']}s ({g['max_gap_after_first_owner_s']}s after the first owner); "
         f"before its first owner a bucket had a message and no owner for "
         f"{fo.get('at_least')}-{fo.get('at_most')}s")
    result = {"scenario": "burst", "relay_timeout_s": args.relay_timeout,
              "relay_env": relay_template_env(), "lambda": public(lam),
              "goals": {
                  "max_owner_gap_after_first_owner_le_2s":
                      g["max_gap_after_first_owner_s"] <= 2.0,
                  "max_owner_gap_before_first_owner_le_2s":
                      fo.get("at_most") is not None and fo["at_most"] <= 2.0}}
    if not args.no_compare:
        on = run_always_on(args, workdir, started)
        step(f"always-on: drain {on['drain_s']}s, max owner gap "
             f"{on['owner_gaps']['max_gap_s']}s")
        ratio = lam["drain_s"] / on["drain_s"]
        result["always_on"] = on
        result["drain_ratio"] = r3(ratio)
        result["goals"]["drain_ratio_le_1.1"] = ratio <= 1.1
    return result


# ------------------------------------------------------------------ scenario: outage

class FaultProxy:
    """A TCP proxy on 127.0.0.1 that passes or refuses (closes every open connection, and
    each new one as soon as it is accepted)."""

    def __init__(self, listener: socket.socket):
        self.listener = listener
        self.port = self.listener.getsockname()[1]
        self.upstream: tuple[str, int] | None = None
        self.refusing = False
        self.lock = threading.Lock()
        self.conns: list[socket.socket] = []
        self.stats = collections.Counter()
        self.closed = False

    def start(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        threading.Thread(target=self.accept_loop, daemon=True).start()

    def accept_loop(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                if self.refusing:
                    self.stats["refused_connections"] += 1
                    client.close()
                    continue
                self.stats["connections"] += 1
            try:
                up = socket.create_connection(self.upstream, timeout=5)
                up.settimeout(None)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.conns += [client, up]
            for a, b in ((client, up), (up, client)):
                threading.Thread(target=self.pump, args=(a, b), daemon=True).start()

    def pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        with self.lock:
            self.conns = [c for c in self.conns if c not in (src, dst)]

    def refuse(self) -> None:
        with self.lock:
            self.refusing = True
            conns, self.conns = self.conns, []
            self.stats["cut_connections"] += len(conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()

    def pass_(self) -> None:
        with self.lock:
            self.refusing = False

    def close(self) -> None:
        self.closed = True
        self.refuse()
        try:  # wakes the accept loop: a socket closed under a blocked accept stays bound
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()


def take_proxy_slot(wait: float = 120.0) -> tuple[socket.socket, tuple[str, int]]:
    """A proxy slot of the stack's broker (OUTBOX_KAFKA_PROXY_SLOTS, "UPSTREAM:ADVERTISED
    ..."): a listening socket on the first ADVERTISED port that binds, and the broker's
    listener of that slot (UPSTREAM).  The slot is this process's while the socket stays
    bound; when every slot is held (other tests' proxies), waits up to `wait` seconds."""
    text = os.environ.get("OUTBOX_KAFKA_PROXY_SLOTS", "")
    slots = []
    for pair in text.split():
        upstream, sep, advertised = pair.partition(":")
        check(sep and upstream.isdigit() and advertised.isdigit(),
              f"OUTBOX_KAFKA_PROXY_SLOTS: {pair!r} is not UPSTREAM:ADVERTISED")
        slots.append((int(upstream), int(advertised)))
    check(slots, "OUTBOX_KAFKA_PROXY_SLOTS is not set: run inside scripts/stack.sh run")
    deadline = time.time() + wait
    while True:
        for upstream, advertised in slots:
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", advertised))
                s.listen(64)
            except OSError:
                s.close()
                continue
            return s, ("127.0.0.1", upstream)
        check(time.time() < deadline, f"every Kafka proxy slot of the stack ({len(slots)}) "
                                      f"stayed bound for {wait:g}s")
        time.sleep(0.2)


class SlotKafka:
    """The stack's broker behind this script's FaultProxy, on a proxy slot: the broker
    advertises the slot's port, where the proxy listens, so a client bootstrapped there
    reaches the broker only through the proxy (as harness/src/broker.rs's proxied broker
    does with testkit's ProxySlot)."""

    name = "kafka-proxy-slot"

    def __init__(self):
        listener, upstream = take_proxy_slot()
        self.proxy = FaultProxy(listener)
        self.proxy.start(upstream)
        self.upstream = f"{upstream[0]}:{upstream[1]}"
        self.bootstrap = f"127.0.0.1:{self.proxy.port}"
        try:
            kafka(self.bootstrap, "ping", "--timeout", "30")
        except Failed:
            self.stop()
            raise

    def tail(self, n: int = 30) -> str:
        return f"proxy {self.bootstrap} -> {self.upstream}: {dict(self.proxy.stats)}"

    def stop(self) -> None:
        self.proxy.close()


def scenario_outage(args, workdir: str, started: list) -> dict:
    broker = SlotKafka()
    started.append(broker)
    step(f"the stack's broker through a proxy slot: the proxy on {broker.bootstrap}, the "
         f"broker's listener {broker.upstream}")
    marks: dict = {}

    def cut() -> None:
        marks["refuse"] = time.time()
        broker.proxy.refuse()
        step(f"Kafka refusing before the burst, for {args.outage_seconds:g}s")

    def during(monitor: Monitor, t_first: float) -> dict:
        if args.cut_before:
            time.sleep(max(0.0, marks["refuse"] + args.outage_seconds - time.time()))
            marks["pass"] = time.time()
            broker.proxy.pass_()
            step("Kafka back")
            return {}
        deadline = time.time() + 120
        while monitor.first_progress_after(t_first) is None:
            check(time.time() < deadline, "no message left the table in 120s")
            time.sleep(0.05)
        marks["refuse"] = time.time()
        broker.proxy.refuse()
        s = monitor.latest()
        check(s and any(h is not None for h in s["heads"]),
              "the burst drained before Kafka could be cut: raise --messages")
        step(f"Kafka refusing from {marks['refuse'] - t_first:.1f}s after the first commit, "
             f"for {args.outage_seconds:g}s")
        time.sleep(args.outage_seconds)
        marks["pass"] = time.time()
        broker.proxy.pass_()
        step("Kafka back")
        return {}

    lam = run_lambda_burst(args, workdir, started, args.messages, bootstrap=broker.bootstrap,
                           during=during, before=cut if args.cut_before else None)
    monitor, t_first, stamps = lam["_monitor"], lam["_t_first"], lam["_stamps"]
    refuse, back = marks["refuse"], marks["pass"]
    # Nothing can be deleted while Kafka refuses (a delete follows an acknowledged publish);
    # a batch acknowledged just before the cut may be deleted within a second of it.
    moved = monitor.progress_between(refuse + 1.0, back)
    check(moved == 0, f"{moved} bucket heads moved while Kafka refused")
    resumed = monitor.first_progress_after(back)
    check(resumed is not None, "no message left the table after Kafka came back")
    after = [t for t in stamps if t >= back]
    # A record's timestamp is set when the relay produces it; one produced while Kafka
    # refused can still land once it is back (the client's own retry): counted, not failed.
    during_out = [t for t in stamps if refuse + 1.0 < t < back]
    relay = lam["_relay"]
    invs = invocations(relay)
    relay.stop()
    started.remove(relay)
    outage_min = (back - refuse) / 60
    started_during = [(inv, s) for inv, s in invs
                      if refuse <= (inv["start"] or inv["received"]) < back]
    by_trigger = collections.Counter(s["trigger"] for _, s in started_during)
    ran_during = [(inv, s) for inv, s in started_during
                  if s["stop_reason"] not in ("covered", "empty", "not_this_outbox")]
    overlapping = [(inv, s) for inv, s in invs
                   if s["stop_reason"] not in ("covered", "empty", "not_this_outbox")
                   and (inv["start"] or 0) < back and (inv["end"] or 0) > refuse]
    run_s = args.relay_timeout - 3.0 - STOP_RESERVE_S
    bound = (back - refuse) / max(1.0, run_s - SUCCESSOR_LEAD_S) + 1
    result = {
        "scenario": "outage", "relay_timeout_s": args.relay_timeout,
        "relay_env": relay_template_env(), "outage_s": r3(back - refuse),
        "outage_started_after_first_commit_s": r3(refuse - t_first),
        "resume_s": r3(resumed - back),
        "first_publish_stamp_after_return_s": r3(min(after) - back) if after else None,
        "records_stamped_during_outage": len(during_out),
        "invocations_started_during_outage": len(started_during),
        "invocations_started_during_outage_by_trigger": dict(by_trigger),
        "relay_runs_started_during_outage": len(ran_during),
        "relay_runs_per_minute_during_outage": r3(len(ran_during) / outage_min),
        "invocations_per_minute_during_outage": r3(len(started_during) / outage_min),
        "relay_runs_overlapping_outage": len(overlapping),
        "bound_runs_started_during_outage": r3(bound),
        "proxy": dict(broker.proxy.stats),
        "lambda": public(lam),
        "goals": {"resume_le_60s": resumed - back <= 60.0,
                  "runs_during_outage_within_bound": len(ran_during) <= bound},
    }
    return result


# ------------------------------------------------------------------ scenario: stuck

def scenario_stuck(args, workdir: str, started: list) -> dict:
    params = {"StuckMessageAgeSeconds": f"{args.stuck_age:g}"}
    table, business, topic, prefix = fresh_outbox(stream=True)
    relay, tenv = start_relay(
        args, workdir, started, table, prefix, os.environ["KAFKA_BOOTSTRAP_SERVERS"],
        extra_env={"OUTBOX_ALLOWED_TOPICS": topic},
        extra_args=["--schedule", f"{args.tick_seconds:g}",
                    "--schedule-payload", json.dumps(sls.SCHEDULE_PAYLOAD)])
    poller, batch_log, poller_stats = start_poller(relay, table, prefix, workdir, started,
                                                   args.relay_timeout)
    step(f"table {table}, topic {topic} (the relay's only allowed topic); RelayFunction "
         f"under lambda_runtime.py with the doorbell and a schedule every "
         f"{args.tick_seconds:g}s; StuckMessageAgeSeconds={args.stuck_age:g}")
    stuck_key, other_key = "customer-stuck", "customer-other"
    check(sls.bucket_of(stuck_key.encode()) != sls.bucket_of(other_key.encode()),
          "the two keys share a bucket")
    t_first = time.time()
    poison = direct_write(table, business, prefix, f"{topic}-not-allowed",
                          [{"key": stuck_key, "value": "poison", "headers": [], "n": 0}],
                          order_id="poison")[0]
    behind = direct_write(table, business, prefix, topic,
                          [{"key": stuck_key, "value": "behind", "headers": [], "n": 1}],
                          order_id="behind")[0]
    healthy = direct_write(table, business, prefix, topic,
                           [{"key": other_key, "value": "healthy", "headers": [], "n": 0}],
                           order_id="healthy")[0]
    step(f"bucket {poison['bucket']}: a message on a topic outside the allow-list, one "
         f"behind it; bucket {healthy['bucket']}: one healthy message")
    bound = args.stuck_age + args.tick_seconds + 90.0
    report = None
    while True:
        time.sleep(5.0)
        now = time.time()
        report = alarm_report(relay, invocations(relay), table, t_first, now, params,
                              require_emf=False)
        stuck_at = first_alarm_s(report, "OutboxStuckAlarm")
        poison_at = first_alarm_s(report, "PoisonItemsAlarm")
        if stuck_at is not None and poison_at is not None:
            break
        check(now - t_first < bound + 60,
              f"OutboxStuckAlarm/PoisonItemsAlarm not in ALARM {now - t_first:.0f}s after the "
              f"poison commit: {report['alarms']}")
    step(f"PoisonItemsAlarm in ALARM {poison_at}s after the poison commit, OutboxStuckAlarm "
         f"{stuck_at}s after it")
    wait_relay_quiet(relay, batch_log, args.relay_timeout + 60)
    pc = stop_poller(poller, poller_stats, started)
    invs = invocations(relay)
    refused = check_invocations(invs, {"doorbell", "direct"}, schedule=True)
    runs = [s for _, s in invs if s["stop_reason"] not in ("covered", "empty", "not_this_outbox")]
    check(runs and all(s["stop_reason"] == "idle" for s in runs),
          f"a bucket parked behind its poison head kept a run going: "
          f"{[(s['trigger'], s['stop_reason']) for s in runs]}")
    delivery = check_delivery(topic, [healthy], None)
    delivery.pop("stamps")
    heads = scan(table)
    left = sorted(i["MessageId"]["S"] for i in heads
                  if i["PK"]["S"].startswith(f"{prefix}#MESSAGES#"))
    check(left == sorted([poison["message_id"], behind["message_id"]]),
          f"the table should keep the poison and the message behind it, has {left}")
    relay.stop()
    started.remove(relay)
    return {
        "scenario": "stuck", "relay_timeout_s": args.relay_timeout,
        "relay_env": relay_template_env(), "params": params,
        "tick_s": args.tick_seconds,
        "poison_alarm_s": poison_at, "stuck_alarm_s": stuck_at,
        "stuck_alarm_bound_s": bound,
        "alarms": report, "relay": summarize_invocations(invs, t_first),
        "poller": {k: pc[k] for k in ("batches", "records", "expired_records")},
        "kafka": delivery, "refused_writes": refused,
        "goals": {"stuck_alarm_within_bound": stuck_at <= bound},
    }


# ------------------------------------------------------------------ scenario: bus

def forward_notifications(queue_url: str, relay: Function, stop: threading.Event,
                          counter: collections.Counter) -> None:
    """EventBridge's Lambda target: each event the rule matched, as an asynchronous
    invocation of the relay."""
    sqs = boto3.client("sqs")
    while not stop.is_set():
        out = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10,
                                  WaitTimeSeconds=1)
        for m in out.get("Messages", []):
            req = urllib.request.Request(relay.invoke_url, data=m["Body"].encode(),
                                         method="POST",
                                         headers={"X-Amz-Invocation-Type": "Event"})
            with urllib.request.urlopen(req, timeout=10) as r:
                check(r.status == 202, f"async invoke answered {r.status}")
            counter["forwarded"] += 1
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=m["ReceiptHandle"])


def scenario_bus(args, workdir: str, started: list) -> dict:
    check(os.environ.get("AWS_ENDPOINT_URL_EVENTBRIDGE"), "no moto endpoint: run inside "
                                                           "scripts/stack.sh run")
    params = {"WakeOn": "stream", "EventBusName": args.bus}
    tpl = template(params)
    enq_props = tpl.resources["EnqueueFunction"]["Properties"]
    enq_tpl_env = {k: str(v) for k, v in
                   tpl.resolve(enq_props.get("Environment", {}).get("Variables", {})).items()}
    rule_res = tpl.resources["CommitNotificationRule"]
    rule_enabled = tpl._enabled(rule_res)
    rule_pattern = tpl.resolve(rule_res["Properties"]["EventPattern"])
    if args.notify_anyway:
        enq_tpl_env["OUTBOX_NOTIFY_EVENT_BUS"] = args.bus
        rule_enabled = True
    table, business, topic, prefix = fresh_outbox(stream=True)
    relay, tenv = start_relay(args, workdir, started, table, prefix,
                              os.environ["KAFKA_BOOTSTRAP_SERVERS"])
    poller, batch_log, poller_stats = start_poller(relay, table, prefix, workdir, started,
                                                   args.relay_timeout)
    enq_env = dict(aws_env(), OUTBOX_TABLE_NAME=table, OUTBOX_KEY_PREFIX=prefix,
                   OUTBOX_BUCKET_COUNT=str(BUCKETS), **enq_tpl_env)
    for var in ("AWS_ENDPOINT_URL_EVENTBRIDGE",):
        enq_env[var] = os.environ[var]
    enqueue = Function("EnqueueFunction", args.enqueue_binary, workdir, sls.ENQUEUE_TIMEOUT_S,
                       enq_env, "", 10, 10.0)
    started.append(enqueue)
    enqueue.wait_ready()
    ev = boto3.client("events")
    try:
        ev.create_event_bus(Name=args.bus)
    except ev.exceptions.ResourceAlreadyExistsException:
        pass
    stop_fwd = threading.Event()
    fwd = collections.Counter()
    fwd_thread = None
    if rule_enabled:
        sqs = boto3.client("sqs")
        name = f"cont-rule-{uuid.uuid4().hex[:10]}"
        url = sqs.create_queue(QueueName=name)["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])[
            "Attributes"]["QueueArn"]
        pattern = dict(rule_pattern)
        pattern["detail"] = {"table": [table], "key_prefix": [prefix]}
        ev.put_rule(Name=name, EventBusName=args.bus, EventPattern=json.dumps(pattern))
        ev.put_targets(Rule=name, EventBusName=args.bus, Targets=[{"Id": "relay", "Arn": arn}])
        fwd_thread = threading.Thread(target=forward_notifications,
                                      args=(url, relay, stop_fwd, fwd), daemon=True)
        fwd_thread.start()
    step(f"WakeOn=stream, EventBusName={args.bus}: the enqueue function's template "
         f"environment {enq_tpl_env or '{}'}, CommitNotificationRule "
         f"{'enabled' if rule_enabled else 'not created'}"
         f"{' (forced by --notify-anyway)' if args.notify_anyway else ''}")
    commits, sent = [], []
    for i in range(args.commits):
        msg = {"key": f"customer-{i}", "value": f"order-{i}", "n": i, "headers": []}
        t = time.time()
        status, ferr, body = enqueue.invoke(
            {"messages": [{"topic": topic, "key": msg["key"], "value": msg["value"]}]},
            timeout=60)
        check(status == 200 and not ferr, f"enqueue: HTTP {status} {ferr} {body[:300]!r}")
        msg["message_id"] = json.loads(body)["messages"][0]["message_id"]
        sent.append(msg)
        commits.append(t)
        time.sleep(args.spacing)
    wait_relay_quiet(relay, batch_log, args.relay_timeout + 60)
    stop_fwd.set()
    if fwd_thread:
        fwd_thread.join(timeout=5)
    pc = stop_poller(poller, poller_stats, started)
    invs = invocations(relay)
    check_invocations(invs, {"doorbell", "notification"})
    per_commit = []
    bounds = commits + [float("inf")]
    for i, t in enumerate(commits):
        got = [s["trigger"] for inv, s in invs if t <= inv["received"] < bounds[i + 1]]
        per_commit.append(dict(collections.Counter(got)))
    delivery = check_delivery(topic, sent, None)
    delivery.pop("stamps")
    check_table_clean(table, prefix)
    result = {"scenario": "bus", "params": params, "notify_anyway": args.notify_anyway,
              "enqueue_env_from_template": enq_tpl_env, "rule_created": rule_enabled,
              "commits": args.commits, "spacing_s": args.spacing,
              "wakeups_per_commit": per_commit, "notifications_forwarded": fwd["forwarded"],
              "relay": summarize_invocations(invs, commits[0]), "kafka": delivery,
              "poller": {k: pc[k] for k in ("batches", "records")}}
    for i, c in enumerate(per_commit):
        check(c == {"doorbell": 1}, f"commit {i}: wake-ups {c}, one doorbell expected "
                                    f"(all: {per_commit})")
    return result


# ------------------------------------------------------------------ main

WARM_THREADS, WARM_PER_THREAD = 8, 25


def warm_dynamodb() -> float:
    """Serves DynamoDB Local some work before a scenario (--warm): each of WARM_THREADS
    threads writes WARM_PER_THREAD transactions of 99 items of 1 KB to a table of its own,
    with a strongly consistent Query after each; then the table goes. A fresh stack's JVM
    has compiled nothing yet, and DynamoDB itself has no such warm-up. Returns the seconds
    it took."""
    table = f"warm-{uuid.uuid4().hex[:10]}"
    create_outbox_table(table)
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="See the module docstring for what each scenario checks.")
    p.add_argument("--scenario", choices=["burst", "outage", "bus", "stuck"], required=True)
    p.add_argument("--relay-binary", default=os.path.join(TARGET, "outbox-relay-function"))
    p.add_argument("--enqueue-binary", default=os.path.join(TARGET, "outbox-enqueue-function"))
    p.add_argument("--outboxctl", default=os.path.join(TARGET, "outboxctl"))
    p.add_argument("--warm", action="store_true",
                   help=f"serve DynamoDB Local {WARM_THREADS * WARM_PER_THREAD} "
                   "transactions of 99 items before the scenario (its JVM is cold in a "
                   "fresh stack; DynamoDB has no warm-up)")
    p.add_argument("--relay-timeout", type=float, default=30.0,
                   help="the relay function's timeout, seconds (default 30; the template's "
                        "RelayTimeout is 70)")
    p.add_argument("--memory", type=int, default=sls.MEMORY_MB,
                   help=f"the relay's memory, MB (default {sls.MEMORY_MB}; the template's "
                   "RelayMemorySize is 128)")
    p.add_argument("--cpu-share", action="store_true",
                   help="the relay gets --memory/1769 of one CPU, as on Lambda "
                   "(lambda_runtime.py --cpu-share)")
    p.add_argument("--relay-concurrency", type=int, default=5,
                   help="the emulator's ceiling on relay environments (default 5)")
    p.add_argument("--messages", type=int, help="burst size (burst 3000, outage 1000)")
    p.add_argument("--value-bytes", type=int, default=1000)
    p.add_argument("--keys", type=int, default=64)
    p.add_argument("--writers", type=int, default=8)
    p.add_argument("--lease-seconds", type=float, default=30.0,
                   help="the relays' lease duration (the library's default, 30)")
    p.add_argument("--monitor-interval", type=float, default=0.2)
    p.add_argument("--wait", type=float, default=900.0, help="longest drain, seconds")
    p.add_argument("--no-compare", action="store_true",
                   help="burst: skip the always-on comparison")
    p.add_argument("--always-on-only", action="store_true",
                   help="burst: only the always-on run (for a comparison in a fresh stack: "
                        "DynamoDB Local slows down after a large burst's deletes)")
    p.add_argument("--outage-seconds", type=float, default=60.0)
    p.add_argument("--cut-before", action="store_true",
                   help="outage: Kafka refuses from just before the burst (deterministic: "
                        "no race with a fast drain), not from the first message published")
    p.add_argument("--stuck-age", type=float, default=60.0,
                   help="stuck: the StuckMessageAgeSeconds parameter (default 60; the "
                        "template's is 300)")
    p.add_argument("--tick-seconds", type=float, default=30.0,
                   help="stuck: the schedule's period (default 30; the template's is 300)")
    p.add_argument("--bus", default="default", help="bus: the EventBusName parameter")
    p.add_argument("--commits", type=int, default=5)
    p.add_argument("--spacing", type=float, default=10.0)
    p.add_argument("--notify-anyway", action="store_true",
                   help="bus: wire the bus whatever the template says (must fail)")
    p.add_argument("--enforce-goals", action="store_true",
                   help="exit 1 when a goal (not a correctness check) is missed")
    p.add_argument("--keep", action="store_true",
                   help="keep the work directory (the relay's log with each line's arrival "
                   "time is RelayFunction.timed.log there)")
    args = p.parse_args()
    if args.messages is None:
        args.messages = 1000 if args.scenario == "outage" else 3000
    need = [args.relay_binary] + ([args.enqueue_binary] if args.scenario == "bus" else []) + \
        ([args.outboxctl] if args.scenario == "burst" and not args.no_compare else [])
    for b in need:
        if not os.access(b, os.X_OK):
            p.error(f"no executable {b}")
    sls.require_stack(p)
    sls.interrupt_on_signals()
    workdir = tempfile.mkdtemp(prefix="outbox-continuity-e2e.")
    started: list = []
    ok = False
    t0 = time.time()
    if args.warm:
        took = warm_dynamodb()
        step(f"DynamoDB Local warmed: {WARM_THREADS * WARM_PER_THREAD} transactions of 99 "
             f"items in {took:.1f}s")
    try:
        fn = {"burst": scenario_burst, "outage": scenario_outage, "bus": scenario_bus,
              "stuck": scenario_stuck}
        result = fn[args.scenario](args, workdir, started)
        result["wall_s"] = r3(time.time() - t0)
        result["command"] = " ".join(sys.argv)
        print("RESULT")
        print(json.dumps(result, indent=1, default=str))
        missed = [k for k, v in result.get("goals", {}).items() if not v]
        step(f"ok in {time.time() - t0:.0f}s; goals missed: {missed or 'none'}")
        ok = True
        if missed and args.enforce_goals:
            step(f"FAILED: goals missed (--enforce-goals): {missed}")
            return 1
        return 0
    except (Failed, Interrupted) as e:
        kind = "interrupted" if isinstance(e, Interrupted) else "FAILED"
        step(f"{kind}: {e}")
        for thing in started:
            tail = thing.function_tail() if isinstance(thing, Function) else thing.tail()
            if tail:
                step(f"---- last lines of {thing.name} ----\n{tail}")
        return 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for thing in reversed(started):
            try:
                thing.stop()
            except Exception as e:  # keep stopping the others
                step(f"stopping {getattr(thing, 'name', thing)}: {e}")
        if ok and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            step(f"logs kept in {workdir}")


if __name__ == "__main__":
    sys.exit(main())
