"""The stream's event source mapping as a scenario runs it: scripts/streams.py poll (a
process of its own) from a table's stream to a function's Invoke URL, with its ready
file, its counters and its log of invocation attempts."""

from __future__ import annotations

import json
import os

from .paths import PY, TEMPLATE, script
from .procs import Proc, wait_file
from .report import Failed


class StreamPoller:
    """streams.py poll TABLE --invoke URL FLAGS..., its files under `workdir` (NAME.ready,
    NAME.stats.json, NAME.batches.jsonl for --batch-log, NAME.out for its stdout)."""

    def __init__(self, workdir: str, table: str, invoke_url: str, *flags: str,
                 env: dict | None = None, name: str = "poller"):
        stem, n = name, 1
        while os.path.exists(os.path.join(workdir, f"{stem}.log")):
            n += 1
            stem = f"{name}-{n}"
        self.name = stem
        self.ready_file = os.path.join(workdir, f"{stem}.ready")
        self.stats_file = os.path.join(workdir, f"{stem}.stats.json")
        self.batch_log = os.path.join(workdir, f"{stem}.batches.jsonl")
        self.out_file = os.path.join(workdir, f"{stem}.out")
        self.proc = Proc(stem, [
            PY, script("streams.py"), "poll", table, "--invoke", invoke_url,
            "--ready-file", self.ready_file, "--stats-file", self.stats_file,
            "--batch-log", self.batch_log, *flags], workdir, env=env, stdout_file=self.out_file)
        self.counters: dict | None = None
        self.returncode: int | None = None

    @classmethod
    def templated(cls, workdir: str, table: str, invoke_url: str, prefix: str,
                  relay_timeout: float, env: dict | None = None,
                  shards: int = 1) -> "StreamPoller":
        """The template's own RelayDoorbell mapping (KeyPrefix=prefix), the invocation
        given the relay's timeout and 30 s more, the records spread over `shards` virtual
        shards."""
        return cls(workdir, table, invoke_url, "--template", TEMPLATE,
                   "--function", "RelayFunction", "--param", f"KeyPrefix={prefix}",
                   "--invoke-timeout", f"{relay_timeout + 30:g}", "--shards", str(shards),
                   env=env)

    def wait_ready(self, timeout: float = 60.0) -> dict:
        """Once every starting shard has its iterator: the effective settings."""
        return json.loads(wait_file(self.ready_file, self.proc, "streams.py poll",
                                    timeout))["settings"]

    def batches(self) -> list[dict]:
        """The --batch-log: one line per invocation attempt."""
        if not os.path.exists(self.batch_log):
            return []
        with open(self.batch_log) as f:
            return [json.loads(x) for x in f if x.strip()]

    def alive(self) -> bool:
        return self.proc.alive()

    def stop(self) -> dict:
        """SIGTERM: the counters it printed on stdout ({} when it printed none)."""
        if self.counters is not None:
            return self.counters
        self.returncode = self.proc.stop(grace=30)
        try:
            with open(self.out_file) as f:
                self.counters = json.loads(f.read().strip().splitlines()[-1])
        except (OSError, ValueError, IndexError):
            self.counters = {}
        return self.counters

    def stop_counters(self) -> dict:
        """stop(), failing unless the poller wrote its counters to --stats-file."""
        self.stop()
        try:
            with open(self.stats_file) as f:
                return json.load(f)
        except (OSError, ValueError) as e:
            raise Failed(f"the poller wrote no counters ({e}):\n{self.tail()}") from e

    def tail(self, n: int = 30) -> str:
        return self.proc.tail(n)
