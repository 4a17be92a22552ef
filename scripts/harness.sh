#!/usr/bin/env bash
# The fault-injection harness (see docs/RELIABILITY.md).
#
# Usage:
#   scripts/harness.sh [--long] [--scenario NAME ...] [--out DIR] [--seed N] [--list]
#
# Builds outboxctl and outbox-harness (debug, in CARGO_TARGET_DIR, default
# ~/.cache/dynamo-outbox/target), starts the local stack (scripts/stack.sh run:
# DynamoDB Local + Apache Kafka on loopback ports) and runs the scenarios against
# `outboxctl relay` processes.  Without --long: the short profile, the one the
# test suite runs (cli/tests/harness.rs).  With --long: about 45 s of writes per
# scenario, the figures of docs/RELIABILITY.md.  Prints a Markdown table of the
# figures; histories and relay logs stay in --out (default a temp directory).
# Exits 1 when a target is missed.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${DYNAMO_OUTBOX_CACHE:-$HOME/.cache/dynamo-outbox}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$CACHE/target}
cd "$ROOT"

cargo build -p outboxctl -p outbox-harness
BIN=$CARGO_TARGET_DIR/debug
for arg in "$@"; do
    if [[ $arg == --list ]]; then
        exec "$BIN/outbox-harness" "$@"
    fi
done
exec bash "$ROOT/scripts/stack.sh" run -- \
    "$BIN/outbox-harness" --outboxctl "$BIN/outboxctl" "$@"
