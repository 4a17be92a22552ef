#!/usr/bin/env python3
"""Continuity of the serverless relay, end to end under the Lambda emulator with the real
relay binary: a backlog larger than one invocation (burst), a drain while Kafka refuses
connections (outage), a poison head in a quiet period (stuck), the wake-ups of a commit
when an event bus is also configured (bus).

  scripts/stack.sh run -- $PY scripts/continuity_e2e.py --scenario burst|outage|bus|stuck [options]

The end-to-end suite runs each scenario with scripts/test.sh's settings
(e2e/test_continuity.py); this command runs one with any settings, for the figures of
BENCHMARKS.md.  What each scenario does, checks and measures: the docstring of
scripts/outbox_e2e/continuity/__init__.py.

Prints one line per step on stderr, then the figures as one JSON document on stdout (after
the line "RESULT"); exits 1 naming the failed check (logs kept), 2 on usage.  Every process
it started is stopped, also on failure or SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time

from outbox_e2e.continuity.options import Options, missed_goals
from outbox_e2e.continuity.rig import WARM_PER_THREAD, WARM_THREADS, warm_dynamodb
from outbox_e2e.continuity.scenarios import SCENARIOS
from outbox_e2e.emulator import MEMORY_MB
from outbox_e2e.paths import target_dir
from outbox_e2e.procs import Started
from outbox_e2e.report import Failed, log_to_stderr, step
from outbox_e2e.stack import NotInStack, Stack

TARGET = os.path.join(target_dir(), "debug")
DEFAULTS = Options()


class Interrupted(Exception):
    pass


def interrupt_on_signals() -> None:
    """SIGTERM and SIGINT raise Interrupted, so that the cleanup stops what was started."""
    def on_signal(signum, _frame):
        raise Interrupted(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="See the module docstring for what each scenario checks.")
    p.add_argument("--scenario", choices=["burst", "outage", "bus", "stuck"], required=True)
    p.add_argument("--relay-binary", default=os.path.join(TARGET, "outbox-relay-function"))
    p.add_argument("--enqueue-binary", default=os.path.join(TARGET, "outbox-enqueue-function"))
    p.add_argument("--outboxctl", default=os.path.join(TARGET, "outboxctl"))
    p.add_argument("--warm", action="store_true",
                   help=f"serve DynamoDB Local {WARM_THREADS * WARM_PER_THREAD} "
                   "transactions of 99 items before the scenario (its JVM is cold in a "
                   "fresh stack; DynamoDB has no warm-up)")
    p.add_argument("--relay-timeout", type=float, default=DEFAULTS.relay_timeout,
                   help="the relay function's timeout, seconds (default 30; the template's "
                        "RelayTimeout is 70)")
    p.add_argument("--memory", type=int, default=DEFAULTS.memory,
                   help=f"the relay's memory, MB (default {MEMORY_MB}; the template's "
                   "RelayMemorySize is 128)")
    p.add_argument("--cpu-share", action="store_true",
                   help="the relay gets --memory/1769 of one CPU, as on Lambda "
                   "(lambda_runtime.py --cpu-share)")
    p.add_argument("--relay-concurrency", type=int, default=DEFAULTS.relay_concurrency,
                   help="the emulator's ceiling on relay environments (default 5)")
    p.add_argument("--shards", type=int, default=DEFAULTS.shards,
                   help="the stream mapping's virtual shards (default 4; DynamoDB Local has 1)")
    p.add_argument("--messages", type=int, help="burst size (burst 3000, outage 1000)")
    p.add_argument("--value-bytes", type=int, default=DEFAULTS.value_bytes)
    p.add_argument("--keys", type=int, default=DEFAULTS.keys)
    p.add_argument("--writers", type=int, default=DEFAULTS.writers)
    p.add_argument("--lease-seconds", type=float, default=DEFAULTS.lease_seconds,
                   help="the relays' lease duration (the library's default, 30)")
    p.add_argument("--monitor-interval", type=float, default=DEFAULTS.monitor_interval)
    p.add_argument("--wait", type=float, default=DEFAULTS.wait, help="longest drain, seconds")
    p.add_argument("--no-compare", action="store_true",
                   help="burst: skip the always-on comparison")
    p.add_argument("--always-on-only", action="store_true",
                   help="burst: only the always-on run (for a comparison in a fresh stack: "
                        "DynamoDB Local slows down after a large burst's deletes)")
    p.add_argument("--outage-seconds", type=float, default=DEFAULTS.outage_seconds)
    p.add_argument("--cut-before", action="store_true",
                   help="outage: Kafka refuses from just before the burst (deterministic: "
                        "no race with a fast drain), not from the first message published")
    p.add_argument("--stuck-age", type=float, default=DEFAULTS.stuck_age,
                   help="stuck: the StuckMessageAgeSeconds parameter (default 60; the "
                        "template's is 300)")
    p.add_argument("--tick-seconds", type=float, default=DEFAULTS.tick_seconds,
                   help="stuck: the schedule's period (default 30; the template's is 300)")
    p.add_argument("--bus", default=DEFAULTS.bus, help="bus: the EventBusName parameter")
    p.add_argument("--commits", type=int, default=DEFAULTS.commits)
    p.add_argument("--spacing", type=float, default=DEFAULTS.spacing)
    p.add_argument("--notify-anyway", action="store_true",
                   help="bus: wire the bus whatever the template says (must fail)")
    p.add_argument("--enforce-goals", action="store_true",
                   help="exit 1 when a goal (not a correctness check) is missed")
    p.add_argument("--keep", action="store_true",
                   help="keep the work directory (the relay's log with each line's arrival "
                   "time is RelayFunction.timed.log there)")
    args = p.parse_args()
    if args.messages is None:
        args.messages = 1000 if args.scenario == "outage" else 3000
    need = [args.relay_binary] + ([args.enqueue_binary] if args.scenario == "bus" else []) + \
        ([args.outboxctl] if args.scenario == "burst" and not args.no_compare else [])
    for b in need:
        if not os.access(b, os.X_OK):
            p.error(f"no executable {b}")
    try:
        Stack.from_env()
    except NotInStack as e:
        p.error(str(e))
    log_to_stderr("continuity-e2e")
    interrupt_on_signals()
    workdir = tempfile.mkdtemp(prefix="outbox-continuity-e2e.")
    started = Started()
    ok = False
    t0 = time.time()
    if args.warm:
        took = warm_dynamodb()
        step(f"DynamoDB Local warmed: {WARM_THREADS * WARM_PER_THREAD} transactions of 99 "
             f"items in {took:.1f}s")
    try:
        result = SCENARIOS[args.scenario](args, workdir, started)
        result["wall_s"] = round(time.time() - t0, 3)
        result["command"] = " ".join(sys.argv)
        print("RESULT")
        print(json.dumps(result, indent=1, default=str))
        missed = missed_goals(result)
        step(f"ok in {time.time() - t0:.0f}s; goals missed: {missed or 'none'}")
        ok = True
        if missed and args.enforce_goals:
            step(f"FAILED: goals missed (--enforce-goals): {missed}")
            return 1
        return 0
    except (Failed, Interrupted) as e:
        kind = "interrupted" if isinstance(e, Interrupted) else "FAILED"
        step(f"{kind}: {e}")
        tails = started.tails()
        if tails:
            step(tails)
        return 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        started.stop_all()
        if ok and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            step(f"logs kept in {workdir}")


if __name__ == "__main__":
    sys.exit(main())
