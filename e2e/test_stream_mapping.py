"""The model of the stream's event source mapping (scripts/streams.py,
scripts/outbox_e2e/streams/), each on a fresh table with times shortened by flags, checked
by counting and ordering what reached a fake function under the emulator: the stream
commands, record age, throttles, function errors, bisection, virtual shards, batching,
and the settings and filter read from template.yaml (with scripts/cfn_template.py).
DynamoDB is the stack's, or one of the suite's own (conftest's dynamodb_endpoint)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid

import boto3
import pytest
from botocore.exceptions import ClientError

from outbox_e2e.paths import PY, TEMPLATE, script
from outbox_e2e.procs import wait_for
from outbox_e2e.report import check
from outbox_e2e.streams import poller


def ddb_env(endpoint: str) -> dict:
    """This process's environment with DynamoDB at `endpoint` (and credentials)."""
    env = dict(os.environ, AWS_ENDPOINT_URL_DYNAMODB=endpoint)
    env.setdefault("AWS_ACCESS_KEY_ID", "local")
    env.setdefault("AWS_SECRET_ACCESS_KEY", "local")
    return env


def ddb_client(env: dict):
    region = env.get("AWS_DEFAULT_REGION") or env.get("AWS_REGION") or "us-east-1"
    return boto3.client("dynamodb", endpoint_url=env["AWS_ENDPOINT_URL_DYNAMODB"],
                        region_name=region, aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])


def create_table(ddb, table: str, stream: bool) -> None:
    kw = {"StreamSpecification": {"StreamEnabled": True, "StreamViewType": "KEYS_ONLY"}} \
        if stream else {}
    ddb.create_table(
        TableName=table, BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[{"AttributeName": "PK", "AttributeType": "S"},
                              {"AttributeName": "SK", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"},
                   {"AttributeName": "SK", "KeyType": "RANGE"}], **kw)


class Rig:
    """A fresh table with a KEYS_ONLY stream, and the event source mapping on it."""

    def __init__(self, endpoint: str, stream_mapping):
        self.env = ddb_env(endpoint)
        self.ddb = ddb_client(self.env)
        self.mapping = stream_mapping
        self.table = f"esm-{uuid.uuid4().hex[:10]}"
        create_table(self.ddb, self.table, stream=True)
        self.poller = None

    def start(self, invoke_url: str, *flags: str):
        self.poller = self.mapping(self.table, invoke_url, *flags, env=self.env)
        return self.poller

    def settings(self) -> dict:
        return self.poller.settings

    def stop(self) -> dict:
        return self.poller.stop() if self.poller else {}

    def batches(self) -> list[dict]:
        return self.poller.batches() if self.poller else []

    def put(self, pk: str, sk: str = "1") -> None:
        self.ddb.put_item(TableName=self.table, Item={"PK": {"S": pk}, "SK": {"S": sk}})

    def put_together(self, keys: list[tuple[str, str]]) -> None:
        """One transaction: the records appear in the stream together."""
        self.ddb.transact_write_items(TransactItems=[
            {"Put": {"TableName": self.table, "Item": {"PK": {"S": pk}, "SK": {"S": sk}}}}
            for pk, sk in keys])


@pytest.fixture
def rig(dynamodb_endpoint, stream_mapping):
    r = Rig(dynamodb_endpoint, stream_mapping)
    yield r
    r.stop()
    try:
        r.ddb.delete_table(TableName=r.table)
    except ClientError:
        pass


def invocation_keys(rec: dict) -> list[tuple[str, str]]:
    """The (PK, SK) of the records an emulator invocation was given (ok or error)."""
    body = rec.get("response") if rec["status"] == "ok" else None
    if body is None:
        return []
    return [(r["dynamodb"]["Keys"]["PK"]["S"], r["dynamodb"]["Keys"]["SK"]["S"])
            for r in (json.loads(body)["event"] or {}).get("Records", [])]


def stream_invocations(emu) -> list[dict]:
    return [r for r in emu.stats()["invocations"] if r["source"] == "invoke"]


def streams_cli(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([PY, script("streams.py"), *args], env=env,
                          capture_output=True, text=True, timeout=120)


def test_streams_commands_and_poller(dynamodb_endpoint, lambda_emulator, fake_function,
                                     stream_mapping) -> None:
    """streams.py enable and records (the Lambda event's records, in order, filtered, after
    a sequence number), and poll: the two message INSERTs in one event, a failed batch
    retried once and dropped, the counters and the batch log."""
    env = ddb_env(dynamodb_endpoint)
    ddb = ddb_client(env)
    table = f"model-{uuid.uuid4().hex[:10]}"
    create_table(ddb, table, stream=False)
    out = streams_cli("enable", table, env=env)
    arn = out.stdout.strip()
    check(out.returncode == 0 and arn == ddb.describe_table(TableName=table)["Table"].get(
        "LatestStreamArn"), "enable prints the stream's ARN", out.stderr + out.stdout)
    again = streams_cli("enable", table, env=env)
    check(again.returncode == 0 and again.stdout.strip() == arn, "enable is idempotent",
          again.stderr)

    emu = lambda_emulator("fake", fake_function, "--timeout", "5")
    poller = stream_mapping(table, emu.invoke_url, "--filter-prefix", "OUTBOX#MESSAGES#",
                            "--batch-size", "10", "--window", "0.5", "--max-retries", "1",
                            env=env)
    check(poller.alive(), "the poller is ready (iterators at LATEST)")

    messages = [("OUTBOX#MESSAGES#3", "0000000000000000001"),
                ("OUTBOX#MESSAGES#5", "0000000000000000001")]
    ddb.transact_write_items(TransactItems=[
        {"Put": {"TableName": table, "Item": {
            "PK": {"S": messages[0][0]}, "SK": {"S": messages[0][1]},
            "Topic": {"S": "orders"}}}},
        {"Update": {"TableName": table,
                    "Key": {"PK": {"S": "OUTBOX#SEQUENCE#3"}, "SK": {"S": "SEQUENCE"}},
                    "UpdateExpression": "ADD #s :one",
                    "ExpressionAttributeNames": {"#s": "Sequence"},
                    "ExpressionAttributeValues": {":one": {"N": "1"}}}},
        {"Put": {"TableName": table, "Item": {
            "PK": {"S": messages[1][0]}, "SK": {"S": messages[1][1]},
            "Topic": {"S": "orders"}}}},
    ])
    want = {m for m in messages}

    out = streams_cli("records", table, env=env)
    event = json.loads(out.stdout) if out.returncode == 0 else {"Records": []}
    recs = event["Records"]
    keys = [(r["dynamodb"]["Keys"]["PK"]["S"], r["dynamodb"]["Keys"]["SK"]["S"])
            for r in recs]
    check(out.returncode == 0 and len(recs) == 3 and all(r["eventName"] == "INSERT"
                                                       for r in recs),
          "records prints the transaction's three INSERTs", out.stderr + str(keys))
    check(want <= set(keys) and ("OUTBOX#SEQUENCE#3", "SEQUENCE") in keys,
          "records carries each item's keys", str(keys))
    shape_ok = all(
        set(r) >= {"eventID", "eventName", "eventVersion", "eventSource", "awsRegion",
                   "dynamodb", "eventSourceARN"}
        and r["eventVersion"] == "1.1" and r["eventSource"] == "aws:dynamodb"
        and r["eventSourceARN"] == arn
        and isinstance(r["dynamodb"]["ApproximateCreationDateTime"], (int, float))
        and abs(r["dynamodb"]["ApproximateCreationDateTime"] - time.time()) < 600
        and isinstance(r["dynamodb"]["SizeBytes"], int)
        and r["dynamodb"]["StreamViewType"] == "KEYS_ONLY"
        and isinstance(r["dynamodb"]["SequenceNumber"], str)
        for r in recs)
    check(shape_ok, "each record has the Lambda event's fields (creation time in seconds)",
          json.dumps(recs[:1]))
    seqs = [int(r["dynamodb"]["SequenceNumber"]) for r in recs]
    check(seqs == sorted(seqs), "records are in sequence order")

    out = streams_cli("records", table, "--filter-prefix", "OUTBOX#MESSAGES#", env=env)
    fkeys = [(r["dynamodb"]["Keys"]["PK"]["S"], r["dynamodb"]["Keys"]["SK"]["S"])
             for r in json.loads(out.stdout)["Records"]] if out.returncode == 0 else []
    check(set(fkeys) == want and len(fkeys) == 2,
          "records --filter-prefix prints the two message INSERTs", str(fkeys))
    if recs:
        out = streams_cli("records", table, "--after", recs[0]["dynamodb"]["SequenceNumber"],
                          env=env)
        n = len(json.loads(out.stdout)["Records"]) if out.returncode == 0 else -1
        check(n == 2, "records --after SEQ leaves out SEQ and what came before", str(n))

    # The poller delivers exactly the two messages, in one batch, to the emulator.
    delivered = wait_for(lambda: [r for r in emu.stats()["invocations"]
                                  if r["status"] == "ok"], 10, 0.1)
    got = []
    for r in delivered or []:
        for rec in json.loads(r["response"])["event"]["Records"]:
            got.append((rec["dynamodb"]["Keys"]["PK"]["S"],
                        rec["dynamodb"]["Keys"]["SK"]["S"]))
    check(sorted(got) == sorted(want) and len(delivered or []) == 1,
          "the poller delivers exactly the two messages to the emulator, in one event",
          f"{len(delivered or [])} invocation(s): {got}")
    if delivered:
        ev = json.loads(delivered[0]["response"])["event"]
        check(all(r["eventSourceARN"] == arn and r["eventName"] == "INSERT"
                  for r in ev["Records"]), "the delivered event is the Lambda stream event")

    # A batch the function fails: retried once (--max-retries 1), then dropped.
    ddb.put_item(TableName=table, Item={"PK": {"S": "OUTBOX#MESSAGES#FAIL"},
                                        "SK": {"S": "0000000000000000001"}})
    failures = wait_for(lambda: [r for r in emu.stats()["invocations"]
                                 if r["status"] == "error"] if len(
        [r for r in emu.stats()["invocations"] if r["status"] == "error"]) >= 2 else None,
        10, 0.1)
    check(bool(failures) and len(failures) == 2,
          "a failed batch is retried (the same records again)",
          str(len(failures or [])))
    time.sleep(0.5)
    counters = poller.stop()
    emu.shutdown()
    check(poller.returncode == 0 and bool(counters), "SIGTERM stops the poller with its counters",
          f"rc {poller.returncode}, stdout {counters!r}")
    expect = {"batches": 1, "records": 2, "records_read": 4, "records_filtered_out": 1,
              "invoke_errors": 2, "function_errors": 2, "retries": 1, "dropped_batches": 1,
              "dropped_records": 1, "buffered_unsent": 0, "in_flight_batches": 0,
              "shards_seen": 1}
    check(all(counters.get(k) == v for k, v in expect.items()),
          "the poller's counters", json.dumps(counters))
    with open(poller.stats_file) as f:
        check(json.load(f) == counters, "--stats-file has the same counters")
    lines = poller.batches()
    check(len(lines) == 3 and lines[0]["records"] == 2 and lines[0]["status"] == 200
          and [x["function_error"] for x in lines[1:]] == ["Unhandled", "Unhandled"],
          "--batch-log has one line per invocation attempt", json.dumps(lines)[:400])
    ddb.delete_table(TableName=table)


def test_record_age(rig, lambda_emulator, fake_function) -> None:
    """Records older than MaximumRecordAgeInSeconds are discarded unsent."""
    emu = lambda_emulator("fake", fake_function, "--timeout", "20", "--env", "FAKE_SLOW=4")
    rig.start(emu.invoke_url, "--batch-size", "1", "--max-record-age", "1",
              "--max-retries", "0")
    rig.put("AGE#SLOW")  # blocks the shard for 4 s
    wait_for(lambda: emu.stats()["totals"]["concurrency_now"] >= 1, 10)
    for i in range(3):
        rig.put(f"AGE#old{i}")
    wait_for(lambda: len([r for r in stream_invocations(emu) if r["status"] == "ok"]) >= 1,
             20)
    time.sleep(0.5)
    rig.put("AGE#fresh")
    got = wait_for(lambda: [k for r in stream_invocations(emu) for k in invocation_keys(r)]
                   if len([r for r in stream_invocations(emu) if r["status"] == "ok"]) >= 2
                   else None, 15)
    time.sleep(0.5)
    c = rig.stop()
    keys = [k for r in stream_invocations(emu) for k in invocation_keys(r)]
    check(keys == [("AGE#SLOW", "1"), ("AGE#fresh", "1")],
          "records older than MaximumRecordAgeInSeconds are not delivered; later ones are",
          str(keys or got))
    check(c.get("expired_records") == 3 and c.get("records") == 2
          and c.get("dropped_records") == 0 and c.get("buffered_unsent") == 0,
          "the three expired records are counted as expired_records", json.dumps(c))


def test_throttles(rig, lambda_emulator, fake_function) -> None:
    """A throttled batch is retried until it goes through or its records expire,
    without using up MaximumRetryAttempts."""
    emu = lambda_emulator("fake", fake_function, "--timeout", "20", "--max-concurrency", "1")
    rig.start(emu.invoke_url, "--max-retries", "0", "--max-record-age", "3",
              "--backoff", "0.2", "--max-backoff", "0.4")
    holder = emu.hold(1.0)
    rig.put("THR#a")
    holder.join(30)
    wait_for(lambda: any(invocation_keys(r) == [("THR#a", "1")]
                         for r in stream_invocations(emu)), 10)
    c_mid_ok = [r for r in stream_invocations(emu) if invocation_keys(r)]
    holder = emu.hold(6.0)
    rig.put("THR#b")
    holder.join(30)
    time.sleep(1.0)
    c = rig.stop()
    lines = rig.batches()
    keys = [k for r in stream_invocations(emu) for k in invocation_keys(r)]
    throttled = [x for x in lines if x["status"] == 429]
    check(keys == [("THR#a", "1")] and len(c_mid_ok) == 1,
          "a batch throttled for 1 s is delivered once it can be (MaximumRetryAttempts 0)",
          str(keys))
    check(c.get("throttles", 0) >= 4 and c.get("throttle_retries", 0) >= 4
          and c.get("retries") == 0 and c.get("function_errors") == 0
          and c.get("dropped_records") == 0,
          "throttles are retried and not counted against MaximumRetryAttempts",
          json.dumps(c))
    check(c.get("expired_records") == 1 and c.get("records") == 1,
          "a batch throttled past MaximumRecordAgeInSeconds is discarded (expired)",
          json.dumps(c))
    late = [x for x in throttled if x["first_seq"] == x["last_seq"]
            and x["oldest_age_s"] > 3.0 + 0.5]
    check(not late, "no attempt is made with a record older than the maximum age",
          json.dumps(late)[:300])


def test_function_errors(rig, lambda_emulator, fake_function) -> None:
    """A function error is retried MaximumRetryAttempts times, then the batch is
    dropped and the shard moves on."""
    emu = lambda_emulator("fake", fake_function, "--timeout", "10")
    rig.start(emu.invoke_url, "--max-retries", "2", "--backoff", "0.1", "--batch-size", "1")
    rig.put("ERR#FAIL")
    rig.put("ERR#after")
    wait_for(lambda: any(invocation_keys(r) == [("ERR#after", "1")]
                         for r in stream_invocations(emu)), 20)
    time.sleep(0.5)
    c = rig.stop()
    invs = stream_invocations(emu)
    statuses = [r["status"] for r in invs]
    check(statuses == ["error", "error", "error", "ok"]
          and invocation_keys(invs[-1]) == [("ERR#after", "1")],
          "a failing batch is tried 1 + MaximumRetryAttempts (2) times, then the next one",
          str(statuses))
    check(c.get("function_errors") == 3 and c.get("retries") == 2
          and c.get("dropped_batches") == 1 and c.get("dropped_records") == 1
          and c.get("records") == 1 and c.get("throttles") == 0,
          "function errors, retries and the dropped batch are counted", json.dumps(c))


def test_bisect(rig, lambda_emulator, fake_function) -> None:
    """BisectBatchOnFunctionError splits a failing batch in two, without using up
    retries."""
    emu = lambda_emulator("fake", fake_function, "--timeout", "10", "--env", "FAKE_SLOW=2")
    rig.start(emu.invoke_url, "--bisect", "--max-retries", "0", "--batch-size", "4",
              "--backoff", "0.1")
    rig.put("BIS#SLOW")  # the next four queue up behind it
    wait_for(lambda: emu.stats()["totals"]["concurrency_now"] >= 1, 10)
    rig.put_together([("BIS#a", "1"), ("BIS#b", "1"), ("BIS#FAIL", "1"), ("BIS#d", "1")])
    wait_for(lambda: any(invocation_keys(r) == [("BIS#d", "1")]
                         for r in stream_invocations(emu)), 20)
    time.sleep(0.5)
    c = rig.stop()
    lines = [x for x in rig.batches()][1:]
    shape = [(x["records"], "ok" if x["status"] == 200 and not x["function_error"]
              else "error") for x in lines]
    check(shape == [(4, "error"), (2, "ok"), (2, "error"), (1, "error"), (1, "ok")],
          "a failing batch of 4 is bisected: 2 ok, 2 fail, 1 fails and is dropped, 1 ok",
          str(shape))
    keys = [k for r in stream_invocations(emu) for k in invocation_keys(r)]
    check(keys == [("BIS#SLOW", "1"), ("BIS#a", "1"), ("BIS#b", "1"), ("BIS#d", "1")],
          "the halves run in order; only the bad record is lost", str(keys))
    check(c.get("bisects") == 2 and c.get("retries") == 0 and c.get("function_errors") == 3
          and c.get("dropped_records") == 1 and c.get("records") == 4,
          "two bisects, no retry used (MaximumRetryAttempts 0), one record dropped",
          json.dumps(c))


def virtual_shard(pk: str, shards: int) -> int:
    """streams.py's routing of a string partition key."""
    return poller.virtual_shard({"S": pk}, shards)


def test_shards(rig, lambda_emulator, fake_function) -> None:
    """--shards 2: two pipelines at once, each in order, one batch at a time."""
    emu = lambda_emulator("fake", fake_function, "--timeout", "10", "--env", "FAKE_SLOW=0.8")
    pks = {}
    for i in range(100):
        pk = f"SHD#SLOW{i}"
        pks.setdefault(virtual_shard(pk, 2), pk)
        if len(pks) == 2:
            break
    p0, p1 = pks[0], pks[1]
    rig.start(emu.invoke_url, "--shards", "2", "--batch-size", "1")
    for sk in ("1", "2", "3"):
        rig.put(p0, sk)
        rig.put(p1, sk)
    wait_for(lambda: len([r for r in stream_invocations(emu) if r["status"] == "ok"]) >= 6,
             30)
    time.sleep(0.3)
    c = rig.stop()
    invs = [r for r in stream_invocations(emu) if r["status"] == "ok"]
    by_pk: dict[str, list] = {p0: [], p1: []}
    for r in invs:
        for pk, sk in invocation_keys(r):
            by_pk[pk].append((r["start"], r["end"], sk))
    order_ok = all([x[2] for x in sorted(v)] == ["1", "2", "3"] for v in by_pk.values())
    check(len(invs) == 6 and order_ok,
          "each virtual shard delivers its partition key's records in order",
          json.dumps({k: [x[2] for x in sorted(v)] for k, v in by_pk.items()}))
    serial = all(b[0] >= a[1] - 0.01 for v in by_pk.values()
                 for a, b in zip(sorted(v), sorted(v)[1:]))
    check(serial, "a virtual shard runs one batch at a time (no overlap within a shard)")
    overlap = any(a[0] < b[1] and b[0] < a[1] for a in by_pk[p0] for b in by_pk[p1])
    check(overlap and c.get("peak_in_flight_batches") == 2 and c.get("virtual_shards") == 2,
          "the two virtual shards run at the same time (two invocations in flight)",
          json.dumps({k: c.get(k) for k in ("peak_in_flight_batches", "virtual_shards")}))


def test_batching(rig, lambda_emulator, fake_function) -> None:
    """BatchSize and MaximumBatchingWindowInSeconds (the window begins when the
    previous invocation completes)."""
    emu = lambda_emulator("fake", fake_function, "--timeout", "10")
    window = 1.5
    rig.start(emu.invoke_url, "--batch-size", "3", "--window", str(window))
    time.sleep(window + 0.3)

    def ok_invs(n):
        return wait_for(lambda: [r for r in stream_invocations(emu) if r["status"] == "ok"]
                        if len([r for r in stream_invocations(emu)
                                if r["status"] == "ok"]) >= n else None, 20)

    rig.put("BAT#r1")
    ok_invs(1)
    rig.put_together([("BAT#r2", "1"), ("BAT#r3", "1")])
    ok_invs(2)
    rig.put_together([(f"BAT#r{i}", "1") for i in range(4, 11)])
    ok_invs(5)
    time.sleep(0.3)
    c = rig.stop()
    lines = rig.batches()
    invs = [r for r in stream_invocations(emu) if r["status"] == "ok"]
    sizes = [x["records"] for x in lines]
    check(sizes == [1, 2, 3, 3, 1] and c.get("records") == 10,
          "batches of at most BatchSize (3): 1, 2, 3, 3, 1", str(sizes))
    if len(lines) == 5 and len(invs) == 5:
        waited = lines[1]["sent"] - invs[0]["end"]
        check(waited >= window - 0.1,
              "records arriving inside the window wait for it (it begins when the previous "
              "invocation completes)", f"sent {waited:.2f}s after the previous end")
        quick = lines[2]["sent"] - invs[1]["end"]
        check(quick < window - 0.2, "a full batch is sent without waiting for the window",
              f"sent {quick:.2f}s after the previous end")
        last = lines[4]["sent"] - invs[3]["end"]
        check(last >= window - 0.1, "the remainder waits for the window", f"{last:.2f}s")


def test_cfn_template_reads_the_mapping_and_the_environment() -> None:
    """scripts/cfn_template.py: RelayDoorbell's settings and filter, RelayFunction's
    EventInvokeConfig, and (--environment) its variables for given parameters."""
    out = subprocess.run([PY, script("cfn_template.py"), TEMPLATE,
                          "--function", "RelayFunction"], capture_output=True, text=True,
                         timeout=60)
    doc = json.loads(out.stdout) if out.returncode == 0 else {}
    m = doc.get("mapping") or {}
    patterns = [json.loads(f.get("Pattern", "{}"))
                for f in m.get("FilterCriteria", {}).get("Filters", [])]
    check(m.get("LogicalId") == "RelayDoorbell" and m.get("BatchSize") == 100
          and m.get("MaximumBatchingWindowInSeconds") == 0
          and m.get("MaximumRecordAgeInSeconds") == -1 and m.get("MaximumRetryAttempts") == 0
          and m.get("BisectBatchOnFunctionError") is False
          and m.get("StartingPosition") == "LATEST"
          and patterns == [{"eventName": ["INSERT"], "dynamodb": {"Keys": {"PK": {"S": [
              {"prefix": f"OUTBOX#{kind}#"}]}}}} for kind in ("MESSAGES", "CONTINUATION")],
          "cfn_template.py reads RelayDoorbell's settings and resolves its !Sub filter",
          out.stderr + json.dumps(m))
    eic = doc.get("event_invoke_config") or {}
    check(eic.get("MaximumRetryAttempts") == 0 and eic.get("MaximumEventAgeInSeconds") == 60,
          "cfn_template.py reads RelayFunction's EventInvokeConfig", json.dumps(eic))
    out = subprocess.run([PY, script("cfn_template.py"), TEMPLATE,
                          "--function", "RelayFunction", "--environment",
                          "--param", "KafkaTopics=orders,pay-*",
                          "--param", "KafkaBootstrapServers=b-1:9096",
                          "--param", "KafkaAuth=scram-sha-512",
                          "--param", "UseExistingTable=true", "--param", "TableName=shared"],
                         capture_output=True, text=True, timeout=60)
    env = (json.loads(out.stdout) if out.returncode == 0 else {}).get("environment") or {}
    check(env.get("KAFKA_AUTH") == "scram-sha-512" and env.get("OUTBOX_TABLE_NAME") == "shared"
          and env.get("OUTBOX_ALLOWED_TOPICS") == "orders,pay-*"
          and env.get("KAFKA_BOOTSTRAP_SERVERS") == "b-1:9096"
          and "KAFKA_SASL_SECRET_ARN" not in env,
          "cfn_template.py --environment: the Globals' variables merged with the function's, "
          "parameters resolved, an !If to AWS::NoValue absent", out.stderr + json.dumps(env))


def test_poll_with_the_template(rig, lambda_emulator, fake_function) -> None:
    """poll --template: the template's RelayDoorbell settings (a flag overriding one), its
    filter with KeyPrefix given; WakeOn=schedule (no mapping) refused."""
    emu = lambda_emulator("fake", fake_function, "--timeout", "10")
    bad = subprocess.run(
        [PY, script("streams.py"), "poll", rig.table, "--invoke",
         emu.invoke_url, "--template", TEMPLATE, "--param", "WakeOn=schedule"],
        env=rig.env, capture_output=True, text=True, timeout=60)
    check(bad.returncode != 0 and "no DynamoDB stream event source mapping" in bad.stderr,
          "--param WakeOn=schedule: the mapping's condition is false, the poller refuses",
          bad.stderr[-300:])
    rig.start(emu.invoke_url, "--template", TEMPLATE, "--function", "RelayFunction",
              "--param", "KeyPrefix=TPL", "--batch-size", "5")
    st = rig.settings()
    check(st["batch_size"] == 5 and st["source"]["batch_size"] == "flag"
          and st["max_record_age_s"] == -1 and st["max_retries"] == 0
          and st["bisect"] is False and st["window_s"] == 0
          and st["starting_position"] == "LATEST"
          and st["source"]["max_record_age"] == "template:RelayDoorbell"
          and [p["dynamodb"]["Keys"]["PK"]["S"] for p in st["filter_patterns"]] == [
              [{"prefix": "TPL#MESSAGES#"}], [{"prefix": "TPL#CONTINUATION#"}]],
          "poll --template: the template's settings, a flag overriding one of them",
          json.dumps(st))
    rig.put("TPL#MESSAGES#1", "1")
    rig.put("TPL#LEASE#1", "1")
    rig.put("OUTBOX#MESSAGES#1", "1")
    rig.put("TPL#CONTINUATION#relay-1", "00000000000000000001")
    wait_for(lambda: [r for r in stream_invocations(emu) if r["status"] == "ok"], 10)
    time.sleep(1.0)
    rig.ddb.delete_item(TableName=rig.table,
                        Key={"PK": {"S": "TPL#MESSAGES#1"}, "SK": {"S": "1"}})
    time.sleep(1.0)
    c = rig.stop()
    keys = [k for r in stream_invocations(emu) for k in invocation_keys(r)]
    check(keys == [("TPL#MESSAGES#1", "1"), ("TPL#CONTINUATION#relay-1", "00000000000000000001")]
          and c.get("records_filtered_out") == 3,
          "the template's filters (KeyPrefix=TPL) keep only the message and continuation INSERTs",
          f"{keys} {json.dumps(c)[:300]}")
