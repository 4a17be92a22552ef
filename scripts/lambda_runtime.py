#!/usr/bin/env python3
"""A small Lambda service emulator for ONE function binary: the local model of a
deployed function (cold starts, warm reuse, real deadlines, timeouts, throttling,
billed duration), for the tests and benchmarks of the local stack.

  scripts/lambda_runtime.py [options] BINARY

BINARY is the function's executable (a cargo-lambda `bootstrap`, or
`target/debug/outbox-relay-function`); `--prefix` runs it through a command such
as `qemu-aarch64-static -L /` (an arm64 bootstrap on x86_64).

Execution environments.  Each environment is one process of BINARY with its own
Runtime API on its own loopback port (AWS_LAMBDA_RUNTIME_API=127.0.0.1:PORT), the
2018-06-01 API that aws-lambda-rust-runtime speaks: `GET
/runtime/invocation/next` (long poll; answers with the event and the headers
Lambda-Runtime-Aws-Request-Id, Lambda-Runtime-Deadline-Ms (now + the function's
timeout, Unix ms), Lambda-Runtime-Invoked-Function-Arn, Lambda-Runtime-Trace-Id),
`POST /runtime/invocation/ID/response`, `POST /runtime/invocation/ID/error`,
`POST /runtime/init/error`.  An invoke goes to an idle environment (the one idle
most recently); when every environment is busy a new process is started (a cold
start), up to --max-concurrency; beyond it the invoke is throttled (HTTP 429
TooManyRequestsException, as Lambda answers).  An environment that has just
posted a response but not yet asked for the next event is waited for up to
--reuse-grace-ms before a cold start is chosen (the runtime asks within
microseconds; without the grace a back-to-back caller would see spurious cold
starts).  Between invocations an environment is frozen (SIGSTOP of its process
group once it waits in /next, SIGCONT when an event is handed to it), as Lambda
freezes it; --no-freeze keeps it running.  An invocation that passes its
timeout kills its environment (SIGKILL of the process group) and answers
`Sandbox.Timedout`; a process that exits during an invocation answers
`Runtime.ExitError`; an environment that does not ask for its first event within
--init-timeout is killed and its invocation fails.

The process environment: the emulator's own environment (so the stack's
AWS_ENDPOINT_URL_DYNAMODB, KAFKA_BOOTSTRAP_SERVERS, ... pass through; --clean-env
passes only PATH, HOME, LANG and the --env values), then every --env K=V, then
what Lambda sets and reserves: AWS_LAMBDA_RUNTIME_API, AWS_LAMBDA_FUNCTION_NAME,
AWS_LAMBDA_FUNCTION_MEMORY_SIZE, AWS_LAMBDA_FUNCTION_VERSION ($LATEST),
AWS_LAMBDA_LOG_GROUP_NAME, AWS_LAMBDA_LOG_STREAM_NAME,
AWS_LAMBDA_INITIALIZATION_TYPE (on-demand), LAMBDA_TASK_ROOT and
LAMBDA_RUNTIME_DIR (the binary's directory, also the working directory),
_HANDLER (bootstrap), TZ (:UTC), AWS_REGION and AWS_DEFAULT_REGION (kept when set,
else us-east-1), and with --log-format/--log-level AWS_LAMBDA_LOG_FORMAT and
AWS_LAMBDA_LOG_LEVEL (the template's LoggingConfig), and AWS_ENDPOINT_URL_LAMBDA
pointing at the emulator's own client API (a function that calls Lambda's Invoke on
itself, the relay starting its successor, reaches this emulator as it would reach
Lambda; an --env value wins).

Measured per invocation: request id, source (invoke, event, schedule), received,
start, end (Unix s), duration_ms, billed_ms, init_ms (cold starts: process start
to its first /next), cold, environment, status (ok, error, timeout, throttled),
error_type, max_memory_mb (the process's VmHWM), the response or error body.
billed_ms = ceil(duration_ms + init_ms) for a cold start (Lambda bills the init
phase of provided.al2023 functions, and of every on-demand function since August
2025), ceil(duration_ms) for a warm one, the timeout for a timed-out one;
--no-bill-init leaves the init phase out.  Totals: invocations (those that
reached an environment), cold and warm starts, errors, timeouts, throttles,
billed ms, GB-seconds, environments started, peak concurrency.

The client API, on 127.0.0.1 (--port, default a free one; printed on stdout as
the first line, and written to --port-file):
  POST /2015-03-31/functions/NAME/invocations   Lambda's Invoke API: the function
        name or its ARN; X-Amz-Invocation-Type RequestResponse (default: waits,
        200 with the function's response, X-Amz-Function-Error: Unhandled on a
        function error), Event (202 at once, x-amzn-RequestId the event's id; then
        Lambda's asynchronous queue, below) or DryRun (204); X-Amz-Log-Type: Tail returns the invocation's last 4 KB of
        log in X-Amz-Log-Result; X-Amz-Client-Context (base64 JSON) reaches the
        function as Lambda-Runtime-Client-Context.  Callable with `aws lambda invoke
        --endpoint-url http://127.0.0.1:PORT` or boto3's lambda client.
  GET  /stats[?since=N][&invocations=0]   JSON: the totals, the environments and
        the per-invocation list (from index N; none with invocations=0)
  POST /shutdown   answers the final stats, kills every environment, exits
SIGTERM and SIGINT shut down the same way.  --stats-file writes the final stats
there on exit.

--schedule SECONDS starts a timer standing in for the template's schedule: every
SECONDS (fixed rate; first tick after --schedule-offset, default SECONDS) an
asynchronous invocation (source "schedule") with an EventBridge scheduled-event
payload ({"version":"0","id":...,"detail-type":"Scheduled Event","source":
"aws.events","account":...,"time":...,"region":...,"resources":[rule ARN],
"detail":{}}), or the JSON of --schedule-payload (the template's ScheduleV2
delivers its Input, {"source":"dynamo-outbox.schedule"}).  A tick never waits for
the invocation it starts.

Asynchronous invocations (Event invokes and --schedule ticks), as "How Lambda
handles errors and retries with asynchronous invocation"
(https://docs.aws.amazon.com/lambda/latest/dg/invocation-async-error-handling.html)
and "Configuring error handling settings for Lambda asynchronous invocations"
(https://docs.aws.amazon.com/lambda/latest/dg/invocation-async-configuring.html)
describe them.  The settings are the function's EventInvokeConfig:
MaximumRetryAttempts (--async-retries, 0-2) and MaximumEventAgeInSeconds
(--async-max-age, at most 21600; values below Lambda's minimum of 60 are accepted,
for tests).  An explicit flag wins; else --template FILE reads them from the SAM
template (the EventInvokeConfig of --template-function, default --function-name,
through scripts/cfn_template.py; template.yaml's RelayFunction has 0 and 60); else
Lambda's defaults, 2 and 21600 (6 hours).  A function error (the function's or the
runtime's, timeouts included) is retried MaximumRetryAttempts times, the first
retry after --async-retry-delays' first value and the second after its second
(default 60,120: Lambda's "one-minute wait between the first two attempts, and two
minutes between the second and third"; --async-retry-delay S sets one delay for
both).  A throttle (no environment free under --max-concurrency) is retried with a
wait of --async-throttle-backoff seconds doubling up to
--async-throttle-max-backoff (default 1 and 300: "from 1 second after the first
attempt to a maximum of 5 minutes"), never counted against the retries.  An event
older than MaximumEventAgeInSeconds is discarded: it is not attempted again, and a
retry that would come after that age is not made (the event is counted discarded
when it reaches the age).  The age counts from the 202.  Not modelled: the queue's
own delays and duplicates, on-failure destinations and dead-letter queues, the
slower reading of a long queue.  Each attempt is one record of /stats with its
event_id and attempt (1, 2, ...; throttled attempts included, status
"throttled"); totals async_invocations, async_succeeded, async_retries (after
function errors), async_throttle_retries, async_expired (discarded for their age),
async_exhausted (out of retries), async_dropped (both); /stats' async_config says
the settings in force and where each came from.

CPU.  With --cpu-share each environment's process runs in a CPU cgroup of its own
whose quota is the function's share of one CPU: --memory / 1769 (CFS quota over a
100 ms period: 7.2 ms at 128 MB, 14.5 ms at 256 MB), as "Configure Lambda function
memory" (https://docs.aws.amazon.com/lambda/latest/dg/configuration-memory.html) says
Lambda allocates it: "CPU power in proportion to the amount of memory configured ...
At 1,769 MB, a function has the equivalent of one vCPU (one vCPU-second of credits per
second)".  Without it a function gets whatever the host gives (the default).  Needs a
writable cgroup CPU controller (v1 /sys/fs/cgroup/cpu or v2 cpu.max); the emulator
exits with status 2 when it cannot create one.  Not modelled: Lambda's burst credits
and the speed of its CPUs against this host's.

The function's stdout and stderr go to our stderr (or --log-file), each line
prefixed with "[NAME:ENV]", with Lambda's START / END / REPORT lines; with
--timed-log-file also to that file, each line prefixed with its arrival time as well.

Standard library only (--template needs PyYAML, in the stack's venv).  Exit codes: 0 after a shutdown, 2 usage.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

RUNTIME_PREFIX = "/2018-06-01/runtime"
INVOKE_PREFIX = "/2015-03-31/functions/"
SYNC_PAYLOAD_LIMIT = 6 * 1024 * 1024  # Lambda's 6 MB request/response limit
ASYNC_PAYLOAD_LIMIT = 1024 * 1024  # Lambda's async payload limit (1 MB since 2025)
TAIL_BYTES = 4096
KEEP_BODY_BYTES = 64 * 1024


def log(msg: str) -> None:
    print(f"[lambda-runtime] {msg}", file=sys.stderr, flush=True)


def iso_now(t: float | None = None) -> str:
    t = time.time() if t is None else t
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def trace_id() -> str:
    return (f"Root=1-{int(time.time()):08x}-{uuid.uuid4().hex[:24]};"
            f"Parent={uuid.uuid4().hex[:16]};Sampled=0")


def read_body(handler: BaseHTTPRequestHandler) -> bytes:
    """The request body, by Content-Length or chunked transfer encoding."""
    if "chunked" in handler.headers.get("Transfer-Encoding", "").lower():
        chunks = []
        while True:
            line = handler.rfile.readline()
            if not line:
                break
            size = int(line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                # Trailers (a streamed error sends some) up to the blank line.
                while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                break
            chunks.append(handler.rfile.read(size))
            handler.rfile.readline()
        return b"".join(chunks)
    n = int(handler.headers.get("Content-Length") or 0)
    return handler.rfile.read(n) if n else b""


LAMBDA_MB_PER_VCPU = 1769  # "At 1,769 MB, a function has the equivalent of one vCPU"
CFS_PERIOD_US = 100_000


class CpuCgroups:
    """One CPU cgroup per environment with the quota of --memory (see --cpu-share)."""

    def __init__(self, memory_mb: int):
        self.quota_us = max(1000, CFS_PERIOD_US * memory_mb // LAMBDA_MB_PER_VCPU)
        v1 = "/sys/fs/cgroup/cpu"
        if os.path.isfile(os.path.join(v1, "cpu.cfs_quota_us")):
            self.root, self.v2 = v1, False
        elif os.path.isfile("/sys/fs/cgroup/cgroup.controllers"):
            self.root, self.v2 = "/sys/fs/cgroup", True
        else:
            raise OSError("no cgroup CPU controller under /sys/fs/cgroup")
        self.prefix = f"outbox-lambda-{os.getpid()}"
        self.remove(self.create(0))  # fails here, at start-up, when it cannot

    def create(self, env_number: int) -> str:
        path = os.path.join(self.root, f"{self.prefix}-{env_number}")
        os.makedirs(path, exist_ok=True)
        if self.v2:
            with open(os.path.join(path, "cpu.max"), "w") as f:
                f.write(f"{self.quota_us} {CFS_PERIOD_US}")
        else:
            with open(os.path.join(path, "cpu.cfs_period_us"), "w") as f:
                f.write(str(CFS_PERIOD_US))
            with open(os.path.join(path, "cpu.cfs_quota_us"), "w") as f:
                f.write(str(self.quota_us))
        return path

    @staticmethod
    def remove(path: str) -> None:
        try:
            os.rmdir(path)
        except OSError:
            pass  # a process of it still exiting: the cgroup is left empty


def process_hwm_mb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return math.ceil(int(line.split()[1]) / 1024)
    except OSError:
        pass
    return None


class QuietServer(ThreadingHTTPServer):
    """A threading HTTP server that does not print a traceback when a peer goes away
    (a killed environment resets its connection to the Runtime API)."""

    daemon_threads = True

    def handle_error(self, request, client_address):
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


class Invocation:
    def __init__(self, payload: bytes, source: str, tail: bool = False,
                 client_context: str | None = None):
        self.request_id = str(uuid.uuid4())
        self.payload = payload
        self.client_context = client_context
        self.source = source
        self.tail = tail
        self.trace_id = trace_id()
        self.received = time.time()
        self.env: Environment | None = None
        self.cold = False
        self.init_ms: float | None = None
        self.start: float | None = None
        self.start_mono: float | None = None
        self.end: float | None = None
        self.deadline_ms: int | None = None
        self.status: str | None = None
        self.error_type: str | None = None
        self.body = b""
        self.log_lines: list[str] = []
        self.log_bytes = 0
        self.timer: threading.Timer | None = None
        self.done = threading.Event()
        self.event_id: str | None = None  # async: the event's id (its 202's request id)
        self.attempt = 1  # async: 1 for the first attempt, then one more per retry

    def add_log(self, line: str) -> None:
        if not self.tail:
            return
        self.log_lines.append(line)
        self.log_bytes += len(line) + 1
        while self.log_bytes > 4 * TAIL_BYTES and len(self.log_lines) > 1:
            self.log_bytes -= len(self.log_lines.pop(0)) + 1

    def log_tail(self) -> str:
        text = ("\n".join(self.log_lines) + "\n").encode()[-TAIL_BYTES:]
        return base64.b64encode(text).decode()


class Environment:
    def __init__(self, service: "Service", number: int):
        self.service = service
        self.number = number
        self.name = f"env-{number}"
        self.state = "init"  # init, idle, busy, finishing, dead
        self.assigned: Invocation | None = None  # handed out at the next /next
        self.current: Invocation | None = None  # being run
        self.proc: subprocess.Popen | None = None
        self.cgroup: str | None = None  # its CPU cgroup's directory (--cpu-share)
        self.started = time.time()
        self.started_mono = time.monotonic()
        self.first_next: float | None = None
        self.init_ms: float | None = None
        self.idle_since = time.monotonic()
        self.frozen = False
        self.invocations = 0
        self.end_reason: str | None = None
        self.server = QuietServer(("127.0.0.1", 0), RuntimeApiHandler)
        self.server.env = self  # type: ignore[attr-defined]
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, name=f"{self.name}-api",
                         daemon=True).start()

    # Called with the service's lock held.
    def signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self, reason: str) -> None:
        """Marks the environment dead and SIGKILLs its process group (lock held)."""
        if self.state == "dead":
            return
        self.state = "dead"
        self.end_reason = reason
        self.signal_group(signal.SIGKILL)
        self.signal_group(signal.SIGCONT)
        self.service.cond.notify_all()

    def describe(self) -> dict:
        return {
            "env": self.name, "port": self.port,
            "pid": self.proc.pid if self.proc else None, "state": self.state,
            "started": round(self.started, 3),
            "init_ms": None if self.init_ms is None else round(self.init_ms, 3),
            "invocations": self.invocations, "end_reason": self.end_reason,
        }


class Service:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.cond = threading.Condition()
        self.closed = False
        self.envs: list[Environment] = []
        self.env_counter = 0
        self.records: list[dict] = []
        self.totals = {
            "invocations": 0, "cold_starts": 0, "warm_starts": 0, "errors": 0,
            "timeouts": 0, "throttles": 0, "billed_ms": 0, "duration_ms": 0.0,
            "init_ms": 0.0, "environments_started": 0, "peak_concurrency": 0,
            "async_invocations": 0, "async_succeeded": 0, "async_dropped": 0,
            "async_expired": 0, "async_exhausted": 0, "async_retries": 0,
            "async_throttle_retries": 0, "schedule_ticks": 0,
        }
        self.name = args.function_name
        # The client API's port (set once its server listens): the functions' endpoint for
        # Lambda's API.
        self.client_port: int | None = None
        self.region = os.environ.get("AWS_REGION") or os.environ.get(
            "AWS_DEFAULT_REGION") or "us-east-1"
        self.arn = f"arn:aws:lambda:{self.region}:{args.account_id}:function:{self.name}"
        self.log_out = open(args.log_file, "a", buffering=1) if args.log_file else sys.stderr
        self.timed_log = (open(args.timed_log_file, "a", buffering=1)
                          if args.timed_log_file else None)
        self.log_lock = threading.Lock()
        self.binary = os.path.abspath(args.binary)
        self.task_root = args.cwd or os.path.dirname(self.binary)
        self.command = shlex.split(args.prefix or "") + [self.binary]
        self.cgroups = CpuCgroups(args.memory) if args.cpu_share else None

    # ----------------------------------------------------------------- logs

    def write_log(self, env: Environment, line: str, inv: Invocation | None = None) -> None:
        with self.log_lock:
            try:
                self.log_out.write(f"[{self.name}:{env.name}] {line}\n")
                self.log_out.flush()
                if self.timed_log is not None:
                    self.timed_log.write(f"{time.time():.3f} [{self.name}:{env.name}] {line}\n")
            except ValueError:
                pass
        target = inv or env.current
        if target is not None:
            target.add_log(line)

    def pump(self, env: Environment, stream) -> None:
        for raw in iter(stream.readline, b""):
            self.write_log(env, raw.decode("utf-8", "replace").rstrip("\n"))
        stream.close()

    # ---------------------------------------------------------- environments

    def process_env(self, env: Environment) -> dict[str, str]:
        if self.args.clean_env:
            base = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
        else:
            base = dict(os.environ)
        for kv in self.args.env:
            k, _, v = kv.partition("=")
            base[k] = v
        day = time.strftime("%Y/%m/%d", time.gmtime())
        base.update({
            "AWS_LAMBDA_RUNTIME_API": f"127.0.0.1:{env.port}",
            "AWS_LAMBDA_FUNCTION_NAME": self.name,
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(self.args.memory),
            "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
            "AWS_LAMBDA_LOG_GROUP_NAME": f"/aws/lambda/{self.name}",
            "AWS_LAMBDA_LOG_STREAM_NAME": f"{day}/[$LATEST]{uuid.uuid4().hex}",
            "AWS_LAMBDA_INITIALIZATION_TYPE": "on-demand",
            "LAMBDA_TASK_ROOT": self.task_root,
            "LAMBDA_RUNTIME_DIR": self.task_root,
            "_HANDLER": "bootstrap",
            "TZ": ":UTC",
        })
        # The function's own Lambda API calls (a relay starting its successor with Invoke)
        # reach this emulator, as they reach Lambda; --env AWS_ENDPOINT_URL_LAMBDA=...
        # points them elsewhere.
        if self.client_port and not any(
                kv.partition("=")[0] == "AWS_ENDPOINT_URL_LAMBDA" for kv in self.args.env):
            base["AWS_ENDPOINT_URL_LAMBDA"] = f"http://127.0.0.1:{self.client_port}"
        base.setdefault("AWS_REGION", self.region)
        base.setdefault("AWS_DEFAULT_REGION", base["AWS_REGION"])
        if self.args.log_format:
            base["AWS_LAMBDA_LOG_FORMAT"] = self.args.log_format
        if self.args.log_level:
            base["AWS_LAMBDA_LOG_LEVEL"] = self.args.log_level
        base.pop("_X_AMZN_TRACE_ID", None)
        return base

    def new_env(self) -> Environment:
        """A new environment in state init (lock held); its process starts outside."""
        self.env_counter += 1
        env = Environment(self, self.env_counter)
        self.envs.append(env)
        self.totals["environments_started"] += 1
        return env

    def start_process(self, env: Environment) -> None:
        preexec = None
        if self.cgroups is not None:
            env.cgroup = self.cgroups.create(env.number)
            procs = os.path.join(env.cgroup, "cgroup.procs")

            def preexec() -> None:  # in the child, before exec: its CPU share from birth
                with open(procs, "w") as f:
                    f.write(str(os.getpid()))
        try:
            proc = subprocess.Popen(
                self.command, cwd=self.task_root, env=self.process_env(env),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True, preexec_fn=preexec)
        except (OSError, subprocess.SubprocessError) as e:
            with self.cond:
                inv = env.assigned
                env.assigned = None
                env.kill(f"spawn failed: {e}")
                if inv is not None:
                    self.finish(inv, "error", json.dumps({
                        "errorType": "Runtime.InvalidEntrypoint",
                        "errorMessage": f"RequestId: {inv.request_id} Error: {e}"}).encode(),
                        "Runtime.InvalidEntrypoint")
            return
        with self.cond:
            env.proc = proc
            dead_already = env.state == "dead"
        if dead_already:  # shut down meanwhile
            env.signal_group(signal.SIGKILL)
        for stream in (proc.stdout, proc.stderr):
            threading.Thread(target=self.pump, args=(env, stream), daemon=True).start()
        threading.Thread(target=self.reap, args=(env,), daemon=True).start()
        timer = threading.Timer(self.args.init_timeout, self.on_init_timeout, (env,))
        timer.daemon = True
        timer.start()

    def reap(self, env: Environment) -> None:
        assert env.proc is not None
        rc = env.proc.wait()
        with self.cond:
            unexpected = env.state != "dead"
            if unexpected:
                env.kill(f"exited with status {rc}")
            for inv in (env.current, env.assigned):
                if inv is not None and not inv.done.is_set():
                    what = f"exit status {rc}" if rc >= 0 else f"signal: {signal.Signals(-rc).name}"
                    self.finish(inv, "error", json.dumps({
                        "errorType": "Runtime.ExitError",
                        "errorMessage": f"RequestId: {inv.request_id} Error: Runtime exited "
                                        f"with error: {what}"}).encode(), "Runtime.ExitError")
            env.current = env.assigned = None
        env.server.shutdown()
        env.server.server_close()
        if env.cgroup is not None:
            CpuCgroups.remove(env.cgroup)

    def on_init_timeout(self, env: Environment) -> None:
        with self.cond:
            if env.first_next is not None or env.state == "dead":
                return
            inv = env.assigned
            env.assigned = None
            env.kill("init timeout")
            if inv is not None:
                self.finish(inv, "error", json.dumps({
                    "errorType": "Sandbox.Timedout",
                    "errorMessage": f"RequestId: {inv.request_id} Error: INIT timed out after "
                                    f"{self.args.init_timeout:.2f} seconds"}).encode(),
                    "Sandbox.Timedout", timed_out=True)

    def reaper_loop(self) -> None:
        """Kills environments idle longer than --idle-expiry (Lambda reclaims them)."""
        while True:
            time.sleep(min(1.0, self.args.idle_expiry / 4))
            with self.cond:
                if self.closed:
                    return
                now = time.monotonic()
                for env in self.envs:
                    if (env.state == "idle" and env.assigned is None
                            and now - env.idle_since > self.args.idle_expiry):
                        env.kill("idle expiry")

    # ------------------------------------------------------------ invoking

    def concurrency(self) -> int:
        return sum(1 for e in self.envs if e.state in ("init", "busy", "finishing")
                   or (e.state == "idle" and e.assigned is not None))

    def dispatch(self, inv: Invocation) -> bool:
        """Hands `inv` to an environment (False: throttled or shutting down), waits
        for its end."""
        cold_env = None
        with self.cond:
            grace_end = time.monotonic() + self.args.reuse_grace_ms / 1000
            while True:
                if self.closed:
                    self.finish_unrun(inv, "error", "Service.ShuttingDown",
                                      "the emulator is shutting down")
                    return False
                idle = [e for e in self.envs if e.state == "idle" and e.assigned is None]
                if idle:
                    env = max(idle, key=lambda e: e.idle_since)
                    env.assigned = inv
                    inv.env = env
                    self.cond.notify_all()
                    break
                live = [e for e in self.envs if e.state != "dead"]
                finishing = any(e.state == "finishing" for e in live)
                now = time.monotonic()
                if finishing and now < grace_end:
                    self.cond.wait(grace_end - now)
                    continue
                if len(live) < self.args.max_concurrency:
                    cold_env = self.new_env()
                    cold_env.assigned = inv
                    inv.env = cold_env
                    inv.cold = True
                    break
                self.totals["throttles"] += 1
                self.finish_unrun(inv, "throttled", "TooManyRequestsException", "Rate Exceeded.")
                return False
            self.totals["peak_concurrency"] = max(self.totals["peak_concurrency"],
                                                  self.concurrency())
        if cold_env is not None:
            self.start_process(cold_env)
        inv.done.wait()
        return True

    def finish_unrun(self, inv: Invocation, status: str, error_type: str, message: str) -> None:
        """Records an invocation that never reached an environment (lock held)."""
        inv.status, inv.error_type = status, error_type
        inv.end = time.time()
        if status == "throttled":
            inv.body = json.dumps({"Reason": "ReservedFunctionConcurrentInvocationLimitExceeded",
                                   "Type": "User", "message": message}).encode()
        else:
            inv.body = json.dumps({"errorType": error_type, "errorMessage": message}).encode()
        self.records.append(self.record(inv))
        inv.done.set()

    def finish(self, inv: Invocation, status: str, body: bytes, error_type: str | None = None,
               timed_out: bool = False) -> None:
        """Ends a delivered (or cold-started) invocation: measures, logs, records (lock held)."""
        if inv.done.is_set():
            return
        if inv.timer is not None:
            inv.timer.cancel()
        env = inv.env
        end_mono = time.monotonic()
        inv.end = time.time()
        inv.status, inv.body, inv.error_type = status, body, error_type
        if inv.start_mono is not None:
            duration = (end_mono - inv.start_mono) * 1000
        else:
            duration = 0.0
        if env is not None and inv.cold:
            inv.init_ms = env.init_ms if env.init_ms is not None else (
                end_mono - env.started_mono) * 1000
        # A timed-out invocation bills exactly its timeout; an invocation that never
        # started (init failed) bills only its init phase.
        run_ms = duration
        if timed_out and inv.start_mono is not None:
            # Lambda reports (and bills) a timed-out invocation as exactly its timeout.
            run_ms = duration = self.args.timeout * 1000
        init_billed = (inv.init_ms if inv.cold and inv.init_ms is not None
                       and not self.args.no_bill_init else 0.0)
        billed = max(math.ceil(run_ms + init_billed), 1)
        inv.duration_ms = duration  # type: ignore[attr-defined]
        inv.billed_ms = billed  # type: ignore[attr-defined]
        inv.max_memory_mb = (process_hwm_mb(env.proc.pid)  # type: ignore[attr-defined]
                             if env is not None and env.proc is not None else None)
        t = self.totals
        t["invocations"] += 1
        t["cold_starts" if inv.cold else "warm_starts"] += 1
        if status != "ok":
            t["errors"] += 1
        if status == "timeout" or timed_out:
            t["timeouts"] += 1
        t["billed_ms"] += billed
        t["duration_ms"] += duration
        if inv.cold and inv.init_ms is not None:
            t["init_ms"] += inv.init_ms
        if env is not None:
            env.invocations += 1
            if status in ("timeout",):
                self.write_log(env, f"{iso_now()} {inv.request_id} Task timed out after "
                                    f"{self.args.timeout:.2f} seconds", inv)
            self.write_log(env, f"END RequestId: {inv.request_id}", inv)
            init = f"\tInit Duration: {inv.init_ms:.2f} ms" if inv.cold and inv.init_ms else ""
            status_note = "" if status == "ok" else f"\tStatus: {status}"
            self.write_log(env, f"REPORT RequestId: {inv.request_id}\tDuration: {duration:.2f} ms"
                                f"\tBilled Duration: {billed} ms\tMemory Size: {self.args.memory} MB"
                                f"\tMax Memory Used: {inv.max_memory_mb or 0} MB{init}{status_note}",
                           inv)
        self.records.append(self.record(inv))
        inv.done.set()
        self.cond.notify_all()

    def record(self, inv: Invocation) -> dict:
        body = inv.body[:KEEP_BODY_BYTES].decode("utf-8", "replace")
        rec = {
            "request_id": inv.request_id, "source": inv.source,
            "received": round(inv.received, 6),
            "start": None if inv.start is None else round(inv.start, 6),
            "end": None if inv.end is None else round(inv.end, 6),
            "deadline_ms": inv.deadline_ms,
            "duration_ms": round(getattr(inv, "duration_ms", 0.0), 3),
            "billed_ms": getattr(inv, "billed_ms", 0),
            "init_ms": None if inv.init_ms is None else round(inv.init_ms, 3),
            "cold": inv.cold,
            "env": inv.env.name if inv.env else None,
            "status": inv.status, "error_type": inv.error_type,
            "max_memory_mb": getattr(inv, "max_memory_mb", None),
        }
        if inv.event_id is not None:
            rec["event_id"] = inv.event_id
            rec["attempt"] = inv.attempt
        rec["response" if inv.status == "ok" else "error"] = body
        if len(inv.body) > KEEP_BODY_BYTES:
            rec["body_truncated_from"] = len(inv.body)
        return rec

    def on_timeout(self, env: Environment, inv: Invocation) -> None:
        with self.cond:
            if inv.done.is_set() or env.current is not inv:
                return
            inv.max_memory_mb = process_hwm_mb(env.proc.pid) if env.proc else None  # type: ignore
            body = json.dumps({
                "errorMessage": f"{iso_now()} {inv.request_id} Task timed out after "
                                f"{self.args.timeout:.2f} seconds",
                "errorType": "Sandbox.Timedout"}).encode()
            self.finish(inv, "timeout", body, "Sandbox.Timedout", timed_out=True)
            env.current = None
            env.kill("timeout")

    def sleep(self, seconds: float) -> bool:
        """Waits `seconds` unless the emulator shuts down meanwhile (False)."""
        end = time.monotonic() + seconds
        with self.cond:
            while not self.closed:
                left = end - time.monotonic()
                if left <= 0:
                    return True
                self.cond.wait(left)
        return False

    def invoke_async(self, payload: bytes, source: str, event_id: str | None = None) -> None:
        """Lambda's asynchronous queue for one event (the module docstring,
        "Asynchronous invocations")."""
        a = self.args
        event_id = event_id or str(uuid.uuid4())
        with self.cond:
            self.totals["async_invocations"] += 1
        first = time.monotonic()
        errors, attempt = 0, 0
        backoff = a.async_throttle_backoff
        inv = None
        outcome = "expired"
        while True:
            if time.monotonic() - first > a.async_max_age:
                break
            attempt += 1
            inv = Invocation(payload, source)
            inv.event_id, inv.attempt = event_id, attempt
            ran = self.dispatch(inv)
            if self.closed:
                return
            if ran and inv.status == "ok":
                with self.cond:
                    self.totals["async_succeeded"] += 1
                return
            if not ran and inv.status == "throttled":
                wait = backoff
                backoff = min(backoff * 2, a.async_throttle_max_backoff)
                key = "async_throttle_retries"
            else:
                errors += 1
                if errors > a.async_retries:
                    outcome = "exhausted"
                    break
                wait = a.async_retry_delays[min(errors, len(a.async_retry_delays)) - 1]
                key = "async_retries"
            left = a.async_max_age - (time.monotonic() - first)
            if wait > left:
                # The event would be older than MaximumEventAgeInSeconds at the retry:
                # discarded when it reaches that age.
                if not self.sleep(max(0.0, left)):
                    return
                break
            with self.cond:
                self.totals[key] += 1
            if not self.sleep(wait):
                return
        with self.cond:
            self.totals["async_dropped"] += 1
            self.totals[f"async_{outcome}"] += 1
        log(f"async event {event_id} from {source} dropped ({outcome}) after {attempt} "
            f"attempt(s), {errors} function error(s), {time.monotonic() - first:.1f}s "
            f"(last status {inv.status if inv else None})")

    # ------------------------------------------------------------ schedule

    def schedule_payload(self) -> bytes:
        if self.args.schedule_payload:
            return self.args.schedule_payload.encode()
        return json.dumps({
            "version": "0", "id": str(uuid.uuid4()), "detail-type": "Scheduled Event",
            "source": "aws.events", "account": self.args.account_id,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "region": self.region,
            "resources": [f"arn:aws:events:{self.region}:{self.args.account_id}:rule/"
                          f"{self.name}-schedule"],
            "detail": {},
        }).encode()

    def schedule_loop(self) -> None:
        period = self.args.schedule
        offset = self.args.schedule_offset if self.args.schedule_offset is not None else period
        t0 = time.monotonic() + offset
        k = 0
        while True:
            due = t0 + k * period
            with self.cond:
                while not self.closed and time.monotonic() < due:
                    self.cond.wait(due - time.monotonic())
                if self.closed:
                    return
                self.totals["schedule_ticks"] += 1
            k += 1
            threading.Thread(target=self.invoke_async, args=(self.schedule_payload(), "schedule"),
                             daemon=True).start()

    # ---------------------------------------------------------------- stats

    def stats(self, since: int = 0, with_invocations: bool = True) -> dict:
        with self.cond:
            totals = dict(self.totals)
            totals["duration_ms"] = round(totals["duration_ms"], 3)
            totals["init_ms"] = round(totals["init_ms"], 3)
            totals["billed_gb_s"] = round(totals["billed_ms"] / 1000 * self.args.memory / 1024, 6)
            totals["environments_alive"] = sum(1 for e in self.envs if e.state != "dead")
            totals["concurrency_now"] = self.concurrency()
            out = {
                "function_name": self.name, "function_arn": self.arn,
                "binary": self.binary, "command": self.command,
                "memory_mb": self.args.memory, "timeout_s": self.args.timeout,
                "cpu_quota": (round(self.cgroups.quota_us / CFS_PERIOD_US, 4)
                              if self.cgroups else None),
                "max_concurrency": self.args.max_concurrency,
                "bill_init": not self.args.no_bill_init,
                "async_config": {
                    "max_retries": self.args.async_retries,
                    "max_event_age_s": self.args.async_max_age,
                    "retry_delays_s": self.args.async_retry_delays,
                    "throttle_backoff_s": [self.args.async_throttle_backoff,
                                           self.args.async_throttle_max_backoff],
                    "source": self.args.async_source,
                },
                "totals": totals,
                "environments": [e.describe() for e in self.envs],
                "invocation_count": len(self.records),
            }
            if with_invocations:
                out["invocations"] = self.records[since:]
            return out

    def shutdown(self) -> None:
        with self.cond:
            if self.closed:
                return
            self.closed = True
            for env in self.envs:
                for inv in (env.current, env.assigned):
                    if inv is not None and not inv.done.is_set():
                        self.finish(inv, "error", json.dumps({
                            "errorType": "Service.ShuttingDown",
                            "errorMessage": "the emulator is shutting down"}).encode(),
                            "Service.ShuttingDown")
                env.kill("shutdown")
            self.cond.notify_all()
            procs = [e.proc for e in self.envs if e.proc is not None]
            cgroups = [e.cgroup for e in self.envs if e.cgroup is not None]
        if cgroups:  # a cgroup goes once its processes are gone (killed just now)
            for proc in procs:
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
            for path in cgroups:
                CpuCgroups.remove(path)


class RuntimeApiHandler(BaseHTTPRequestHandler):
    """The Runtime API of one environment (self.server.env)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # quiet
        pass

    def reply(self, code: int, body: bytes = b"", headers: dict | None = None) -> None:
        try:
            self.send_response(code)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Type", (headers or {}).get("Content-Type",
                                                                  "application/json"))
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass

    def do_GET(self):
        env: Environment = self.server.env  # type: ignore[attr-defined]
        if self.path != f"{RUNTIME_PREFIX}/invocation/next":
            return self.reply(404, b'{"errorType":"NotFound"}')
        service = env.service
        with service.cond:
            if env.state == "dead":
                return self.reply(410, b'{"errorType":"EnvironmentGone"}')
            if env.first_next is None:
                env.first_next = time.monotonic()
                env.init_ms = (env.first_next - env.started_mono) * 1000
            if env.current is not None and not env.current.done.is_set():
                # /next without a response: Lambda treats the invocation as failed.
                service.finish(env.current, "error", json.dumps({
                    "errorType": "Runtime.NoResponse",
                    "errorMessage": "the runtime asked for the next event without "
                                    "answering this one"}).encode(), "Runtime.NoResponse")
            env.current = None
            if env.state != "dead":
                env.state = "idle"
                env.idle_since = time.monotonic()
            service.cond.notify_all()
            while env.assigned is None and env.state != "dead" and not service.closed:
                if service.args.freeze and not env.frozen:
                    env.signal_group(signal.SIGSTOP)
                    env.frozen = True
                service.cond.wait()
            if env.frozen:
                env.signal_group(signal.SIGCONT)
                env.frozen = False
            if env.assigned is None or env.state == "dead":
                return self.reply(410, b'{"errorType":"EnvironmentGone"}')
            inv = env.assigned
            env.assigned = None
            env.current = inv
            env.state = "busy"
            inv.start = time.time()
            inv.start_mono = time.monotonic()
            timeout = service.args.timeout
            inv.deadline_ms = int(inv.start * 1000 + timeout * 1000)
            inv.timer = threading.Timer(timeout, service.on_timeout, (env, inv))
            inv.timer.daemon = True
            inv.timer.start()
            service.write_log(env, f"START RequestId: {inv.request_id} Version: $LATEST", inv)
            headers = {
                "Lambda-Runtime-Aws-Request-Id": inv.request_id,
                "Lambda-Runtime-Deadline-Ms": str(inv.deadline_ms),
                "Lambda-Runtime-Invoked-Function-Arn": service.arn,
                "Lambda-Runtime-Trace-Id": inv.trace_id,
            }
            if inv.client_context:
                headers["Lambda-Runtime-Client-Context"] = inv.client_context
        self.reply(200, inv.payload, headers)

    def do_POST(self):
        env: Environment = self.server.env  # type: ignore[attr-defined]
        service = env.service
        body = read_body(self)
        path = self.path
        if path == f"{RUNTIME_PREFIX}/init/error":
            with service.cond:
                inv = env.assigned or env.current
                env.assigned = env.current = None
                error_type = self.headers.get("Lambda-Runtime-Function-Error-Type",
                                              "Runtime.InitError")
                diag = parse_diagnostic(body, error_type)
                if inv is not None:
                    service.finish(inv, "error", json.dumps(diag).encode(), diag["errorType"])
                service.write_log(env, f"INIT error: {json.dumps(diag)}")
            self.reply(202, b'{"status":"OK"}')
            with service.cond:
                env.kill("init error")
            return
        prefix = f"{RUNTIME_PREFIX}/invocation/"
        if not path.startswith(prefix) or path.count("/") != 5:
            return self.reply(404, b'{"errorType":"NotFound"}')
        request_id, _, what = path[len(prefix):].partition("/")
        if what not in ("response", "error"):
            return self.reply(404, b'{"errorType":"NotFound"}')
        with service.cond:
            inv = env.current
            if inv is None or inv.request_id != request_id:
                return self.reply(400, json.dumps({
                    "errorMessage": f"Invalid request ID: {request_id}",
                    "errorType": "InvalidRequestID"}).encode())
            if inv.done.is_set():
                return self.reply(410, b'{"errorType":"InvocationEnded"}')
            if what == "response":
                if len(body) > SYNC_PAYLOAD_LIMIT:
                    diag = {"errorType": "Function.ResponseSizeTooLarge",
                            "errorMessage": f"Response payload size ({len(body)} bytes) exceeded "
                                            f"maximum allowed payload size "
                                            f"({SYNC_PAYLOAD_LIMIT} bytes)."}
                    service.finish(inv, "error", json.dumps(diag).encode(), diag["errorType"])
                else:
                    service.finish(inv, "ok", body)
            else:
                error_type = self.headers.get("Lambda-Runtime-Function-Error-Type", "Unhandled")
                diag = parse_diagnostic(body, error_type)
                service.finish(inv, "error", json.dumps(diag).encode(), diag["errorType"])
            env.current = None
            if env.state == "busy":
                env.state = "finishing"
        self.reply(202, b'{"status":"OK"}')


def parse_diagnostic(body: bytes, fallback_type: str) -> dict:
    try:
        diag = json.loads(body)
        if isinstance(diag, dict):
            diag.setdefault("errorType", fallback_type)
            diag.setdefault("errorMessage", "")
            return diag
    except ValueError:
        pass
    return {"errorType": fallback_type, "errorMessage": body.decode("utf-8", "replace")}


class ClientApiHandler(BaseHTTPRequestHandler):
    """Lambda's Invoke API for the one function, plus /stats and /shutdown."""

    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def reply(self, code: int, body: bytes = b"", headers: dict | None = None) -> None:
        try:
            self.send_response(code)
            headers = dict(headers or {})
            headers.setdefault("Content-Type", "application/json")
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass

    def error(self, code: int, error_type: str, message: str, extra: dict | None = None) -> None:
        body = {"Type": "User", "message": message, "__type": error_type, **(extra or {})}
        self.reply(code, json.dumps(body).encode(), {"x-amzn-ErrorType": error_type,
                                                     "x-amzn-RequestId": str(uuid.uuid4())})

    def do_GET(self):
        service: Service = self.server.service  # type: ignore[attr-defined]
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/stats":
            q = urllib.parse.parse_qs(url.query)
            since = int(q.get("since", ["0"])[0])
            with_inv = q.get("invocations", ["1"])[0] not in ("0", "false", "no")
            return self.reply(200, json.dumps(service.stats(since, with_inv)).encode())
        self.error(404, "ResourceNotFoundException", f"no route for GET {url.path}")

    def do_POST(self):
        service: Service = self.server.service  # type: ignore[attr-defined]
        url = urllib.parse.urlsplit(self.path)
        body = read_body(self)
        if url.path == "/shutdown":
            service.shutdown()
            self.reply(200, json.dumps(service.stats()).encode())
            threading.Thread(target=self.server.shutdown, daemon=True).start()
            return
        if not (url.path.startswith(INVOKE_PREFIX) and url.path.endswith("/invocations")):
            return self.error(404, "ResourceNotFoundException", f"no route for POST {url.path}")
        name = urllib.parse.unquote(url.path[len(INVOKE_PREFIX):-len("/invocations")])
        if function_name_of(name) != service.name:
            return self.error(404, "ResourceNotFoundException",
                              f"Function not found: {service.arn.rsplit(':', 1)[0]}:{name}")
        kind = self.headers.get("X-Amz-Invocation-Type", "RequestResponse")
        tail = self.headers.get("X-Amz-Log-Type", "None") == "Tail"
        if kind == "DryRun":
            return self.reply(204)
        if kind == "Event":
            if len(body) > ASYNC_PAYLOAD_LIMIT:
                return self.error(413, "RequestTooLargeException",
                                  "Request must be smaller than 1048576 bytes for the "
                                  "InvokeAsync operation")
            event_id = str(uuid.uuid4())
            threading.Thread(target=service.invoke_async, args=(body, "event", event_id),
                             daemon=True).start()
            return self.reply(202, b"", {"x-amzn-RequestId": event_id})
        if kind != "RequestResponse":
            return self.error(400, "InvalidParameterValueException",
                              f"invalid X-Amz-Invocation-Type {kind}")
        if len(body) > SYNC_PAYLOAD_LIMIT:
            return self.error(413, "RequestTooLargeException",
                              "Request must be smaller than 6291456 bytes for the Invoke "
                              "operation")
        context = self.headers.get("X-Amz-Client-Context")
        if context:
            try:
                context = base64.b64decode(context).decode()
            except ValueError:
                return self.error(400, "InvalidRequestContentException",
                                  "X-Amz-Client-Context is not base64")
        inv = Invocation(body, "invoke", tail, context)
        service.dispatch(inv)
        if inv.status == "throttled":
            return self.error(429, "TooManyRequestsException", "Rate Exceeded.",
                              {"Reason": "ReservedFunctionConcurrentInvocationLimitExceeded"})
        if inv.error_type == "Service.ShuttingDown" and inv.env is None:
            return self.error(503, "ServiceException", "the emulator is shutting down")
        headers = {"X-Amz-Executed-Version": "$LATEST", "x-amzn-RequestId": inv.request_id,
                   "X-Amzn-Trace-Id": inv.trace_id}
        if inv.status != "ok":
            headers["X-Amz-Function-Error"] = "Unhandled"
        if tail:
            headers["X-Amz-Log-Result"] = inv.log_tail()
        self.reply(200, inv.body, headers)


def function_name_of(name: str) -> str:
    """The function name in a name, a partial ARN or an ARN, without its qualifier."""
    parts = name.split(":")
    if "function" in parts:
        return parts[parts.index("function") + 1]
    return parts[0]


def async_settings(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The EventInvokeConfig: explicit flags over --template over Lambda's defaults."""
    source = {"retries": "flag", "max_age": "flag"}
    config = {"MaximumRetryAttempts": 2, "MaximumEventAgeInSeconds": 21600,
              "Source": "Lambda's defaults"}
    if args.template:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import cfn_template  # noqa: E402 (next to this script; needs PyYAML)
        try:
            tpl = cfn_template.Template(args.template, cfn_template.parse_params(args.param))
            config = tpl.event_invoke_config(args.template_function or args.function_name)
        except cfn_template.TemplateError as e:
            p.error(f"--template: {e}")
        config["Source"] = f"template:{config['Source']}"
    if args.async_retries is None:
        args.async_retries = config["MaximumRetryAttempts"]
        source["retries"] = config["Source"]
    if args.async_max_age is None:
        args.async_max_age = float(config["MaximumEventAgeInSeconds"])
        source["max_age"] = config["Source"]
    args.async_source = source
    if not 0 <= args.async_retries <= 2:
        p.error("--async-retries must be 0, 1 or 2 (Lambda's range)")
    if not 0 < args.async_max_age <= 21600:
        p.error("--async-max-age must be > 0 and at most 21600 (Lambda's maximum)")
    if args.async_retry_delay is not None:
        args.async_retry_delays = [args.async_retry_delay]
    else:
        try:
            args.async_retry_delays = [float(x) for x in args.async_retry_delays.split(",")]
        except ValueError:
            p.error("--async-retry-delays wants seconds separated by commas, e.g. 60,120")
    if any(d < 0 for d in args.async_retry_delays) or args.async_throttle_backoff <= 0 \
            or args.async_throttle_max_backoff < args.async_throttle_backoff:
        p.error("async delays must be >= 0, the throttle back-off > 0 and <= its maximum")


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="See the module docstring (the head of this file) for the full behaviour.")
    p.add_argument("binary", help="the function's executable (bootstrap)")
    p.add_argument("--prefix", default="",
                   help="command the binary runs under, e.g. 'qemu-aarch64-static -L /'")
    p.add_argument("--function-name", help="default: the binary's name (its directory's "
                   "name for a file called bootstrap)")
    p.add_argument("--memory", type=int, default=128, help="MB (default 128, the template's is 256)")
    p.add_argument("--cpu-share", action="store_true",
                   help="each environment gets --memory/1769 of one CPU, as Lambda gives "
                   "(a cgroup CPU quota; see the docstring)")
    p.add_argument("--timeout", type=float, default=3.0, help="function timeout, seconds (default 3)")
    p.add_argument("--max-concurrency", type=int, default=10,
                   help="most environments at once; beyond it invokes are throttled (default 10)")
    p.add_argument("--init-timeout", type=float, default=10.0,
                   help="seconds from process start to its first /next (default 10, Lambda's)")
    p.add_argument("--reuse-grace-ms", type=float, default=100.0,
                   help="how long an invoke waits for an environment that has answered but "
                        "not yet asked for its next event, before a cold start (default 100)")
    p.add_argument("--idle-expiry", type=float, default=0.0,
                   help="kill environments idle this many seconds (default 0: never)")
    p.add_argument("--no-freeze", dest="freeze", action="store_false",
                   help="do not SIGSTOP idle environments")
    p.add_argument("--no-bill-init", action="store_true",
                   help="leave the init phase out of the billed duration")
    p.add_argument("--env", action="append", default=[], metavar="K=V",
                   help="an environment variable of the function (repeatable)")
    p.add_argument("--clean-env", action="store_true",
                   help="do not pass this process's environment on (only PATH, HOME, LANG)")
    p.add_argument("--log-format", choices=["JSON", "Text"],
                   help="sets AWS_LAMBDA_LOG_FORMAT (the template's LoggingConfig is JSON)")
    p.add_argument("--log-level", help="sets AWS_LAMBDA_LOG_LEVEL")
    p.add_argument("--cwd", help="working directory and LAMBDA_TASK_ROOT (default: the binary's)")
    p.add_argument("--account-id", default="123456789012")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="client API port (default: a free one)")
    p.add_argument("--port-file", help="write the client API port to this file once listening")
    p.add_argument("--stats-file", help="write the final stats JSON here on exit")
    p.add_argument("--log-file", help="append the function's logs here instead of stderr")
    p.add_argument("--timed-log-file",
                   help="also append each line of the function's logs here, prefixed with "
                   "the time it arrived (seconds since the epoch, to the millisecond): the "
                   "function's JSON lines carry no time of their own")
    p.add_argument("--schedule", type=float, metavar="SECONDS",
                   help="invoke asynchronously with a scheduled event every SECONDS")
    p.add_argument("--schedule-offset", type=float, metavar="SECONDS",
                   help="first tick after this many seconds (default: SECONDS)")
    p.add_argument("--schedule-payload", metavar="JSON",
                   help="payload of each tick instead of the EventBridge scheduled event")
    p.add_argument("--template", metavar="FILE",
                   help="read the async settings (EventInvokeConfig) from this SAM template")
    p.add_argument("--template-function", metavar="LOGICAL_ID",
                   help="the function of --template (default: --function-name)")
    p.add_argument("--param", action="append", default=[], metavar="K=V",
                   help="a template parameter for --template (repeatable)")
    p.add_argument("--async-max-age", type=float, default=None,
                   help="MaximumEventAgeInSeconds: an async event older than this is "
                        "discarded (default: the template's, else Lambda's 21600)")
    p.add_argument("--async-retries", type=int, default=None,
                   help="MaximumRetryAttempts after function errors, 0-2 (default: the "
                        "template's, else Lambda's 2)")
    p.add_argument("--async-retry-delays", metavar="S1,S2", default="60,120",
                   help="seconds before the first and the second retry (default 60,120, "
                        "Lambda's one and two minutes)")
    p.add_argument("--async-retry-delay", type=float, default=None,
                   help="one delay before every retry (overrides --async-retry-delays)")
    p.add_argument("--async-throttle-backoff", type=float, default=1.0,
                   help="first wait before retrying a throttled async event, doubling "
                        "(default 1, Lambda's)")
    p.add_argument("--async-throttle-max-backoff", type=float, default=300.0,
                   help="longest wait between throttle retries (default 300, Lambda's)")
    args = p.parse_args()

    if not os.path.exists(args.binary):
        p.error(f"no such binary: {args.binary}")
    if args.schedule_payload:
        try:
            json.loads(args.schedule_payload)
        except ValueError as e:
            p.error(f"--schedule-payload is not JSON: {e}")
    for kv in args.env:
        if "=" not in kv:
            p.error(f"--env wants K=V, got {kv!r}")
    if args.max_concurrency < 1 or args.timeout <= 0:
        p.error("--max-concurrency must be >= 1 and --timeout > 0")
    if not args.function_name:
        base = os.path.basename(os.path.abspath(args.binary))
        args.function_name = (os.path.basename(os.path.dirname(os.path.abspath(args.binary)))
                              if base == "bootstrap" else base)
    async_settings(p, args)

    try:
        service = Service(args)
    except OSError as e:
        print(f"lambda_runtime: --cpu-share: cannot create a CPU cgroup: {e}", file=sys.stderr)
        return 2
    server = QuietServer((args.host, args.port), ClientApiHandler)
    server.service = service  # type: ignore[attr-defined]
    port = server.server_address[1]
    service.client_port = port

    def on_signal(signum, _frame):
        service.shutdown()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    if args.idle_expiry > 0:
        threading.Thread(target=service.reaper_loop, daemon=True).start()
    if args.schedule:
        threading.Thread(target=service.schedule_loop, daemon=True).start()

    print(port, flush=True)
    if args.port_file:
        tmp = f"{args.port_file}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(f"{port}\n")
        os.replace(tmp, args.port_file)
    log(f"{service.name}: {' '.join(service.command)}; memory {args.memory} MB, timeout "
        f"{args.timeout:g}s, max concurrency {args.max_concurrency}; invoke at "
        f"http://127.0.0.1:{port}{INVOKE_PREFIX}{service.name}/invocations")
    server.serve_forever()
    service.shutdown()
    server.server_close()
    # Let the reapers collect the killed processes.
    for env in service.envs:
        if env.proc is not None:
            try:
                env.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
    final = service.stats()
    if args.stats_file:
        with open(args.stats_file, "w") as f:
            json.dump(final, f, indent=1)
    t = final["totals"]
    log(f"stopped: {t['invocations']} invocations, {t['cold_starts']} cold starts, "
        f"{t['errors']} errors ({t['timeouts']} timeouts), {t['throttles']} throttles, "
        f"{t['billed_ms']} billed ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
