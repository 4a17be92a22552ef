#!/usr/bin/env bash
# The README's main command: the whole path on the local stack.
#   install what is missing -> start DynamoDB Local + the Kafka broker ->
#   `outboxctl demo` (table, topic, orders placed in business transactions that carry
#   their messages, a relay publishing them) -> read the topic back with an independent
#   client (confluent-kafka) and verify per-key order.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${DYNAMO_OUTBOX_CACHE:-$HOME/.cache/dynamo-outbox}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$CACHE/target}
ORDERS=${DEMO_ORDERS:-300}

if [[ ${1:-} == --inside-stack ]]; then
    cd "$ROOT"
    cargo build -q -p outboxctl
    "$CARGO_TARGET_DIR/debug/outboxctl" demo --topic orders --partitions 3 --orders "$ORDERS" --keys 12
    echo "--- read back from Kafka by confluent-kafka ---"
    "$OUTBOX_STACK_PYTHON" "$OUTBOX_STACK_SCRIPTS/kafka.py" read orders \
        | "$OUTBOX_STACK_PYTHON" "$OUTBOX_STACK_SCRIPTS/demo_check.py" "$ORDERS"
    exit 0
fi

bash "$ROOT/scripts/install.sh"
exec bash "$ROOT/scripts/stack.sh" run -- bash "$ROOT/scripts/demo.sh" --inside-stack
