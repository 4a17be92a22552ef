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
#        scripts/sam_build_check.sh: sam build with samconfig.toml for x86_64 (and again
#          with nothing changed), and as it is for arm64 (the template's default: the
#          artifact `sam build && sam deploy` ships), each checked for its ELF machine and
#          its built template's literal architecture
#        pytest: the end-to-end suite (e2e/, one pytest run; docs/testing.md lists its
#          tests): the template per setup (translated, linted, policy-scanned), the
#          alarm evaluator, the local model of Lambda (the emulator and the stream
#          mapping, against a fake function), both functions under cargo lambda watch,
#          the Kafka setups (mTLS, SCRAM, MSK IAM, PLAIN without a VPC), the library's
#          examples, sam build's x86_64 bootstraps woken by the stream's doorbell, the
#          arm64 bootstraps under qemu-aarch64-static (one scheduled invocation), and
#          the continuity scenarios (bus, stuck, outage, burst)
#        cargo test -p dynamo-outbox --lib --no-default-features (the writer-only
#          library), then cargo check of each of its features alone
#        cargo test --workspace --all-features (the local-stack test targets included)
#   3. scripts/stack.sh run again with KAFKA_VERSION set to the 3.x line (3.9.x): the
#      integration test targets that exercise the Kafka client (COMPAT_TESTS below: the
#      records and headers, TLS, SASL, authorization, a broker restart, large records,
#      the pipeline, transactions; with --full, every target) and the suite's Kafka setups (pytest -m
#      kafka_lines) against that broker. Should Maven not have served that version, this
#      step prints NOT RUN with the reason (install.sh wrote it).
#   4. A table of the steps' times (each of the suite's test files a line of its own),
#      pytest's summary line of each run, and the total of the cargo tests and the pytest
#      tests as the last line ("tests: N passed, M failed").
#
# Build output goes to CARGO_TARGET_DIR (default ~/.cache/dynamo-outbox/target,
# shared by every clone on the machine, so CI's fresh clone builds
# incrementally).  `--full` (first) runs every integration test target against the 3.x
# line too; other arguments are passed on to `cargo test`.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${DYNAMO_OUTBOX_CACHE:-$HOME/.cache/dynamo-outbox}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$CACHE/target}
cd "$ROOT"

# Each step's start goes to $OUTBOX_TEST_TIMES (epoch seconds, tab, name; e2e/conftest.py
# adds a line per test file of the suite); the first half prints the table at the end. The
# cargo tests' and pytest's output is kept in $OUTBOX_TEST_RESULTS for the closing count.
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

# The end-to-end suite (pytest.ini: e2e/, the support code in scripts/outbox_e2e/) with the
# venv's python, its output also appended to $OUTBOX_TEST_RESULTS; returns pytest's status.
e2e_suite() {
    local rc=0
    "$CACHE/venv/bin/python" -u -m pytest "$@" 2>&1 | tee -a "${OUTBOX_TEST_RESULTS:-/dev/null}" || rc=$?
    return "$rc"
}

# The integration test targets the 3.x run runs (without --full).
COMPAT_TESTS=(publish tls kafka_auth authorization broker_restart large pipeline transactions exactly_once)

# The 3.x run: the Kafka-facing integration test targets and the Kafka setups against the
# broker of KAFKA_VERSION (stack.sh started it), after the main run with 4.x.
if [[ ${1:-} == --inside-stack-compat ]]; then
    shift
    export PATH="$CACHE/venv/bin:$PATH"
    step "Apache Kafka $KAFKA_VERSION: the Kafka setups end-to-end (pytest -m kafka_lines)"
    setups=0
    e2e_suite -m kafka_lines || setups=$?
    # The test targets whose outcome depends on the broker's version: the client's
    # requests and the broker's answers (records, headers, TLS, SASL, ACLs, a restart,
    # large records, the writer-to-Kafka pipeline, transactions, exactly-once delivery). The relay's own logic is the same on
    # either line; --full runs every target here too.
    targets=(--test '*')
    if [[ -z ${OUTBOX_TEST_FULL:-} ]]; then
        targets=()
        for t in "${COMPAT_TESTS[@]}"; do targets+=(--test "$t"); done
    fi
    step "Apache Kafka $KAFKA_VERSION: cargo test --workspace --all-features --no-fail-fast ${targets[*]}"
    tests=0
    cargo_test --workspace --all-features --no-fail-fast "${targets[@]}" "$@" || tests=$?
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
    # $sam_dir is removed after the end-to-end suite, which runs these bootstraps.

    # The end-to-end suite, one pytest run (e2e/; docs/testing.md says what each test file
    # checks; about 6 minutes once its binaries are built): the template per setup, the
    # alarm evaluator, the local model of Lambda, both functions under cargo lambda
    # watch, the Kafka setups, the library's examples, the serverless mode with sam
    # build's bootstraps above (x86_64 woken by the doorbell; arm64 under
    # qemu-aarch64-static, one scheduled invocation), and the continuity scenarios (bus,
    # stuck, outage, burst), each test file a line of the times' table. A failure is
    # reported after the cargo tests, which run either way.
    step "the end-to-end suite (pytest e2e/)"
    e2e=0
    e2e_suite --sam-build="$sam_dir" || e2e=$?
    rm -rf "$sam_dir"

    # The library as a writer-only service builds it (default-features = false: no Kafka
    # client): every other step turns `otel` on, so only this one shows that a writer
    # without it stamps no trace headers (writer::tests). Then each feature on its own
    # compiles, warning-free (a feature that needs another must say so in lib/Cargo.toml).
    step "cargo test -p dynamo-outbox --lib --no-default-features (writer only); cargo check of each feature alone"
    lib_plain=0
    cargo_test -p dynamo-outbox --lib --no-default-features || lib_plain=$?
    features=$(sed -n '/^\[features\]/,/^\[/s/^\([a-z][a-z0-9_-]*\) = .*/\1/p' lib/Cargo.toml | grep -vx default)
    for feature in $features; do
        echo "--- dynamo-outbox with only the feature $feature"
        out=$(cargo check -p dynamo-outbox --no-default-features --features "$feature" 2>&1) || lib_plain=$?
        printf '%s\n' "$out"
        if grep -q 'warning: `dynamo-outbox` (lib) generated' <<<"$out"; then
            echo "dynamo-outbox with only the feature $feature has warnings" >&2
            lib_plain=1
        fi
    done

    # Last, so that its summary lines ("test result: ...") close the output.
    # --no-fail-fast: every test binary runs and prints its summary even when
    # an earlier one failed (the exit status is still non-zero then).
    # --all-features turns on `local-stack`: every integration test runs, none is skipped.
    step "cargo test --workspace --all-features --no-fail-fast"
    cargo_test --workspace --all-features --no-fail-fast "$@"
    if ((lib_plain != 0)); then
        echo "the writer-only library's unit tests or a feature's build alone FAILED (exit $lib_plain); see above" >&2
    fi
    if ((e2e != 0)); then
        echo "the end-to-end suite FAILED (pytest exit $e2e); its failures are listed above its summary line" >&2
        exit "$e2e"
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

if [[ ${1:-} == --full ]]; then
    shift
    export OUTBOX_TEST_FULL=1
fi

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
# pytest's summary line of each run (the main run's, then the 3.x line's).
grep -E '^=+ .*(passed|failed|error|no tests ran).* in [0-9.]+s' "$OUTBOX_TEST_RESULTS" |
    sed 's/^/pytest: /' || true
# Last: the cargo tests and the pytest tests of both runs, counted from their summary lines
# (cargo's "test result: ok. N passed; M failed; ...", pytest's "== N passed, M failed,
# K errors in S s ==", an error counted as a failure).
awk '/^test result:/ || /^=+ .* in [0-9.]+s/ {
         for (i = 1; i < NF; i++) {
             if ($(i+1) ~ /^passed/) p += $i
             if ($(i+1) ~ /^failed/ || $(i+1) ~ /^errors?[,;]?$/) f += $i
         }
     }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$OUTBOX_TEST_RESULTS"
((main == 0)) || exit "$main"
exit "$compat"
