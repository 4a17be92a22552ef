"""The successor through the table's stream, end to end: the relay binary under the Lambda
emulator with the template's relay environment (OUTBOX_SUCCESSOR=stream), the stream
mapping with the template's RelayDoorbell settings over four virtual shards, and Kafka
refusing (the stack's broker behind a proxy slot) so that the first run ends with work
left and writes a continuation item.

A continuation's shard is set by its key's hash, not by its writer: it may run at once
beside the leaver (another shard) or only after the shard's current invocation (the
leaver's own doorbell shard). The emulator numbers its request ids, so the first run's
relay id, and with it its continuation's key, is known in advance; the key prefix is
chosen so that the continuation lands where each case needs it. Both must hand the backlog
over: every message in Kafka in per-key order, the table empty, its leases released,
0 refused writes.

The third case starts the chain from a schedule tick instead of a doorbell (the messages
are committed before the mapping starts reading, so no doorbell rings): the tick checks
coverage first (no live relay: it joins), its run leaves work and writes a continuation,
and a later tick that comes while that run holds every bucket answers `covered` instead of
adding a relay."""

from __future__ import annotations

import json
import os
import time

import pytest

from outbox_e2e import dynamodb
from outbox_e2e.continuity.fault_proxy import SlotKafka
from outbox_e2e.continuity.options import Options
from outbox_e2e.continuity.rig import (check_delivery, check_invocations, check_table_clean,
                                       fresh_outbox, invocations, start_poller, start_relay,
                                       stop_poller, wait_relay_quiet)
from outbox_e2e.items import bucket_of, direct_write
from outbox_e2e.report import check, step
from outbox_e2e.serverless import SCHEDULE_PAYLOAD
from outbox_e2e.streams.poller import virtual_shard

SHARDS = 4
RELAY_TIMEOUT = 40.0  # runs long enough to start a successor (twice the lead) after a slow decision
KEY = "customer-7"
FIRST_RELAY = "RelayFunction-00000000-0000-4000-8000-000000000001"


def continuation_pk(prefix: str, relay_id: str) -> str:
    return f"{prefix}#CONTINUATION#{relay_id}"


def shard_of(pk: str) -> int:
    return virtual_shard({"S": pk}, SHARDS)


def prefix_where(same_shard: bool) -> str:
    """A key prefix under which the first run's continuation lands on the shard of KEY's
    message partition (same_shard) or on another one."""
    bucket = bucket_of(KEY.encode())
    for i in range(1000):
        prefix = f"SHOP{i}"
        message_shard = shard_of(f"{prefix}#MESSAGES#{bucket}")
        if (shard_of(continuation_pk(prefix, FIRST_RELAY)) == message_shard) == same_shard:
            return prefix
    raise AssertionError("no prefix found")


def continuations(table: str, prefix: str) -> list[dict]:
    return [i for i in dynamodb.scan(table)
            if i["PK"]["S"].startswith(f"{prefix}#CONTINUATION#")]


def wait_for(what: str, cond, timeout: float):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout:g}s")


@pytest.fixture
def rig(stack, debug_binaries, started, tmp_path):
    """Starts the pieces: rig(prefix, extra_args) -> (broker, relay, table, business, topic).
    The mapping is started by the test (start_mapping)."""
    opts = Options(relay_binary=debug_binaries["relay"], relay_timeout=RELAY_TIMEOUT)

    def make(prefix: str, extra_args: list[str] | None = None):
        broker = SlotKafka()
        started.append(broker)
        table, business, topic, prefix = fresh_outbox(stream=True, bootstrap=broker.bootstrap,
                                                      prefix=prefix)
        relay, _ = start_relay(opts, str(tmp_path), started, table, prefix, broker.bootstrap,
                               extra_args=["--sequential-request-ids", *(extra_args or [])])
        return broker, relay, table, business, topic

    def start_mapping(relay, table, prefix):
        return start_poller(relay, table, prefix, str(tmp_path), started, RELAY_TIMEOUT,
                            SHARDS)

    make.start_mapping = start_mapping
    make.started = started
    return make


def commit(table: str, business: str, prefix: str, topic: str, n: int) -> list[dict]:
    msgs = [{"key": KEY, "value": f"order-{i}", "headers": [], "n": i} for i in range(n)]
    return direct_write(table, business, prefix, topic, msgs, order_id="orders")


def hand_over(broker, table: str, prefix: str) -> dict:
    """Waits for the first continuation, then lets Kafka through; returns the item."""
    items = wait_for("a continuation item", lambda: continuations(table, prefix),
                     RELAY_TIMEOUT + 10)
    broker.proxy.pass_()
    step(f"continuation {items[0]['PK']['S']} / {items[0]['SK']['S']} written; Kafka back")
    return items[0]


def settle(relay, poller, started, table: str, prefix: str, topic: str, sent, broker):
    wait_for("the table drained", lambda: not any(
        i["PK"]["S"].startswith(f"{prefix}#MESSAGES#") for i in dynamodb.scan(table)), 120)
    wait_relay_quiet(relay, poller, RELAY_TIMEOUT + 60)
    stop_poller(poller, started)
    invs = invocations(relay)
    check_invocations(invs, {"doorbell", "successor", "direct"}, schedule=True)
    check_delivery(topic, sent, broker.bootstrap)
    check_table_clean(table, prefix)
    return invs


@pytest.mark.parametrize("same_shard", [False, True], ids=["beside", "behind"])
def test_a_continuation_starts_the_successor_on_whichever_shard_it_lands(rig, same_shard):
    prefix = prefix_where(same_shard)
    broker, relay, table, business, topic = rig(prefix)
    poller = rig.start_mapping(relay, table, prefix)
    broker.proxy.refuse()
    sent = commit(table, business, prefix, topic, 5)
    bucket = sent[0]["bucket"]
    step(f"prefix {prefix}: bucket {bucket}'s messages on shard "
         f"{shard_of(f'{prefix}#MESSAGES#{bucket}')}, the first run's continuation on "
         f"{shard_of(continuation_pk(prefix, FIRST_RELAY))}; Kafka refusing")
    item = hand_over(broker, table, prefix)
    check(item["PK"]["S"] == continuation_pk(prefix, FIRST_RELAY),
          f"the first run's continuation: {item}")
    invs = settle(relay, poller, rig.started, table, prefix, topic, sent, broker)

    by_id = {s["relay_id"]: (inv, s) for inv, s in invs}
    first_inv, first = by_id[FIRST_RELAY]
    check(first["trigger"] == "doorbell" and first["successor_started"],
          f"the first run, woken by the doorbell, left work and started its successor: {first}")
    successors = [(inv, s) for inv, s in invs if s["trigger"] == "successor"]
    check(len(successors) >= 1, f"no successor ran: {[s for _, s in invs]}")
    succ_inv, succ = successors[0]
    # The mapping delivered the continuation on the shard its key hashes to.
    batches = [b for b in poller.batches()
               if b.get("status") == 200 and not b.get("function_error")]
    check(any(b["shard"] == f"shard-{shard_of(item['PK']['S'])}" for b in batches),
          f"no batch on the continuation's shard: {batches}")
    if same_shard:
        check(succ_inv["start"] >= first_inv["end"],
              f"the successor ran before the leaver's invocation ended on their shard: "
              f"{succ_inv['start']} < {first_inv['end']}")
    else:
        check(succ_inv["start"] < first_inv["end"],
              f"the successor did not run beside the leaver: started {succ_inv['start']}, "
              f"the leaver ended {first_inv['end']}")
    step(f"successor {succ['relay_id'][-12:]} started "
         f"{succ_inv['start'] - first_inv['end']:+.1f}s from the leaver's end, published "
         f"{succ['published']}")


def test_a_tick_started_run_hands_over_through_a_continuation(rig):
    prefix = "SHOPTICK"
    tick = ["--schedule", "8", "--schedule-offset", "4",
            "--schedule-payload", json.dumps(SCHEDULE_PAYLOAD)]
    broker, relay, table, business, topic = rig(prefix, tick)
    broker.proxy.refuse()
    # Committed before the mapping reads (it starts at LATEST): no doorbell rings for them.
    sent = commit(table, business, prefix, topic, 5)
    poller = rig.start_mapping(relay, table, prefix)
    step("5 messages committed before the mapping started; Kafka refusing; ticks every 8s")
    hand_over(broker, table, prefix)
    invs = settle(relay, poller, rig.started, table, prefix, topic, sent, broker)

    runs = [(inv, s) for inv, s in invs
            if s["stop_reason"] not in ("covered", "empty", "not_this_outbox")]
    first_inv, first = runs[0]
    check(first_inv["source"] == "schedule" and first["successor_started"],
          f"the first run, started by a tick, left work and wrote its continuation: {first}")
    items = continuations(table, prefix)
    check(any(i["PK"]["S"] == continuation_pk(prefix, first["relay_id"]) for i in items),
          f"no continuation of {first['relay_id']}: {items}")
    check(any(s["trigger"] == "successor" for _, s in invs),
          f"no successor ran: {[s['trigger'] for _, s in invs]}")
    # A tick while that run held every bucket (its first round done, its stop still far)
    # adds no relay.
    during = [s for inv, s in invs if inv["source"] == "schedule"
              and first_inv["start"] + 4 <= inv["received"] <= first_inv["end"] - 6]
    check(during and all(s["stop_reason"] == "covered" for s in during),
          f"ticks during the first run: {[s['stop_reason'] for s in during]}")
