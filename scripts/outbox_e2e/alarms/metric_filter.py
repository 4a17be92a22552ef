"""A CloudWatch Logs metric filter with a JSON filter pattern, over log lines: the
datapoints it would publish.

Source: "Filter pattern syntax for metric filters" (CloudWatch Logs user guide,
https://docs.aws.amazon.com/AmazonCloudWatch/latest/logs/FilterAndPatternSyntaxForMetricFilters.html):
a JSON pattern is `{ SELECTOR OPERATOR VALUE }`, selectors `$.a.b`, string comparisons
`=` and `!=`, joined with `&&` and `||` and grouped with parentheses. Modeled: exactly
that subset, on lines that are JSON objects (other lines never match). Assumed, not in
the guide's text: a comparison whose selector names no field of the event is false,
whichever the operator. Each matching line gives one datapoint of MetricValue at the
line's "time" (RFC 3339) or, without one, at the time given; no DefaultValue (a line
that does not match gives nothing)."""

from __future__ import annotations

import json
import re

from .emf import Sample, parse_time

_TOKEN = re.compile(r'\s*(\(|\)|&&|\|\||!=|=|"[^"]*"|\$[A-Za-z0-9_.]+)')


def _tokens(pattern: str) -> list[str]:
    text = pattern.strip()
    if not (text.startswith("{") and text.endswith("}")):
        raise ValueError(f"not a JSON filter pattern: {pattern!r}")
    body, out, i = text[1:-1], [], 0
    while body[i:].strip():
        m = _TOKEN.match(body, i)
        if not m:
            raise ValueError(f"cannot read {body[i:]!r} in {pattern!r}")
        out.append(m.group(1))
        i = m.end()
    return out


def _field(event, selector: str):
    node = event
    for part in selector[2:].split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def compile_pattern(pattern: str):
    """The pattern as a predicate over a decoded JSON event."""
    toks = _tokens(pattern)
    pos = 0

    def peek():
        return toks[pos] if pos < len(toks) else None

    def take(expected=None):
        nonlocal pos
        tok = peek()
        if tok is None or (expected is not None and tok != expected):
            raise ValueError(f"expected {expected!r} at {tok!r} in {pattern!r}")
        pos += 1
        return tok

    def primary():
        if peek() == "(":
            take("(")
            e = disjunction()
            take(")")
            return e
        selector, op, value = take(), take(), take()
        if not selector.startswith("$.") or op not in ("=", "!=") or not value.startswith('"'):
            raise ValueError(f"unsupported comparison {selector} {op} {value} in {pattern!r}")
        want = value[1:-1]

        def compare(event):
            got = _field(event, selector)
            if got is None:
                return False
            return (str(got) == want) == (op == "=")
        return compare

    def conjunction():
        parts = [primary()]
        while peek() == "&&":
            take("&&")
            parts.append(primary())
        return lambda e: all(p(e) for p in parts)

    def disjunction():
        parts = [conjunction()]
        while peek() == "||":
            take("||")
            parts.append(conjunction())
        return lambda e: any(p(e) for p in parts)

    predicate = disjunction()
    if pos != len(toks):
        raise ValueError(f"trailing {toks[pos:]} in {pattern!r}")
    return predicate


def filter_samples(pattern: str, namespace: str, metric: str, value: float, lines,
                   default_time_ms: int | None = None) -> list:
    """The datapoints the metric filter publishes for `lines`."""
    match = compile_pattern(pattern)
    out = []
    for line in lines:
        try:
            event = json.loads(line)
        except (TypeError, ValueError):
            continue
        if not isinstance(event, dict) or not match(event):
            continue
        t = parse_time(event["time"]) if "time" in event else default_time_ms
        out.append(Sample(namespace, metric, (), t, float(value)))
    return out


# Lambda's application log levels, most detailed first ("Log-level filtering", Lambda
# developer guide: https://docs.aws.amazon.com/lambda/latest/dg/monitoring-cloudwatchlogs-log-level.html).
LOG_LEVELS = ["TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL"]


def lambda_log_level_filter(lines, application_log_level: str) -> list:
    """The function's stdout lines Lambda sends to CloudWatch Logs with LogFormat JSON and
    this ApplicationLogLevel: a line whose JSON object has a "level" key of a known level
    keeps it; any other line (no "level", an invalid one, not JSON) is filed as INFO, as
    the guide says; lines below the configured level are dropped."""
    floor = LOG_LEVELS.index(application_log_level.upper())
    kept = []
    for line in lines:
        level = "INFO"
        try:
            event = json.loads(line)
        except (TypeError, ValueError):
            event = None
        if isinstance(event, dict) and str(event.get("level", "")).upper() in LOG_LEVELS:
            level = str(event["level"]).upper()
        if LOG_LEVELS.index(level) >= floor:
            kept.append(line)
    return kept
