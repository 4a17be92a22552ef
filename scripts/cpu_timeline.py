#!/usr/bin/env python3
"""How much CPU a Lambda function's process uses, and when: for telling a cold path that
waits on its requests from one that waits on its CPU share (lambda_runtime.py --cpu-share
gives a 128 MB function 7.2 % of a CPU, so a CPU-bound millisecond takes about 14).

  cpu_timeline.py watch COMM OUT
      Until interrupted: finds every process whose name (/proc/PID/comm, 15 characters)
      starts with COMM, and every 10 ms writes "epoch pid cpu_ms" to OUT when the
      process's on-CPU time changed (the sum over its threads of the first field of
      /proc/PID/task/TID/schedstat, nanoseconds). Line it up with the function's log lines
      as lambda_runtime.py --timed-log-file stamps them (continuity_e2e.py keeps them as
      RelayFunction.timed.log with --keep).

  cpu_timeline.py init BINARY [--runs N]
      The CPU of a function's initialization: runs BINARY N times (default 5) against a
      stub of Lambda's runtime API that never answers, and prints the process's on-CPU
      time when its first GET .../invocation/next arrives (everything before the handler:
      the runtime, the log subscriber, the SDK's configuration and clients). BINARY reads
      its configuration from this process's environment.

The watcher runs outside the function's cgroup, so its own CPU is not charged to the
function. Linux only.
"""
from __future__ import annotations

import argparse
import http.server
import os
import subprocess
import sys
import threading
import time


def cpu_ms(pid: int | str) -> float:
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            total += int(f.read().split()[0])
    return total / 1e6


def watch(comm: str, out_path: str) -> None:
    prefix = comm[:15]
    pids: set[str] = set()
    last: dict[str, float] = {}
    scanned = 0.0
    with open(out_path, "w", buffering=1) as out:
        while True:
            now = time.time()
            if now - scanned > 0.1:  # a new process: found within 0.1 s
                scanned = now
                for pid in os.listdir("/proc"):
                    if pid.isdigit() and pid not in pids:
                        try:
                            with open(f"/proc/{pid}/comm") as f:
                                if f.read().strip().startswith(prefix):
                                    pids.add(pid)
                        except OSError:
                            pass
            for pid in list(pids):
                try:
                    used = cpu_ms(pid)
                except OSError:  # gone
                    pids.discard(pid)
                    continue
                if last.get(pid) != used:
                    last[pid] = used
                    out.write(f"{time.time():.3f} {pid} {used:.1f}\n")
            time.sleep(0.01)


def init(binary: str, runs: int) -> list[float]:
    arrived = threading.Event()

    class Stub(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.endswith("/invocation/next"):
                arrived.set()
            time.sleep(30)  # never answers; the process is killed first

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = dict(os.environ, AWS_LAMBDA_RUNTIME_API=f"127.0.0.1:{server.server_port}")
    env.setdefault("AWS_LAMBDA_FUNCTION_NAME", "cpu-timeline")
    env.setdefault("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128")
    env.setdefault("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
    found = []
    for _ in range(runs):
        arrived.clear()
        proc = subprocess.Popen([binary], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        if not arrived.wait(10):
            proc.kill()
            err = proc.communicate()[1].decode(errors="replace")
            sys.exit(f"{binary} asked for no invocation within 10 s: {err[-2000:]}")
        found.append(cpu_ms(proc.pid))
        proc.kill()
        proc.wait()
    server.shutdown()
    return found


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("watch")
    w.add_argument("comm")
    w.add_argument("out")
    i = sub.add_parser("init")
    i.add_argument("binary")
    i.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    if args.cmd == "watch":
        try:
            watch(args.comm, args.out)
        except KeyboardInterrupt:
            pass
        return 0
    ms = init(args.binary, args.runs)
    print(f"on-CPU time to the first /next, {len(ms)} runs: "
          + ", ".join(f"{m:.1f}" for m in ms) + " ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
