"""The scenarios (the package docstring): burst (with the always-on comparison), outage,
stuck, bus.  Each takes the options, a work directory and the registry of what it starts
(stopped by the caller), and returns its figures."""

from __future__ import annotations

import collections
import json
import os
import threading
import time
import urllib.request
import uuid

import boto3

from .. import dynamodb
from ..emulator import Emulator
from ..items import BUCKET_COUNT as BUCKETS
from ..items import bucket_of, direct_write
from ..procs import Proc, Stopper
from ..report import check, step
from ..serverless import ENQUEUE_TIMEOUT_S, SCHEDULE_PAYLOAD
from ..stack import aws_env
from .fault_proxy import SlotKafka
from .monitor import FirstOwnerWatch, Monitor, r3
from .rig import (NullFunction, alarm_report, burst, check_delivery, check_invocations,
                  check_no_trouble_alarm, check_table_clean, first_alarm_s, fresh_outbox,
                  invocations, relay_template_env, start_poller, start_relay, stop_poller,
                  summarize_invocations, template, wait_drained, wait_relay_quiet)

SUCCESSOR_LEAD_S = 10.0  # lib/src/notification/successor.rs
STOP_RESERVE_S = 2.0  # relay::DEFAULT_STOP_RESERVE (docs/protocol.md constants)
OWNER_GAP_BOUND_S = 10.0  # the burst's check (the package docstring); its goal is 2 s
WAKE_BOUND_S = 6.0  # a commit wakes a relay: the first owner's bound (docs/design.md)


def run_lambda_burst(args, workdir: str, started: list, messages: int,
                     bootstrap: str | None = None, during=None, before=None) -> dict:
    """The relay under the emulator, the poller, the monitor and a burst.  `before` is
    called just before the burst is written; `during` with (monitor, t_first_commit)
    after it, before the drain is waited for.  Returns the figures and the objects the
    caller still needs."""
    table, business, topic, prefix = fresh_outbox(stream=True, bootstrap=bootstrap)
    relay, tenv = start_relay(args, workdir, started, table, prefix,
                              bootstrap or os.environ["KAFKA_BOOTSTRAP_SERVERS"])
    poller = start_poller(relay, table, prefix, workdir, started, args.relay_timeout,
                          args.shards)
    step(f"table {table} (8 buckets, KEYS_ONLY stream), topic {topic}; RelayFunction "
         f"{args.relay_binary} under lambda_runtime.py (timeout {args.relay_timeout:g}s, "
         f"{', '.join(f'{k}={v}' for k, v in tenv.items())}, EventInvokeConfig from the "
         f"template, no schedule); streams.py poll with the template's mapping")
    monitor = Monitor(table, prefix, args.lease_seconds, args.monitor_interval)
    monitor.start()
    started.append(Stopper("the monitor", monitor.stop))
    watch = FirstOwnerWatch(monitor)
    watch.start()
    started.append(Stopper("the first owner's watch", watch.stop))
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
    wait_relay_quiet(relay, poller, args.relay_timeout + 60)
    monitor.stop()
    watch.stop()
    pc = stop_poller(poller, started)
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
    # The same stream, read by the same mapping model into a function that does nothing,
    # so that the writers share DynamoDB Local with the same reader as in the Lambda run
    # (on AWS a stream's reader does not slow the table's writes; here it shares the
    # machine).
    table, business, topic, prefix = fresh_outbox(stream=True)
    null = NullFunction()
    started.append(Stopper("the null function", null.stop))
    reader = start_poller(null, table, prefix, workdir, started, args.relay_timeout,
                          args.shards)
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
    started.append(Stopper("the always-on monitor", monitor.stop))
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
    reader_counters = stop_poller(reader, started)
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
            "owner_gaps": monitor.gaps(t_first),
            "stream_reader": {k: reader_counters.get(k) for k in ("batches", "records")}}


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
    # A commit wakes a relay within a few seconds: the idle fleet's first owner came no
    # later than WAKE_BOUND_S after a bucket had its first message (measured 1.8-4.5 s).
    check(fo.get("at_most") is not None and fo["at_most"] <= WAKE_BOUND_S,
          f"the idle fleet's first owner took up to {fo.get('at_most')}s after a bucket's "
          f"first message, more than the {WAKE_BOUND_S}s bound: {lam['first_owner']}")
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


def scenario_stuck(args, workdir: str, started: list) -> dict:
    params = {"StuckMessageAgeSeconds": f"{args.stuck_age:g}"}
    table, business, topic, prefix = fresh_outbox(stream=True)
    relay, tenv = start_relay(
        args, workdir, started, table, prefix, os.environ["KAFKA_BOOTSTRAP_SERVERS"],
        extra_env={"OUTBOX_ALLOWED_TOPICS": topic},
        extra_args=["--schedule", f"{args.tick_seconds:g}",
                    "--schedule-payload", json.dumps(SCHEDULE_PAYLOAD)])
    poller = start_poller(relay, table, prefix, workdir, started, args.relay_timeout,
                          args.shards)
    step(f"table {table}, topic {topic} (the relay's only allowed topic); RelayFunction "
         f"under lambda_runtime.py with the doorbell and a schedule every "
         f"{args.tick_seconds:g}s; StuckMessageAgeSeconds={args.stuck_age:g}")
    stuck_key, other_key = "customer-stuck", "customer-other"
    check(bucket_of(stuck_key.encode()) != bucket_of(other_key.encode()),
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
        if stuck_at is not None:
            break
        check(now - t_first < bound + 60,
              f"OutboxStuckAlarm not in ALARM {now - t_first:.0f}s after the "
              f"poison commit: {report['alarms']}")
    step(f"OutboxStuckAlarm in ALARM {stuck_at}s after the poison commit")
    wait_relay_quiet(relay, poller, args.relay_timeout + 60)
    pc = stop_poller(poller, started)
    invs = invocations(relay)
    refused = check_invocations(invs, {"doorbell", "direct"}, schedule=True)
    runs = [s for _, s in invs if s["stop_reason"] not in ("covered", "empty", "not_this_outbox")]
    check(runs and all(s["stop_reason"] == "idle" for s in runs),
          f"a bucket parked behind its poison head kept a run going: "
          f"{[(s['trigger'], s['stop_reason']) for s in runs]}")
    delivery = check_delivery(topic, [healthy], None)
    delivery.pop("stamps")
    heads = dynamodb.scan(table)
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
        "stuck_alarm_s": stuck_at,
        "stuck_alarm_bound_s": bound,
        "alarms": report, "relay": summarize_invocations(invs, t_first),
        "poller": {k: pc[k] for k in ("batches", "records", "expired_records")},
        "kafka": delivery, "refused_writes": refused,
        "goals": {"stuck_alarm_within_bound": stuck_at <= bound},
    }


# ------------------------------------------------------------------ scenario: bus

def forward_notifications(queue_url: str, relay: Emulator, stop: threading.Event,
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
    poller = start_poller(relay, table, prefix, workdir, started, args.relay_timeout,
                          args.shards)
    enq_env = dict(aws_env(), OUTBOX_TABLE_NAME=table, OUTBOX_KEY_PREFIX=prefix,
                   OUTBOX_BUCKET_COUNT=str(BUCKETS), **enq_tpl_env)
    for var in ("AWS_ENDPOINT_URL_EVENTBRIDGE",):
        enq_env[var] = os.environ[var]
    enqueue = Emulator.function("EnqueueFunction", args.enqueue_binary, workdir,
                                ENQUEUE_TIMEOUT_S, enq_env, max_concurrency=10, init_timeout=10.0)
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
        started.append(Stopper("the notification forwarder", stop_fwd.set))
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
    wait_relay_quiet(relay, poller, args.relay_timeout + 60)
    stop_fwd.set()
    if fwd_thread:
        fwd_thread.join(timeout=5)
    pc = stop_poller(poller, started)
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


SCENARIOS = {"burst": scenario_burst, "outage": scenario_outage, "stuck": scenario_stuck,
             "bus": scenario_bus}
