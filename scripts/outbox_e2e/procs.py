"""Background processes of a scenario (emulators, pollers, relays, proxies): started in a
session of their own with their output in a log file, and stopped, whatever happens, by
the registry that started them."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from .report import Failed, step


def kill_group(pgid: int) -> None:
    """SIGKILL to a process group (and SIGCONT, for a frozen Lambda environment)."""
    for sig in (signal.SIGKILL, signal.SIGCONT):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


class Proc:
    """A background process in its own session, its stderr (and its stdout, unless
    `stdout_file` or `stdout_pipe`) in NAME.log under `workdir`."""

    def __init__(self, name: str, args: list[str], workdir: str, env: dict | None = None,
                 stdout_file: str | None = None, stdout_pipe: bool = False):
        self.name = name
        self.log_path = os.path.join(workdir, f"{name}.log")
        self.log = open(self.log_path, "w")
        self.stdout_path = stdout_file
        if stdout_pipe:
            out = subprocess.PIPE
        else:
            out = open(stdout_file, "w") if stdout_file else self.log
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out,
                                     stderr=self.log, env=env, start_new_session=True,
                                     text=stdout_pipe or None)
        if stdout_file:
            out.close()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace: float = 15.0) -> int | None:
        """SIGTERM, wait up to `grace` s, then SIGKILL of its process group."""
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                step(f"{self.name} ignored SIGTERM for {grace:g}s; killing it")
        kill_group(self.proc.pid)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            step(f"warning: {self.name} (pid {self.proc.pid}) still alive")
        self.log.close()
        return self.proc.returncode

    def tail(self, n: int = 30) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""


def wait_file(path: str, proc: Proc, what: str, timeout: float = 60.0) -> str:
    """The content of `path` once a process has written it (fails when the process exits
    first, or after `timeout` seconds)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(path):
            with open(path) as f:
                text = f.read()
            if text.strip():
                return text
        if not proc.alive():
            raise Failed(f"{what} exited with {proc.proc.returncode} before it was ready:\n"
                         f"{proc.tail()}")
        time.sleep(0.1)
    raise Failed(f"{what} not ready after {timeout:g}s:\n{proc.tail()}")


class Started(list):
    """What a scenario started, in order: each thing has a name, stop() and tail() (an
    emulator also function_tail()).  stop_all() stops them in reverse order and goes on
    past a failure to stop one."""

    def tails(self, n: int = 40) -> str:
        out = []
        for thing in self:
            if hasattr(thing, "function_tail"):
                tail, what = thing.function_tail(n), f"the {thing.name} function log"
            else:
                tail, what = thing.tail(), thing.name
            if tail:
                out.append(f"---- last lines of {what} ----\n{tail}")
        return "\n".join(out)

    def stop_all(self) -> None:
        while self:
            thing = self.pop()
            try:
                thing.stop()
            except Exception as e:  # keep stopping the others
                step(f"stopping {getattr(thing, 'name', thing)}: {e}")


def wait_for(pred, timeout: float, interval: float = 0.05):
    """pred()'s first true value within `timeout` seconds, else its last value."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    return pred()


class Stopper:
    """A thing a scenario started that a call stops (a thread's flag), for `Started`."""

    def __init__(self, name: str, stop):
        self.name = name
        self._stop = stop

    def stop(self) -> None:
        self._stop()

    def tail(self, n: int = 30) -> str:
        return ""
