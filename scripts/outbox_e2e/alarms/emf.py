"""Samples: from the EMF documents in log lines ("Specification: Embedded metric format")
and from datapoints given directly."""

from __future__ import annotations

import datetime as _dt
import json
import math
import re
from dataclasses import dataclass, field
from typing import Iterable

from .template import AlarmError

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
