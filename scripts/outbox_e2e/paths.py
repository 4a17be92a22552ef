"""Where things are: the repository, its template, the install cache, the build output,
and the Python that runs the tools (the stack's venv)."""

from __future__ import annotations

import os
import sys

SCRIPTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(SCRIPTS)
TEMPLATE = os.path.join(ROOT, "template.yaml")
CACHE = os.environ.get("DYNAMO_OUTBOX_CACHE", os.path.expanduser("~/.cache/dynamo-outbox"))
PY = sys.executable


def target_dir() -> str:
    """Cargo's output: CARGO_TARGET_DIR (scripts/test.sh sets it), else the cache's
    target directory that every clone on the machine shares."""
    return os.environ.get("CARGO_TARGET_DIR") or os.path.join(CACHE, "target")


def script(name: str) -> str:
    """A command-line tool of scripts/ (lambda_runtime.py, streams.py, ...)."""
    return os.path.join(SCRIPTS, name)
