"""What the emulator's parts share: the API paths and limits, logging, the HTTP server,
the CPU cgroups of --cpu-share and the memory high-water mark."""

from __future__ import annotations

import datetime
import math
import os
import sys
import time
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

