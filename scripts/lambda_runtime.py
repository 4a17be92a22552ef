#!/usr/bin/env python3
"""The Lambda emulator for one function binary (cold starts, warm reuse, real deadlines,
timeouts, throttling, asynchronous retries, billed duration):

  scripts/lambda_runtime.py [options] BINARY

What it models, with its sources, and every option: the docstring of
scripts/outbox_e2e/lambda_runtime/__init__.py, and --help.
"""

import sys

from outbox_e2e.lambda_runtime.cli import main

if __name__ == "__main__":
    sys.exit(main())
