#!/usr/bin/env python3
"""Reads what the local model of Lambda needs out of the SAM template: a function's
DynamoDB stream mapping, its EventInvokeConfig and (--environment) its variables.

  scripts/cfn_template.py template.yaml --function RelayFunction [--param K=V ...]
                          [--environment]

The resolver and what it prints: the docstring of scripts/outbox_e2e/cfn_template.py.
"""

import sys

from outbox_e2e.cfn_template import main

if __name__ == "__main__":
    sys.exit(main())
