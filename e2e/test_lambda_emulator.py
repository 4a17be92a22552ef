"""The Lambda emulator (scripts/lambda_runtime.py, scripts/outbox_e2e/lambda_runtime/)
against a fake function (conftest's fake_function: a Python script speaking the Runtime
API that answers with what it received, sleeps, spins or fails when asked), each check
counting and ordering what reached it: cold starts and warm reuse, deadlines, freezing,
throttles, timeouts, the log tail, the schedule, Lambda's asynchronous retries
(EventInvokeConfig, from the flags or the template), and --cpu-share."""

from __future__ import annotations

import base64
import json
import os
import threading
import time

from botocore.exceptions import ClientError

from outbox_e2e.paths import TEMPLATE
from outbox_e2e.procs import wait_for
from outbox_e2e.report import check


def process_state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def test_emulator(lambda_emulator, fake_function) -> None:
    """Cold starts, deadlines, Lambda's variables, freezing, warm reuse, the log tail and
    client context, throttles, function errors, timeouts, Event invokes, unknown
    functions, the totals, and the shutdown."""
    timeout = 2.0
    emu = lambda_emulator("fake", fake_function, "--timeout", str(timeout),
                          "--max-concurrency", "2", "--memory", "256", "--env", "FAKE_X=forty-two")
    check(emu.printed_port == emu.port, "the port is printed on stdout and in --port-file")

    # Two concurrent invokes: two environments, one cold start each.
    results: list[dict] = [None, None]  # type: ignore[list-item]

    def call(i):
        results[i] = emu.invoke_sdk({"sleep": 0.6, "n": i})

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
    third = emu.invoke_sdk({"n": 3})
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
            emu.invoke_sdk({"sleep": 1.0})
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
    failed = emu.invoke_sdk({"fail": True})
    check(failed.get("FunctionError") == "Unhandled"
          and json.loads(failed["body"])["errorType"] == "FakeError",
          "a function error answers X-Amz-Function-Error with the function's error",
          str(failed.get("body")))

    # A timeout kills the environment.
    started = time.time()
    timed = emu.invoke_sdk({"sleep": 10})
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
    after = [emu.invoke_sdk({"n": i}) for i in range(2)]
    check(all("FunctionError" not in a for a in after), "invokes after a timeout succeed")

    # Async invoke.
    asynced = emu.invoke_sdk({"n": "async"}, kind="Event")
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
    final = emu.shutdown()
    check(final is not None and emu.proc.proc.returncode == 0, "POST /shutdown stops the emulator",
          str(emu.proc.proc.returncode))
    pids_left = [e["pid"] for e in (final or {}).get("environments", [])
                 if process_state(e["pid"]) not in (None, "Z")]
    check(not pids_left, "no environment process outlives the emulator", str(pids_left))
    check(os.path.exists(emu.stats_file) and json.load(open(emu.stats_file))["totals"][
        "invocations"] == 11, "--stats-file has the final stats")


def test_schedule(lambda_emulator, fake_function) -> None:
    """--schedule: EventBridge scheduled events a period apart; --prefix runs the binary
    through a command."""
    emu = lambda_emulator("fake", fake_function, "--timeout", "3", "--schedule", "1",
                          "--schedule-offset", "0.2", "--prefix", "env FAKE_PREFIXED=yes")

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


def test_async_function_errors_retried(lambda_emulator, fake_function) -> None:
    """EventInvokeConfig: a function error is retried MaximumRetryAttempts times after the
    configured delays."""
    emu = lambda_emulator("fake", fake_function, "--timeout", "10", "--async-retries", "2",
                          "--async-retry-delays", "0.5,1.0")
    emu.invoke_sdk({"fail": True, "n": "retried"}, kind="Event")
    wait_for(lambda: emu.stats(invocations=False)["totals"]["async_dropped"] >= 1, 15)
    time.sleep(1.5)
    s = emu.stats()
    tries = [r for r in s["invocations"] if r["source"] == "event"]
    check([r["attempt"] for r in tries] == [1, 2, 3]
          and len({r["event_id"] for r in tries}) == 1
          and all(r["status"] == "error" for r in tries),
          "a failing async event is tried 1 + MaximumRetryAttempts (2) times",
          json.dumps([(r.get("attempt"), r["status"]) for r in tries]))
    check(len({r["request_id"] for r in tries}) == 1,
          "the retries of an async event carry the first attempt's request id, as Lambda's do",
          json.dumps([r["request_id"] for r in tries]))
    if len(tries) == 3:
        gaps = [tries[1]["received"] - tries[0]["end"], tries[2]["received"] - tries[1]["end"]]
        check(0.45 <= gaps[0] < 0.45 + 2 and 0.95 <= gaps[1] < 0.95 + 2,
              "the retries wait the configured delays (0.5 s, then 1 s)",
              str([round(g, 2) for g in gaps]))
    t = s["totals"]
    check(t["async_retries"] == 2 and t["async_exhausted"] == 1 and t["async_expired"] == 0,
          "async_retries 2, async_exhausted 1", json.dumps(t))


def test_async_throttles_retried_until_max_age(lambda_emulator, fake_function) -> None:
    """EventInvokeConfig: a throttled event runs once there is room; one throttled past
    MaximumEventAgeInSeconds is never run."""
    emu = lambda_emulator("fake", fake_function, "--timeout", "10", "--max-concurrency", "1",
                          "--async-max-age", "2.5", "--async-throttle-backoff", "0.2",
                          "--async-throttle-max-backoff", "0.4")
    holder = emu.hold(1.0)
    emu.invoke_sdk({"n": "patient"}, kind="Event")
    holder.join(30)
    wait_for(lambda: emu.stats(invocations=False)["totals"]["async_succeeded"] >= 1, 10)
    holder = emu.hold(5.0)
    emu.invoke_sdk({"n": "stale"}, kind="Event")
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


def test_cpu_share(lambda_emulator, fake_function) -> None:
    """--cpu-share at 128 MB: a function spinning for 2 s of wall time gets at most its
    share of one CPU, 128/1769 (CFS enforces it per 100 ms period)."""
    emu = lambda_emulator("fake", fake_function, "--cpu-share", "--memory", "128",
                          "--timeout", "10")
    quota = emu.stats(invocations=False)["cpu_quota"]
    check(abs(quota - 128 / 1769) < 0.001, "cpu_share: the quota is 128/1769 of a CPU",
          f"{quota}")
    out = emu.invoke_sdk({"spin": 2.0})
    cpu = json.loads(out["body"])["cpu_s"]
    # At most the quota over 2 s plus one period's worth; at least some CPU.
    check(0.005 < cpu <= 2.0 * quota + 0.1 * 1.0,
          "cpu_share: 2 s of spinning used at most its share of a CPU",
          f"{cpu:.3f} CPU s, the share {2.0 * quota:.3f}")


def test_async_settings_from_lambda_defaults_or_the_template(lambda_emulator,
                                                            fake_function) -> None:
    """The emulator's async settings: Lambda's defaults, or the template's
    EventInvokeConfig (--template)."""
    emu = lambda_emulator("fake", fake_function)
    ac = emu.stats(invocations=False)["async_config"]
    check(ac["max_retries"] == 2 and ac["max_event_age_s"] == 21600
          and ac["retry_delays_s"] == [60, 120],
          "lambda_runtime.py without --template: Lambda's async defaults (2, 6 h, 1 and "
          "2 min)", json.dumps(ac))
    emu.shutdown()
    emu = lambda_emulator("fake", fake_function, "--template", TEMPLATE,
                          "--template-function", "RelayFunction")
    ac = emu.stats(invocations=False)["async_config"]
    check(ac["max_retries"] == 0 and ac["max_event_age_s"] == 60
          and ac["source"]["retries"].startswith("template:"),
          "lambda_runtime.py --template: RelayFunction's EventInvokeConfig (0, 60 s)",
          json.dumps(ac))
    emu.invoke_sdk({"fail": True}, kind="Event")
    wait_for(lambda: emu.stats(invocations=False)["totals"]["async_dropped"] >= 1, 10)
    time.sleep(1.0)
    s = emu.stats()
    tries = [r for r in s["invocations"] if r["source"] == "event"]
    check(len(tries) == 1 and s["totals"]["async_exhausted"] == 1,
          "with the template's MaximumRetryAttempts 0 a failed event is not retried",
          json.dumps(s["totals"]))
