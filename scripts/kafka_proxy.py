#!/usr/bin/env python3
"""An Amazon MSK IAM listener (TLS, SASL/OAUTHBEARER with the token's SigV4 signature
checked) in front of the local broker's PLAINTEXT listener:

  scripts/kafka_proxy.py [--upstream HOST:PORT] --cert PEM [--key PEM] [--region R]
                         --access-key-id K --secret-access-key S [--session-token T]

What it checks and rewrites: the docstring of scripts/outbox_e2e/kafka_proxy.py.
"""

import sys

from outbox_e2e.kafka_proxy import main

if __name__ == "__main__":
    sys.exit(main())
