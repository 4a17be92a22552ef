#!/usr/bin/env python3
"""Evaluates the CloudWatch metric alarms of template.yaml over EMF documents (a
function's log) and direct datapoints, with CloudWatch's M-of-N and missing-data rules;
prints each alarm's transitions as JSON.

  scripts/alarms.py [--template template.yaml] [--param K=V ...] --emf FILE|- ...

What it models and leaves out, with its sources: the docstring of
scripts/outbox_e2e/alarms/__init__.py, and --help.
"""

import sys

from outbox_e2e.alarms.cli import main

if __name__ == "__main__":
    sys.exit(main())
