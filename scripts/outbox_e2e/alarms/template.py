"""The CloudWatch metric alarms of a CloudFormation template, resolved: short-form
intrinsics, parameters, conditions, pseudo parameters and resource names."""

from __future__ import annotations

import re
from dataclasses import dataclass

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


def percentile_of(name: str):
    """The NN of an ExtendedStatistic pNN or pNN.N; None for anything else."""
    m = re.fullmatch(r"p(\d{1,2}(?:\.\d+)?|100)", name or "")
    return float(m.group(1)) if m else None


class AlarmError(Exception):
    """A template, document or alarm this evaluator cannot handle."""


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
    if extended is not None and percentile_of(extended) is None:
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
