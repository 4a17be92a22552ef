#!/usr/bin/env python3
"""A small evaluator of the CloudWatch metric alarms of template.yaml over EMF documents.

Tests feed it what a scenario printed (the relay function's stdout, EMF documents mixed
with other log lines) and, for the alarms on AWS/Lambda metrics, datapoints given
directly; it replays CloudWatch's alarm evaluation in simulated time and reports each
alarm's state transitions as JSON.

Sources (the text of these pages was read in their source repository,
awsdocs/amazon-cloudwatch-user-guide, commit b355497 "Periodic Update 05/17/2023"):

- "Using Amazon CloudWatch alarms", section "Evaluating an alarm":
  https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/AlarmThatSendsEmail.html
- "Configuring how CloudWatch alarms treat missing data" (with "How alarm state is
  evaluated when data is missing" and "Avoiding premature transitions to alarm state"):
  https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/alarms-and-missing-data.html
- "CloudWatch statistics definitions":
  https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/Statistics-definitions.html
- "Amazon CloudWatch concepts" (dimensions, units, periods, resolution):
  https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/cloudwatch_concepts.html
- "Specification: Embedded metric format":
  https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch_Embedded_Metric_Format_Specification.html
- "Setting alarms on metrics created with the embedded metric format":
  https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch_Embedded_Metric_Format_Alarms.html
- "AWS::CloudWatch::Alarm" (CloudFormation; a new alarm starts in INSUFFICIENT_DATA):
  https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/aws-resource-cloudwatch-alarm.html
- AWS Knowledge Center, "Why did my CloudWatch alarm send me a notification after a
  single breached data point?":
  https://repost.aws/knowledge-center/cloudwatch-alarm-single-data-point

What it models
--------------
Template: the `AWS::CloudWatch::Alarm` resources of a CloudFormation YAML template
(short-form intrinsics read by a small PyYAML loader). Parameters take their Default,
overridden by `params`; `Conditions` are evaluated (Fn::Equals, Not, And, Or, Condition);
Ref, Fn::Sub, Fn::If, Fn::Join, Fn::Select, Fn::Split, Fn::GetAtt, Fn::FindInMap and
AWS::NoValue are resolved. A Ref to a resource is the resource's logical id unless
`resource_names` names it; Fn::GetAtt gives "Logical.Attr" unless `resource_attrs` does;
pseudo parameters (AWS::StackName, AWS::Region, ...) have fixed test values unless
`pseudo` overrides them. An alarm whose Condition is false is absent. DatapointsToAlarm
defaults to EvaluationPeriods, TreatMissingData to `missing`.

EMF ("Specification: Embedded metric format"): a line is an EMF document when, from its
first "{" on (Lambda may prepend metadata), it is a JSON object whose `_aws` member has
`CloudWatchMetrics`. A document is rejected whole (listed in `rejected`, no datapoint)
when it breaks the specification: no integer `_aws.Timestamp`, a directive without a
non-empty Namespace, Dimensions (an array of arrays of at most 30 keys) or Metrics (at
most 100 definitions with a Name), a dimension key whose root member is not a string, or
a metric target that is not a number or an array of 1 to 100 numbers. Every value of an
array target is one sample; every dimension set of a directive makes its own metric (the
identity is namespace, metric name and the exact set of dimension names and values).
A metric's Unit (default None) and StorageResolution (default 60) come along; a
standard-resolution sample is stored at the start of its minute. The specification
(2023 text) allows only a number or an array of numbers as a metric target: an object
with `Values`/`Counts` (a PutMetricData-style histogram) is not EMF and is rejected.

Datapoints that do not come from EMF (AWS/Lambda Errors, Invocations, Throttles,
Duration, ...) are passed directly: {namespace, metric, dimensions, timestamp, value or
values, unit}, see `samples_from_records`.

Aggregation ("CloudWatch statistics definitions", "concepts"): per period, over the
samples of the alarm's metric (and of its Unit when the alarm names one): SampleCount,
Sum, Average (Sum/SampleCount), Minimum, Maximum, and the ExtendedStatistic pNN or
pNN.N (nearest rank: the ceil(p/100 * n)-th smallest sample; CloudWatch's percentile
algorithm is not documented, so percentiles are an approximation here).

Evaluation ("Evaluating an alarm"): an alarm with a period of a minute or more is
evaluated every minute, at whole minutes, over the periods ending at that minute (a
5-minute period at the end of minute 6 covers minutes 2 to 6); an alarm with a 10 or 30
second period every 10 seconds. The k-th most recent period at evaluation time T is
[T - k*Period, T - (k-1)*Period). A period with no sample is missing. A datapoint
breaches when it compares with Threshold as ComparisonOperator says
(GreaterThanOrEqualToThreshold, GreaterThanThreshold, LessThanThreshold,
LessThanOrEqualToThreshold). The alarm starts in INSUFFICIENT_DATA at `start`.

Missing data ("How alarm state is evaluated when data is missing"): each evaluation
looks at an evaluation range of more periods than EvaluationPeriods (N); AWS documents
the range only by its example (N = 3, range 5), so the range here is N + 2 unless
`evaluation_range` says otherwise. Then, with M = DatapointsToAlarm:
1. at least N real datapoints in the range: the N most recent real ones decide
   (ALARM when at least M breach, else OK); TreatMissingData is not used;
2. fewer than N: every real datapoint of the range counts, plus N - (real ones) filled
   datapoints: `breaching` fills breaching ones, `notBreaching` non-breaching ones,
   ALARM when at least M breach, else OK;
3. fewer than N with `missing` or `ignore`: no datapoint at all gives INSUFFICIENT_DATA
   (`missing`) or keeps the state (`ignore`); at least M breaching real ones give ALARM;
   a non-breaching real one gives OK; otherwise (only breaching real ones, fewer than M)
   `missing` goes to ALARM when the oldest breaching one is at least M periods old
   ("Avoiding premature transitions to alarm state"), else INSUFFICIENT_DATA, and
   `ignore` keeps the state.
This reproduces every row of the two tables of the AWS page (3 of 3 and 2 of 3), which
scripts/test_alarms.py checks. Alarms on the AWS/DynamoDB namespace always ignore
missing data, as the page says.

What it does not model
----------------------
Alarm actions (AlarmActions, OKActions, InsufficientDataActions, ActionsEnabled: only
transitions are reported), composite alarms, metric math alarms (`Metrics`: reported as
unsupported), anomaly detection (the LessThanLowerOrGreaterThanUpperThreshold family),
EvaluateLowSampleCountPercentile, the statistics other than the five and pNN (trimmed
mean, winsorized mean, percentile rank, trimmed count and sum, IQM), the delay between a
log line and its metric (EMF ingestion) and between a period's end and its evaluation,
late datapoints that change an already evaluated period, the evaluation range of other
sizes than the documented example (see above), the retention and aggregation of old
data, EMF timestamps too far in the past or future, unit conversion, metric streams,
and the time limits on Period x EvaluationPeriods.

CLI: `python3 scripts/alarms.py --param AlarmTopicArn=arn:... --emf relay.log` prints
{"alarms": {LogicalId: {config, transitions, final_state}}, "emf": {...}}; see --help.
"""
from __future__ import annotations

import argparse
import bisect
import datetime as _dt
import json
import math
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Iterable

OK = "OK"
ALARM = "ALARM"
INSUFFICIENT_DATA = "INSUFFICIENT_DATA"

TREATMENTS = ("missing", "notBreaching", "breaching", "ignore")
STATISTICS = ("SampleCount", "Sum", "Average", "Minimum", "Maximum")
COMPARISONS = {
    "GreaterThanOrEqualToThreshold": lambda v, t: v >= t,
    "GreaterThanThreshold": lambda v, t: v > t,
    "LessThanThreshold": lambda v, t: v < t,
    "LessThanOrEqualToThreshold": lambda v, t: v <= t,
}
DEFAULT_PSEUDO = {
    "AWS::StackName": "stack",
    "AWS::StackId": "arn:aws:cloudformation:us-east-1:123456789012:stack/stack/00000000-0000-0000-0000-000000000000",
    "AWS::Region": "us-east-1",
    "AWS::AccountId": "123456789012",
    "AWS::Partition": "aws",
    "AWS::URLSuffix": "amazonaws.com",
    "AWS::NotificationARNs": [],
}


class AlarmError(Exception):
    """A template, document or alarm this evaluator cannot handle."""


# ---------------------------------------------------------------------------------------
# Template


class _NoValue:
    """AWS::NoValue: the property (or list element) is dropped."""


NO_VALUE = _NoValue()


def _cfn_loader():
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    def construct(loader, suffix, node):
        name = "Ref" if suffix == "Ref" else ("Condition" if suffix == "Condition" else f"Fn::{suffix}")
        if isinstance(node, yaml.ScalarNode):
            value = loader.construct_scalar(node)
            if suffix == "GetAtt":
                value = value.split(".", 1)
        elif isinstance(node, yaml.SequenceNode):
            value = loader.construct_sequence(node, deep=True)
        else:
            value = loader.construct_mapping(node, deep=True)
        return {name: value}

    Loader.add_multi_constructor("!", construct)
    return Loader


def load_template(path: str) -> dict:
    """Reads a CloudFormation YAML (or JSON) template, short-form intrinsics included."""
    import yaml

    with open(path, encoding="utf-8") as f:
        return yaml.load(f, Loader=_cfn_loader())  # noqa: S506 (a SafeLoader subclass)


class _Resolver:
    def __init__(self, template, params, resource_names, resource_attrs, pseudo):
        self.t = template
        self.params = {k: v for k, v in (params or {}).items()}
        self.resource_names = dict(resource_names or {})
        self.resource_attrs = dict(resource_attrs or {})
        self.pseudo = {**DEFAULT_PSEUDO, **(pseudo or {})}
        self.conditions: dict[str, bool] = {}
        unknown = set(self.params) - set(template.get("Parameters", {}))
        if unknown:
            raise AlarmError(f"unknown parameters: {sorted(unknown)}")

    def param(self, name):
        spec = self.t.get("Parameters", {}).get(name)
        if spec is None:
            raise AlarmError(f"no parameter {name}")
        if name in self.params:
            value = self.params[name]
        elif "Default" in spec:
            value = spec["Default"]
        else:
            raise AlarmError(f"parameter {name} has no Default: pass it")
        kind = spec.get("Type", "String")
        if kind == "CommaDelimitedList" or kind.startswith("List<"):
            if isinstance(value, list):
                return [str(v) for v in value]
            return [] if value == "" else [v.strip() for v in str(value).split(",")]
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)

    def ref(self, name):
        if name in self.pseudo:
            return self.pseudo[name]
        if name == "AWS::NoValue":
            return NO_VALUE
        if name in self.t.get("Parameters", {}):
            return self.param(name)
        if name in self.t.get("Resources", {}):
            return self.resource_names.get(name, name)
        raise AlarmError(f"Ref to unknown {name}")

    def condition(self, name):
        if name not in self.conditions:
            spec = self.t.get("Conditions", {}).get(name)
            if spec is None:
                raise AlarmError(f"no condition {name}")
            self.conditions[name] = bool(self.resolve(spec))
        return self.conditions[name]

    def sub(self, text, variables):
        def one(m):
            key = m.group(1)
            if key.startswith("!"):
                return "${" + key[1:] + "}"
            if key in variables:
                v = self.resolve(variables[key])
            elif "." in key and key.split(".", 1)[0] in self.t.get("Resources", {}):
                v = self.getatt(*key.split(".", 1))
            else:
                v = self.ref(key)
            if isinstance(v, list):
                raise AlarmError(f"Fn::Sub of the list {key}")
            return str(v)

        return re.sub(r"\$\{([^}]+)\}", one, text)

    def getatt(self, logical, attr):
        key = f"{logical}.{attr}"
        if logical not in self.t.get("Resources", {}):
            raise AlarmError(f"Fn::GetAtt of unknown {logical}")
        return self.resource_attrs.get(key, key)

    def resolve(self, node):
        if isinstance(node, list):
            out = [self.resolve(v) for v in node]
            return [v for v in out if v is not NO_VALUE]
        if not isinstance(node, dict):
            return node
        if len(node) == 1:
            (key, arg), = node.items()
            if key == "Ref":
                return self.ref(arg)
            if key == "Condition" and isinstance(arg, str):
                return self.condition(arg)
            if key == "Fn::If":
                name, yes, no = arg
                return self.resolve(yes if self.condition(name) else no)
            if key == "Fn::Equals":
                a, b = (self.resolve(v) for v in arg)
                return str(a) == str(b) if not isinstance(a, list) else a == b
            if key == "Fn::Not":
                return not self.resolve(arg[0])
            if key == "Fn::And":
                return all(self.resolve(v) for v in arg)
            if key == "Fn::Or":
                return any(self.resolve(v) for v in arg)
            if key == "Fn::Sub":
                if isinstance(arg, str):
                    return self.sub(arg, {})
                return self.sub(arg[0], arg[1])
            if key == "Fn::Join":
                sep, items = arg
                items = self.resolve(items)
                return str(self.resolve(sep)).join(str(v) for v in items)
            if key == "Fn::Select":
                index, items = arg
                return self.resolve(items)[int(self.resolve(index))]
            if key == "Fn::Split":
                sep, text = arg
                return str(self.resolve(text)).split(self.resolve(sep))
            if key == "Fn::GetAtt":
                logical, attr = arg if isinstance(arg, list) else arg.split(".", 1)
                return self.getatt(logical, self.resolve(attr))
            if key == "Fn::FindInMap":
                m, k1, k2 = (self.resolve(v) for v in arg)
                return self.t["Mappings"][m][k1][k2]
            if key.startswith("Fn::"):
                raise AlarmError(f"intrinsic {key} is not modeled")
        out = {}
        for k, v in node.items():
            r = self.resolve(v)
            if r is not NO_VALUE:
                out[k] = r
        return out


@dataclass
class Alarm:
    """One metric alarm, resolved."""

    logical_id: str
    name: str | None
    namespace: str
    metric_name: str
    dimensions: dict[str, str]
    period: int
    evaluation_periods: int
    datapoints_to_alarm: int
    threshold: float
    comparison: str
    treat_missing_data: str = "missing"
    statistic: str | None = None
    extended_statistic: str | None = None
    unit: str | None = None
    description: str | None = None

    def config(self) -> dict:
        return {
            "name": self.name,
            "namespace": self.namespace,
            "metric": self.metric_name,
            "dimensions": self.dimensions,
            "statistic": self.statistic or self.extended_statistic,
            "unit": self.unit,
            "period": self.period,
            "evaluation_periods": self.evaluation_periods,
            "datapoints_to_alarm": self.datapoints_to_alarm,
            "threshold": self.threshold,
            "comparison": self.comparison,
            "treat_missing_data": self.treat_missing_data,
        }


def _number(props, key, logical, kind=float):
    if key not in props:
        raise AlarmError(f"{logical}: no {key}")
    try:
        value = float(props[key])
    except (TypeError, ValueError):
        raise AlarmError(f"{logical}: {key} {props[key]!r} is not a number") from None
    if kind is int:
        if value != int(value):
            raise AlarmError(f"{logical}: {key} {props[key]!r} is not an integer")
        return int(value)
    return value


def alarm_from_properties(logical_id: str, props: dict) -> Alarm:
    """An Alarm from resolved AWS::CloudWatch::Alarm properties (PutMetricAlarm names)."""
    if "Metrics" in props:
        raise AlarmError(f"{logical_id}: metric math alarms (Metrics) are not modeled")
    for key in ("Namespace", "MetricName", "ComparisonOperator"):
        if key not in props:
            raise AlarmError(f"{logical_id}: no {key}")
    comparison = props["ComparisonOperator"]
    if comparison not in COMPARISONS:
        raise AlarmError(f"{logical_id}: ComparisonOperator {comparison} is not modeled")
    statistic = props.get("Statistic")
    extended = props.get("ExtendedStatistic")
    if (statistic is None) == (extended is None):
        raise AlarmError(f"{logical_id}: give exactly one of Statistic and ExtendedStatistic")
    if statistic is not None and statistic not in STATISTICS:
        raise AlarmError(f"{logical_id}: Statistic {statistic} is not one of {STATISTICS}")
    if extended is not None and _percentile(extended) is None:
        raise AlarmError(f"{logical_id}: ExtendedStatistic {extended} is not modeled (only pNN)")
    treat = props.get("TreatMissingData", "missing")
    if treat not in TREATMENTS:
        raise AlarmError(f"{logical_id}: TreatMissingData {treat} is not one of {TREATMENTS}")
    period = _number(props, "Period", logical_id, int)
    if period not in (10, 30) and (period < 60 or period % 60):
        raise AlarmError(f"{logical_id}: Period {period} is not 10, 30 or a multiple of 60")
    n = _number(props, "EvaluationPeriods", logical_id, int)
    m = _number(props, "DatapointsToAlarm", logical_id, int) if "DatapointsToAlarm" in props else n
    if not 1 <= m <= n:
        raise AlarmError(f"{logical_id}: DatapointsToAlarm {m} is not within 1..{n}")
    dims = {}
    for d in props.get("Dimensions", []):
        dims[str(d["Name"])] = str(d["Value"])
    return Alarm(
        logical_id=logical_id,
        name=props.get("AlarmName"),
        namespace=str(props["Namespace"]),
        metric_name=str(props["MetricName"]),
        dimensions=dims,
        period=period,
        evaluation_periods=n,
        datapoints_to_alarm=m,
        threshold=_number(props, "Threshold", logical_id),
        comparison=comparison,
        treat_missing_data=treat,
        statistic=statistic,
        extended_statistic=extended,
        unit=props.get("Unit"),
        description=props.get("AlarmDescription"),
    )


def resolve_alarms(
    template: dict,
    params: dict | None = None,
    resource_names: dict | None = None,
    resource_attrs: dict | None = None,
    pseudo: dict | None = None,
) -> dict[str, Alarm]:
    """The template's metric alarms whose Condition holds, by logical id."""
    r = _Resolver(template, params, resource_names, resource_attrs, pseudo)
    alarms = {}
    for logical, res in template.get("Resources", {}).items():
        if res.get("Type") != "AWS::CloudWatch::Alarm":
            continue
        if "Condition" in res and not r.condition(res["Condition"]):
            continue
        alarms[logical] = alarm_from_properties(logical, r.resolve(res.get("Properties", {})))
    return alarms


# ---------------------------------------------------------------------------------------
# Samples: EMF documents and direct datapoints


@dataclass(frozen=True)
class Sample:
    """One value of one metric at one time (milliseconds since the epoch)."""

    namespace: str
    metric: str
    dimensions: tuple  # sorted (name, value) pairs
    timestamp_ms: int
    value: float
    unit: str | None = None
    storage_resolution: int = 60


@dataclass
class EmfRead:
    """What read_emf found: samples, documents, rejected EMF documents, other lines."""

    samples: list = field(default_factory=list)
    documents: int = 0
    rejected: list = field(default_factory=list)  # (line number, reason)
    other_lines: int = 0


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _emf_samples(doc: dict) -> list:
    aws = doc["_aws"]
    if not isinstance(aws, dict):
        raise ValueError("_aws is not an object")
    ts = aws.get("Timestamp")
    if not isinstance(ts, int) or isinstance(ts, bool):
        raise ValueError("_aws.Timestamp is not an integer (milliseconds)")
    directives = aws.get("CloudWatchMetrics")
    if not isinstance(directives, list):
        raise ValueError("_aws.CloudWatchMetrics is not an array")
    out = []
    for d in directives:
        if not isinstance(d, dict):
            raise ValueError("a MetricDirective is not an object")
        ns = d.get("Namespace")
        if not isinstance(ns, str) or not ns:
            raise ValueError("a MetricDirective has no Namespace")
        sets = d.get("Dimensions")
        if not isinstance(sets, list):
            raise ValueError("Dimensions is not an array")
        metrics = d.get("Metrics")
        if not isinstance(metrics, list) or len(metrics) > 100:
            raise ValueError("Metrics is not an array of at most 100 definitions")
        dimsets = []
        for s in sets:
            if not isinstance(s, list) or len(s) > 30:
                raise ValueError("a DimensionSet is not an array of at most 30 keys")
            dims = []
            for key in s:
                if not isinstance(key, str) or not isinstance(doc.get(key), str):
                    raise ValueError(f"dimension {key!r} has no string value at the root")
                dims.append((key, doc[key]))
            dimsets.append(tuple(sorted(dims)))
        for m in metrics:
            if not isinstance(m, dict) or not isinstance(m.get("Name"), str):
                raise ValueError("a MetricDefinition has no Name")
            name = m["Name"]
            target = doc.get(name)
            if _is_number(target):
                values = [float(target)]
            elif (
                isinstance(target, list)
                and 1 <= len(target) <= 100
                and all(_is_number(v) for v in target)
            ):
                values = [float(v) for v in target]
            else:
                raise ValueError(f"metric {name!r}: the target is not a number or an array of 1 to 100 numbers")
            unit = m.get("Unit")
            resolution = m.get("StorageResolution", 60)
            for dims in dimsets:
                for v in values:
                    out.append(Sample(ns, name, dims, ts, v, unit, resolution))
    return out


def read_emf(lines: Iterable[str]) -> EmfRead:
    """Picks the EMF documents out of log lines and turns them into samples."""
    read = EmfRead()
    for number, line in enumerate(lines, 1):
        start = line.find("{")
        doc = None
        if start >= 0:
            try:
                doc = json.loads(line[start:])
            except ValueError:
                doc = None
        if not (isinstance(doc, dict) and isinstance(doc.get("_aws"), dict) and "CloudWatchMetrics" in doc["_aws"]):
            read.other_lines += 1
            continue
        try:
            samples = _emf_samples(doc)
        except ValueError as e:
            read.rejected.append((number, str(e)))
            continue
        read.documents += 1
        read.samples.extend(samples)
    return read


def parse_time(value) -> int:
    """Milliseconds since the epoch from an integer (milliseconds) or an ISO-8601 string."""
    if _is_number(value):
        return int(value)
    text = str(value).strip()
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    t = _dt.datetime.fromisoformat(text)
    if t.tzinfo is None:
        t = t.replace(tzinfo=_dt.timezone.utc)
    return int(round(t.timestamp() * 1000))


def iso(ms: int) -> str:
    return _dt.datetime.fromtimestamp(ms / 1000, _dt.timezone.utc).isoformat().replace("+00:00", "Z")


def samples_from_records(records: Iterable[dict]) -> list:
    """Samples from direct datapoints: {namespace, metric, dimensions ({name: value} or
    [{Name, Value}]), timestamp (ms or ISO-8601), value (or values: [...]), unit?}."""
    out = []
    for r in records:
        dims = r.get("dimensions") or {}
        if isinstance(dims, list):
            dims = {d["Name"]: d["Value"] for d in dims}
        values = r["values"] if "values" in r else [r["value"]]
        for v in values:
            if not _is_number(v):
                raise AlarmError(f"datapoint value {v!r} is not a number")
            out.append(
                Sample(
                    r["namespace"],
                    r["metric"],
                    tuple(sorted((str(k), str(v2)) for k, v2 in dims.items())),
                    parse_time(r["timestamp"]),
                    float(v),
                    r.get("unit"),
                    int(r.get("storage_resolution", 60)),
                )
            )
    return out


# ---------------------------------------------------------------------------------------
# Statistics and evaluation


def _percentile(name: str):
    m = re.fullmatch(r"p(\d{1,2}(?:\.\d+)?|100)", name or "")
    return float(m.group(1)) if m else None


def statistic(name: str, values: list) -> float | None:
    """CloudWatch's statistic `name` (SampleCount, Sum, Average, Minimum, Maximum, pNN)
    over one period's sample values; None for no sample."""
    if not values:
        return None
    if name == "SampleCount":
        return float(len(values))
    if name == "Sum":
        return float(sum(values))
    if name == "Average":
        return float(sum(values)) / len(values)
    if name == "Minimum":
        return float(min(values))
    if name == "Maximum":
        return float(max(values))
    p = _percentile(name)
    if p is None:
        raise AlarmError(f"statistic {name} is not modeled")
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return float(ordered[rank - 1])


def decide(points: list, n: int, m: int, treat: str, current: str) -> tuple[str, str]:
    """The state an evaluation sets from the evaluation range `points` (oldest first; each
    True for breaching, False for not breaching, None for missing), with N = `n`
    evaluation periods, M = `m` datapoints to alarm, TreatMissingData `treat` and the
    `current` state. Returns (state, reason). See the module docstring for the rules."""
    real = [(len(points) - i, b) for i, b in enumerate(points) if b is not None]  # (age, breaching)
    if len(real) >= n:
        recent = real[-n:]
        breaching = sum(1 for _, b in recent if b)
        state = ALARM if breaching >= m else OK
        return state, f"{breaching} of the {n} most recent datapoints breaching (M = {m})"
    if treat in ("breaching", "notBreaching"):
        fill = n - len(real)
        breaching = sum(1 for _, b in real if b) + (fill if treat == "breaching" else 0)
        state = ALARM if breaching >= m else OK
        return state, (
            f"{len(real)} real datapoints and {fill} filled as {treat}: "
            f"{breaching} breaching (M = {m})"
        )
    if not real:
        if treat == "missing":
            return INSUFFICIENT_DATA, "no datapoint in the evaluation range"
        return current, "no datapoint in the evaluation range: state kept (ignore)"
    breaching = [age for age, b in real if b]
    if len(breaching) >= m:
        return ALARM, f"{len(breaching)} real datapoints breaching (M = {m})"
    if len(breaching) < len(real):
        return OK, f"{len(real)} real datapoints, {len(breaching)} breaching (M = {m})"
    if treat == "missing":
        oldest = max(breaching)
        if oldest >= m:
            return ALARM, (
                f"only breaching datapoints, the oldest {oldest} periods old (>= M = {m})"
            )
        return INSUFFICIENT_DATA, (
            f"only breaching datapoints, the oldest {oldest} periods old (< M = {m})"
        )
    return current, "only breaching datapoints, fewer than M: state kept (ignore)"


@dataclass
class Evaluation:
    """One alarm's replay: every evaluation, the transitions, the final state."""

    alarm: Alarm
    start_ms: int
    end_ms: int
    evaluation_range: int
    evaluations: list = field(default_factory=list)  # dicts: time_ms, values, state, reason
    transitions: list = field(default_factory=list)
    final_state: str = INSUFFICIENT_DATA

    def states(self) -> list:
        return [e["state"] for e in self.evaluations]

    def to_json(self, verbose=False) -> dict:
        out = {
            "config": self.alarm.config(),
            "from": iso(self.start_ms),
            "to": iso(self.end_ms),
            "evaluation_range": self.evaluation_range,
            "transitions": self.transitions,
            "final_state": self.final_state,
        }
        if verbose:
            out["evaluations"] = [
                {"time": iso(e["time_ms"]), **{k: v for k, v in e.items() if k != "time_ms"}}
                for e in self.evaluations
            ]
        return out


def matching_samples(alarm: Alarm, samples: Iterable[Sample]) -> list:
    """The samples of the alarm's metric: namespace, name, the exact dimension set, and
    the alarm's Unit if it names one."""
    dims = tuple(sorted(alarm.dimensions.items()))
    return [
        s
        for s in samples
        if s.namespace == alarm.namespace
        and s.metric == alarm.metric_name
        and s.dimensions == dims
        and (alarm.unit is None or s.unit == alarm.unit)
    ]


def evaluation_step_ms(alarm: Alarm) -> int:
    return 10_000 if alarm.period < 60 else 60_000


def evaluate(
    alarm: Alarm,
    samples: Iterable[Sample],
    start: int | str | None = None,
    end: int | str | None = None,
    evaluation_range: int | None = None,
) -> Evaluation:
    """Replays the alarm over `samples` (all metrics; the alarm picks its own) from `start`
    (default: the whole minute, or 10 s, of the first matching sample) to `end` (default:
    the evaluation just after the last matching sample), evaluating as CloudWatch does."""
    step = evaluation_step_ms(alarm)
    mine = matching_samples(alarm, samples)
    stored = sorted(
        ((s.timestamp_ms - s.timestamp_ms % 60_000 if s.storage_resolution >= 60 else s.timestamp_ms), s.value)
        for s in mine
    )
    times = [t for t, _ in stored]
    if start is None:
        if not stored:
            raise AlarmError(f"{alarm.logical_id}: no datapoint of its metric and no start given")
        start_ms = times[0] - times[0] % step
    else:
        start_ms = parse_time(start)
    if end is None:
        if not stored:
            raise AlarmError(f"{alarm.logical_id}: no datapoint of its metric and no end given")
        end_ms = times[-1] - times[-1] % step + step
    else:
        end_ms = parse_time(end)
    n, m = alarm.evaluation_periods, alarm.datapoints_to_alarm
    size = evaluation_range if evaluation_range is not None else n + 2
    if size < n:
        raise AlarmError(f"evaluation range {size} is shorter than EvaluationPeriods {n}")
    treat = "ignore" if alarm.namespace == "AWS/DynamoDB" else alarm.treat_missing_data
    stat = alarm.statistic or alarm.extended_statistic
    compare = COMPARISONS[alarm.comparison]
    period_ms = alarm.period * 1000
    result = Evaluation(alarm, start_ms, end_ms, size)
    state = INSUFFICIENT_DATA
    # The first evaluation is the first whole step after the alarm exists.
    t = start_ms - start_ms % step + step
    while t <= end_ms:
        values = []
        for k in range(size, 0, -1):
            lo, hi = t - k * period_ms, t - (k - 1) * period_ms
            i, j = bisect.bisect_left(times, lo), bisect.bisect_left(times, hi)
            values.append(statistic(stat, [v for _, v in stored[i:j]]))
        points = [None if v is None else compare(v, alarm.threshold) for v in values]
        new, reason = decide(points, n, m, treat, state)
        result.evaluations.append({"time_ms": t, "values": values, "state": new, "reason": reason})
        if new != state:
            result.transitions.append(
                {"time": iso(t), "time_ms": t, "from": state, "to": new, "reason": reason, "values": values}
            )
            state = new
        t += step
    result.final_state = state
    return result


def evaluate_all(
    alarms: dict,
    samples: list,
    start=None,
    end=None,
    evaluation_range: int | None = None,
) -> dict:
    """evaluate() for each alarm over one timeline (default: the first to the last sample
    of any alarm's metric). An alarm that cannot be evaluated reports its error."""
    if start is None or end is None:
        times = [s.timestamp_ms for a in alarms.values() for s in matching_samples(a, samples)]
        if times:
            step = 60_000
            start = start if start is not None else min(times) - min(times) % step
            end = end if end is not None else max(times) - max(times) % step + step
    out = {}
    for logical, alarm in alarms.items():
        if start is None or end is None:
            out[logical] = {"config": alarm.config(), "error": "no datapoint of any alarm's metric and no --from/--to"}
            continue
        out[logical] = evaluate(alarm, samples, start, end, evaluation_range)
    return out


# ---------------------------------------------------------------------------------------
# CLI


def _pairs(items, what):
    out = {}
    for item in items or []:
        if "=" not in item:
            raise SystemExit(f"{what} {item!r}: expected K=V")
        k, v = item.split("=", 1)
        out[k] = v
    return out


def _read_records(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    text = text.strip()
    if text.startswith("["):
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description="Evaluate the CloudWatch alarms of a CloudFormation template over EMF documents.",
    )
    p.add_argument("--template", default="template.yaml")
    p.add_argument("--param", action="append", metavar="K=V", help="a template parameter")
    p.add_argument("--resource-name", action="append", metavar="LOGICAL=NAME",
                   help="what a Ref to a resource gives (default: its logical id)")
    p.add_argument("--resource-attr", action="append", metavar="LOGICAL.ATTR=VALUE",
                   help="what a Fn::GetAtt gives (default: LOGICAL.ATTR)")
    p.add_argument("--pseudo", action="append", metavar="AWS::X=V", help="a pseudo parameter")
    p.add_argument("--emf", action="append", metavar="FILE",
                   help="log lines with EMF documents ('-' for stdin); repeatable")
    p.add_argument("--datapoints", action="append", metavar="FILE",
                   help="direct datapoints, a JSON array or JSON lines of "
                        "{namespace, metric, dimensions, timestamp, value}")
    p.add_argument("--from", dest="start", help="start (ms since the epoch or ISO-8601)")
    p.add_argument("--to", dest="end", help="end (ms since the epoch or ISO-8601)")
    p.add_argument("--alarm", action="append", metavar="LOGICAL", help="only these alarms")
    p.add_argument("--evaluation-range", type=int, help="periods per evaluation range (default N + 2)")
    p.add_argument("--list", action="store_true", help="print the resolved alarms only")
    p.add_argument("--verbose", action="store_true", help="include every evaluation")
    args = p.parse_args(argv)

    try:
        alarms = resolve_alarms(
            load_template(args.template),
            _pairs(args.param, "--param"),
            _pairs(args.resource_name, "--resource-name"),
            _pairs(args.resource_attr, "--resource-attr"),
            _pairs(args.pseudo, "--pseudo"),
        )
        if args.alarm:
            missing = set(args.alarm) - set(alarms)
            if missing:
                raise AlarmError(f"no such alarm (or its Condition is false): {sorted(missing)}")
            alarms = {k: v for k, v in alarms.items() if k in args.alarm}
        if args.list:
            print(json.dumps({k: a.config() for k, a in alarms.items()}, indent=2))
            return 0
        samples, emf = [], EmfRead()
        for path in args.emf or []:
            f = sys.stdin if path == "-" else open(path, encoding="utf-8")
            with f:
                r = read_emf(f)
            emf.documents += r.documents
            emf.other_lines += r.other_lines
            emf.rejected += [(f"{path}:{n}", why) for n, why in r.rejected]
            samples += r.samples
        for path in args.datapoints or []:
            samples += samples_from_records(_read_records(path))
        results = evaluate_all(alarms, samples, args.start, args.end, args.evaluation_range)
    except (AlarmError, OSError, ValueError, KeyError) as e:
        print(f"alarms: {e}", file=sys.stderr)
        return 2
    print(json.dumps({
        "alarms": {
            k: (v.to_json(args.verbose) if isinstance(v, Evaluation) else v) for k, v in results.items()
        },
        "emf": {
            "documents": emf.documents,
            "samples": len(samples),
            "other_lines": emf.other_lines,
            "rejected": [{"line": n, "reason": why} for n, why in emf.rejected],
        },
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
