"""A stream mapping's settings: explicit flags over the template's mapping over Lambda's
defaults (the package docstring, "Settings")."""

from __future__ import annotations

import json

from .. import cfn_template
from .filters import prefix_pattern
from .records import StreamError

def template_settings(args) -> tuple[dict, list[dict] | None, str]:
    """The mapping's settings read from --template (function --function), the filter
    patterns, and the mapping's logical id."""
    try:
        tpl = cfn_template.Template(args.template, cfn_template.parse_params(args.param))
        mapping = tpl.stream_mapping(args.function)
    except cfn_template.TemplateError as e:
        raise StreamError(f"--template: {e}") from e
    if mapping is None:
        raise StreamError(f"--template: {args.function} has no DynamoDB stream event source mapping with "
            f"these parameters (its Condition is false, or it has none)")
    settings = {}
    for key, attr, conv in (("BatchSize", "batch_size", int),
                            ("MaximumBatchingWindowInSeconds", "window", float),
                            ("MaximumRecordAgeInSeconds", "max_record_age", float),
                            ("MaximumRetryAttempts", "max_retries", int),
                            ("BisectBatchOnFunctionError", "bisect",
                             lambda v: str(v).lower() == "true"),
                            ("StartingPosition", "starting_position", str)):
        if key in mapping:
            settings[attr] = conv(mapping[key])
    patterns = None
    filters = (mapping.get("FilterCriteria") or {}).get("Filters")
    if filters:
        patterns = []
        for f in filters:
            pat = f.get("Pattern")
            patterns.append(json.loads(pat) if isinstance(pat, str) else pat)
    return settings, patterns, mapping["LogicalId"]


DEFAULTS = {"batch_size": 100, "window": 0.0, "max_record_age": -1.0, "max_retries": -1,
            "bisect": False, "starting_position": "LATEST"}


def effective_settings(args) -> dict:
    """Explicit flags over the template's mapping over Lambda's defaults; sets the
    attributes of args and returns where each came from."""
    from_template, patterns, mapping_id = ({}, None, None)
    if args.template:
        from_template, patterns, mapping_id = template_settings(args)
    source = {}
    for attr, default in DEFAULTS.items():
        if getattr(args, attr) is not None:
            source[attr] = "flag"
        elif attr in from_template:
            setattr(args, attr, from_template[attr])
            source[attr] = f"template:{mapping_id}"
        else:
            setattr(args, attr, default)
            source[attr] = "default"
    if args.filter_prefix is not None:
        args.patterns = [prefix_pattern(args.filter_prefix, args.key_attribute or "PK")]
        source["filter"] = "flag"
    elif patterns:
        args.patterns = patterns
        source["filter"] = f"template:{mapping_id}"
    else:
        args.patterns = None
        source["filter"] = "none"
    return {"batch_size": args.batch_size, "window_s": args.window,
            "max_record_age_s": args.max_record_age, "max_retries": args.max_retries,
            "bisect": args.bisect, "starting_position": args.starting_position,
            "filter_patterns": args.patterns, "shards": args.shards,
            "mapping": mapping_id, "source": source}
