"""The Runtime API (2018-06-01) of one execution environment, as aws-lambda-rust-runtime
speaks it: /next, a response, an error, an init error."""

from __future__ import annotations

import json
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING

from .common import RUNTIME_PREFIX, SYNC_PAYLOAD_LIMIT, read_body

if TYPE_CHECKING:
    from .service import Environment

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
