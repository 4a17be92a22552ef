#!/usr/bin/env bash
# The README's main command: the whole path on the local stack.
#   install what is missing -> start DynamoDB Local + the Kafka broker ->
#   `outboxctl demo` (table, topic, orders placed in business transactions that carry
#   their messages, a relay publishing them) -> read the topic back with an independent
#   client (confluent-kafka) and verify per-key order.
#
# Prints the summary only; the relay's own log (every lease and ownership change) goes
# to a file the summary names.  --verbose (or DEMO_VERBOSE=1) shows it as it runs.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${DYNAMO_OUTBOX_CACHE:-$HOME/.cache/dynamo-outbox}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$CACHE/target}
ORDERS=${DEMO_ORDERS:-300}
if [[ ${1:-} == --verbose || ${2:-} == --verbose ]]; then
    export DEMO_VERBOSE=1
fi

if [[ ${1:-} == --inside-stack ]]; then
    cd "$ROOT"
    cargo build -q -p outboxctl
    log=$CACHE/logs/demo.log
    mkdir -p "$(dirname "$log")"
    if [[ ${DEMO_VERBOSE:-} == 1 ]]; then
        "$CARGO_TARGET_DIR/debug/outboxctl" demo --topic orders --partitions 3 --orders "$ORDERS" --keys 12
    elif ! NO_COLOR=1 "$CARGO_TARGET_DIR/debug/outboxctl" demo --topic orders --partitions 3 \
        --orders "$ORDERS" --keys 12 2>"$log"; then
        echo "outboxctl demo failed; the end of its log ($log):" >&2
        tail -n 20 "$log" >&2
        exit 1
    else
        echo "relay log: $log ($(wc -l <"$log") lines)"
    fi
    echo "--- read back from Kafka by confluent-kafka ---"
    "$OUTBOX_STACK_PYTHON" "$OUTBOX_STACK_SCRIPTS/kafka.py" read orders \
        | "$OUTBOX_STACK_PYTHON" "$OUTBOX_STACK_SCRIPTS/demo_check.py" "$ORDERS"
    exit 0
fi

# What install.sh did or failed to do, without a line per component already present.
bash "$ROOT/scripts/install.sh" | { grep -v '^\[install\] skip: ' || true; }
exec bash "$ROOT/scripts/stack.sh" run -- bash "$ROOT/scripts/demo.sh" --inside-stack
