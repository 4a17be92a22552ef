"""The CloudWatch alarm evaluator (scripts/outbox_e2e/alarms/): CloudWatch's M-of-N and
missing-data rules against every row of AWS's tables, statistics, EMF, the template's
alarms over synthetic series, and the command line.  No network; reads the repository's
template.yaml."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from outbox_e2e import alarms as A
from outbox_e2e.paths import ROOT, TEMPLATE, script

TOPIC = "arn:aws:sns:us-east-1:123456789012:outbox-alarms"
T0 = 1_764_500_000_000 - 1_764_500_000_000 % 60_000  # a whole minute
MIN = 60_000


def eq(actual, expected, what=""):
    assert actual == expected, f"{what}: expected {expected!r}, got {actual!r}"


def points(text):
    """'0 - X' -> [False, None, True] (the AWS tables' notation, oldest first)."""
    return [{"0": False, "X": True, "-": None}[c] for c in text.split()]


# AWS's tables ("Configuring how CloudWatch alarms treat missing data"), evaluation range
# 5, most recent on the right; each row: data points, then the state for MISSING, IGNORE,
# BREACHING, NOT BREACHING ("keep" is "Retain current state").
TABLE_3_OF_3 = [
    ("0 - X - X", A.OK, A.OK, A.OK, A.OK),
    ("0 - - - -", A.OK, A.OK, A.OK, A.OK),
    ("- - - - -", A.INSUFFICIENT_DATA, "keep", A.ALARM, A.OK),
    ("0 X X - X", A.ALARM, A.ALARM, A.ALARM, A.ALARM),
    ("- - X - -", A.ALARM, "keep", A.ALARM, A.OK),
    # Two more rows from the page's earlier (2019) version of the same table.
    ("- - - - X", A.INSUFFICIENT_DATA, "keep", A.ALARM, A.OK),
    ("X - - - -", A.ALARM, "keep", A.ALARM, A.OK),
]
TABLE_2_OF_3 = [
    ("0 - X - X", A.ALARM, A.ALARM, A.ALARM, A.ALARM),
    ("0 0 X 0 X", A.ALARM, A.ALARM, A.ALARM, A.ALARM),
    ("0 - X - -", A.OK, A.OK, A.ALARM, A.OK),
    ("- - - - 0", A.OK, A.OK, A.ALARM, A.OK),
    ("- - - X -", A.ALARM, "keep", A.ALARM, A.OK),
    # From the 2019 version of the page.
    ("- - - - X", A.INSUFFICIENT_DATA, "keep", A.ALARM, A.OK),
]


def table_rows() -> list:
    return [pytest.param(m, row, id=f"{m} of 3: {row[0]}")
            for m, table in ((3, TABLE_3_OF_3), (2, TABLE_2_OF_3)) for row in table]


@pytest.mark.parametrize("m, row", table_rows())
def test_aws_tables(m, row):
    """AWS's tables, 3 of 3 and 2 of 3: every row, every TreatMissingData, from every
    state."""
    data, *expected = row
    for treat, want in zip(("missing", "ignore", "breaching", "notBreaching"), expected):
        for current in (A.OK, A.ALARM, A.INSUFFICIENT_DATA):
            got, _ = A.decide(points(data), 3, m, treat, current)
            eq(got, current if want == "keep" else want, f"{data} {treat} from {current}")


def test_aws_table_row_2_breaching_alarms_once_the_real_datapoint_leaves():
    """AWS table row 2 (3 of 3, breaching): OK now, ALARM once the real datapoint leaves the range."""
    eq(A.decide(points("0 - - - -"), 3, 3, "breaching", A.OK)[0], A.OK)
    eq(A.decide(points("- - - - -"), 3, 3, "breaching", A.OK)[0], A.ALARM)


# ---------------------------------------------------------------------------------------
# Timelines


def alarm(**kw):
    base = dict(
        logical_id="Test", name=None, namespace="Test", metric_name="M", dimensions={},
        period=60, evaluation_periods=3, datapoints_to_alarm=3, threshold=10.0,
        comparison="GreaterThanThreshold", treat_missing_data="missing", statistic="Maximum",
    )
    base.update(kw)
    return A.Alarm(**base)


def series(values, start=T0, step=MIN, namespace="Test", metric="M", dims=()):
    """Samples at start + i*step + 30 s for each non-None value (a list for several)."""
    out = []
    for i, v in enumerate(values):
        if v is None:
            continue
        for x in v if isinstance(v, list) else [v]:
            out.append(A.Sample(namespace, metric, tuple(dims), start + i * step + 30_000, float(x)))
    return out


def transitions(ev):
    return [((t["time_ms"] - T0) // MIN, t["to"]) for t in ev.transitions]


def test_m_of_n_with_gaps():
    """M of N with gaps (3 of 5, missing): ALARM at the third breach within 5 minutes, OK when a window holds fewer."""
    a = alarm(evaluation_periods=5, datapoints_to_alarm=3)
    # minute:        0   1     2   3     4   5  6  7  8  9
    s = series([20, None, 5, None, 20, 20, 5, 5, 5, 5])
    ev = A.evaluate(a, s, start=T0, end=T0 + 10 * MIN)
    # Minute k's datapoint is first evaluated at k+1; the range is 7 periods.
    states = ev.states()
    # 1-2: only the breaching 20 of minute 0, younger than M = 3 periods: INSUFFICIENT_DATA.
    # 3: a real non-breaching one (minute 2) too: OK.
    eq(states[:3], [A.INSUFFICIENT_DATA, A.INSUFFICIENT_DATA, A.OK], "minutes 1-3")
    # 6: 4 real ones (fewer than N = 5), all counted: 20, 5, 20, 20: 3 breach: ALARM.
    eq(states[5], A.ALARM, "minute 6")
    # 8: the 5 most recent real ones 5 20 20 5 5: 2 breach: OK.
    eq(transitions(ev), [(3, A.OK), (6, A.ALARM), (8, A.OK)], "transitions")


def test_m_of_n_breaches_not_consecutive():
    """M of N: breaches that are not consecutive still alarm (2 of 3, notBreaching)."""
    a = alarm(evaluation_periods=3, datapoints_to_alarm=2, treat_missing_data="notBreaching")
    ev = A.evaluate(a, series([20, 1, 20, 1, 1, 1]), start=T0, end=T0 + 6 * MIN)
    # 3: X 0 X, two breaching of three: ALARM; 4: 0 X 0: OK.
    eq(ev.states(), [A.OK, A.OK, A.ALARM, A.OK, A.OK, A.OK])


def test_evaluation_every_minute_over_sliding_periods():
    """evaluation every minute over sliding periods: a 5-minute Sum alarm sees an error for 5 evaluations."""
    a = alarm(period=300, evaluation_periods=1, datapoints_to_alarm=1, threshold=1,
              comparison="GreaterThanOrEqualToThreshold", statistic="Sum",
              treat_missing_data="notBreaching")
    # One sample a minute (0 = an invocation without error), an error at minute 2.
    ev = A.evaluate(a, series([0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]), start=T0, end=T0 + 11 * MIN)
    eq(transitions(ev), [(1, A.OK), (3, A.ALARM), (8, A.OK)])


def test_last_real_datapoints_decide_while_in_range():
    """after the metric stops, the last real datapoints keep deciding while they are in the range."""
    a = alarm(treat_missing_data="notBreaching")  # 3 of 3, range 5
    ev = A.evaluate(a, series([20, 20, 20]), start=T0, end=T0 + 8 * MIN)
    # ALARM at 3; at 4 and 5 the three real ones are still in the range; at 6 only two.
    eq(transitions(ev), [(1, A.OK), (3, A.ALARM), (6, A.OK)])


def test_treat_missing_data_over_a_timeline():
    """TreatMissingData over a timeline: each mode once the metric stops."""
    s = series([5, 5, 5])  # healthy, then nothing
    want = {
        "missing": A.INSUFFICIENT_DATA,
        "notBreaching": A.OK,
        "breaching": A.ALARM,
        "ignore": A.OK,
    }
    for treat, final in want.items():
        ev = A.evaluate(alarm(treat_missing_data=treat), s, start=T0, end=T0 + 12 * MIN)
        eq(ev.final_state, final, treat)
    # breaching: at 4 the range holds 3 real OK ones; at 6 two (+1 filled); at 8 none.
    ev = A.evaluate(alarm(treat_missing_data="breaching"), s, start=T0, end=T0 + 12 * MIN)
    eq(transitions(ev), [(1, A.OK), (8, A.ALARM)], "breaching")
    ev = A.evaluate(alarm(treat_missing_data="missing"), s, start=T0, end=T0 + 12 * MIN)
    eq(transitions(ev), [(1, A.OK), (8, A.INSUFFICIENT_DATA)], "missing")


def test_premature_alarm_rule():
    """one breaching datapoint per 5 minutes, 3 of 3: notBreaching never alarms, missing does (premature-alarm rule)."""
    s = series([400, None, None, None, None] * 6)
    ev = A.evaluate(alarm(threshold=300, treat_missing_data="notBreaching"), s, start=T0, end=T0 + 30 * MIN)
    eq(set(ev.states()), {A.OK}, "notBreaching")
    ev = A.evaluate(alarm(threshold=300, treat_missing_data="missing"), s, start=T0, end=T0 + 30 * MIN)
    # "- - - - X", "- - - X -": INSUFFICIENT_DATA; "- - X - -": ALARM (the oldest breaching
    # datapoint is M = 3 periods old and nothing after it is non-breaching).
    eq(ev.states()[:6], [A.INSUFFICIENT_DATA, A.INSUFFICIENT_DATA, A.ALARM, A.ALARM, A.ALARM,
                         A.INSUFFICIENT_DATA], "missing")


def test_dynamodb_alarms_ignore_missing_data():
    """AWS/DynamoDB alarms always ignore missing data."""
    a = alarm(namespace="AWS/DynamoDB", treat_missing_data="breaching")
    s = [A.Sample("AWS/DynamoDB", "M", (), T0 + 30_000, 5.0)]
    ev = A.evaluate(a, s, start=T0, end=T0 + 10 * MIN)
    eq(ev.final_state, A.OK)


def test_statistics():
    """statistics: SampleCount, Sum, Average, Minimum, Maximum, p50, p90, p100."""
    v = [4.0, 1.0, 7.0, 2.0, 6.0, 3.0, 5.0, 8.0, 10.0, 9.0]
    want = {"SampleCount": 10, "Sum": 55, "Average": 5.5, "Minimum": 1, "Maximum": 10,
            "p50": 5, "p90": 9, "p100": 10}
    for name, w in want.items():
        eq(A.statistic(name, v), float(w), name)
    eq(A.statistic("Sum", []), None, "no sample")
    with pytest.raises(A.AlarmError):
        A.statistic("tm90", v)


def test_each_statistic_decides_its_own_alarm():
    """statistics over a period: each statistic decides its own alarm on the same samples."""
    # One period with the samples 1, 2 and 9 (an EMF array); threshold 3, GreaterThan.
    s = series([[1, 2, 9]])
    for stat, breach in [("SampleCount", False), ("Sum", True), ("Average", True),
                         ("Minimum", False), ("Maximum", True)]:
        a = alarm(statistic=stat, threshold=3, evaluation_periods=1, datapoints_to_alarm=1)
        eq(A.evaluate(a, s).final_state, A.ALARM if breach else A.OK, stat)
    a = alarm(statistic=None, extended_statistic="p50", threshold=1.5, evaluation_periods=1, datapoints_to_alarm=1)
    eq(A.evaluate(a, s).final_state, A.ALARM, "p50 = 2 > 1.5")


def test_high_resolution_alarm_every_10_seconds():
    """a 10-second alarm is evaluated every 10 seconds over high-resolution samples."""
    a = alarm(period=10, evaluation_periods=1, datapoints_to_alarm=1)
    s = [A.Sample("Test", "M", (), T0 + 12_000, 20.0, None, 1)]
    ev = A.evaluate(a, s, start=T0, end=T0 + MIN)
    eq([(t["time_ms"] - T0, t["to"]) for t in ev.transitions],
       [(20_000, A.ALARM), (50_000, A.INSUFFICIENT_DATA)])  # in the 3-period range until 50 s


# ---------------------------------------------------------------------------------------
# EMF


def relay_doc(ts, table="OutboxTable", namespace="Outbox", service="outbox-relay", **metrics):
    """An EMF document shaped as lib/src/metrics/emf.rs renders one."""
    units = {"OldestPendingAge": "Seconds", "BatchDuration": "Milliseconds", "RoundDuration": "Milliseconds"}
    doc = {
        "_aws": {
            "Timestamp": ts,
            "CloudWatchMetrics": [{
                "Namespace": namespace,
                "Dimensions": [["service", "table"]],
                "Metrics": [{"Name": k, "Unit": units.get(k, "Count")} for k in metrics],
            }],
        },
        "service": service,
        "table": table,
    }
    doc.update(metrics)
    return json.dumps(doc, separators=(",", ":"))


def test_emf_documents_in_mixed_log_lines():
    """EMF: documents picked out of mixed log lines, Lambda's prefix allowed, arrays are samples."""
    lines = [
        "START RequestId: 1 Version: $LATEST",
        '{"level":"INFO","message":"relay started"}',
        relay_doc(T0 + 1000, Published=3, BatchDuration=[1.5, 2.5, 3]),
        "2025-11-30T10:00:00.000Z 1234 INFO " + relay_doc(T0 + 2000, OldestPendingAge=7),
        "not json {",
        '{"_aws": {"Timestamp": 1}}',  # no CloudWatchMetrics: not an EMF document
    ]
    r = A.read_emf(lines)
    eq(r.documents, 2, "documents")
    eq(r.other_lines, 4, "other lines")
    eq(r.rejected, [], "rejected")
    by = {}
    for s in r.samples:
        by.setdefault(s.metric, []).append(s.value)
    eq(by, {"Published": [3.0], "BatchDuration": [1.5, 2.5, 3.0], "OldestPendingAge": [7.0]})
    s = [x for x in r.samples if x.metric == "OldestPendingAge"][0]
    eq((s.namespace, s.dimensions, s.timestamp_ms, s.unit),
       ("Outbox", (("service", "outbox-relay"), ("table", "OutboxTable")), T0 + 2000, "Seconds"))


def test_emf_documents_breaking_the_specification_rejected():
    """EMF: documents breaking the specification are rejected whole."""
    good = json.loads(relay_doc(T0, Published=1))
    bad = []
    d = json.loads(json.dumps(good)); d["table"] = 5; bad.append(d)                      # dimension not a string
    d = json.loads(json.dumps(good)); d["Published"] = list(range(101)); bad.append(d)   # 101 values
    d = json.loads(json.dumps(good)); d["Published"] = {"Values": [1], "Counts": [2]}; bad.append(d)
    d = json.loads(json.dumps(good)); del d["_aws"]["Timestamp"]; bad.append(d)
    d = json.loads(json.dumps(good)); d["Published"] = True; bad.append(d)
    d = json.loads(json.dumps(good)); d["_aws"]["CloudWatchMetrics"][0]["Dimensions"] = [["service"] * 31]; bad.append(d)
    r = A.read_emf([json.dumps(x) for x in bad] + [json.dumps(good)])
    eq(r.documents, 1, "documents")
    eq([n for n, _ in r.rejected], [1, 2, 3, 4, 5, 6], "rejected lines")
    eq(len(r.samples), 1, "samples")


def test_emf_dimension_sets_are_metrics():
    """EMF: each dimension set is its own metric; an alarm matches the exact dimension set."""
    doc = json.loads(relay_doc(T0, OldestPendingAge=400))
    doc["_aws"]["CloudWatchMetrics"][0]["Dimensions"] = [["service", "table"], ["service"], []]
    doc["function_name"] = "relay"
    r = A.read_emf([json.dumps(doc)])
    eq(sorted(s.dimensions for s in r.samples),
       sorted([(), (("service", "outbox-relay"),), (("service", "outbox-relay"), ("table", "OutboxTable"))]))
    a = alarm(namespace="Outbox", metric_name="OldestPendingAge",
              dimensions={"service": "outbox-relay", "table": "OutboxTable"})
    eq(len(A.matching_samples(a, r.samples)), 1, "exact set")
    a.dimensions = {"service": "outbox-relay", "table": "OutboxTable", "function_name": "relay"}
    eq(len(A.matching_samples(a, r.samples)), 0, "a dimension the document does not publish")
    a.dimensions = {"service": "outbox-relay", "table": "OutboxTable"}
    # A relay that adds a dimension (EmfMetrics::with_dimension) publishes another metric.
    more = json.loads(relay_doc(T0, OldestPendingAge=400))
    more["_aws"]["CloudWatchMetrics"][0]["Dimensions"] = [["service", "table", "function_name"]]
    more["function_name"] = "relay"
    eq(len(A.matching_samples(a, A.read_emf([json.dumps(more)]).samples)), 0, "a superset of the alarm's dimensions")
    a.unit = "Seconds"
    eq(len(A.matching_samples(a, r.samples)), 1, "unit Seconds")
    a.unit = "Milliseconds"
    eq(len(A.matching_samples(a, r.samples)), 0, "another unit")


# ---------------------------------------------------------------------------------------
# The template


def template_alarms(**params):
    return A.resolve_alarms(A.load_template(TEMPLATE), {"AlarmTopicArn": TOPIC, **params})


# The default deployment's seven (WakeOn=stream, the enqueue function, PoisonPolicy block).
ALARMS = ["EnqueueFaultsAlarm", "OutboxStuckAlarm", "QuarantinedItemsAlarm",
          "RefusedWritesAlarm", "RelayConcurrencyAlarm", "RelayErrorsAlarm",
          "SuccessorFailuresAlarm"]


def test_template_defaults_every_alarm_exists():
    """template with its defaults: every alarm exists (AlarmTopicArn only adds actions)."""
    eq(sorted(A.resolve_alarms(A.load_template(TEMPLATE))), ALARMS)


def test_template_alarm_fields_resolved():
    """template with AlarmTopicArn: seven alarms, fields resolved from the defaults; the
    same under PoisonPolicy quarantine-after=1 and WakeOn=schedule, none of the enqueue
    function's without it."""
    al = template_alarms()
    eq(sorted(al), ALARMS)
    s = al["OutboxStuckAlarm"]
    eq((s.namespace, s.metric_name, s.dimensions, s.statistic, s.period, s.evaluation_periods,
        s.datapoints_to_alarm, s.threshold, s.comparison, s.treat_missing_data),
       ("Outbox", "OldestPendingAge", {"service": "outbox-relay", "table": "OutboxTable"}, "Maximum",
        60, 10, 1, 300.0, "GreaterThanOrEqualToThreshold", "notBreaching"))
    q = al["RelayConcurrencyAlarm"]
    eq((q.metric_name, q.dimensions, q.statistic, q.evaluation_periods, q.datapoints_to_alarm,
        q.threshold, q.treat_missing_data),
       ("ConcurrentExecutions", {"FunctionName": "RelayFunction"}, "Maximum", 15, 15, 10.0,
        "breaching"))
    eq(sorted(template_alarms(PoisonPolicy="quarantine-after=1", EnableEnqueueApi="false",
                              WakeOn="schedule")),
       sorted(set(ALARMS) - {"EnqueueFaultsAlarm"}))


def test_template_overrides_reach_the_alarms():
    """template parameters, conditions and resource names: overrides reach the alarms."""
    t = A.load_template(TEMPLATE)
    al = A.resolve_alarms(t, {"AlarmTopicArn": TOPIC, "UseExistingTable": "true", "TableName": "orders-outbox",
                              "RefusedWritesMinutes": "7", "StuckMessageAgeSeconds": "60"},
                          resource_names={"RelayFunction": "stack-RelayFunction-ABC"})
    eq(al["OutboxStuckAlarm"].dimensions["table"], "orders-outbox", "table of an existing table")
    eq(al["OutboxStuckAlarm"].threshold, 60.0, "threshold")
    eq((al["RefusedWritesAlarm"].evaluation_periods, al["RefusedWritesAlarm"].datapoints_to_alarm), (15, 7))
    eq(al["RelayErrorsAlarm"].dimensions, {"FunctionName": "stack-RelayFunction-ABC"})
    al = A.resolve_alarms(t, {"AlarmTopicArn": TOPIC}, resource_names={"OutboxTable": "stack-OutboxTable-XYZ"})
    eq(al["RefusedWritesAlarm"].dimensions["table"], "stack-OutboxTable-XYZ", "created table's name")
    with pytest.raises(A.AlarmError):
        A.resolve_alarms(t, {"NoSuchParameter": "1"})


def stuck_series(alarm_, minutes, growing=True):
    """One relay document a minute (WakeOn=schedule at rate(1 minute)): the oldest pending
    message ages by 60 s a minute from 0 (growing) or stays at 2 s (healthy)."""
    return [relay_doc(T0 + i * MIN + 45_000, table=alarm_.dimensions["table"], Published=0 if growing else 5,
                      PendingMessages=12, OldestPendingAge=(i * 60 if growing else 2))
            for i in range(minutes)]


def test_stuck_alarm_at_the_first_old_head():
    """template OutboxStuckAlarm: ALARM at the first minute a relay sees a head as old as the threshold."""
    a = template_alarms()["OutboxStuckAlarm"]
    lines = stuck_series(a, 15)
    r = A.read_emf(lines)
    ev = A.evaluate(a, r.samples)
    first_breach = next(i for i in range(15) if i * 60 >= a.threshold)  # minute 5 with 300 s
    eq(transitions(ev), [(1, A.OK), (first_breach + 1, A.ALARM)])


def test_stuck_alarm_stays_ok_when_healthy():
    """template OutboxStuckAlarm: stays OK on a healthy series."""
    a = template_alarms()["OutboxStuckAlarm"]
    ev = A.evaluate(a, A.read_emf(stuck_series(a, 30, growing=False)).samples)
    eq(transitions(ev), [(1, A.OK)])


def quiet_poison_series(minutes, poison_at_min=0, tick_every=5, run_min=2):
    """A poison head in a quiet period with WakeOn=stream and the schedule every
    `tick_every` minutes, as the relay function writes its metrics: the commit's doorbell
    starts a relay at minute `poison_at_min`, then a relay runs at each tick (a parked
    bucket is no work left, so no successor); a running relay writes a document every
    minute of its run, in which the parked bucket's head (its age growing from the
    commit) and its retries (PoisonItems, PublishFailures) appear. Nothing is written
    between runs."""
    docs = []
    starts = [poison_at_min] + [m for m in range(minutes) if m % tick_every == 0 and m > poison_at_min]
    for start in starts:
        for k in range(run_min):
            t = T0 + (start + k) * MIN + 30_000
            age = (start + k - poison_at_min) * 60 + 30
            docs.append(relay_doc(t, PoisonItems=6, PublishFailures=6, OldestPendingAge=age))
    return docs


def test_poison_head_in_a_quiet_period_alarms():
    """a poison head in a quiet period (stream mode, schedule every 5 minutes, PoisonPolicy
    block): the stuck alarm within 10 minutes, and in ALARM between the runs."""
    al = template_alarms()
    samples = A.read_emf(quiet_poison_series(30)).samples
    stuck = A.evaluate(al["OutboxStuckAlarm"], samples, start=T0, end=T0 + 30 * MIN)
    at = next(m for m, state in transitions(stuck) if state == A.ALARM)
    assert at <= 10, transitions(stuck)
    eq([state for _, state in transitions(stuck) if _ > at], [],
       "stays in ALARM between runs (a run every 5 minutes, a window of 10)")


def test_healthy_drain_raises_no_alarm():
    """a healthy drain then quiet: no stuck, poison or publish-failure alarm."""
    al = template_alarms()
    docs = [relay_doc(T0 + i * MIN + 30_000, Published=500, OldestPendingAge=[40, 25, 8, 0][i]) for i in range(4)]
    samples = A.read_emf(docs).samples
    for name in ["OutboxStuckAlarm", "RefusedWritesAlarm", "SuccessorFailuresAlarm"]:
        ev = A.evaluate(al[name], samples, start=T0, end=T0 + 30 * MIN)
        assert all(state != A.ALARM for _, state in transitions(ev)), (name, transitions(ev))


def test_stuck_alarm_ignores_another_table():
    """template OutboxStuckAlarm: another table's documents do not count."""
    a = template_alarms()["OutboxStuckAlarm"]
    other = A.alarm_from_properties("X", {"Namespace": "Outbox", "MetricName": "M", "ComparisonOperator": "GreaterThanThreshold",
                                           "Statistic": "Sum", "Period": 60, "EvaluationPeriods": 1, "Threshold": 0})
    other.dimensions = {"table": "someone-else"}
    r = A.read_emf(stuck_series(other, 15))
    eq(A.matching_samples(a, r.samples), [])


def test_relay_concurrency_alarm_when_quiet():
    """template RelayConcurrencyAlarm (direct Lambda datapoints): OK while a relay runs every 5 minutes, ALARM after they stop."""
    a = template_alarms()["RelayConcurrencyAlarm"]
    fn = a.dimensions["FunctionName"]
    records = [{"namespace": "AWS/Lambda", "metric": "ConcurrentExecutions", "dimensions": {"FunctionName": fn},
                "timestamp": T0 + i * MIN + 5_000, "value": 1} for i in range(0, 60, 5)]
    ev = A.evaluate(a, A.samples_from_records(records), start=T0, end=T0 + 120 * MIN)
    last = 55
    n = a.evaluation_periods
    # The last invocation's datapoint (non-breaching) stays in the range of N + 2 periods:
    # with it, N - 1 filled breaching datapoints are not enough; ALARM when it leaves.
    eq(transitions(ev), [(1, A.OK), (last + n + 2 + 1, A.ALARM)])


def test_relay_errors_alarm():
    """template RelayErrorsAlarm (direct Lambda datapoints): ALARM on an error, OK 5 minutes later."""
    a = template_alarms()["RelayErrorsAlarm"]
    fn = a.dimensions["FunctionName"]
    records = [{"namespace": "AWS/Lambda", "metric": "Errors", "dimensions": [{"Name": "FunctionName", "Value": fn}],
                "timestamp": A.iso(T0 + i * MIN + 5_000), "value": 1 if i == 7 else 0} for i in range(20)]
    ev = A.evaluate(a, A.samples_from_records(records), start=T0, end=T0 + 20 * MIN)
    eq(transitions(ev), [(1, A.OK), (8, A.ALARM), (13, A.OK)])


# ---------------------------------------------------------------------------------------
# CLI


def cli(*args, stdin=None):
    p = subprocess.run([sys.executable, script("alarms.py"), *args], input=stdin,
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    return p.returncode, p.stdout, p.stderr


def test_cli_emf_and_datapoints(tmp_path):
    """CLI: EMF on stdin and datapoints from a file, transitions as JSON."""
    a = template_alarms()["OutboxStuckAlarm"]
    path = tmp_path / "lambda.json"
    path.write_text(json.dumps([{"namespace": "AWS/Lambda", "metric": "Errors",
                                 "dimensions": {"FunctionName": "RelayFunction"},
                                 "timestamp": T0 + 2 * MIN, "value": 1}]))
    rc, out, err = cli("--param", f"AlarmTopicArn={TOPIC}", "--emf", "-", "--datapoints", str(path),
                       stdin="\n".join(["a log line"] + stuck_series(a, 12)) + "\n")
    eq(rc, 0, f"exit status ({err.strip()})")
    doc = json.loads(out)
    eq(doc["emf"]["documents"], 12, "documents")
    eq(doc["emf"]["other_lines"], 1, "other lines")
    stuck = doc["alarms"]["OutboxStuckAlarm"]
    eq([(t["to"], (t["time_ms"] - T0) // MIN) for t in stuck["transitions"]], [(A.OK, 1), (A.ALARM, 6)])
    eq(stuck["final_state"], A.ALARM, "final")
    eq([(t["to"], (t["time_ms"] - T0) // MIN) for t in doc["alarms"]["RelayErrorsAlarm"]["transitions"]],
       [(A.OK, 1), (A.ALARM, 3)], "errors")
    eq(doc["alarms"]["RefusedWritesAlarm"]["final_state"], A.OK, "refused writes: none")


def test_cli_options_and_errors():
    """CLI: --from/--to, --alarm, --list, and errors exit 2."""
    a = template_alarms()["OutboxStuckAlarm"]
    rc, out, err = cli("--param", f"AlarmTopicArn={TOPIC}", "--alarm", "OutboxStuckAlarm", "--emf", "-",
                       "--from", A.iso(T0), "--to", A.iso(T0 + 30 * MIN), stdin="\n".join(stuck_series(a, 12)))
    eq(rc, 0, err)
    doc = json.loads(out)
    eq(list(doc["alarms"]), ["OutboxStuckAlarm"], "one alarm")
    # The documents stop at minute 11 (the head published: nothing pending, nothing
    # reported): missing data is not breaching, and the alarm goes OK once the old heads
    # have left its window.
    eq([(t["to"], (t["time_ms"] - T0) // MIN) for t in doc["alarms"]["OutboxStuckAlarm"]["transitions"]],
       [(A.OK, 1), (A.ALARM, 6), (A.OK, 24)])
    rc, out, _ = cli("--list")
    eq((rc, sorted(json.loads(out))), (0, ALARMS), "--list with defaults: every alarm")
    rc, _, err = cli("--alarm", "NoSuchAlarm")
    eq(rc, 2, "an alarm the template does not have")


# ---------------------------------------------------------------------------------------
# Alarms that fire on their fault, and not on the harmless case


def first_alarm(ev):
    return next((m for m, state in transitions(ev) if state == A.ALARM), None)


def refused_doc(minute, table="OutboxTable", n=1):
    return relay_doc(T0 + minute * MIN + 20_000, table=table, RefusedWrites=n, **{"RefusedWrites.renew": n})


def test_refused_writes_alarm_fires_across_short_runs():
    """template RefusedWritesAlarm, M of N: a lasting cause (clock skew) refuses writes in the
    runs of the schedule alone, one short run every 5 minutes with quiet minutes between:
    ALARM at the third such minute within 15; a single refusal (a lost race at a handover)
    never alarms."""
    a = template_alarms()["RefusedWritesAlarm"]
    lasting = A.read_emf([refused_doc(m) for m in range(0, 30, 5)]).samples
    ev = A.evaluate(a, lasting, start=T0, end=T0 + 30 * MIN)
    eq(first_alarm(ev), 11, "the third refusing minute (10) is evaluated at 11")
    once = A.read_emf([refused_doc(4)]).samples
    ev = A.evaluate(a, once, start=T0, end=T0 + 30 * MIN)
    eq(first_alarm(ev), None, "one refused minute")
    # The same lasting series under N consecutive minutes (the streak a quiet minute
    # resets) never alarms: why the alarm is M of N.
    streak = alarm(namespace=a.namespace, metric_name=a.metric_name, dimensions=a.dimensions,
                   statistic="Sum", threshold=0, comparison="GreaterThanThreshold",
                   evaluation_periods=3, datapoints_to_alarm=3, treat_missing_data="notBreaching")
    eq(first_alarm(A.evaluate(streak, lasting, start=T0, end=T0 + 30 * MIN)), None,
       "3 consecutive minutes: never")


def concurrency(values, fn="RelayFunction"):
    """ConcurrentExecutions maxima, one a minute from T0 (None: no execution that minute)."""
    return A.samples_from_records([
        {"namespace": "AWS/Lambda", "metric": "ConcurrentExecutions", "dimensions": {"FunctionName": fn},
         "timestamp": T0 + i * MIN + 30_000, "value": v} for i, v in enumerate(values) if v is not None])


def test_relay_concurrency_alarm_on_a_runaway():
    """template RelayConcurrencyAlarm: relays that never stop (30 at once, every minute)
    alarm after RelayQuietMinutes; a 10-minute drain with 30 at once, and the schedule's
    single relay every 5 minutes, do not."""
    a = template_alarms()["RelayConcurrencyAlarm"]
    ev = A.evaluate(a, concurrency([1, None, None, None, None] + [30] * 40), start=T0, end=T0 + 45 * MIN)
    at = first_alarm(ev)
    assert at is not None and 15 <= at <= 5 + a.evaluation_periods, (at, transitions(ev))
    burst = [1, None, None, None, None] + [30] * 10 + [1, None, None, None, None] * 6
    ev = A.evaluate(a, concurrency(burst), start=T0, end=T0 + 45 * MIN)
    eq(first_alarm(ev), None, "a drain: many relays for 10 minutes")
    ev = A.evaluate(a, concurrency([2, 1, None, None, None] * 12), start=T0, end=T0 + 60 * MIN)
    eq(first_alarm(ev), None, "the schedule alone")


def test_successor_failures_alarm():
    """template SuccessorFailuresAlarm: successors that cannot be started (every run of a
    backlog) alarm within two failing minutes; one transient failure does not."""
    a = template_alarms()["SuccessorFailuresAlarm"]
    failing = A.read_emf([relay_doc(T0 + m * MIN + 50_000, SuccessorFailures=1, Published=100,
                                    OldestPendingAge=5) for m in range(0, 20, 2)]).samples
    eq(first_alarm(A.evaluate(a, failing, start=T0, end=T0 + 20 * MIN)), 3, "2 of 10 minutes")
    once = A.read_emf([relay_doc(T0 + 50_000, SuccessorFailures=1)]).samples
    eq(first_alarm(A.evaluate(a, once, start=T0, end=T0 + 20 * MIN)), None, "once")


def report(minute, status="success", error_type=None):
    """A platform.report record of the enqueue function's log group (JSON system logs)."""
    record = {"requestId": f"r-{minute}", "status": status,
              "metrics": {"durationMs": 12.5, "billedDurationMs": 13, "memorySizeMB": 256,
                          "maxMemoryUsedMB": 30}}
    if error_type:
        record["errorType"] = error_type
    return json.dumps({"time": A.iso(T0 + minute * MIN + 15_000), "type": "platform.report",
                       "record": record})


def enqueue_fault_samples(lines):
    doc = A.load_template(TEMPLATE)
    f = doc["Resources"]["EnqueueFaultsMetricFilter"]["Properties"]
    t = f["MetricTransformations"][0]
    a = template_alarms()["EnqueueFaultsAlarm"]
    return a, A.filter_samples(f["FilterPattern"], a.namespace, t["MetricName"],
                               float(t["MetricValue"]), lines)


def test_enqueue_faults_alarm_counts_faults_not_refused_requests():
    """template EnqueueFaultsAlarm over its metric filter: a DynamoDB error, a
    misconfiguration or a timeout of the enqueue function alarms; callers' refused requests
    (errorType ValidationError, which Lambda's Errors counts too) and successes do not."""
    healthy = [report(m) for m in range(20)]
    refused = healthy + [report(m, "failure", "ValidationError") for m in range(20)]
    a, samples = enqueue_fault_samples(refused)
    eq(samples, [], "no fault, no data point")
    eq(first_alarm(A.evaluate(a, samples, start=T0, end=T0 + 20 * MIN)), None, "refused requests")
    for status, error_type in [("failure", "DynamoDb"), ("error", "Misconfiguration"),
                               ("timeout", None)]:
        a, samples = enqueue_fault_samples(healthy + [report(7, status, error_type)])
        eq(len(samples), 1, f"{status} {error_type}")
        eq(first_alarm(A.evaluate(a, samples, start=T0, end=T0 + 20 * MIN)), 8, f"{status} {error_type}")


def relay_application_log_level():
    """The relay's ApplicationLogLevel as deployed (its own LoggingConfig over the Globals')."""
    doc = A.load_template(TEMPLATE)
    level = doc["Globals"]["Function"]["LoggingConfig"].get("ApplicationLogLevel")
    return doc["Resources"]["RelayFunction"]["Properties"]["LoggingConfig"].get("ApplicationLogLevel", level)


def test_relay_log_level_keeps_the_metrics():
    """Lambda files an EMF line (JSON without "level") as INFO: at the template's relay
    ApplicationLogLevel the documents of a stuck outbox reach CloudWatch and the stuck
    alarm fires; at WARN every one is dropped and the alarm stays silent (why the template
    pins the relay's level)."""
    a = template_alarms()["OutboxStuckAlarm"]
    lines = ['{"level":"INFO","fields":{"message":"bucket ownership"}}',
             '{"level":"WARN","fields":{"message":"publish failed"}}'] + stuck_series(a, 15)
    level = relay_application_log_level()
    kept = A.lambda_log_level_filter(lines, level)
    eq(A.read_emf(kept).documents, 15, f"EMF documents kept at {level}")
    eq(first_alarm(A.evaluate(a, A.read_emf(kept).samples, start=T0, end=T0 + 15 * MIN)), 6,
       "stuck alarm")
    silenced = A.lambda_log_level_filter(lines, "WARN")
    eq((A.read_emf(silenced).documents, len(silenced)), (0, 1), "WARN keeps only the WARN line")
