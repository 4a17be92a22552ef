#!/usr/bin/env bash
# `sam build` as a user runs it, with the repository's samconfig.toml (cached = true,
# parallel = true, its parameter_overrides): the artifact users deploy by default (arm64),
# and two traps that cfn-lint and `sam validate` cannot see:
#
#   arm64         samconfig.toml as it is (Architecture="arm64", the template's default:
#                 what `sam build && sam deploy` ships) must give aarch64 executables,
#                 cross-compiled by cargo-lambda with zig (the venv's ziglang);
#                 scripts/test.sh then runs them under qemu-aarch64-static.
#   architecture  samconfig.toml with Architecture="x86_64" (the host's; the template's
#                 default is arm64) must give x86-64 executables: sam build reads
#                 parameter_overrides only from [default.global.parameters] or
#                 [default.build.parameters], not from [default.deploy.parameters].
#   build cache   a second sam build with the same build and cache directories, after a
#                 change under lib/ only, must build both functions again: SAM's cache is
#                 keyed on a checksum of each function's CodeUri, so a CodeUri of
#                 functions/relay kept the cached bootstrap ("Valid cache found") and
#                 `sam deploy` shipped the old code.  The change is a new file under lib/
#                 that cargo does not compile: SAM's checksum covers every file of
#                 CodeUri, so it must say "Cache is invalid, running build" for both
#                 functions, and cargo-lambda then finds nothing to recompile (seconds,
#                 where a changed source file cost two more release builds of the
#                 project's crates per run: this build and, at the next run, its undoing).
#
# Usage: scripts/sam_build_check.sh OUT_DIR
#   OUT_DIR/build        the x86-64 bootstraps of the working tree (RelayFunction/bootstrap,
#                        ...), which the later steps of scripts/test.sh run natively;
#   OUT_DIR/build-arm64  the arm64 bootstraps of the working tree (the default artifact).
#
# Cost: every build runs in a copy of the working tree at a fixed path under the cache
# (tree/; a file is rewritten only when its content changed) with the shared
# CARGO_TARGET_DIR, so cargo rebuilds only what changed in the working tree since the
# last run, once per architecture (nothing: seconds; a change under lib/: ~5 min each
# on 2 cores; the arm64 build from scratch, with the host's build scripts and proc
# macros already built by the x86-64 build: ~10.5 min).  SAM's own cache directory is
# fresh on every run.  Builds into the
# shared target directory take $CACHE/sam-build.lock: every sam build of the machine
# writes the same $CARGO_TARGET_DIR/lambda/<binary>/bootstrap, from which SAM copies,
# and two at once (another clone's, or the other architecture) could copy each other's.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${DYNAMO_OUTBOX_CACHE:-$HOME/.cache/dynamo-outbox}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$CACHE/target}
export SAM_CLI_TELEMETRY=0
WORK=${SAM_BUILD_CHECK_DIR:-$CACHE/sam-build-check}
OUT=${1:?usage: scripts/sam_build_check.sh OUT_DIR}
mkdir -p "$WORK" "$OUT"
OUT=$(cd "$OUT" && pwd)

fail() { echo "sam build check FAILED: $*" >&2; exit 1; }

exec 8>"$CACHE/sam-build.lock"
if ! flock -n 8; then
    echo "--- another sam build holds $CACHE/sam-build.lock; waiting"
    flock 8
fi

# Checks that $1/{RelayFunction,EnqueueFunction}/bootstrap are ELF executables of the
# machine $2 (62 x86-64, 183 aarch64; e_machine at offset 18) and prints their sizes.
check_elf() { # $1: build directory, $2: e_machine, $3: its name, $4: what went wrong
    local fn bootstrap magic machine
    for fn in "${FUNCTIONS[@]}"; do
        bootstrap=$1/$fn/bootstrap
        [[ -x $bootstrap ]] || fail "sam build made no executable $bootstrap"
        magic=$(od -An -tx1 -N4 "$bootstrap" | tr -d ' \n')
        machine=$(od -An -tu2 -j18 -N2 "$bootstrap" | tr -d ' \n')
        [[ $magic == 7f454c46 && $machine == "$2" ]] ||
            fail "$bootstrap is not an $3 ELF executable (magic $magic, machine $machine): $4"
        echo "$fn/bootstrap: $3 ELF, $(($(stat -c %s "$bootstrap") / 1024)) KiB"
    done
}
FUNCTIONS=(RelayFunction EnqueueFunction)

# Makes $2 a copy of the tree $1 (no .git, no build output): a file is rewritten only
# when its content differs, so cargo's mtime-based freshness stays exact and cheap.  The
# optional $3 (a path in the tree) is left to the caller.
sync_tree() {
    local src=$1 dst=$2 skip=${3:-} rel list
    mkdir -p "$dst"
    list=$(mktemp)
    (cd "$src" && find . \( -name .git -o -name .aws-sam -o -name target -o -name __pycache__ \
        -o -path ./fuzz/corpus -o -path ./fuzz/artifacts \) -prune -o -type f -print) | sort >"$list"
    while IFS= read -r rel; do
        [[ $rel == "./$skip" ]] && continue
        if ! cmp -s "$src/$rel" "$dst/$rel"; then
            mkdir -p "$(dirname "$dst/$rel")"
            cp "$src/$rel" "$dst/$rel"
        fi
    done <"$list"
    # Files gone from the tree go from the copy too.
    (cd "$dst" && find . -type f -print) | sort | comm -13 "$list" - | while IFS= read -r rel; do
        rm -f "$dst/$rel"
    done
    rm -f "$list"
}

# The repository's samconfig.toml with the host's architecture, wherever it sets it.
config=$WORK/samconfig.toml
sed 's/Architecture=\\"arm64\\"/Architecture=\\"x86_64\\"/' "$ROOT/samconfig.toml" >"$config"
grep -q 'Architecture=\\"x86_64\\"' "$config" ||
    fail "samconfig.toml sets no Architecture=\"arm64\" in parameter_overrides to replace"

# One copy of the working tree, at a fixed path (SAM's build.toml records each function's
# CodeUri as an absolute path: the second build must see the same directory changed).
tree=$WORK/tree
stamp=lib/sam-build-check.stamp
[[ ! -e $ROOT/$stamp ]] || fail "$stamp exists in the working tree; it is this check's"
sync_tree "$ROOT" "$tree"
# Put the copy back as the working tree has it, whatever happens below.
trap 'rm -f "$tree/$stamp"' EXIT

# Same build directory's parent (SAM keeps build.toml, with each function's source
# checksum, next to the build directory) and the same cache directory for both builds.
build() { # $1: build directory
    (cd "$tree" && sam build --config-file "$config" --template template.yaml \
        --build-dir "$1" --cache-dir "$OUT/cache")
}

started=$SECONDS
echo "--- sam build of the working tree (samconfig.toml, Architecture=x86_64)"
build "$OUT/build"
check_elf "$OUT/build" 62 x86-64 "sam build did not take Architecture from samconfig.toml"
echo "($((SECONDS - started)) s)"

# The change under lib/ only: a file that no crate compiles (so cargo has nothing to
# redo), which SAM's checksum of CodeUri sees.
date -u +%s%N >"$tree/$stamp"
started=$SECONDS
echo "--- sam build again, same build and cache directories, after a change under lib/ only"
log=$OUT/build-lib-changed.log
build "$OUT/build-lib-changed" 2>&1 | tee "$log"
for fn in "${FUNCTIONS[@]}"; do
    grep -q "Valid cache found, copying previously built resources for following functions.*\b$fn\b" "$log" &&
        fail "$fn: SAM's build cache missed the change under lib/ (\"Valid cache found\"): sam deploy would ship the old bootstrap"
    grep -q "Cache is invalid, running build and copying resources for following functions.*\b$fn\b" "$log" ||
        fail "$fn: sam build did not say \"Cache is invalid, running build\" after the change under lib/ (see $log)"
    [[ -x $OUT/build-lib-changed/$fn/bootstrap ]] || fail "$fn: no bootstrap after the change under lib/"
    echo "$fn: built again after the change under lib/ (SAM's cache saw it)"
done
rm -rf "$OUT/build-lib-changed" "$log"
echo "($((SECONDS - started)) s)"

# The default artifact: samconfig.toml as it is, from the same copy (the stamp is no
# source of any crate) with a cache directory of its own.
started=$SECONDS
echo "--- sam build of the working tree (samconfig.toml as it is, Architecture=arm64)"
(cd "$tree" && sam build --config-file "$ROOT/samconfig.toml" --template template.yaml \
    --build-dir "$OUT/build-arm64" --cache-dir "$OUT/cache-arm64")
check_elf "$OUT/build-arm64" 183 aarch64 "sam build did not build the template's default architecture"
echo "($((SECONDS - started)) s)"
echo "sam build check passed"
