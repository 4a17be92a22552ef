#!/usr/bin/env bash
# The benchmarks of BENCHMARKS.md (the project's `make bench`):
#
#   scripts/bench.sh                 every benchmark at full size (about 15 minutes)
#   scripts/bench.sh --small all     every benchmark at small sizes (a quick check)
#   scripts/bench.sh drain --pairs 2 one benchmark, with its options
#                                    (outbox-bench --help, outbox-bench drain --help)
#   scripts/bench.sh large-items     drain rate and peak RSS of `outboxctl relay` by value
#                                    size: 20,000 x 1 KB, 1,600 x 100 KB, 1,600 x 300 KB over
#                                    64 keys, 2 runs each (the footprint benchmark with
#                                    --outboxctl); BENCH_BEFORE_OUTBOXCTL=PATH adds another
#                                    outboxctl binary ("before"), alternating with this one;
#                                    a relay not drained after BENCH_TIMEOUT_SECS (300) is
#                                    stopped; builds only outbox-bench and outboxctl
#
# 1. scripts/install.sh (what is missing), 2. a release build of outbox-bench, outboxctl
# and the relay function (their sizes are part of the footprint benchmark), 3.
# scripts/stack.sh run: DynamoDB Local + Apache Kafka on loopback ports, then
# outbox-bench with the stack's endpoints exported. BENCH_PROFILE=debug skips the release
# build (quick checks of the benchmarks themselves; the figures then mean little).
#
# Each run's raw output (stdout and stderr, with the commit and the machine's load) is
# also written to $CARGO_TARGET_DIR/bench/<benchmark>/<UTC time>-<commit>.log, outside the
# repository (CARGO_TARGET_DIR defaults to ~/.cache/dynamo-outbox/target); BENCHMARKS.md
# keeps only the figures.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${DYNAMO_OUTBOX_CACHE:-$HOME/.cache/dynamo-outbox}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$CACHE/target}
PROFILE=${BENCH_PROFILE:-release}

if [[ ${1:-} == --inside-stack ]]; then
    shift
    name=all
    for arg in "$@"; do
        if [[ $arg != -* ]]; then
            name=$arg
            break
        fi
    done
    if commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null); then
        dirty=$(git -C "$ROOT" status --porcelain -- lib cli bench functions Cargo.lock | wc -l)
        commit_line="commit: $commit ($dirty files of lib/, cli/, bench/, functions/, Cargo.lock modified in the tree)"
    else
        commit=nogit
        commit_line="commit: not a git checkout ($ROOT)"
    fi
    raw_dir=$CARGO_TARGET_DIR/bench/$name
    mkdir -p "$raw_dir"
    raw_log=$raw_dir/$(date -u +%Y%m%dT%H%M%SZ)-$commit.log
    echo "raw output: $raw_log"
    exec > >(tee "$raw_log") 2>&1
    echo "$commit_line"
    if [[ ${1:-} == large-items ]]; then
        shift
        relays=()
        if [[ -n ${BENCH_BEFORE_OUTBOXCTL:-} ]]; then
            relays+=(--outboxctl "before=$BENCH_BEFORE_OUTBOXCTL")
        fi
        relays+=(--outboxctl "after=$CARGO_TARGET_DIR/$PROFILE/outboxctl")
        set -- footprint --value-bytes 1024,102400,307200 --messages 20000,1600,1600 \
            --keys 64 "${relays[@]}" --runs 2 --timeout-secs "${BENCH_TIMEOUT_SECS:-300}" "$@"
    fi
    echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ)"
    exec "$CARGO_TARGET_DIR/$PROFILE/outbox-bench" "$@"
fi

cd "$ROOT"
bash "$ROOT/scripts/install.sh"
if [[ $PROFILE == release && ${1:-} == large-items ]]; then
    cargo build --release -p outbox-bench -p outboxctl
elif [[ $PROFILE == release ]]; then
    cargo build --release -p outbox-bench -p outboxctl -p outbox-relay-function
else
    cargo build -p outbox-bench -p outboxctl
fi
(($# > 0)) || set -- all
exec bash "$ROOT/scripts/stack.sh" run -- bash "$ROOT/scripts/bench.sh" --inside-stack "$@"
