"""The client API: Lambda's Invoke for the one function, /stats and /shutdown."""

from __future__ import annotations

import base64
import json
import threading
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING

from .common import ASYNC_PAYLOAD_LIMIT, INVOKE_PREFIX, SYNC_PAYLOAD_LIMIT, read_body
from .service import Invocation

if TYPE_CHECKING:
    from .service import Service

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
