"""The relay: rounds and conditional writes (docs/protocol.md section 4), moving messages
(section 5), the graceful stop (section 6)."""
from __future__ import annotations

import dataclasses
import random
import socket
import threading
import time
import uuid

from .plan import compute_plan, rank_order
from .schema import (BATCH_BYTES, DELETES_PER_REQUEST, HANDOVER_STEP, HANDOVER_WATCH,
                     JOIN_DELAY, MAX_GAP_PROBES, MAX_REFETCHES, SILENT_HEARTBEAT_STALE_LEASES,
                     STOP_RELEASE_PASSES, TICKS_PER_SECOND, TOPIC_RE, BadItem,
                     decode_headers, kafka_partition, log, now_ticks, parse_duration)


def num(item: dict, name: str):
    """A numeric attribute as int (a whole number), float (a fraction) or None."""
    v = item.get(name)
    if not v or "N" not in v:
        return None
    text = v["N"]
    try:
        return int(text)
    except ValueError:
        return float(text)


@dataclasses.dataclass
class Held:
    expiry: int
    valid_mono: float  # monotonic instant at which the lease ends


@dataclasses.dataclass
class BucketState:
    last_removed: int | None = None
    next_probe: float = 0.0
    full: bool = False
    head_only: bool = False


class Misconfiguration(Exception):
    pass


class Relay:
    def __init__(self, env: dict, relay_id: str | None = None):
        import boto3
        from botocore.config import Config
        from confluent_kafka import Producer
        self.table = env["OUTBOX_TABLE_NAME"]
        self.n = int(env.get("OUTBOX_BUCKET_COUNT", "8"))
        self.prefix = env.get("OUTBOX_KEY_PREFIX", "OUTBOX")
        self.pk = env.get("OUTBOX_PARTITION_KEY_ATTRIBUTE", "PK")
        self.sk = env.get("OUTBOX_SORT_KEY_ATTRIBUTE", "SK")
        self.me = relay_id or env.get("OUTBOX_RELAY_ID") or (
            f"{socket.gethostname()}-py-{uuid.uuid4().hex[:8]}")
        self.lease = parse_duration(env.get("OUTBOX_LEASE_DURATION", "30s"))
        self.renew = parse_duration(env.get("OUTBOX_LEASE_RENEW_INTERVAL", "10s"))
        self.poll = parse_duration(env.get("OUTBOX_POLL_INTERVAL", "1s"))
        self.backoff = parse_duration(env.get("OUTBOX_ERROR_BACKOFF", "1s"))
        self.batch_size = int(env.get("OUTBOX_BATCH_SIZE", "500"))
        self.publish_timeout = parse_duration(env.get("KAFKA_PUBLISH_TIMEOUT", "20s"))
        self.id_header = env.get("OUTBOX_MESSAGE_ID_HEADER", "x-outbox-message-id")
        if not 1 <= len(self.me) <= 128 or any(ord(c) < 32 or ord(c) == 127 for c in self.me):
            raise Misconfiguration(f"bad relay id {self.me!r}")
        if self.renew >= self.lease:
            raise Misconfiguration("the renew interval must be below the lease duration")
        self.d_ticks = int(self.lease * TICKS_PER_SECOND)
        self.coord_pk = f"{self.prefix}#COORDINATION"
        self.ddb = boto3.client("dynamodb", config=Config(
            connect_timeout=2, read_timeout=5, retries={"max_attempts": 3, "mode": "standard"}))
        self.producer = Producer({
            "bootstrap.servers": env["KAFKA_BOOTSTRAP_SERVERS"],
            "client.id": f"independent-relay-{self.me}", "enable.idempotence": True,
            "acks": "all", "linger.ms": 5,
            "message.timeout.ms": int(self.publish_timeout * 1000)})
        self.stopping = threading.Event()
        self.held: dict[int, Held] = {}
        self.buckets: dict[int, BucketState] = {}
        self.partitions: dict[str, tuple[float, int]] = {}
        self.refused: dict[str, int] = {}
        self.published = 0
        self.lost_leases = 0
        self.rounds = 0
        self.claim_holds = 0
        self.errors = 0
        self.heartbeats_deleted = 0
        self.gap_probes = self.gaps_filled = 0
        self.max_held = 0
        self.first_round = True
        self.next_round = 0.0

    # ---- DynamoDB helpers

    def key(self, pk: str, sk: str) -> dict:
        return {self.pk: {"S": pk}, self.sk: {"S": sk}}

    def conditional(self, kind: str, sk: str, update: str, cond: str, names: dict,
                    values: dict, shows_write) -> bool | None:
        """One conditional UpdateItem of section 4.5; False when refused (counted), None
        when the request failed (no answer: it may still land)."""
        args = dict(TableName=self.table, Key=self.key(self.coord_pk, sk),
                    UpdateExpression=update, ConditionExpression=cond,
                    ExpressionAttributeNames=names,
                    ReturnValuesOnConditionCheckFailure="ALL_OLD")
        if values:
            args["ExpressionAttributeValues"] = values
        try:
            self.ddb.update_item(**args)
            return True
        except self.ddb.exceptions.ConditionalCheckFailedException as e:
            old = e.response.get("Item")
            if old is not None and shows_write(old):
                return True  # an SDK retry of a request whose first attempt landed
            self.refused[kind] = self.refused.get(kind, 0) + 1
            log.warning("refused %s on %s (item now %s)", kind, sk, old)
            return False
        except Exception as e:  # throttled, timed out: not a refusal
            self.errors += 1
            log.warning("%s on %s failed: %s", kind, sk, e)
            return None

    def read_coordination(self) -> list[dict]:
        items, start = [], None
        while True:
            args = dict(TableName=self.table, ConsistentRead=True,
                        KeyConditionExpression="#pk = :pk",
                        ExpressionAttributeNames={"#pk": self.pk},
                        ExpressionAttributeValues={":pk": {"S": self.coord_pk}})
            if start:
                args["ExclusiveStartKey"] = start
            page = self.ddb.query(**args)
            items += page.get("Items", [])
            start = page.get("LastEvaluatedKey")
            if not start:
                return items

    # ---- 4.5, the writes

    def heartbeat(self, now: int, stop: bool = False) -> bool:
        if stop:
            update = "SET #ls = :now, #st = :now"
        else:
            update = "SET #ls = :now REMOVE #st, #sa"
        names = {"#ls": "LastSeenUtc", "#st": "StoppedAtUtc"}
        if not stop:
            names["#sa"] = "StopsAtUtc"
        return self.conditional(
            "stop_stamp" if stop else "heartbeat", f"RELAY#{self.me}", update,
            "attribute_not_exists(#ls) OR #ls < :now", names, {":now": {"N": str(now)}},
            lambda old: num(old, "LastSeenUtc") == now and (
                not stop or num(old, "StoppedAtUtc") == now))

    def expiry_guard(self, read) -> tuple[str, dict]:
        """The version part of renew / release conditions (4.5, incl. non-whole expiries)."""
        if isinstance(read, int):
            return "#ex = :read", {":read": {"N": str(read)}}
        if isinstance(read, float):
            return ("(attribute_not_exists(#ex) OR NOT attribute_type(#ex, :ntype) OR "
                    "#ex <= :read)", {":read": {"N": repr(read)}, ":ntype": {"S": "N"}})
        return "(attribute_not_exists(#ex) OR NOT attribute_type(#ex, :ntype))", {
            ":ntype": {"S": "N"}}

    def renew_lease(self, b: int, read, lapsed: bool, new_expiry: int) -> bool:
        guard, values = self.expiry_guard(read)
        cond = "#ow = :me AND " + guard
        if not lapsed:
            cond += " AND #ex > :sent"
            values[":sent"] = {"N": str(now_ticks())}
        values.update({":me": {"S": self.me}, ":new": {"N": str(new_expiry)}})
        return self.conditional(
            "take_back" if lapsed else "renew", f"LEASE#{b:010d}", "SET #ex = :new", cond,
            {"#ow": "Owner", "#ex": "ExpiresAtUtc"}, values,
            lambda old: old.get("Owner", {}).get("S") == self.me
            and num(old, "ExpiresAtUtc") == new_expiry)

    def release_lease(self, b: int, read=None, at_stop: bool = False) -> bool:
        names, values = {"#ow": "Owner"}, {":me": {"S": self.me}}
        cond = "#ow = :me"
        if not at_stop:
            guard, extra = self.expiry_guard(read)
            cond += " AND " + guard
            names["#ex"] = "ExpiresAtUtc"
            values.update(extra)
        return self.conditional(
            "stop_release" if at_stop else "release", f"LEASE#{b:010d}", "REMOVE #ow", cond,
            names, values, lambda old: "Owner" not in old and (
                at_stop or num(old, "ExpiresAtUtc") == read))

    def claim_lease(self, b: int, now: int, new_expiry: int) -> bool:
        return self.conditional(
            "claim", f"LEASE#{b:010d}", "SET #ow = :me, #ex = :new",
            "attribute_not_exists(#ow) OR attribute_not_exists(#ex) OR "
            "NOT attribute_type(#ex, :ntype) OR #ex <= :now",
            {"#ow": "Owner", "#ex": "ExpiresAtUtc"},
            {":me": {"S": self.me}, ":new": {"N": str(new_expiry)}, ":now": {"N": str(now)},
             ":ntype": {"S": "N"}},
            lambda old: old.get("Owner", {}).get("S") == self.me
            and num(old, "ExpiresAtUtc") == new_expiry)

    def delete_stale_heartbeat(self, relay: str, read) -> None:
        cond = ("attribute_not_exists(#sk) OR attribute_not_exists(#ls) OR "
                "NOT attribute_type(#ls, :ntype)")
        values = {":ntype": {"S": "N"}}
        if read is not None:
            cond += " OR #ls <= :read"
            values[":read"] = {"N": str(read)}
        try:
            self.ddb.delete_item(TableName=self.table, Key=self.key(self.coord_pk,
                                                                    f"RELAY#{relay}"),
                                 ConditionExpression=cond, ExpressionAttributeValues=values,
                                 ExpressionAttributeNames={"#sk": self.sk, "#ls": "LastSeenUtc"})
            self.heartbeats_deleted += 1
        except self.ddb.exceptions.ConditionalCheckFailedException:
            self.refused["delete_heartbeat"] = self.refused.get("delete_heartbeat", 0) + 1
            log.warning("refused delete of the heartbeat of %s", relay)
        except Exception as e:
            self.errors += 1
            log.warning("delete of the heartbeat of %s failed: %s", relay, e)

    # ---- 4.1, a round

    def parse_read(self, items: list[dict]) -> tuple[dict, dict]:
        leases, beats = {}, {}
        for it in items:
            sk = it[self.sk]["S"]
            if sk.startswith("LEASE#") and sk[6:].isdigit():
                leases[int(sk[6:])] = it
            elif sk.startswith("RELAY#"):
                beats[sk[6:]] = it
        return leases, beats

    def round(self) -> None:
        self.rounds += 1
        mono_start = time.monotonic()
        hb_ok = self.heartbeat(now_ticks()) is True  # else: renew, release, claim nothing
        if self.first_round:
            self.first_round = False
            self.stopping.wait(min(JOIN_DELAY, self.renew / 4))
        mono = time.monotonic()
        now = now_ticks()
        leases, beats = self.parse_read(self.read_coordination())
        d = self.d_ticks
        active, stale, stamped = {self.me}, [], set()
        for rid, it in beats.items():
            seen, stopped = num(it, "LastSeenUtc"), num(it, "StoppedAtUtc")
            if isinstance(seen, int) and stopped is None and now - d < seen <= now + d:
                active.add(rid)
            if stopped is not None and now - stopped < HANDOVER_WATCH * TICKS_PER_SECOND:
                stamped.add(rid)
            if rid != self.me and isinstance(seen, int) and (
                    (stopped is not None and now - stopped >= d)
                    or (stopped is None and now - seen >= SILENT_HEARTBEAT_STALE_LEASES * d)):
                stale.append((rid, seen))
        view, expiries = {}, {}
        for b, it in leases.items():
            if b >= self.n:
                continue
            owner = it.get("Owner", {}).get("S")
            ex = num(it, "ExpiresAtUtc")
            expiries[b] = ex
            view[b] = (owner, not isinstance(ex, int) or ex <= now)
        for b in list(self.held):
            if view.get(b, (None, True))[0] != self.me:
                log.warning("lost the lease of bucket %d", b)
                self.lost_leases += 1
                self.drop(b)
        plan = compute_plan(self.n, active, view, self.me)
        new_expiry = now + d
        for b in plan.keep:
            if isinstance(expiries[b], (int, float)) and new_expiry <= expiries[b]:
                log.warning("clock behind the expiry of bucket %d: no renewal", b)
                continue
            landed = self.renew_lease(b, expiries[b], view[b][1], new_expiry)
            if landed:
                self.take(b, new_expiry, mono)
            elif landed is False:
                self.drop(b)
        for b in plan.release:
            self.drop(b)
            self.release_lease(b, expiries[b])
        releasing = any(view[b][0] in stamped and not view[b][1] for b in view
                        if view[b][0] != self.me)
        if plan.claim and (not hb_ok or releasing):
            self.claim_holds += 1
            log.info("claims held back (heartbeat landed: %s, peer releasing: %s)",
                     hb_ok, releasing)
        elif plan.claim:
            for b in plan.claim:
                if self.claim_lease(b, now, new_expiry):
                    self.take(b, new_expiry, mono)
        self.next_round = mono_start + self.renew
        if releasing:
            self.next_round = min(self.next_round, time.monotonic() + HANDOVER_STEP)
        if rank_order(active)[0] == self.me:
            for rid, seen in stale:
                self.delete_stale_heartbeat(rid, seen)
        self.max_held = max(self.max_held, len(self.held))

    def take(self, b: int, expiry: int, mono: float) -> None:
        if b not in self.held:
            self.buckets[b] = BucketState()  # last removed: none since it took the bucket
        self.held[b] = Held(expiry, mono + self.lease)

    def drop(self, b: int) -> None:
        self.held.pop(b, None)
        self.buckets.pop(b, None)

    # ---- 5, moving messages

    def remaining(self, b: int) -> float:
        """Seconds of validity left on both clocks."""
        h = self.held[b]
        return min(h.valid_mono - time.monotonic(),
                   (h.expiry - now_ticks()) / TICKS_PER_SECOND)

    def query_bucket(self, b: int, limit: int, consistent: bool, lo: int | None = None,
                     hi: int | None = None, count: bool = False, start=None) -> dict:
        names, values = {"#pk": self.pk}, {":pk": {"S": f"{self.prefix}#MESSAGES#{b}"}}
        cond = "#pk = :pk"
        if lo is not None:
            cond += " AND #sk BETWEEN :lo AND :hi"
            names["#sk"] = self.sk
            values.update({":lo": {"S": f"{lo:019d}"}, ":hi": {"S": f"{hi:019d}"}})
        args = dict(TableName=self.table, KeyConditionExpression=cond, Limit=limit,
                    ConsistentRead=consistent, ScanIndexForward=True,
                    ExpressionAttributeNames=names, ExpressionAttributeValues=values)
        if count:
            args["Select"] = "COUNT"
        if start:
            args["ExclusiveStartKey"] = start
        return self.ddb.query(**args)

    def fetch(self, b: int, limit: int) -> list[dict]:
        """Up to `limit` messages in sequence order, strongly consistent, within the
        byte budget (at least one item)."""
        items, size, start = [], 0, None
        while len(items) < limit:
            page = self.query_bucket(b, limit - len(items), True, start=start)
            for it in page.get("Items", []):
                size += sum(len(v.get("B", b"")) + len(v.get("S", "")) for v in it.values())
                if items and size > BATCH_BYTES:
                    return items
                items.append(it)
            start = page.get("LastEvaluatedKey")
            if not start:
                break
        return items

    def fetch_with_gaps(self, b: int, st: BucketState) -> list[dict]:
        limit = 1 if st.head_only else self.batch_size
        for attempt in range(MAX_REFETCHES + 1):
            items = self.fetch(b, limit)
            st.full = len(items) >= limit and not st.head_only
            prev = st.last_removed if st.last_removed is not None else 0
            gaps = []
            for idx, it in enumerate(items):
                seq = int(it[self.sk]["S"])
                if seq > prev + 1:
                    gaps.append((prev + 1, seq - 1, idx))
                prev = max(prev, seq)
            filled = None
            for gi, (lo, hi, idx) in enumerate(gaps):
                if gi >= MAX_GAP_PROBES:
                    return items[:idx]  # never past a gap it did not probe
                self.gap_probes += 1
                if self.query_bucket(b, 1, True, lo, hi, count=True)["Count"] > 0:
                    self.gaps_filled += 1
                    filled = idx
                    break
            if filled is None:
                return items
            if attempt == MAX_REFETCHES:
                return items[:filled]
        return []

    def partition_count(self, topic: str) -> int | None:
        cached = self.partitions.get(topic)
        if cached and time.monotonic() - cached[0] < 30:
            return cached[1]
        md = self.producer.list_topics(topic, timeout=5).topics.get(topic)
        if md is None or md.error is not None or not md.partitions:
            return None
        self.partitions[topic] = (time.monotonic(), len(md.partitions))
        return len(md.partitions)

    def record_of(self, it: dict, sticky: dict) -> tuple:
        try:
            mid, topic = it["MessageId"]["S"], it["Topic"]["S"]
        except KeyError:
            raise BadItem("MessageId or Topic missing or not a string") from None
        bc = num(it, "BucketCount")
        if bc is not None and bc != self.n:
            raise Misconfiguration(f"{it[self.sk]['S']} is stamped with {bc} buckets, "
                                   f"this relay has {self.n}")
        if not TOPIC_RE.match(topic) or topic in (".", ".."):
            raise BadItem(f"bad topic {topic!r}")
        key = it["Key"]["B"] if "Key" in it else None
        value = it["Value"]["B"] if "Value" in it else None
        try:
            headers = decode_headers(it["Headers"]["B"]) if "Headers" in it else []
        except BadItem as e:
            raise BadItem(f"bad header blob: {e}") from None
        part = num(it, "Partition")
        if part is not None and (not isinstance(part, int) or part < 0):
            raise BadItem(f"bad Partition {part}")
        count = self.partition_count(topic)
        if count is None:
            raise BadItem(f"topic {topic} unknown")
        p = kafka_partition(key, part, count, sticky.setdefault(topic, random.randrange(count)))
        if p is None:
            raise BadItem(f"partition {part} not in {topic} ({count} partitions)")
        return topic, key, value, headers + [(self.id_header, mid.encode())], p

    def publish(self, items: list[dict], deadline: float) -> tuple[int, bool]:
        """Publishes in order; returns (acknowledged prefix length, whether all went)."""
        sticky, records = {}, []
        failed = False
        for it in items:
            try:
                records.append(self.record_of(it, sticky))
            except BadItem as e:
                log.error("bucket stops at %s: %s", it[self.sk]["S"], e)
                failed = True
                break
        acks: list = [None] * len(records)
        for i, (topic, key, value, headers, p) in enumerate(records):
            def done(err, _msg, i=i):
                acks[i] = err is None
                if err is not None:
                    log.warning("publish failed: %s", err)
            self.producer.produce(topic, value=value, key=key, headers=headers, partition=p,
                                  on_delivery=done)
        while any(a is None for a in acks) and time.monotonic() < deadline:
            self.producer.poll(min(0.05, max(0.0, deadline - time.monotonic())))
        prefix = 0
        while prefix < len(acks) and acks[prefix]:
            prefix += 1
        return prefix, prefix == len(items) and not failed

    def delete(self, b: int, st: BucketState, items: list[dict], deadline: float) -> int:
        done = 0
        for i in range(0, len(items), DELETES_PER_REQUEST):
            chunk = items[i:i + DELETES_PER_REQUEST]
            todo = [{"DeleteRequest": {"Key": {self.pk: it[self.pk], self.sk: it[self.sk]}}}
                    for it in chunk]
            pause = 0.05
            while todo:
                if time.monotonic() > deadline:
                    return done
                out = self.ddb.batch_write_item(RequestItems={self.table: todo})
                todo = out.get("UnprocessedItems", {}).get(self.table, [])
                if todo:
                    time.sleep(pause)
                    pause = min(pause * 2, 1.0)
            done += len(chunk)
            st.last_removed = max(st.last_removed or 0, int(chunk[-1][self.sk]["S"]))
        return done

    def work_bucket(self, b: int) -> bool:
        """One batch of a bucket; True when it moved messages or should go on at once."""
        st = self.buckets[b]
        mono = time.monotonic()
        if self.remaining(b) <= self.renew or mono < st.next_probe:
            return False
        if not st.full and not st.head_only:
            st.next_probe = mono + self.poll
            if not self.query_bucket(b, 1, False).get("Items"):
                return False
        items = self.fetch_with_gaps(b, st)
        if not items:
            return False
        mono = time.monotonic()
        left = self.remaining(b)
        publish_end = mono + min(left - self.renew, self.publish_timeout)
        delete_end = mono + left - self.renew + self.renew / 4
        acked, all_went = self.publish(items, publish_end)
        self.published += acked
        deleted = self.delete(b, st, items[:acked], delete_end)
        if not all_went or deleted < acked:
            st.head_only, st.full = True, False
            st.next_probe = time.monotonic() + self.backoff
            return False
        st.head_only = False
        return True

    # ---- the run and section 6, the graceful stop

    def run(self, run_for: float | None, grace: float) -> tuple[str, bool]:
        deadline = time.monotonic() + run_for if run_for else None
        reason = "signal"
        try:
            while not self.stopping.is_set():
                if deadline and time.monotonic() >= deadline:
                    reason = "deadline"
                    break
                if time.monotonic() >= self.next_round:
                    try:
                        self.round()
                    except Misconfiguration:
                        raise
                    except Exception as e:
                        self.errors += 1
                        log.warning("round failed: %s", e)
                        self.next_round = time.monotonic() + self.backoff
                busy = False
                for b in sorted(self.held):
                    if self.stopping.is_set() or time.monotonic() >= self.next_round:
                        break
                    try:
                        busy |= self.work_bucket(b)
                    except (Misconfiguration, KeyboardInterrupt):
                        raise
                    except Exception as e:
                        self.errors += 1
                        log.warning("batch of bucket %d failed: %s", b, e)
                        if b in self.buckets:
                            self.buckets[b].head_only = True
                            self.buckets[b].next_probe = time.monotonic() + self.backoff
                if not busy:
                    waits = [self.next_round] + [s.next_probe for s in self.buckets.values()]
                    self.stopping.wait(max(0.01, min(min(waits) - time.monotonic(), 0.2)))
        except Misconfiguration as e:
            log.error("misconfiguration: %s", e)
            reason = "misconfiguration"
        return reason, self.stop(time.monotonic() + grace)

    def stop(self, until: float) -> bool:
        self.producer.flush(max(0.0, min(2.0, until - time.monotonic())))
        if not self.heartbeat(now_ticks(), stop=True):
            return False  # refused (or failed): release nothing, the leases lapse
        for b in sorted(self.held):
            self.drop(b)
            self.release_lease(b, at_stop=True)
        for _ in range(STOP_RELEASE_PASSES):
            if time.monotonic() >= until:
                return False
            try:
                leases, _ = self.parse_read(self.read_coordination())
                named = [b for b, it in leases.items()
                         if b < self.n and it.get("Owner", {}).get("S") == self.me]
                if not named:
                    return True
                for b in named:
                    self.release_lease(b, at_stop=True)
            except Exception as e:
                log.warning("stop read failed: %s", e)
        return False

    def report(self) -> dict:
        return {"relay_id": self.me, "published": self.published,
                "refused_writes": sum(self.refused.values()), "refused": dict(self.refused),
                "lost_leases": self.lost_leases, "rounds": self.rounds,
                "claim_holds": self.claim_holds, "errors": self.errors,
                "heartbeats_deleted": self.heartbeats_deleted, "gap_probes": self.gap_probes,
                "gaps_filled": self.gaps_filled,
                "max_buckets_held": self.max_held}
