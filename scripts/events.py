#!/usr/bin/env python3
"""EventBridge helper for the local stack and the tests, built on boto3 against
moto's server (the endpoints come from $AWS_ENDPOINT_URL_EVENTBRIDGE and
$AWS_ENDPOINT_URL_SQS, as exported by scripts/stack.sh); the functions are in
scripts/outbox_e2e/events.py.  Run it with the stack's venv python ($OUTBOX_STACK_PYTHON).

Subcommands:
  watch BUS       create the event bus BUS (if missing), an SQS queue, and a
                  rule on BUS matching commit notifications (source
                  dynamo-outbox, detail-type OutboxCommitted) that targets the
                  queue, as the SAM template's rule targets the relay; print
                  the queue URL
  receive URL [--wait S]
                  print every event delivered to the queue so far, one JSON
                  object per line (the event as a Lambda target receives it),
                  and delete them; waits up to S seconds (default 2) for the
                  first one

Exit codes: 0 ok, 1 failure (a message goes to stderr), 2 usage.
"""

from __future__ import annotations

import argparse
import json
import sys

from outbox_e2e import events


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("watch")
    p.add_argument("bus")
    p = sub.add_parser("receive")
    p.add_argument("url")
    p.add_argument("--wait", type=float, default=2.0)
    args = parser.parse_args()
    try:
        if args.command == "watch":
            print(events.watch(args.bus))
        else:
            for event in events.receive(args.url, args.wait):
                print(json.dumps(event, sort_keys=True))
    except Exception as e:  # noqa: BLE001 - one clear line for the test's assertion
        print(f"events.py {args.command}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
