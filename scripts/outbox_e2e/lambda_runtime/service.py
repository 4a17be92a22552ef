"""The emulated service: invocations, execution environments (one process each), the
dispatch of an invoke to a warm or a cold environment, Lambda's asynchronous queue, the
schedule, and the measurements."""

from __future__ import annotations

import argparse
import base64
import itertools
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid

from .common import (CFS_PERIOD_US, KEEP_BODY_BYTES, TAIL_BYTES, CpuCgroups, QuietServer,
                     iso_now, log, process_hwm_mb, trace_id)
from .runtime_api import RuntimeApiHandler

class Invocation:
    # --sequential-request-ids: 00000000-0000-4000-8000-000000000001, ...2, in the order
    # invocations arrive (a test that must know a relay's id, which embeds it, in advance).
    sequential = False
    _counter = itertools.count(1)
    _counter_lock = threading.Lock()

    def __init__(self, payload: bytes, source: str, tail: bool = False,
                 client_context: str | None = None, request_id: str | None = None):
        # an asynchronous event's retries keep the first attempt's request id, as Lambda's do
        if request_id is not None:
            self.request_id = request_id
        elif Invocation.sequential:
            with Invocation._counter_lock:
                n = next(Invocation._counter)
            self.request_id = f"00000000-0000-4000-8000-{n:012d}"
        else:
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
        # Lambda gives every attempt of one asynchronous event the same request id
        request_id = str(uuid.uuid4())
        while True:
            if time.monotonic() - first > a.async_max_age:
                break
            attempt += 1
            inv = Invocation(payload, source, request_id=request_id)
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
