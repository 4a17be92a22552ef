"""The command (scripts/alarms.py): the template's alarms over EMF files and datapoints,
transitions as JSON."""

from __future__ import annotations

import argparse
import json
import sys

from .emf import EmfRead, read_emf, samples_from_records
from .evaluate import Evaluation, evaluate_all
from .template import AlarmError, load_template, resolve_alarms



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
