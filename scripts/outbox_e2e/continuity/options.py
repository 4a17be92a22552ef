"""The settings of the continuity scenarios, with their defaults (scripts/continuity_e2e.py
has one option per field; the suite's tests set those of scripts/test.sh)."""

from __future__ import annotations

from dataclasses import dataclass

from ..emulator import MEMORY_MB


@dataclass
class Options:
    relay_binary: str = ""          # the relay function's binary (a debug build)
    enqueue_binary: str = ""        # the enqueue function's (bus)
    outboxctl: str = ""             # the always-on relay of the burst's comparison
    relay_timeout: float = 30.0     # the relay function's timeout (the template's is 70)
    memory: int = MEMORY_MB         # the relay's memory, MB (the template's is 128)
    cpu_share: bool = False         # the relay gets memory/1769 of one CPU, as on Lambda
    relay_concurrency: int = 5      # the emulator's ceiling on relay environments
    shards: int = 4                 # the stream mapping's virtual shards (DynamoDB Local has 1)
    messages: int | None = None     # burst size (burst 3000, outage 1000)
    value_bytes: int = 1000
    keys: int = 64
    writers: int = 8
    lease_seconds: float = 30.0     # the relays' lease duration (the library's default)
    monitor_interval: float = 0.2
    wait: float = 900.0             # longest drain, seconds
    no_compare: bool = False        # burst: skip the always-on comparison
    always_on_only: bool = False    # burst: only the always-on run
    outage_seconds: float = 60.0
    cut_before: bool = False        # outage: Kafka refuses from just before the burst
    stuck_age: float = 60.0         # stuck: StuckMessageAgeSeconds (the template's is 300)
    tick_seconds: float = 30.0      # stuck: the schedule's period (the template's is 300)
    bus: str = "default"            # bus: the EventBusName parameter
    commits: int = 5                # bus: enqueue calls, one message each
    spacing: float = 10.0           # bus: seconds between them
    notify_anyway: bool = False     # bus: wire the bus whatever the template says


def missed_goals(result: dict) -> list[str]:
    """The goals (figures, not correctness checks) a scenario's result missed."""
    return [k for k, v in result.get("goals", {}).items() if not v]
