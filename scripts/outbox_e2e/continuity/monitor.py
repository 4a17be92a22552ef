"""The monitor of a continuity scenario: the coordination partition and each bucket's
head sampled every few hundred milliseconds (the owner gaps), and the idle fleet's first
owner timed to one read (the package docstring)."""

from __future__ import annotations

import collections
import threading
import time

import boto3

from ..items import BUCKET_COUNT as BUCKETS

UNIX_EPOCH_TICKS = 621355968000000000
TICKS_PER_SECOND = 10_000_000


def now_ticks(t: float) -> int:
    return UNIX_EPOCH_TICKS + int(t * TICKS_PER_SECOND)


def r3(x):
    return None if x is None else round(x, 3)


def live_owners(items: list[dict], now: int, lease_ticks: int) -> tuple[set, dict]:
    """The active relays of a coordination read and the live owner of each bucket (the
    rules in the module docstring)."""
    active = set()
    for i in items:
        sk = i["SK"]["S"]
        if not sk.startswith("RELAY#") or "StoppedAtUtc" in i:
            continue
        try:
            seen = int(i["LastSeenUtc"]["N"])
        except (KeyError, ValueError):
            continue
        if seen <= now + lease_ticks and now - seen < lease_ticks:
            active.add(sk[len("RELAY#"):])
    owner = {}
    for i in items:
        sk = i["SK"]["S"]
        if not sk.startswith("LEASE#") or "Owner" not in i:
            continue
        try:
            expires = int(i["ExpiresAtUtc"]["N"])
        except (KeyError, ValueError):
            expires = 0
        b = int(sk[len("LEASE#"):])
        if b < BUCKETS and expires > now and i["Owner"]["S"] in active:
            owner[b] = i["Owner"]["S"]
    return active, owner


def first_change(reads: list[tuple[float, float, bool]]) -> tuple[float, float] | None:
    """When a condition a series of reads watched first held: after the start of the last
    read before it that did not show it, before the end of the first that did (a
    strongly consistent read sees every write completed before it started)."""
    prev_start = None
    for start, end, seen in reads:
        if seen:
            return (prev_start if prev_start is not None else start, end)
        prev_start = start
    return None


class FirstOwnerWatch(threading.Thread):
    """The idle fleet's first owner, timed to within one read (the monitor's sample is
    nine reads): reads the coordination partition, one strongly consistent read after
    another, until every bucket has had a live owner (or it is stopped).  Watching the
    buckets' heads as closely too was tried: eight more readers slowed DynamoDB Local
    (the first doorbell reached the function 1.08-1.19 s after the first commit's start
    in three 3,000 bursts, against 0.51-0.81 s in six without them) and knew a message's
    arrival no better than the first commit's own start and return do."""

    def __init__(self, monitor: "Monitor"):
        super().__init__(daemon=True)
        self.monitor = monitor
        self.reads: list[tuple[float, float, set]] = []  # (start, end, owned buckets)
        self.stop_flag = threading.Event()

    def run(self) -> None:
        seen: set = set()
        while not self.stop_flag.is_set() and len(seen) < BUCKETS:
            t0 = time.time()
            try:
                items = self.monitor.coordination()
            except Exception:  # a lost read only widens the window
                items = None
            if items is not None:
                _, owner = live_owners(items, now_ticks(t0), self.monitor.lease_ticks)
                self.reads.append((t0, time.time(), set(owner)))
                seen |= set(owner)
            self.stop_flag.wait(0.02)

    def stop(self) -> None:
        self.stop_flag.set()
        self.join(timeout=10)

    def figures(self, first_start: float, first_sent: float, first_return: float,
                first_buckets: set) -> dict:
        """Bounds of the longest time a bucket had a message and no owner before its
        first owner.  A bucket's first message became visible after the first commit's
        request left the client (botocore's before-send: serialized and signed); the
        first commit's buckets had theirs before that commit returned.  So the longest
        such time is at most (the last bucket's first claim landed, at the latest) -
        (the first commit's request sent), and at least (a first commit's bucket's
        first claim landed, at the earliest, the latest of them) - (the first commit's
        return).  Times are also given from the first commit's start (the call), the
        zero of every other figure of the run."""
        landed = {}
        for b in range(BUCKETS):
            w = first_change([(s, e, b in o) for s, e, o in self.reads])
            if w is not None:
                landed[b] = w
        if not landed:
            return {"buckets": 0, "reads": len(self.reads)}
        return {
            "buckets": len(landed), "reads": len(self.reads),
            "longest_without_owner_s": {
                "at_least": r3(max([0.0] + [lo - first_return for b, (lo, _) in landed.items()
                                            if b in first_buckets])),
                "at_most": r3(max(hi for _, hi in landed.values()) - first_sent)},
            "first_commit_buckets": sorted(first_buckets),
            "first_commit_sent_after_s": r3(first_sent - first_start),
            "first_commit_returned_after_s": r3(first_return - first_start),
            "last_first_claim_after_s": r3(max(hi for _, hi in landed.values()) - first_start),
            "claim_window_s": r3(max(hi - lo for lo, hi in landed.values())),
        }


class Monitor(threading.Thread):
    """Samples the coordination partition and the head of each message partition."""

    def __init__(self, table: str, prefix: str, lease_s: float, interval: float):
        super().__init__(daemon=True)
        self.table, self.prefix = table, prefix
        self.lease_ticks = int(lease_s * TICKS_PER_SECOND)
        self.interval = interval
        self.client = boto3.client("dynamodb")
        self.samples: list[dict] = []
        self.errors = 0
        self.stop_flag = threading.Event()

    def coordination(self) -> list[dict]:
        items, start = [], None
        while True:
            kw = dict(TableName=self.table, ConsistentRead=True,
                      KeyConditionExpression="PK = :pk",
                      ExpressionAttributeValues={":pk": {"S": f"{self.prefix}#COORDINATION"}})
            if start:
                kw["ExclusiveStartKey"] = start
            out = self.client.query(**kw)
            items += out["Items"]
            start = out.get("LastEvaluatedKey")
            if not start:
                return items

    def head(self, bucket: int) -> str | None:
        out = self.client.query(
            TableName=self.table, ConsistentRead=True, Limit=1,
            KeyConditionExpression="PK = :pk", ProjectionExpression="SK",
            ExpressionAttributeValues={":pk": {"S": f"{self.prefix}#MESSAGES#{bucket}"}})
        return out["Items"][0]["SK"]["S"] if out["Items"] else None

    def sample(self) -> dict:
        t = time.time()
        active, owner = live_owners(self.coordination(), now_ticks(t), self.lease_ticks)
        heads = [self.head(b) for b in range(BUCKETS)]
        return {"t": t, "t_end": time.time(), "owner": owner, "heads": heads,
                "active": sorted(active)}

    def run(self) -> None:
        while not self.stop_flag.is_set():
            began = time.time()
            try:
                self.samples.append(self.sample())
            except Exception:  # counted; a lost sample only lowers the resolution
                self.errors += 1
            self.stop_flag.wait(max(0.0, self.interval - (time.time() - began)))

    def stop(self) -> None:
        self.stop_flag.set()
        self.join(timeout=10)

    def latest(self) -> dict | None:
        return self.samples[-1] if self.samples else None

    def empty_since(self, after: float) -> float | None:
        """The time of the first sample of the trailing run in which every bucket was
        empty, counting only samples begun after `after` (the last commit); None when
        there is none or the latest sample saw a message."""
        when = None
        for s in reversed(list(self.samples)):
            if s["t"] <= after or any(h is not None for h in s["heads"]):
                break
            when = s["t"]
        return when

    @staticmethod
    def moved_on(a: str | None, b: str | None) -> bool:
        """A bucket's head moved on from `a` to `b` (sort keys of the same width): a
        message of it was deleted, so published.  A head that moves back is a commit that
        landed after a later one of another writer (sequences are reserved before the
        commit), not progress."""
        return a is not None and (b is None or b > a)

    def first_progress_after(self, t0: float) -> float | None:
        """The first sample after t0 at which some bucket's head moved on (a message of
        it was deleted, so published) compared with the sample before it."""
        prev = None
        for s in self.samples:
            if prev is not None and s["t"] > t0:
                for a, b in zip(prev["heads"], s["heads"]):
                    if self.moved_on(a, b):
                        return s["t"]
            prev = s
        return None

    def progress_between(self, t0: float, t1: float) -> int:
        """Samples in [t0, t1] at which a bucket's head moved on from the sample before."""
        prev, moved = None, 0
        for s in self.samples:
            if prev is not None and t0 <= prev["t"] and s["t"] <= t1:
                moved += sum(1 for a, b in zip(prev["heads"], s["heads"])
                             if self.moved_on(a, b))
            prev = s
        return moved

    def gaps(self, since: float) -> dict:
        """Per bucket, the intervals (from the sample at `since` on) with a message and no
        live owner; split into those before the bucket's first owner and the others."""
        samples = [s for s in self.samples if s["t"] >= since]
        gaps = []
        for b in range(BUCKETS):
            open_at, owned_before = None, False
            for s in samples:
                uncovered = s["heads"][b] is not None and b not in s["owner"]
                if uncovered and open_at is None:
                    open_at = (s["t"], owned_before)
                elif not uncovered and open_at is not None:
                    gaps.append({"bucket": b, "start": open_at[0], "end": s["t"],
                                 "s": s["t"] - open_at[0], "after_first_owner": open_at[1]})
                    open_at = None
                if b in s["owner"]:
                    owned_before = True
            if open_at is not None and samples:
                gaps.append({"bucket": b, "start": open_at[0], "end": samples[-1]["t"],
                             "s": samples[-1]["t"] - open_at[0],
                             "after_first_owner": open_at[1], "open_at_end": True})
        periods = [s2["t"] - s1["t"] for s1, s2 in zip(samples, samples[1:])]
        edges = [0.5, 1, 2, 5, 10, 30]

        def hist(xs):
            out = collections.OrderedDict()
            lo = 0.0
            for e in edges + [float("inf")]:
                label = f"{lo:g}-{e:g}s" if e != float("inf") else f">={lo:g}s"
                out[label] = sum(1 for x in xs if lo <= x < e)
                lo = e
            return out

        handover = [g for g in gaps if g["after_first_owner"]]
        initial = [g for g in gaps if not g["after_first_owner"]]
        top = sorted(gaps, key=lambda g: -g["s"])[:10]
        return {
            "samples": len(samples), "sample_errors": self.errors,
            "sample_period_s": {"median": r3(sorted(periods)[len(periods) // 2]) if periods
                                else None, "max": r3(max(periods)) if periods else None},
            "max_gap_s": r3(max((g["s"] for g in gaps), default=0.0)),
            "max_gap_after_first_owner_s": r3(max((g["s"] for g in handover), default=0.0)),
            "max_gap_before_first_owner_s": r3(max((g["s"] for g in initial), default=0.0)),
            "gaps": len(gaps), "gaps_after_first_owner": len(handover),
            "histogram": hist([g["s"] for g in gaps]),
            "histogram_after_first_owner": hist([g["s"] for g in handover]),
            "longest": [{"bucket": g["bucket"], "start_s": r3(g["start"] - since),
                         "s": r3(g["s"]), "after_first_owner": g["after_first_owner"],
                         **({"open_at_end": True} if g.get("open_at_end") else {})}
                        for g in top],
        }
