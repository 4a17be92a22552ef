"""The suite's shared fixtures, defined once here:

  stack              the stack's endpoints (scripts/stack.sh run exports them); a test
                     that needs the stack fails, never skips, outside it
  dynamodb_endpoint  the stack's DynamoDB Local, else one of the suite's own
  fresh              fresh outbox and business tables, and topics
  kafka              the independent Kafka client (confluent-kafka): topics, read-back
  started            what a test started; stopped at its end, their logs shown when it
                     failed
  lambda_emulator    function binaries under the Lambda emulator (scripts/lambda_runtime.py)
  fake_function      a fake function binary for the emulator's own tests
  stream_mapping     the stream's event source mapping (scripts/streams.py poll)
  debug_binaries     outboxctl and both functions, built (dev profile)
  sam_build          sam build's bootstraps (--sam-build DIR, else scripts/sam_build_check.sh)

The support code they stand on is scripts/outbox_e2e/ (pytest.ini's pythonpath).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import pytest

from outbox_e2e import dynamodb
from outbox_e2e import kafka as kafka_client
from outbox_e2e.emulator import Emulator
from outbox_e2e.mapping import StreamPoller
from outbox_e2e.paths import ROOT, script, target_dir
from outbox_e2e.procs import Started
from outbox_e2e.report import step
from outbox_e2e.stack import NotInStack, Stack
from outbox_e2e.streams.records import enable as enable_stream


def pytest_addoption(parser):
    parser.addoption("--sam-build", metavar="DIR",
                     help="sam build's output (scripts/sam_build_check.sh OUT_DIR: DIR/build, "
                          "DIR/build-arm64); default: the suite runs sam_build_check.sh once")


def pytest_configure(config):
    # The steps of the suite's own logger at INFO; the libraries' chatter (botocore's
    # "Found credentials", ...) only when it is a warning.
    for noisy in ("botocore", "boto3", "urllib3", "samtranslator"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # The venv's tools first (sam, cfn-lint, cargo-lambda as `cargo lambda`), as
    # scripts/test.sh puts them.
    venv_bin = os.path.dirname(sys.executable)
    if venv_bin not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = venv_bin + os.pathsep + os.environ.get("PATH", "")


# The order of the test files in a run: the checks that need no stack first, then the
# scenarios, the longest last (pytest's own order is alphabetical).
FILE_ORDER = ["test_template.py", "test_alarms.py", "test_lambda_emulator.py",
              "test_stream_mapping.py", "test_lambda_watch.py", "test_kafka_setups.py",
              "test_examples.py", "test_serverless.py", "test_continuity.py"]


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(FILE_ORDER)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


_timed_file: list[str] = []


def pytest_runtest_logstart(nodeid, location):
    """Under scripts/test.sh, each test file's start is a line of its times' table
    ($OUTBOX_TEST_TIMES: epoch seconds, tab, name)."""
    times = os.environ.get("OUTBOX_TEST_TIMES")
    module = nodeid.split("::")[0]
    if times and _timed_file[-1:] != [module]:
        _timed_file.append(module)
        with open(times, "a") as f:
            f.write(f"{int(time.time())}\t  {module}\n")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """Keeps each phase's report on the test item (rep_setup, rep_call): `started` shows
    the logs of what a failed test started."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


# ------------------------------------------------------------------------ the stack

@pytest.fixture(scope="session")
def stack() -> Stack:
    try:
        return Stack.from_env()
    except NotInStack as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="session")
def dynamodb_endpoint(tmp_path_factory) -> str:
    """The stack's DynamoDB Local when the suite runs inside the stack; else one of its
    own from the install cache, for the session (the emulator's and the stream mapping's
    own tests need only DynamoDB)."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL_DYNAMODB")
    if endpoint:
        yield endpoint
        return
    local = dynamodb.DynamoDbLocal(str(tmp_path_factory.mktemp("dynamodb-local")))
    step(f"started DynamoDB Local at {local.endpoint}")
    try:
        yield local.endpoint
    finally:
        local.stop()


class Fresh:
    """Fresh outbox and business tables and topics (the tests give them random names)."""

    def outbox_table(self, name: str, stream: bool = False) -> str:
        """An outbox table as the library creates it; with `stream`, its KEYS_ONLY stream
        turned on (UpdateTable, as streams.py enable does) and ENABLED."""
        dynamodb.create_outbox_table(name)
        if stream:
            enable_stream(name)
        return name

    def business_table(self, name: str) -> str:
        dynamodb.create_business_table(name)
        return name

    def topic(self, name: str, partitions: int = 3, bootstrap: str | None = None) -> str:
        kafka_client.create_topic(name, partitions, bootstrap)
        return name


@pytest.fixture
def fresh(stack) -> Fresh:
    return Fresh()


class Kafka:
    """The independent client (confluent-kafka) on the stack's PLAINTEXT listener, or on
    `bootstrap` (a proxy)."""

    def __init__(self, bootstrap: str):
        self.bootstrap = bootstrap

    def create_topic(self, name: str, partitions: int = 3, bootstrap: str | None = None) -> dict:
        return kafka_client.create_topic(name, partitions, bootstrap or self.bootstrap)

    def read(self, topic: str, bootstrap: str | None = None, **kw) -> list[dict]:
        """Every record of the topic from offset 0 (outbox_e2e.kafka.read_topic)."""
        return kafka_client.read_topic(topic, bootstrap or self.bootstrap, **kw)


@pytest.fixture(scope="session")
def kafka(stack) -> Kafka:
    return Kafka(stack.kafka)


# ------------------------------------------------------------------- what a test starts

@pytest.fixture
def started(request) -> Started:
    """What the test started (emulators, pollers, proxies, relays): stopped in reverse
    order at its end; when it failed, the last lines of their logs are printed (pytest
    shows them with the failure) and the test's tmp_path keeps the whole logs."""
    things = Started()
    yield things
    rep = getattr(request.node, "rep_call", None) or getattr(request.node, "rep_setup", None)
    if rep is not None and rep.failed:
        tails = things.tails(60)
        if tails:
            print(tails)
        tmp = request.node.funcargs.get("tmp_path")
        if tmp is not None:
            print(f"logs kept in {tmp}")
    things.stop_all()


@pytest.fixture
def lambda_emulator(started, tmp_path):
    """Starts function binaries under the Lambda emulator, each stopped (with its
    environments) at the test's end:

      lambda_emulator(name, binary, *args, env=None)  the emulator with these options
      lambda_emulator.function(name, binary, timeout, env, prefix="", max_concurrency=10,
                               init_timeout=10.0, extra_args=None)
                                                     as the template deploys a function
    Each returns the Emulator once its client API listens."""

    class Factory:
        def __call__(self, name: str, binary: str, *args: str, env: dict | None = None):
            emu = Emulator(name, binary, str(tmp_path), list(args), env=env)
            started.append(emu)
            return emu.wait_ready()

        def function(self, name: str, binary: str, timeout: float, env: dict, **kw):
            emu = Emulator.function(name, binary, str(tmp_path), timeout, env, **kw)
            started.append(emu)
            return emu.wait_ready()

    return Factory()


@pytest.fixture
def stream_mapping(started, tmp_path):
    """Starts the event source mapping on a table's stream, stopped at the test's end:

      stream_mapping(table, invoke_url, *flags, env=None)  streams.py poll with these flags
      stream_mapping.templated(table, function, prefix, relay_timeout)
                                                          the template's RelayDoorbell
    Each returns the StreamPoller once it is ready (its settings in .settings)."""

    class Factory:
        def __call__(self, table: str, invoke_url: str, *flags: str, env: dict | None = None):
            poller = StreamPoller(str(tmp_path), table, invoke_url, *flags, env=env)
            started.append(poller)
            poller.settings = poller.wait_ready()
            return poller

        def templated(self, table: str, function: Emulator, prefix: str,
                      relay_timeout: float):
            poller = StreamPoller.templated(str(tmp_path), table, function.invoke_url, prefix,
                                            relay_timeout)
            started.append(poller)
            poller.settings = poller.wait_ready()
            return poller

    return Factory()


# The fake function of the emulator's and the stream mapping's own tests: a Python
# script speaking the Runtime API that answers with what it received (headers, event,
# environment, pid), sleeps when asked (or $FAKE_SLOW seconds when a stream record's key
# contains SLOW), spins on the CPU when asked, and fails when asked (or when a stream
# record's key contains FAIL).
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
                        if k.startswith(("AWS_LAMBDA", "FAKE", "LAMBDA_", "_HANDLER",
                                         "AWS_REGION"))}}
        req = urllib.request.Request(api + f"/invocation/{rid}/response", method="POST",
                                     data=json.dumps(body).encode())
    urllib.request.urlopen(req).read()
'''


@pytest.fixture(scope="session")
def fake_function(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("fake-function") / "fake-function.py"
    path.write_text(FAKE_FUNCTION.replace("/usr/bin/env python3", sys.executable, 1))
    path.chmod(0o755)
    return str(path)


# ---------------------------------------------------------------------------- builds

@pytest.fixture(scope="session")
def debug_binaries() -> dict[str, str]:
    """outboxctl and both functions, built once per session (dev profile, in
    CARGO_TARGET_DIR): {"outboxctl", "enqueue", "relay"} -> path."""
    step("building outboxctl, both functions and the examples (dev profile)")
    # The features `cargo test --workspace --all-features` resolves (examples bring the
    # dev-dependencies in, as tests do): that step then finds every binary built, and
    # the library is compiled once per run, not once per feature set.
    out = subprocess.run(["cargo", "build", "-q", "--workspace", "--all-features",
                          "--examples", "--bins"],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, f"cargo build: {out.stderr}"
    debug = os.path.join(target_dir(), "debug")
    return {"outboxctl": os.path.join(debug, "outboxctl"),
            "enqueue": os.path.join(debug, "outbox-enqueue-function"),
            "relay": os.path.join(debug, "outbox-relay-function")}


@pytest.fixture(scope="session")
def sam_build(request, tmp_path_factory) -> str:
    """sam build's output directory: DIR/build (x86-64 bootstraps) and DIR/build-arm64
    (the template's default, arm64).  scripts/test.sh passes its own (--sam-build); else
    scripts/sam_build_check.sh builds and checks both once for the session."""
    given = request.config.getoption("--sam-build")
    if given:
        return os.path.abspath(given)
    out = str(tmp_path_factory.mktemp("sam-build"))
    step(f"scripts/sam_build_check.sh {out} (minutes after a change under lib/)")
    p = subprocess.run(["bash", script("sam_build_check.sh"), out], cwd=ROOT,
                       capture_output=True, text=True)
    assert p.returncode == 0, f"scripts/sam_build_check.sh: {p.stdout[-3000:]}{p.stderr[-3000:]}"
    return out
