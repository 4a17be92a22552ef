"""How the end-to-end pieces report: a step line on the `outbox_e2e` logger (pytest shows
it live, pytest.ini's log_cli; a command-line tool sends it to stderr), and the failure of
a check as an AssertionError, which pytest reports as a failed assertion."""

from __future__ import annotations

import logging
import sys

LOG = logging.getLogger("outbox_e2e")


class Failed(AssertionError):
    """A check of an end-to-end scenario failed; the message names it."""


def check(cond, msg: str, detail: str = "") -> None:
    """Fails with `msg` (and `detail`, what was seen instead) unless `cond` holds."""
    if not cond:
        raise Failed(f"{msg}: {detail}" if detail else msg)


def step(msg: str) -> None:
    LOG.info(msg)


def log_to_stderr(name: str) -> None:
    """For a command-line tool: the steps on stderr, each line prefixed with [name]."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"[{name}] %(message)s"))
    LOG.addHandler(handler)
    LOG.setLevel(logging.INFO)
    LOG.propagate = False
