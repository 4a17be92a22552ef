"""Lambda's event filtering ("Control which events Lambda sends to your function",
https://docs.aws.amazon.com/lambda/latest/dg/invocation-eventfiltering.html) for the
patterns of a stream mapping's FilterCriteria."""

from __future__ import annotations


def match_pattern(pattern: dict, event) -> bool:
    """Lambda's event filtering for one filter pattern (JSON): every key of the
    pattern must match; a list of values matches when one of them does."""
    for key, rule in pattern.items():
        present = isinstance(event, dict) and key in event
        value = event.get(key) if present else None
        if isinstance(rule, dict):
            if not present or not isinstance(value, dict) or not match_pattern(rule, value):
                return False
        elif isinstance(rule, list):
            if not any(match_value(r, present, value) for r in rule):
                return False
        else:
            raise ValueError(f"filter pattern: {key} must be an object or a list")
    return True


def match_value(rule, present: bool, value) -> bool:
    if isinstance(rule, dict):
        if "exists" in rule:
            return present == bool(rule["exists"])
        if not present:
            return False
        if "prefix" in rule:
            return isinstance(value, str) and value.startswith(rule["prefix"])
        if "suffix" in rule:
            return isinstance(value, str) and value.endswith(rule["suffix"])
        if "equals-ignore-case" in rule:
            return isinstance(value, str) and value.lower() == str(
                rule["equals-ignore-case"]).lower()
        if "anything-but" in rule:
            but = rule["anything-but"]
            if isinstance(but, dict) and "prefix" in but:
                return not (isinstance(value, str) and value.startswith(but["prefix"]))
            but = but if isinstance(but, list) else [but]
            return value not in but
        if "numeric" in rule:
            try:
                x = float(value)
            except (TypeError, ValueError):
                return False
            ops = rule["numeric"]
            checks = {"=": x.__eq__, "<": x.__lt__, "<=": x.__le__, ">": x.__gt__,
                      ">=": x.__ge__}
            return all(checks[ops[i]](float(ops[i + 1])) for i in range(0, len(ops), 2))
        raise ValueError(f"filter pattern: unsupported rule {rule}")
    if not present:
        return False
    if isinstance(value, list):
        return rule in value
    return value == rule


def prefix_pattern(prefix: str, key_attribute: str) -> dict:
    """The template's filter: INSERTs whose partition key begins with PREFIX."""
    return {"eventName": ["INSERT"],
            "dynamodb": {"Keys": {key_attribute: {"S": [{"prefix": prefix}]}}}}


def make_keep(patterns: list[dict] | None):
    """A record is kept when one of the patterns matches (no patterns: every record)."""
    if not patterns:
        return lambda rec: True
    return lambda rec: any(match_pattern(p, rec) for p in patterns)


def make_filter(prefix: str | None, key_attribute: str):
    """The template's filter criteria: {"eventName": ["INSERT"], "dynamodb": {"Keys":
    {PK: {"S": [{"prefix": PREFIX}]}}}}; None keeps everything."""
    if prefix is None:
        return lambda rec: True
    return make_keep([prefix_pattern(prefix, key_attribute)])

