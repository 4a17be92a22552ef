#!/usr/bin/env python3
"""DynamoDB Streams for the local stack: enable a table's stream, print its records as the
Lambda event the event source mapping would deliver, and the poller standing in for that
event source mapping.

  scripts/streams.py enable TABLE [--view-type KEYS_ONLY]
  scripts/streams.py records TABLE [--after SEQ] [--filter-prefix PREFIX] [--pretty]
  scripts/streams.py poll TABLE --invoke URL [--template template.yaml ...]

What each does and what the poller models, with its sources: the docstring of
scripts/outbox_e2e/streams/__init__.py, and --help.
"""

import sys

from outbox_e2e.streams.cli import main

if __name__ == "__main__":
    sys.exit(main())
