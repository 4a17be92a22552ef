"""A function binary under the Lambda emulator (scripts/lambda_runtime.py, a process of its
own): started, invoked through Lambda's Invoke API, asked for its stats, stopped with the
environments it started."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import urllib.error
import urllib.request

import boto3
from botocore.config import Config

from .paths import PY, script
from .procs import Proc, kill_group, wait_file, wait_for

# The template's Globals MemorySize, the enqueue function's; the emulator gives the relay
# the same (the template's RelayMemorySize is 128: the continuity benchmark's --memory 128
# --cpu-share).
MEMORY_MB = 256


class Emulator:
    """scripts/lambda_runtime.py on one binary: its client API on a free loopback port
    (written to NAME.port, printed on its stdout), its final stats in NAME.stats.json, its
    own log in NAME.emulator.log, all under `workdir`."""

    def __init__(self, name: str, binary: str, workdir: str, args: list[str],
                 env: dict | None = None, function_log: str | None = None,
                 timeout: float | None = None):
        stem, n = name, 1
        while os.path.exists(os.path.join(workdir, f"{stem}.port")) or \
                os.path.exists(os.path.join(workdir, f"{stem}.emulator.log")):
            n += 1
            stem = f"{name}-{n}"
        self.name = name
        self.timeout = timeout
        self.port_file = os.path.join(workdir, f"{stem}.port")
        self.stats_file = os.path.join(workdir, f"{stem}.stats.json")
        self.function_log = function_log
        self.env_pids: set[int] = set()
        self.last_trace_id: str | None = None
        self.proc = Proc(f"{stem}.emulator", [
            PY, script("lambda_runtime.py"), binary, "--function-name", name,
            "--port-file", self.port_file, "--stats-file", self.stats_file, *args],
            workdir, env=env, stdout_pipe=True)
        self.port = 0
        self.printed_port: int | None = None
        self._client = None

    @classmethod
    def function(cls, name: str, binary: str, workdir: str, timeout: float, env: dict,
                 prefix: str = "", max_concurrency: int = 10, init_timeout: float = 10.0,
                 extra_args: list[str] | None = None) -> "Emulator":
        """A deployed function as the template describes one: its memory, timeout and
        concurrency ceiling, JSON logging at INFO (the template's LoggingConfig), and only
        `env` for its environment (--clean-env: the template's variables plus what Lambda
        and the execution role provide); its log in NAME.function.log."""
        function_log = os.path.join(workdir, f"{name}.function.log")
        args = ["--memory", str(MEMORY_MB), "--timeout", f"{timeout:g}",
                "--max-concurrency", str(max_concurrency), "--init-timeout", f"{init_timeout:g}",
                "--log-file", function_log, "--log-format", "JSON", "--log-level", "INFO",
                "--clean-env"]
        if prefix:
            args.append(f"--prefix={prefix}")
        for k, v in env.items():
            args += ["--env", f"{k}={v}"]
        args += extra_args or []
        return cls(name, binary, workdir, args, function_log=function_log, timeout=timeout)

    def wait_ready(self, timeout: float = 60.0) -> "Emulator":
        self.port = int(wait_file(self.port_file, self.proc, f"the {self.name} emulator",
                                  timeout))
        line = self.proc.proc.stdout.readline()
        self.printed_port = int(line) if line.strip() else None
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def invoke_url(self) -> str:
        return f"{self.url}/2015-03-31/functions/{self.name}/invocations"

    @property
    def client(self):
        """boto3's Lambda client on the emulator's endpoint (one attempt per call)."""
        if self._client is None:
            self._client = boto3.client(
                "lambda", endpoint_url=self.url, region_name="us-east-1",
                aws_access_key_id="local", aws_secret_access_key="local",
                config=Config(retries={"total_max_attempts": 1}, read_timeout=60))
        return self._client

    def invoke(self, payload, timeout: float, kind: str = "RequestResponse") \
            -> tuple[int, str | None, bytes]:
        """One invocation: the HTTP status, X-Amz-Function-Error and the body."""
        req = urllib.request.Request(self.invoke_url, data=json.dumps(payload).encode(),
                                     method="POST", headers={
                                         "Content-Type": "application/json",
                                         "X-Amz-Invocation-Type": kind})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                # The invocation's X-Ray trace header (Lambda answers with it).
                self.last_trace_id = r.headers.get("X-Amzn-Trace-Id")
                return r.status, r.headers.get("X-Amz-Function-Error"), r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("X-Amz-Function-Error"), e.read()

    def invoke_sdk(self, payload, kind: str = "RequestResponse") -> dict:
        """One invocation through boto3's Lambda client: its answer, the body read into
        "body" (a throttle or an unknown function raises botocore's ClientError)."""
        out = self.client.invoke(FunctionName=self.name, Payload=json.dumps(payload).encode(),
                                 InvocationType=kind)
        out["body"] = out["Payload"].read()
        return out

    def hold(self, seconds: float) -> threading.Thread:
        """Keeps one environment busy for `seconds` (a synchronous invoke of the fake
        function's {"sleep": seconds} in a thread); returns once it runs."""
        t = threading.Thread(target=lambda: self.invoke_sdk({"sleep": seconds}), daemon=True)
        t.start()
        wait_for(lambda: self.stats(invocations=False)["totals"]["concurrency_now"] >= 1, 10)
        return t

    def stats(self, since: int = 0, invocations: bool = True) -> dict:
        q = f"?since={since}" + ("" if invocations else "&invocations=0")
        with urllib.request.urlopen(f"{self.url}/stats{q}", timeout=10) as r:
            out = json.load(r)
        # Remembered for the cleanup: environments are process groups of their own.
        self.env_pids.update(e["pid"] for e in out["environments"] if e.get("pid"))
        return out

    def shutdown(self) -> dict | None:
        """POST /shutdown: the final stats; waits for the emulator to exit."""
        try:
            req = urllib.request.Request(f"{self.url}/shutdown", data=b"", method="POST")
            with urllib.request.urlopen(req, timeout=15) as r:
                final = json.load(r)
        except OSError:
            final = None
        try:
            self.proc.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pass
        return final

    def stop(self) -> dict | None:
        """Stops the emulator (SIGTERM) and every environment it started; the final
        stats (its --stats-file)."""
        if self.port and self.proc.alive():
            try:
                self.stats()
            except OSError:
                pass
        self.proc.stop()
        if self.proc.proc.stdout:
            self.proc.proc.stdout.close()
        final = None
        try:
            with open(self.stats_file) as f:
                final = json.load(f)
            self.env_pids.update(e["pid"] for e in final["environments"] if e.get("pid"))
        except (OSError, ValueError):
            pass
        for pid in self.env_pids:
            kill_group(pid)
        return final

    def tail(self, n: int = 30) -> str:
        return self.proc.tail(n)

    def function_tail(self, n: int = 40) -> str:
        """The last lines of the function's log (the emulator's own when it has none)."""
        if not self.function_log:
            return self.proc.tail(n)
        try:
            with open(self.function_log, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def function_log_text(self) -> str:
        try:
            with open(self.function_log or self.proc.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""
