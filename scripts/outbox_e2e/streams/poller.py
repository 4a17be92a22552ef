"""The event source mapping: every shard read independently of the invocations, the kept
records routed to virtual shards, each an in-order pipeline that invokes one batch at a
time with Lambda's batching, record age, retry and bisect rules (the package docstring)."""

from __future__ import annotations

import collections
import hashlib
import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request

from .filters import make_keep
from .records import clients, lambda_record, list_shards, say, stream_arn
from .settings import effective_settings

EVENT_LIMIT = 6 * 1024 * 1024  # Lambda's synchronous payload limit
RETENTION_S = 24 * 3600  # DynamoDB Streams keeps a record for 24 hours



def virtual_shard(key: dict | None, shards: int) -> int:
    """The virtual shard of a record whose partition key has the attribute value `key`
    (`{"S": "..."}`): MD5 of its JSON, mod `shards`; one key always goes to one shard, as
    DynamoDB keeps the items of a partition key in one shard."""
    digest = hashlib.md5(json.dumps(key, sort_keys=True).encode()).digest()
    return int.from_bytes(digest[:8], "big") % shards

class VirtualShard:
    """One in-order, one-batch-at-a-time pipeline: the records routed to it, in the
    order they were read, each with the monotonic time it was first read."""

    def __init__(self, index: int):
        self.index = index
        self.name = f"shard-{index}"
        self.queue: collections.deque = collections.deque()  # (read_at, record, size)
        self.cond = threading.Condition()


class Poller:
    def __init__(self, args):
        self.args = args
        self.ddb, self.streams = clients()
        self.arn, desc = stream_arn(self.ddb, args.table, with_description=True)
        hash_keys = [k["AttributeName"] for k in desc.get("KeySchema", [])
                     if k["KeyType"] == "HASH"]
        self.partition_key = args.key_attribute or (hash_keys[0] if hash_keys else "PK")
        self.keep = make_keep(args.patterns)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.c = {
            "batches": 0, "records": 0, "records_read": 0, "records_filtered_out": 0,
            "invoke_errors": 0, "function_errors": 0, "throttles": 0, "retries": 0,
            "throttle_retries": 0, "bisects": 0, "expired_records": 0,
            "dropped_batches": 0, "dropped_records": 0, "buffered_unsent": 0,
            "in_flight_batches": 0, "peak_in_flight_batches": 0, "get_records_calls": 0,
            "shards_seen": 0, "shards_finished": 0, "virtual_shards": args.shards,
        }
        self.known: dict[str, dict] = {}  # shard id -> {"parent", "state"}
        self.readers: list[threading.Thread] = []
        self.vshards = [VirtualShard(i) for i in range(args.shards)]
        self.pipelines: list[threading.Thread] = []
        self.batch_log = open(args.batch_log, "a", buffering=1) if args.batch_log else None
        self.max_age = args.max_record_age if args.max_record_age >= 0 else RETENTION_S

    def count(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.c[key] += n

    # ---------------------------------------------------------------- reading

    def start(self) -> None:
        initial = self.args.starting_position
        pending = []
        for shard in list_shards(self.streams, self.arn):
            sid = shard["ShardId"]
            closed = "EndingSequenceNumber" in shard.get("SequenceNumberRange", {})
            self.known[sid] = {"parent": shard.get("ParentShardId"), "state": "new"}
            self.count("shards_seen")
            if closed and initial == "LATEST":
                self.known[sid]["state"] = "done"  # nothing after LATEST in a closed shard
                self.count("shards_finished")
            else:
                pending.append(sid)
        for vs in self.vshards:
            t = threading.Thread(target=self.pipeline_loop, args=(vs,), daemon=True)
            self.pipelines.append(t)
            t.start()
        for sid in pending:
            it = self.streams.get_shard_iterator(StreamArn=self.arn, ShardId=sid,
                                                 ShardIteratorType=initial)["ShardIterator"]
            self.launch(sid, it)
        threading.Thread(target=self.discover_loop, daemon=True).start()
        if self.args.ready_file:
            tmp = f"{self.args.ready_file}.tmp{os.getpid()}"
            with open(tmp, "w") as f:
                json.dump({"stream_arn": self.arn, "shards": len(pending),
                           "settings": self.args.settings}, f)
            os.replace(tmp, self.args.ready_file)
        a = self.args
        say(f"ready: {self.arn}, {len(pending)} shard(s) from {initial} into {a.shards} "
            f"virtual shard(s); batch {a.batch_size}, window {a.window:g}s, record age "
            f"{a.max_record_age:g}s, retries {a.max_retries}, bisect {a.bisect}; invoking "
            f"{a.invoke}")

    def launch(self, sid: str, iterator: str) -> None:
        self.known[sid]["state"] = "reading"
        t = threading.Thread(target=self.shard_reader, args=(sid, iterator), daemon=True)
        self.readers.append(t)
        t.start()

    def discover_loop(self) -> None:
        while not self.stop.wait(self.args.discover_interval):
            try:
                shards = list_shards(self.streams, self.arn)
            except Exception as e:  # a transient failure: try again next round
                say(f"describe_stream failed: {e}")
                continue
            for shard in shards:
                sid = shard["ShardId"]
                if sid not in self.known:
                    self.known[sid] = {"parent": shard.get("ParentShardId"), "state": "new"}
                    self.count("shards_seen")
            for sid, info in list(self.known.items()):
                if info["state"] != "new":
                    continue
                parent = self.known.get(info["parent"]) if info["parent"] else None
                if parent is not None and parent["state"] != "done":
                    continue  # a child is read after its parent, as Lambda does
                try:
                    it = self.streams.get_shard_iterator(
                        StreamArn=self.arn, ShardId=sid,
                        ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
                except Exception as e:
                    say(f"get_shard_iterator {sid} failed: {e}")
                    continue
                self.launch(sid, it)

    def route(self, rec: dict) -> VirtualShard:
        """The virtual shard of a record: a hash of its partition key's value."""
        if len(self.vshards) == 1:
            return self.vshards[0]
        key = (rec.get("dynamodb", {}).get("Keys") or {}).get(self.partition_key)
        return self.vshards[virtual_shard(key, len(self.vshards))]

    def shard_reader(self, sid: str, it: str | None) -> None:
        """Reads one real shard to its end, stamps and routes the kept records."""
        last_seq = None
        while it and not self.stop.is_set():
            try:
                r = self.streams.get_records(ShardIterator=it, Limit=1000)
            except self.streams.exceptions.ExpiredIteratorException:
                kind = ("AFTER_SEQUENCE_NUMBER", last_seq) if last_seq else ("TRIM_HORIZON", None)
                kw = {"SequenceNumber": kind[1]} if kind[1] else {}
                it = self.streams.get_shard_iterator(StreamArn=self.arn, ShardId=sid,
                                                     ShardIteratorType=kind[0],
                                                     **kw)["ShardIterator"]
                continue
            except Exception as e:
                say(f"get_records {sid} failed: {e}")
                self.stop.wait(1.0)
                continue
            self.count("get_records_calls")
            records = r.get("Records", [])
            it = r.get("NextShardIterator")
            now = time.monotonic()
            pages: dict[int, list] = {}
            kept = 0
            for rec in records:
                last_seq = rec["dynamodb"]["SequenceNumber"]
                lr = lambda_record(rec, self.arn)
                if not self.keep(lr):
                    continue
                kept += 1
                pages.setdefault(self.route(lr).index, []).append(
                    (now, lr, len(json.dumps(lr)) + 2))
            self.count("records_read", len(records))
            self.count("records_filtered_out", len(records) - kept)
            for index, page in pages.items():
                vs = self.vshards[index]
                with vs.cond:
                    vs.queue.extend(page)
                    vs.cond.notify_all()
            if not it:
                break
            if not records:
                self.stop.wait(self.args.poll_interval)
        if not it:
            self.known[sid]["state"] = "done"
            self.count("shards_finished")

    # ------------------------------------------------------------- processing

    def expired(self, read_at: float, now: float) -> bool:
        return now - read_at > self.max_age

    def prune_queue(self, vs: VirtualShard) -> None:
        """Discards the expired records at the head of the queue (lock held)."""
        now = time.monotonic()
        n = 0
        while vs.queue and self.expired(vs.queue[0][0], now):
            vs.queue.popleft()
            n += 1
        if n:
            self.count("expired_records", n)
            say(f"{vs.name}: {n} record(s) older than {self.max_age:g}s discarded unsent")

    def take_batch(self, vs: VirtualShard) -> list:
        """Up to BatchSize records and 6 MB of event from the head of the queue
        (lock held)."""
        batch, size = [], 0
        while vs.queue and len(batch) < self.args.batch_size:
            item = vs.queue[0]
            if batch and size + item[2] > EVENT_LIMIT - 64:
                break
            batch.append(vs.queue.popleft())
            size += item[2]
        return batch

    def batch_ready(self, vs: VirtualShard) -> bool:
        if len(vs.queue) >= self.args.batch_size:
            return True
        size = 0
        for item in vs.queue:
            size += item[2]
            if size > EVENT_LIMIT - 64:
                return True
        return False

    def pipeline_loop(self, vs: VirtualShard) -> None:
        """One virtual shard: a batch is invoked when BatchSize records are waiting,
        or the next one would pass 6 MB, or the batching window (which begins when
        the previous invocation completes) has passed and a record is waiting."""
        window_start = time.monotonic()
        while not self.stop.is_set():
            with vs.cond:
                while not self.stop.is_set():
                    self.prune_queue(vs)
                    now = time.monotonic()
                    due = window_start + self.args.window
                    if vs.queue and (now >= due or self.batch_ready(vs)):
                        break
                    wait = 0.5 if not vs.queue else min(0.5, max(0.0, due - now))
                    vs.cond.wait(wait)
                if self.stop.is_set():
                    break
                batch = self.take_batch(vs)
            self.deliver(vs, batch)
            window_start = time.monotonic()
        with vs.cond:
            self.count("buffered_unsent", len(vs.queue))

    def deliver(self, vs: VirtualShard, batch: list) -> None:
        """Invokes with one batch (and, bisecting, its halves in order) until each
        part succeeds, expires or runs out of retries."""
        with self.lock:
            self.c["in_flight_batches"] += 1
            self.c["peak_in_flight_batches"] = max(self.c["peak_in_flight_batches"],
                                                   self.c["in_flight_batches"])
        try:
            parts = [batch]
            while parts:
                part = parts.pop(0)
                if not self.deliver_part(vs, part, parts):
                    self.count("buffered_unsent", len(part) + sum(len(p) for p in parts))
                    return
        finally:
            self.count("in_flight_batches", -1)

    def deliver_part(self, vs: VirtualShard, part: list, parts: list) -> bool:
        """One batch until it is done with (True) or the poller stops (False); a
        bisect puts the two halves at the front of `parts`."""
        errors, attempts, backoff = 0, 0, self.args.backoff
        while True:
            now = time.monotonic()
            fresh = [x for x in part if not self.expired(x[0], now)]
            if len(fresh) < len(part):
                self.count("expired_records", len(part) - len(fresh))
                say(f"{vs.name}: {len(part) - len(fresh)} record(s) of a failing batch older "
                    f"than {self.max_age:g}s discarded")
                part = fresh
            if not part:
                return True
            attempts += 1
            records = [x[1] for x in part]
            sent = time.time()
            status, function_error, text = self.invoke(
                json.dumps({"Records": records}).encode())
            done = time.time()
            if self.batch_log:
                self.batch_log.write(json.dumps({
                    "shard": vs.name, "records": len(records),
                    "first_seq": records[0]["dynamodb"]["SequenceNumber"],
                    "last_seq": records[-1]["dynamodb"]["SequenceNumber"],
                    "oldest_age_s": round(time.monotonic() - part[0][0], 3),
                    "sent": round(sent, 6), "done": round(done, 6), "attempt": attempts,
                    "status": status, "function_error": function_error,
                    "response": text[:1000]}) + "\n")
            if status == 200 and not function_error:
                with self.lock:
                    self.c["batches"] += 1
                    self.c["records"] += len(records)
                return True
            with self.lock:
                self.c["invoke_errors"] += 1
                if status == 429:
                    self.c["throttles"] += 1
                elif function_error:
                    self.c["function_errors"] += 1
            say(f"invoke of {len(records)} record(s) from {vs.name} failed (attempt "
                f"{attempts}): HTTP {status} {function_error or ''} {text[:300]}")
            if function_error and status == 200:
                if self.args.bisect and len(part) > 1:
                    mid = len(part) // 2
                    parts[:0] = [part[:mid], part[mid:]]
                    self.count("bisects")
                    return True
                errors += 1
                if 0 <= self.args.max_retries < errors:
                    with self.lock:
                        self.c["dropped_batches"] += 1
                        self.c["dropped_records"] += len(part)
                    return True
                self.count("retries")
            else:
                self.count("throttle_retries")
            # Wait the back-off, or until the oldest record expires if sooner.
            until_expiry = self.max_age - (time.monotonic() - part[0][0])
            if self.stop.wait(max(0.0, min(backoff, until_expiry + 0.001))):
                return False
            backoff = min(backoff * 2, self.args.max_backoff)

    def invoke(self, body: bytes) -> tuple[int, str | None, str]:
        req = urllib.request.Request(self.args.invoke, data=body, method="POST", headers={
            "Content-Type": "application/json", "X-Amz-Invocation-Type": "RequestResponse"})
        try:
            with urllib.request.urlopen(req, timeout=self.args.invoke_timeout) as r:
                return r.status, r.headers.get("X-Amz-Function-Error"), \
                    r.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("X-Amz-Function-Error"), \
                e.read().decode("utf-8", "replace")
        except OSError as e:
            return 0, None, f"{type(e).__name__}: {e}"

    def counters(self) -> dict:
        with self.lock:
            out = dict(self.c)
        out["stream_arn"] = self.arn
        out["settings"] = self.args.settings
        return out


def cmd_poll(args) -> int:
    args.settings = effective_settings(args)
    poller = Poller(args)

    def on_signal(signum, _frame):
        poller.stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    poller.start()
    while not poller.stop.wait(0.5):
        pass
    for vs in poller.vshards:
        with vs.cond:
            vs.cond.notify_all()
    deadline = time.time() + args.stop_grace
    for t in poller.pipelines + poller.readers:
        t.join(max(0.0, deadline - time.time()))
    counters = poller.counters()
    text = json.dumps(counters, sort_keys=True)
    if args.stats_file:
        with open(args.stats_file, "w") as f:
            f.write(text + "\n")
    print(text, flush=True)
    return 0
