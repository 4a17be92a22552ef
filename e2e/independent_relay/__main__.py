"""python -m independent_relay (with e2e/ on the path): run one relay until SIGTERM,
SIGINT or --for; see the package docstring."""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys

from . import __doc__ as DOC
from .relay import Misconfiguration, Relay
from .schema import log, parse_duration


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=DOC.split("\n\n")[0])
    ap.add_argument("--relay-id")
    ap.add_argument("--for", dest="run_for", type=parse_duration)
    ap.add_argument("--grace", type=parse_duration, default=10.0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=os.environ.get("INDEPENDENT_RELAY_LOG", "INFO"),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        relay = Relay(dict(os.environ), args.relay_id)
    except (Misconfiguration, KeyError, ValueError) as e:
        print(f"independent relay: {e}", file=sys.stderr)
        return 2
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: relay.stopping.set())
    log.info("relay %s starting on %s (%d buckets)", relay.me, relay.table, relay.n)
    reason, released = relay.run(args.run_for, args.grace)
    rep = dict(relay.report(), stop_reason=reason, released=released)
    print(f"relay {relay.me} stopped ({reason}): published {relay.published}, refused "
          f"writes {rep['refused_writes']}, leases released: {str(released).lower()}")
    print("report: " + json.dumps(rep, sort_keys=True), flush=True)
    return 2 if reason == "misconfiguration" else 0


if __name__ == "__main__":
    sys.exit(main())
