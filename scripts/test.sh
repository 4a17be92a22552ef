#!/usr/bin/env bash
# The project's test command (what CI runs through .ci/run):
#
#   1. scripts/install.sh   installs/updates the local stack in the cache
#   2. scripts/stack.sh run starts DynamoDB Local, Apache Kafka (the first of install.sh's
#      KAFKA_VERSIONS, 4.1.x) and moto on loopback ports and, with their endpoints
#      exported, runs the checks below:
#        cargo fmt --all --check
#        cargo clippy --workspace --all-targets --all-features -- -D warnings
#        cargo doc -p dynamo-outbox --no-deps --all-features, warnings denied
#        cfn-lint template.yaml, sam validate --lint
#        scripts/template_test.py (the template as SAM translates it for each named
#          setup: grants, network, variables, table, alarms, outputs, rules; cfn-lint on
#          each setup and Checkov over the template and each setup)
#        scripts/test_alarms.py (the self-test of the CloudWatch alarm evaluator)
#        scripts/continuity_e2e.py --scenario bus (one wake-up per commit in stream mode)
#        scripts/continuity_e2e.py --scenario stuck (a poison head in a quiet period puts
#          the stuck-outbox and poison alarms into ALARM, over the EMF the relay wrote)
#        scripts/continuity_e2e.py --scenario outage --cut-before (Kafka refusing 40 s:
#          bounded successors, publishing resumes once it returns)
#        scripts/continuity_e2e.py --scenario burst (3,000 messages into an idle fleet,
#          drained by doorbells alone: every message, per-key order, no tick)
#        scripts/test_lambda_model.py (the self-test of the local model of Lambda:
#          lambda_runtime.py, streams.py poll, cfn_template.py, with a fake function)
#        scripts/sam_build_check.sh: sam build with samconfig.toml for x86_64 (and again
#          with nothing changed), and as it is for arm64 (the template's default: the
#          artifact `sam build && sam deploy` ships), each checked for its ELF machine and
#          its built template's literal architecture
#        scripts/lambda_e2e.py (both functions under cargo lambda watch/invoke)
#        scripts/kafka_setups_e2e.py (the debug binaries under scripts/lambda_runtime.py
#          with the template's environment against the broker's own SSL and SASL_SSL
#          listeners: mTLS, SCRAM (a wrong password, then rotated), PLAIN without a VPC;
#          MSK IAM through scripts/kafka_proxy.py; the CA, certificates, keys and
#          passwords in moto's Secrets Manager)
#        scripts/examples_e2e.py (the library's examples: place_orders, then
#          embedded_relay publishing the orders and stopping on SIGTERM)
#        scripts/serverless_e2e.py (sam build's x86_64 bootstraps under
#          scripts/lambda_runtime.py, woken by the table's stream through
#          scripts/streams.py: the doorbell)
#        scripts/serverless_e2e.py --mode tick (the arm64 bootstraps under
#          qemu-aarch64-static: a batch enqueued, one scheduled relay invocation)
#        cargo test -p dynamo-outbox --lib (the library without optional features)
#        cargo test --workspace --all-features (the local-stack test targets included)
#   3. scripts/stack.sh run again with KAFKA_VERSION set to the 3.x line (3.9.x): every
#      integration test target (cargo test --workspace --all-features --test '*') and
#      scripts/kafka_setups_e2e.py against that broker. Should Maven not have served that
#      version, this step prints NOT RUN with the reason (install.sh wrote it).
#   4. A table of the steps' times, and the cargo tests' total as the last line
#      ("tests: N passed, M failed").
#
# Build output goes to CARGO_TARGET_DIR (default ~/.cache/dynamo-outbox/target,
# shared by every clone on the machine, so CI's fresh clone builds
# incrementally).  Extra arguments are passed on to `cargo test`.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${DYNAMO_OUTBOX_CACHE:-$HOME/.cache/dynamo-outbox}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$CACHE/target}
cd "$ROOT"

# Each step's start goes to $OUTBOX_TEST_TIMES (epoch seconds, tab, name); the first half
# prints the table at the end. The cargo tests' output is kept in $OUTBOX_TEST_RESULTS
# for the closing count.
step() {
    printf '\n==> %s\n' "$*"
    [[ -z ${OUTBOX_TEST_TIMES:-} ]] || printf '%s\t%s\n' "$(date +%s)" "$*" >>"$OUTBOX_TEST_TIMES"
}

# cargo test, its output also appended to $OUTBOX_TEST_RESULTS; returns cargo's status.
cargo_test() {
    local rc=0
    cargo test "$@" 2>&1 | tee -a "${OUTBOX_TEST_RESULTS:-/dev/null}" || rc=$?
    return "$rc"
}

# The 3.x run: every integration test target and the Kafka setups against the broker of
# KAFKA_VERSION (stack.sh started it), after the main run with 4.x.
if [[ ${1:-} == --inside-stack-compat ]]; then
    shift
    export PATH="$CACHE/venv/bin:$PATH"
    step "Apache Kafka $KAFKA_VERSION: Kafka setups end-to-end (scripts/kafka_setups_e2e.py)"
    setups=0
    "$CACHE/venv/bin/python" scripts/kafka_setups_e2e.py || setups=$?
    step "Apache Kafka $KAFKA_VERSION: cargo test --workspace --all-features --no-fail-fast --test '*'"
    tests=0
    cargo_test --workspace --all-features --no-fail-fast --test '*' "$@" || tests=$?
    if ((setups != 0)); then
        echo "the Kafka setups' end-to-end test against Apache Kafka $KAFKA_VERSION FAILED (exit $setups)" >&2
        exit "$setups"
    fi
    exit "$tests"
fi

# ---------------------------------------------------------------------------
# Second half: runs inside `stack.sh run`, with the stack's variables set.
if [[ ${1:-} == --inside-stack ]]; then
    shift
    # The venv's tools (sam, cfn-lint, cargo-lambda -> `cargo lambda`) first.
    export PATH="$CACHE/venv/bin:$PATH"

    step "cargo fmt --all --check"
    cargo fmt --all --check

    # --all-features: the test targets that need the local stack are built only with the
    # `local-stack` feature (a bare `cargo test` leaves them out).
    step "cargo clippy --workspace --all-targets --all-features -- -D warnings"
    cargo clippy --workspace --all-targets --all-features -- -D warnings

    # The library's documentation: its public surface, with no broken or private links
    # (every public item has docs: #![deny(missing_docs)]).
    step "cargo doc -p dynamo-outbox --no-deps --all-features (-D warnings)"
    RUSTDOCFLAGS="-D warnings" cargo doc -p dynamo-outbox --no-deps --all-features

    step "cargo deny check licenses bans"
    "$CACHE/cargo-deny/bin/cargo-deny" --log-level error check licenses bans

    # The SAM template (template.yaml); its IAM actions are checked by
    # functions/relay/tests/template.rs.
    step "cfn-lint template.yaml"
    cfn-lint template.yaml

    step "sam validate --lint"
    SAM_CLI_TELEMETRY=0 sam validate --lint --template template.yaml

    # The template as each kind of user deploys it (MSK IAM, SCRAM, Serverless, SASL over
    # the internet, mTLS, schedule mode, an existing table, the options): translated by
    # SAM, resolved per setup and checked for its grants, network, variables, table,
    # alarms and outputs; the Rules refuse the broken combinations; cfn-lint on each
    # setup and the policy scan (Checkov, every suppression with its reason in the
    # template). e2e/test_template.py says what it checks; about 25 s.
    step "the template per setup: translated, linted, policy-scanned (e2e/test_template.py)"
    "$CACHE/venv/bin/python" -m pytest e2e/test_template.py

    # The local model of Lambda the end-to-end steps below rely on: the emulator, the
    # stream event source mapping and the template reader, against a fake function
    # (e2e/test_lambda_emulator.py and e2e/test_stream_mapping.py say what they check;
    # about two minutes). A failure is reported after the tests, which run either way.
    step "the local model of Lambda's event sources (e2e/test_lambda_emulator.py, e2e/test_stream_mapping.py)"
    model=0
    "$CACHE/venv/bin/python" -m pytest e2e/test_lambda_emulator.py e2e/test_stream_mapping.py || model=$?

    # The evaluator of the template's CloudWatch alarms over EMF documents (CloudWatch's
    # M-of-N and missing-data rules; e2e/test_alarms.py says what it checks; seconds).
    # A failure is reported after the tests, which run either way.
    step "the CloudWatch alarm evaluator (e2e/test_alarms.py)"
    alarms=0
    "$CACHE/venv/bin/python" -m pytest e2e/test_alarms.py || alarms=$?

    # sam build with the repository's samconfig.toml (cached = false) into the shared
    # target directory: for the host's architecture (x86_64: the template's architecture
    # line changed, as docs/deploy.md tells users without zig), then again with nothing
    # changed (the same bootstraps), then the template as it is (arm64, cross-compiled by
    # cargo-lambda with the venv's zig), which must give aarch64 executables; each built
    # template must name its bootstraps' architecture with no parameter that could change
    # it at deploy time.  A failed build fails the test command here.
    # scripts/sam_build_check.sh says what it checks and costs (the arm64 build: seconds
    # when nothing changed, ~5 min after a change under lib/, ~10.5 min from scratch).
    step "sam build with samconfig.toml: x86_64, again with nothing changed, and arm64 (scripts/sam_build_check.sh)"
    sam_dir=$(mktemp -d "${TMPDIR:-/tmp}/outbox-sam.XXXXXX")
    bash scripts/sam_build_check.sh "$sam_dir"
    # $sam_dir is removed after the end-to-end steps, which run these bootstraps.

    # Both functions under cargo-lambda's emulator: enqueue, notification, bad request,
    # relay, read back with confluent-kafka (scripts/lambda_e2e.py says what it checks).
    # A failure is reported after the tests, which run either way.
    step "lambda end-to-end: cargo lambda watch + cargo lambda invoke (scripts/lambda_e2e.py)"
    e2e=0
    "$CACHE/venv/bin/python" scripts/lambda_e2e.py || e2e=$?

    # The relay against Kafka set up as deployments find it, each over TLS with a private
    # CA and its material in moto's Secrets Manager, the functions' environment resolved
    # from template.yaml for the setup (scripts/kafka_setups_e2e.py says what it checks;
    # about 45 s with the binaries lambda_e2e.py built). A failure is reported after the
    # tests, which run either way.
    step "Kafka setups end-to-end: mTLS, SCRAM, MSK IAM, no VPC (scripts/kafka_setups_e2e.py)"
    setups=0
    "$CACHE/venv/bin/python" scripts/kafka_setups_e2e.py || setups=$?

    # The library's examples (lib/examples/): place_orders writes orders and their
    # messages in one transaction each, embedded_relay publishes them and stops
    # gracefully on SIGTERM with its leases released, read back with confluent-kafka
    # (scripts/examples_e2e.py says what it checks; seconds, its build reused by the
    # cargo test step). A failure is reported after the tests, which run either way.
    step "the library's examples on the local stack (scripts/examples_e2e.py)"
    examples=0
    "$CACHE/venv/bin/python" scripts/examples_e2e.py || examples=$?

    # The serverless mode with the artifacts sam build just made: both bootstraps under
    # scripts/lambda_runtime.py (real deadlines), the table's stream polled by
    # scripts/streams.py with the template's mapping, no schedule: the enqueue function's
    # commit and a direct TransactWriteItems each wake the relay through the doorbell,
    # read back with confluent-kafka (scripts/serverless_e2e.py says what it checks).
    # A failure is reported after the tests, which run either way.
    step "serverless end-to-end: sam build's bootstraps woken by the stream doorbell (scripts/serverless_e2e.py)"
    serverless=0
    "$CACHE/venv/bin/python" scripts/serverless_e2e.py "$sam_dir/build" || serverless=$?

    # One wake-up per commit: stream mode with an event bus configured, the debug
    # bootstraps lambda_e2e.py built under scripts/lambda_runtime.py, the stream read by
    # scripts/streams.py with the template's mapping: each commit reaches the relay as one
    # doorbell and no notification (scripts/continuity_e2e.py --scenario bus; about 40 s).
    # A failure is reported after the tests, which run either way.
    step "one wake-up per commit with a bus in stream mode (scripts/continuity_e2e.py --scenario bus)"
    wakeups=0
    "$CACHE/venv/bin/python" scripts/continuity_e2e.py --scenario bus --commits 3 --spacing 8 || wakeups=$?

    # A poison head in a quiet period: the relay (debug bootstrap, the doorbell and a
    # schedule every 30 s) parks the bucket and stops idle each time; the template's
    # alarms (StuckMessageAgeSeconds 60), evaluated by scripts/alarms.py over the EMF the
    # relay wrote, go into ALARM: PoisonItemsAlarm, then OutboxStuckAlarm within the age
    # plus a tick plus 90 s (scripts/continuity_e2e.py --scenario stuck; about 2 minutes).
    step "a poison head in a quiet period alarms (scripts/continuity_e2e.py --scenario stuck)"
    "$CACHE/venv/bin/python" scripts/continuity_e2e.py --scenario stuck --enforce-goals || wakeups=$?

    # Kafka refusing for 40 s from just before a burst of 500: the relay function (30 s
    # timeout) starts one successor a run while nothing moves (at most outage / (run - the
    # 10 s lead) + 1 runs start in the outage), publishing resumes within 60 s of Kafka's
    # return, each message once or more, 0 refused writes (continuity_e2e.py --scenario
    # outage --cut-before; about a minute).
    step "Kafka refusing during a burst (scripts/continuity_e2e.py --scenario outage --cut-before)"
    "$CACHE/venv/bin/python" scripts/continuity_e2e.py --scenario outage --cut-before --messages 500 \
        --outage-seconds 40 --relay-timeout 30 --enforce-goals || wakeups=$?

    # A burst of 3,000 into an idle fleet, then nothing (the debug bootstrap with the
    # template's relay environment and a 30 s timeout, the stream read by streams.py with
    # the template's mapping, no schedule): drained by doorbells alone, each message in Kafka once or more in
    # per-key order, the table empty and its leases released, 0 refused writes, no
    # function error, the template's alarms quiet, no bucket with a message and no live
    # owner for more than 10 s. The 2 s owner-gap goals are reported, not enforced: they
    # are a benchmark's figures (BENCHMARKS.md, serverless continuity), and a loaded
    # machine stretches them (continuity_e2e.py --scenario burst; about a minute).
    step "a burst drained by doorbells alone (scripts/continuity_e2e.py --scenario burst)"
    "$CACHE/venv/bin/python" scripts/continuity_e2e.py --scenario burst --messages 3000 \
        --no-compare || wakeups=$?

    # The default artifact: sam build's arm64 bootstraps, each under qemu-aarch64-static
    # (scripts/install.sh installs it and libc6:arm64) through scripts/lambda_runtime.py
    # (real deadlines): 20 messages through the enqueue function, one relay invocation
    # with the template's schedule payload, read back with confluent-kafka (each id once,
    # per-key order), the table empty, the leases released, the answer before the
    # deadline.  The emulator is for correctness, not timing: no bound on durations.
    # A failure is reported after the tests, which run either way.
    emulator=()
    [[ $(uname -m) == aarch64 ]] || emulator=(--prefix "qemu-aarch64-static -L /")
    step "arm64 smoke run: sam build's arm64 bootstraps ${emulator[1]:+under ${emulator[1]} }(scripts/serverless_e2e.py --mode tick)"
    arm64=0
    "$CACHE/venv/bin/python" scripts/serverless_e2e.py "$sam_dir/build-arm64" --mode tick \
        --arch aarch64 "${emulator[@]}" --relay-timeout 60 --init-timeout 30 || arm64=$?
    rm -rf "$sam_dir"

    # The library as a service without its optional features builds it: every other
    # step turns `otel` on, so only this one shows that a writer without it stamps no
    # trace headers (writer::tests; a build of its own, about a minute).
    step "cargo test -p dynamo-outbox --lib (no optional features)"
    lib_plain=0
    cargo_test -p dynamo-outbox --lib || lib_plain=$?

    # Last, so that its summary lines ("test result: ...") close the output.
    # --no-fail-fast: every test binary runs and prints its summary even when
    # an earlier one failed (the exit status is still non-zero then).
    # --all-features turns on `local-stack`: every integration test runs, none is skipped.
    step "cargo test --workspace --all-features --no-fail-fast"
    cargo_test --workspace --all-features --no-fail-fast "$@"
    if ((model != 0)); then
        echo "the Lambda model's self-test FAILED (exit $model); see its output above" >&2
    fi
    if ((alarms != 0)); then
        echo "the alarm evaluator's self-test FAILED (exit $alarms); see its output above" >&2
    fi
    if ((wakeups != 0)); then
        echo "a continuity scenario (bus, stuck, outage or burst) FAILED (exit $wakeups); see its output above" >&2
    fi
    if ((arm64 != 0)); then
        echo "arm64 smoke run FAILED (exit $arm64); see its output above" >&2
    fi
    if ((serverless != 0)); then
        echo "serverless end-to-end test FAILED (exit $serverless); see its output above" >&2
    fi
    if ((examples != 0)); then
        echo "the examples' end-to-end test FAILED (exit $examples); see its output above" >&2
    fi
    if ((setups != 0)); then
        echo "the Kafka setups' end-to-end test FAILED (exit $setups); see its output above" >&2
    fi
    if ((lib_plain != 0)); then
        echo "the library's unit tests without optional features FAILED (exit $lib_plain); see above" >&2
    fi
    if ((e2e != 0)); then
        echo "lambda end-to-end test FAILED (exit $e2e); see its output above" >&2
        exit "$e2e"
    fi
    if ((serverless != 0)); then
        exit "$serverless"
    fi
    if ((arm64 != 0)); then
        exit "$arm64"
    fi
    if ((model != 0)); then
        exit "$model"
    fi
    if ((alarms != 0)); then
        exit "$alarms"
    fi
    if ((wakeups != 0)); then
        exit "$wakeups"
    fi
    if ((examples != 0)); then
        exit "$examples"
    fi
    if ((setups != 0)); then
        exit "$setups"
    fi
    if ((lib_plain != 0)); then
        exit "$lib_plain"
    fi
    exit 0
fi

# ---------------------------------------------------------------------------
# First half: install, then this script inside the stack, once per Kafka line.
OUTBOX_TEST_TIMES=$(mktemp "${TMPDIR:-/tmp}/outbox-test-times.XXXXXX")
OUTBOX_TEST_RESULTS=$(mktemp "${TMPDIR:-/tmp}/outbox-test-results.XXXXXX")
export OUTBOX_TEST_TIMES OUTBOX_TEST_RESULTS
trap 'rm -f "$OUTBOX_TEST_TIMES" "$OUTBOX_TEST_RESULTS"' EXIT
# Ctrl-C (or a TERM) during a run ends the whole command, not just that run: bash runs
# the trap once the run in the foreground has returned.
trap 'exit 130' INT TERM

step "scripts/install.sh"
bash "$ROOT/scripts/install.sh"

# The Kafka versions install.sh fetched: the first is the main run's, the second the 3.x
# line's run.
mapfile -t KAFKA_LINES < <(sed -n 's/^KAFKA_VERSIONS=(\(.*\))/\1/p' "$ROOT/scripts/install.sh" | tr ' ' '\n')
((${#KAFKA_LINES[@]} == 2)) || {
    echo "scripts/install.sh's KAFKA_VERSIONS must name two versions (4.x, then 3.x): ${KAFKA_LINES[*]}" >&2
    exit 2
}

step "scripts/stack.sh run (DynamoDB Local, Apache Kafka ${KAFKA_LINES[0]}, moto)"
main=0
KAFKA_VERSION=${KAFKA_LINES[0]} bash "$ROOT/scripts/stack.sh" run -- \
    bash "$ROOT/scripts/test.sh" --inside-stack "$@" || main=$?

compat=0
compat_line="Apache Kafka ${KAFKA_LINES[1]}"
if [[ -f $CACHE/kafka/${KAFKA_LINES[1]}.not-run ]]; then
    step "$compat_line: NOT RUN"
    compat_line+=": NOT RUN: $(cat "$CACHE/kafka/${KAFKA_LINES[1]}.not-run")"
else
    step "scripts/stack.sh run (DynamoDB Local, Apache Kafka ${KAFKA_LINES[1]}, moto)"
    KAFKA_VERSION=${KAFKA_LINES[1]} bash "$ROOT/scripts/stack.sh" run -- \
        bash "$ROOT/scripts/test.sh" --inside-stack-compat "$@" || compat=$?
    if ((compat == 0)); then
        compat_line+=": passed"
    else
        compat_line+=": FAILED (exit $compat)"
    fi
fi
printf '%s\tend\n' "$(date +%s)" >>"$OUTBOX_TEST_TIMES"

# The steps' times, each from its start to the next one's.
printf '\n==> the steps'"'"' times\n'
awk -F'\t' '
    NR > 1 { d = $1 - start; total += d; printf "%5d:%02d  %s\n", d / 60, d % 60, name }
    { start = $1; name = $2 }
    END { printf "%5d:%02d  in all\n", total / 60, total % 60 }
' "$OUTBOX_TEST_TIMES"
echo "main run (Apache Kafka ${KAFKA_LINES[0]}): $( ((main == 0)) && echo passed || echo "FAILED (exit $main)")"
echo "$compat_line"
# Last: the cargo tests of both runs, counted from their summary lines.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$OUTBOX_TEST_RESULTS"
((main == 0)) || exit "$main"
exit "$compat"
